#ifndef STALLSCOPE_TCPKERNEL_H
#define STALLSCOPE_TCPKERNEL_H
#include <stdint.h>

/* Verdict bits as printed by tshark (tcp.analysis.*). Keep in sync with
 * forensics/tcp/verdicts.py, which is the single table Python reads. */
#define V_RETRANSMISSION (1u << 0)
#define V_FAST_RETRANSMISSION (1u << 1)
#define V_SPURIOUS_RETRANSMISSION (1u << 2)
#define V_OUT_OF_ORDER (1u << 3)
#define V_LOST_SEGMENT (1u << 4)
#define V_ACK_LOST_SEGMENT (1u << 5)
#define V_DUPLICATE_ACK (1u << 6)
#define V_ZERO_WINDOW (1u << 7)
#define V_ZERO_WINDOW_PROBE (1u << 8)
#define V_ZERO_WINDOW_PROBE_ACK (1u << 9)
#define V_WINDOW_FULL (1u << 10)
#define V_WINDOW_UPDATE (1u << 11)
#define V_KEEP_ALIVE (1u << 12)
#define V_KEEP_ALIVE_ACK (1u << 13)
#define V_REUSED_PORTS (1u << 14)
#define V_HIDDEN (1u << 15)     /* options cut by snaplen: tshark prints no analysis */
#define V_NOT_ANALYZED (1u << 16) /* no sequence analysis possible (short segment) */

/* TCP header flag bits */
#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_PUSH 0x08
#define TH_ACK 0x10

typedef struct {
    const uint32_t *frame;   /* 1-based frame number */
    const int64_t *ts;       /* ns */
    const uint8_t *ipver;    /* 4 or 6 */
    const uint32_t *src;     /* n x addr_words address words, big-endian word order */
    const uint32_t *dst;
    int64_t addr_words;      /* 4, or 1 when every packet of the batch is IPv4 */
    const uint16_t *sport;
    const uint16_t *dport;
    const uint32_t *seq;
    const uint32_t *ack;
    const uint32_t *seglen;
    const uint16_t *win;     /* raw 16-bit window field */
    const uint16_t *flags;   /* TCP flags */
    const int8_t *wscale;    /* window-scale option shift, -1 when absent */
    const uint8_t *status;   /* 0 ok, 1 options truncated, 2 no sequence analysis */
} tcpk_in;

typedef struct {
    uint32_t *key;      /* endpoint-pair id, dense, in order of first appearance */
    uint8_t *dir;       /* 1: sender is flow1 (its endpoint compares greater) */
    uint32_t *stream;
    uint32_t *verdicts;
    uint32_t *dupack_num;
    uint32_t *dupack_frame;
    uint32_t *acks_frame;
    uint32_t *seq_rel;
    uint32_t *ack_rel;
    int64_t *ack_rtt;
    int64_t *rto;
} tcpk_out;

#define HISTORY_LEN 48

/* Per-conversation summary, flow index 0 = flow1, 1 = flow2. */
typedef struct {
    uint32_t key;
    uint32_t first_frame;
    uint8_t orig_flow;      /* which flow opened the conversation */
    int64_t first_ts, last_ts;
    int64_t irtt;
    uint64_t packets[2], bytes[2];
    uint32_t retrans[2], fast[2], spurious[2], ooo[2], lost[2], dupack[2];
    uint32_t zero_window[2], rst[2], keep_alive[2], syn[2], fin[2];
    int64_t rtt_sum[2], rtt_min[2];
    uint32_t rtt_n[2];
    char history[HISTORY_LEN];
} tcpk_conv;

typedef struct tcpk_state tcpk_state;

tcpk_state *tcpk_new(void);
void tcpk_free(tcpk_state *st);
int64_t tcpk_run(tcpk_state *st, const tcpk_in *in, tcpk_out *out, int64_t n);
int64_t tcpk_nconv(const tcpk_state *st);
#define KEY_WORDS 11 /* ipver, flow1 address[4], flow1 port, flow2 address[4], flow2 port */
int64_t tcpk_nkeys(const tcpk_state *st);
int64_t tcpk_keys(const tcpk_state *st, int64_t from, uint32_t *out, int64_t max);
int64_t tcpk_convs(const tcpk_state *st, tcpk_conv *out, int64_t max);
const char *tcpk_error(const tcpk_state *st);
#endif
