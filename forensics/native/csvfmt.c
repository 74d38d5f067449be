/*
 * CSV formatting of integer packet columns: one row per packet, straight from
 * the numpy columns, so writing every row keeps pace with the analysis
 * (pandas' to_csv manages about a quarter of a million rows a second).
 */
#include <stdint.h>
#include <string.h>

#include "csvfmt.h"

static inline char *put_u64(char *p, uint64_t v) {
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) *p++ = tmp[--n];
    return p;
}

static inline char *put_i64(char *p, int64_t v) {
    if (v < 0) {
        *p++ = '-';
        return put_u64(p, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(p, (uint64_t)v);
}

int64_t csv_format(const csv_col *cols, int32_t ncols, const char *const *strs, const int32_t *str_lens,
                   int32_t nstrs, int64_t row, int64_t nrows, char *out, int64_t cap, int64_t *rows_done) {
    char *p = out;
    int64_t r = row;
    for (; r < nrows; r++) {
        /* worst case per row: 21 bytes per number, the longest string, separators */
        int64_t need = 0;
        for (int32_t c = 0; c < ncols; c++) {
            if (cols[c].type == CSV_CATEGORY) {
                int32_t code = ((const int32_t *)cols[c].data)[r];
                need += (code >= 0 && code < nstrs) ? str_lens[code] + 1 : 1;
            } else {
                need += 22;
            }
        }
        if ((p - out) + need + 1 > cap) break;
        for (int32_t c = 0; c < ncols; c++) {
            const void *d = cols[c].data;
            switch (cols[c].type) {
            case CSV_U8: p = put_u64(p, ((const uint8_t *)d)[r]); break;
            case CSV_U16: p = put_u64(p, ((const uint16_t *)d)[r]); break;
            case CSV_U32: p = put_u64(p, ((const uint32_t *)d)[r]); break;
            case CSV_I64: p = put_i64(p, ((const int64_t *)d)[r]); break;
            case CSV_BIT: *p++ = (char)('0' + ((((const uint32_t *)d)[r] >> cols[c].param) & 1)); break;
            case CSV_CATEGORY: {
                int32_t code = ((const int32_t *)d)[r];
                if (code >= 0 && code < nstrs) {
                    memcpy(p, strs[code], (size_t)str_lens[code]);
                    p += str_lens[code];
                }
                break;
            }
            default: break;
            }
            *p++ = c + 1 < ncols ? ',' : '\n';
        }
    }
    *rows_done = r;
    return p - out;
}
