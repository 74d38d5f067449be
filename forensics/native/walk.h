#ifndef STALLSCOPE_WALK_H
#define STALLSCOPE_WALK_H
#include <stdint.h>

#define WALK_PCAP 1
#define WALK_PCAPNG 2
#define WALK_NOT_A_PACKET (-1) /* link type of records that are frames but not packets */

typedef struct walk_state walk_state;

/* Column buffers the walker fills, one entry per packet record. */
typedef struct {
    int64_t *data_off; /* absolute file offset of the packet bytes */
    uint32_t *caplen;
    uint32_t *origlen;
    int64_t *ts_ns; /* UTC nanoseconds */
    int32_t *linktype;
} walk_cols;

walk_state *walk_new(int fmt, int swapped, int nsec, int32_t linktype, uint32_t snaplen);
void walk_free(walk_state *st);
const char *walk_error(const walk_state *st);
void walk_counters(const walk_state *st, int64_t *out);
int64_t walk_records(walk_state *st, const uint8_t *buf, int64_t len, int64_t base,
                     walk_cols *out, int64_t max_out, int64_t *consumed);
#endif
