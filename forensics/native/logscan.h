#ifndef STALLSCOPE_LOGSCAN_H
#define STALLSCOPE_LOGSCAN_H
#include <stdint.h>

/* Columns of NCCL_DEBUG COLL lines, one entry per line (see logscan.c). Text fields are
 * given as (offset, length) into the buffer plus a 64-bit hash, so the caller decodes
 * each distinct value once. */
typedef struct {
    int64_t *start;      /* offset of the line's first byte */
    int64_t *pre;        /* offset of the NCCL prefix: its "[time] " when present, else the host */
    int32_t *ts_len;     /* length of that "[time]" (0: none) */
    int64_t *host_off;
    int32_t *host_len;
    uint64_t *host_hash;
    int64_t *pid;
    int64_t *tid;
    int32_t *dev;
    int64_t *op_off;
    int32_t *op_len;
    uint64_t *op_hash;
    uint64_t *op_count;
    uint64_t *sendbuff;  /* pointers: "(nil)" is 0 */
    uint64_t *recvbuff;
    int64_t *count;
    int32_t *datatype;
    int32_t *red_op;
    int64_t *root;
    uint64_t *comm;
    int32_t *nranks;     /* "[nranks=N]" (a line without it is not read here) */
    uint64_t *stream;
} coll_cols;

int64_t logscan_coll(const uint8_t *buf, int64_t len, int64_t from, coll_cols *out, int64_t cap,
                     int64_t *other, int64_t other_cap, int64_t *n_other, int64_t *next);
int64_t logscan_hits(const uint8_t *buf, int64_t len, int64_t from, const uint8_t *needle, int64_t nlen,
                     int64_t *out, int64_t cap, int64_t *next);
int64_t logscan_spans(const uint8_t *buf, int64_t len, const int64_t *pos, int64_t n, int64_t *start,
                      int64_t *end, int64_t *line);
void logscan_count(const uint8_t *buf, int64_t len, int64_t *lines, int64_t *nonblank);
#define PRESENCE_MAX 1024                       /* needles per logscan_presence call */
int logscan_presence(const uint8_t *buf, int64_t len, const uint8_t *needles, const int64_t *off,
                     const int32_t *nlen, int32_t n, int64_t *first);

/* Channel lines of NCCL's init (connections and ring order), one entry per line read; the
 * prefix columns as in coll_cols. */
typedef struct {
    int64_t *start, *pre;
    uint64_t *pre_hash;    /* of the bytes from the line's start to pre (the launcher's tags) */
    int32_t *ts_len;
    int64_t *host_off;
    int32_t *host_len;
    uint64_t *host_hash;
    int64_t *pid, *tid;
    int32_t *dev;
    int64_t *msg_off;      /* the message after "NCCL INFO ", trailing blanks dropped */
    int32_t *msg_len;
    uint64_t *msg_hash;
    int32_t *kind;         /* 1: a connection, 2: ring order, 3: another message (any_message), 4: Trees */
    int64_t *channel, *sub;   /* "Channel CC/SS": SS the connection index or nChannels, -1 when absent */
    int64_t *src_rank, *dst_rank;
    int64_t *src_dev_off; int32_t *src_dev_len; uint64_t *src_dev_hash;
    int64_t *dst_dev_off; int32_t *dst_dev_len; uint64_t *dst_dev_hash;
    int32_t *direction;    /* 0: none, 1: send, 2: receive */
    int64_t *via_off; int32_t *via_len; uint64_t *via_hash;
    int64_t *order_off; int32_t *order_len; uint64_t *order_hash;
    /* the items of "Trees [c] d->r->u ..." lines (kind 4), item_cap at most in all */
    int64_t item_cap;
    int64_t *item_row;     /* the row (line) of the item */
    int64_t *item_channel, *item_rank, *item_up;
    int64_t *item_down_off; int32_t *item_down_len; uint64_t *item_down_hash;
    int64_t n_items;       /* out */
} topo_cols;

int64_t logscan_topo(const uint8_t *buf, int64_t len, const int64_t *hits, int64_t n, int32_t any_message,
                     topo_cols *o, int64_t *rest, int64_t *n_rest);
#endif
