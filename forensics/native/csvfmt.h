#ifndef STALLSCOPE_CSVFMT_H
#define STALLSCOPE_CSVFMT_H
#include <stdint.h>

enum { CSV_U8 = 1, CSV_U16 = 2, CSV_U32 = 3, CSV_I64 = 4, CSV_BIT = 5, CSV_CATEGORY = 6 };

typedef struct {
    const void *data;
    int32_t type;
    int32_t param; /* CSV_BIT: the bit */
} csv_col;

/* Format rows [row, nrows) into out (at most cap bytes, whole rows only).
 * Returns bytes written; *rows_done is the next row to format. */
int64_t csv_format(const csv_col *cols, int32_t ncols, const char *const *strs, const int32_t *str_lens,
                   int32_t nstrs, int64_t row, int64_t nrows, char *out, int64_t cap, int64_t *rows_done);
#endif
