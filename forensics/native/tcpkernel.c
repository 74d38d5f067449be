/*
 * Per-flow TCP sequence analysis with the semantics of Wireshark 4.0.17's
 * tcp_analyze_sequence_number() (see ../shared/reference/TCP_ANALYSIS.md).
 *
 * This is the path-dependent part of the engine: the unacked-segment list,
 * "ACKed unseen", the duplicate-ACK counter and the conversation table with
 * SYN port reuse. It runs once over columns that numpy has already decoded,
 * in file order, and keeps its state between calls so a capture can be fed
 * chunk by chunk with bounded memory. Quirks of the oracle are deliberate and
 * marked "quirk".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "tcpkernel.h"

#define MAX_UNACKED 10000
#define FASTRT_WINDOW_NS 20000000ull /* 20 ms */
#define OOO_DEFAULT_NS 3000000ull    /* 3 ms */
#define WS_UNKNOWN (-1)
#define WS_NONE (-2)

/* tcpk_in.status, as decoded by forensics/pcap/decode.py (STATUS_*) */
#define ST_HIDDEN 1
#define ST_NO_ANALYSIS 2
#define ST_BOGUS_HLEN 3

/* 32-bit serial-number comparisons (packet-tcp.h GT_SEQ and friends). */
#define GT_SEQ(a, b) ((int32_t)((b) - (a)) < 0)
#define GE_SEQ(a, b) ((int32_t)((b) - (a)) <= 0)
#define LT_SEQ(a, b) ((int32_t)((a) - (b)) < 0)
#define LE_SEQ(a, b) ((int32_t)((a) - (b)) <= 0)

typedef struct {
    uint32_t frame, seq, nextseq;
    int64_t ts;
} unacked;

typedef struct {
    uint32_t base_seq;
    int base_set;
    int win_scale;
    uint32_t window;
    int is_first_ack;
    uint32_t nextseq, nextseqframe;
    int64_t nextseqtime;
    uint32_t maxseqtobeacked;
    uint32_t lastack;
    int64_t lastacktime;
    uint32_t lastnondupack;
    uint32_t dupacknum; /* quirk: u32, set to 0xFFFFFFFF after ACKed-unseen */
    uint32_t lastsegmentflags;
    unacked *segs; /* oldest first */
    int32_t nseg, capseg;
    /* A rescan with the ACK value of the previous scan and no segment added
     * since changes nothing (every survivor ends after that ACK and starts at
     * or after it), so it is skipped: dup-ACK storms stay O(1). */
    int scan_clean;
    uint32_t scan_ack;
    /* history bookkeeping */
    uint32_t hist_seen;
    uint32_t hist_next_t, hist_next_w, hist_next_g;
} flow_state;

typedef struct {
    int64_t ts_mru_syn, ts_first_rtt;
    flow_state f[2]; /* f[0] = flow1, f[1] = flow2 */
    tcpk_conv sum;
    int hist_len;
} conv_state;

struct tcpk_state {
    conv_state *conv;
    int64_t nconv, capconv;
    /* endpoint pairs: key id -> words and current conversation */
    uint32_t *keys;    /* nkeys x KEY_WORDS */
    int64_t *key_conv; /* key id -> current conversation index */
    int64_t nkeys, capkeys, last_key;
    /* open-addressing hash table of key ids (-1 = empty) */
    int64_t *slots;
    uint64_t nslots; /* power of two */
    char error[128];
};

tcpk_state *tcpk_new(void) {
    tcpk_state *st = calloc(1, sizeof(tcpk_state));
    if (st) st->last_key = -1;
    return st;
}

void tcpk_free(tcpk_state *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->nconv; i++) {
        free(st->conv[i].f[0].segs);
        free(st->conv[i].f[1].segs);
    }
    free(st->conv);
    free(st->keys);
    free(st->key_conv);
    free(st->slots);
    free(st);
}

const char *tcpk_error(const tcpk_state *st) { return st->error; }
int64_t tcpk_nconv(const tcpk_state *st) { return st->nconv; }

static void flow_init(flow_state *f) {
    memset(f, 0, sizeof *f);
    f->win_scale = WS_UNKNOWN;
    f->window = 0xFFFFFFFFu;
    f->hist_next_t = f->hist_next_w = f->hist_next_g = 1;
}

static int64_t new_conv(tcpk_state *st, uint32_t key, uint32_t frame, int64_t ts) {
    if (st->nconv == st->capconv) {
        int64_t cap = st->capconv ? st->capconv * 2 : 1024;
        conv_state *c = realloc(st->conv, (size_t)cap * sizeof *c);
        if (!c) return -1;
        st->conv = c;
        st->capconv = cap;
    }
    conv_state *c = &st->conv[st->nconv];
    memset(c, 0, sizeof *c);
    flow_init(&c->f[0]);
    flow_init(&c->f[1]);
    c->sum.key = key;
    c->sum.first_frame = frame;
    c->sum.first_ts = ts;
    c->sum.rtt_min[0] = c->sum.rtt_min[1] = -1;
    return st->nconv++;
}

static inline uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 33);
}

/* Equal keys hash equal; lookups compare the words exactly, so a weak fold is fine. */
static uint64_t key_hash(const uint32_t *w) {
    uint64_t a = ((uint64_t)w[1] << 32 | w[6]) ^ ((uint64_t)w[5] << 48 | (uint64_t)w[10] << 32 | w[0]);
    uint64_t b = ((uint64_t)(w[2] ^ w[7]) << 32 | (w[3] ^ w[8])) ^ ((uint64_t)w[4] << 32 | w[9]);
    return mix64(a ^ mix64(b));
}

static int rehash(tcpk_state *st, uint64_t nslots) {
    int64_t *slots = malloc(nslots * sizeof *slots);
    if (!slots) return -1;
    for (uint64_t i = 0; i < nslots; i++) slots[i] = -1;
    for (int64_t id = 0; id < st->nkeys; id++) {
        uint64_t j = key_hash(&st->keys[id * KEY_WORDS]) & (nslots - 1);
        while (slots[j] >= 0) j = (j + 1) & (nslots - 1);
        slots[j] = id;
    }
    free(st->slots);
    st->slots = slots;
    st->nslots = nslots;
    return 0;
}

/* Find or create the id of an endpoint pair (exact compare, never merged by hash). */
static int64_t key_lookup(tcpk_state *st, const uint32_t *w) {
    /* packets come in bursts of one flow: try the previous key first */
    if (st->last_key >= 0 && !memcmp(&st->keys[st->last_key * KEY_WORDS], w, KEY_WORDS * sizeof *w))
        return st->last_key;
    if ((uint64_t)(st->nkeys + 1) * 2 > st->nslots && rehash(st, st->nslots ? st->nslots * 2 : 4096) < 0)
        return -1;
    uint64_t j = key_hash(w) & (st->nslots - 1);
    for (;;) {
        int64_t id = st->slots[j];
        if (id < 0) break;
        if (!memcmp(&st->keys[id * KEY_WORDS], w, KEY_WORDS * sizeof *w)) return st->last_key = id;
        j = (j + 1) & (st->nslots - 1);
    }
    if (st->nkeys == st->capkeys) {
        int64_t cap = st->capkeys ? st->capkeys * 2 : 1024;
        uint32_t *k = realloc(st->keys, (size_t)cap * KEY_WORDS * sizeof *k);
        if (!k) return -1;
        st->keys = k;
        int64_t *kc = realloc(st->key_conv, (size_t)cap * sizeof *kc);
        if (!kc) return -1;
        st->key_conv = kc;
        st->capkeys = cap;
    }
    int64_t id = st->nkeys++;
    memcpy(&st->keys[id * KEY_WORDS], w, KEY_WORDS * sizeof *w);
    st->key_conv[id] = -1;
    st->slots[j] = id;
    return st->last_key = id;
}

/* Wireshark's flow choice: compare addresses (bytes), then ports; >0 means flow1. */
static int endpoint_cmp(const uint32_t *sa, const uint32_t *da, uint16_t sp, uint16_t dp) {
    for (int k = 0; k < 4; k++)
        if (sa[k] != da[k]) return sa[k] > da[k] ? 1 : -1;
    return sp > dp ? 1 : -1;
}

int64_t tcpk_nkeys(const tcpk_state *st) { return st->nkeys; }

int64_t tcpk_keys(const tcpk_state *st, int64_t from, uint32_t *out, int64_t max) {
    int64_t n = 0;
    for (int64_t id = from; id < st->nkeys && n < max; id++, n++)
        memcpy(&out[n * KEY_WORDS], &st->keys[id * KEY_WORDS], KEY_WORDS * sizeof *out);
    return n;
}

static int push_unacked(flow_state *f, uint32_t frame, uint32_t seq, uint32_t nextseq, int64_t ts) {
    if (f->nseg == f->capseg) {
        int32_t cap = f->capseg ? f->capseg * 2 : 16;
        if (cap > MAX_UNACKED) cap = MAX_UNACKED;
        unacked *s = realloc(f->segs, (size_t)cap * sizeof *s);
        if (!s) return -1;
        f->segs = s;
        f->capseg = cap;
    }
    f->segs[f->nseg++] = (unacked){frame, seq, nextseq, ts};
    f->scan_clean = 0;
    return 0;
}

/* Zeek-style history: a letter once per direction, T/W/G again at 10, 100, ... */
static void history_add(conv_state *c, int flow, char letter, uint32_t *next) {
    flow_state *f = &c->f[flow];
    char ch = (flow == c->sum.orig_flow) ? letter : (char)(letter + ('a' - 'A'));
    if (next) {
        if (++(*next) == 0) return;
        uint32_t count = *next - 1; /* occurrences so far, including this one */
        if (count != 1 && count != 10 && count != 100 && count != 1000 && count != 10000 &&
            count != 100000 && count != 1000000)
            return;
    } else {
        uint32_t bit = 1u << (letter - 'A');
        if (f->hist_seen & bit) return;
        f->hist_seen |= bit;
    }
    if (c->hist_len < HISTORY_LEN - 1) {
        c->sum.history[c->hist_len++] = ch;
        c->sum.history[c->hist_len] = 0;
    }
}

static void account(conv_state *c, int fi, uint32_t flags, uint32_t seglen, uint32_t v,
                    int64_t ts, int64_t ack_rtt) {
    tcpk_conv *s = &c->sum;
    flow_state *f = &c->f[fi];
    s->packets[fi]++;
    s->bytes[fi] += seglen;
    s->last_ts = ts;
    if (v & V_RETRANSMISSION) s->retrans[fi]++;
    if (v & V_FAST_RETRANSMISSION) s->fast[fi]++;
    if (v & V_SPURIOUS_RETRANSMISSION) s->spurious[fi]++;
    if (v & V_OUT_OF_ORDER) s->ooo[fi]++;
    if (v & V_LOST_SEGMENT) s->lost[fi]++;
    if (v & V_DUPLICATE_ACK) s->dupack[fi]++;
    if (v & V_ZERO_WINDOW) s->zero_window[fi]++;
    if (v & V_KEEP_ALIVE) s->keep_alive[fi]++;
    if (flags & TH_RST) s->rst[fi]++;
    if (flags & TH_SYN) s->syn[fi]++;
    if (flags & TH_FIN) s->fin[fi]++;
    if (ack_rtt > 0) {
        s->rtt_sum[fi] += ack_rtt;
        s->rtt_n[fi]++;
        if (s->rtt_min[fi] < 0 || ack_rtt < s->rtt_min[fi]) s->rtt_min[fi] = ack_rtt;
    }
    if ((flags & (TH_SYN | TH_ACK)) == TH_SYN) history_add(c, fi, 'S', NULL);
    else if ((flags & (TH_SYN | TH_ACK)) == (TH_SYN | TH_ACK)) history_add(c, fi, 'H', NULL);
    else if (seglen == 0 && (flags & TH_ACK) && !(flags & (TH_FIN | TH_RST))) history_add(c, fi, 'A', NULL);
    if (seglen > 0) history_add(c, fi, 'D', NULL);
    if (flags & TH_FIN) history_add(c, fi, 'F', NULL);
    if (flags & TH_RST) history_add(c, fi, 'R', NULL);
    if (v & V_RETRANSMISSION) history_add(c, fi, 'T', &f->hist_next_t);
    if (v & V_ZERO_WINDOW) history_add(c, fi, 'W', &f->hist_next_w);
    if (v & V_LOST_SEGMENT) history_add(c, fi, 'G', &f->hist_next_g);
}

int64_t tcpk_run(tcpk_state *st, const tcpk_in *in, tcpk_out *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const uint32_t frame = in->frame[i];
        const int64_t now = in->ts[i];
        const uint32_t seq = in->seq[i], ack = in->ack[i], seglen = in->seglen[i];
        const uint32_t window = in->win[i];
        const uint32_t fl = in->flags[i];
        const int syn = (fl & TH_SYN) != 0, fin = (fl & TH_FIN) != 0, rst = (fl & TH_RST) != 0;
        const int synfinrst = (fl & (TH_SYN | TH_FIN | TH_RST)) != 0;
        uint32_t v = 0;

        out->dupack_num[i] = 0;
        out->dupack_frame[i] = 0;
        out->acks_frame[i] = 0;
        out->ack_rtt[i] = 0;
        out->rto[i] = 0;

        /* --- conversation lookup and SYN port reuse (dissect_tcp) --- */
        uint32_t sbuf[4] = {0, 0, 0, 0}, dbuf[4] = {0, 0, 0, 0};
        const uint32_t *sa = sbuf, *da = dbuf;
        if (in->addr_words == 4) {
            sa = &in->src[i * 4];
            da = &in->dst[i * 4];
        } else {
            sbuf[0] = in->src[i];
            dbuf[0] = in->dst[i];
        }
        const uint16_t sp = in->sport[i], dp = in->dport[i];
        const int flow1 = endpoint_cmp(sa, da, sp, dp) > 0;
        const int fi = flow1 ? 0 : 1;
        uint32_t kw[KEY_WORDS];
        kw[0] = in->ipver[i];
        memcpy(&kw[1], flow1 ? sa : da, 16);
        kw[5] = flow1 ? sp : dp;
        memcpy(&kw[6], flow1 ? da : sa, 16);
        kw[10] = flow1 ? dp : sp;
        const int64_t key = key_lookup(st, kw);
        if (key < 0) goto oom;
        out->key[i] = (uint32_t)key;
        out->dir[i] = (uint8_t)flow1;
        int64_t ci = st->key_conv[key];
        if (ci < 0) {
            ci = new_conv(st, (uint32_t)key, frame, now);
            if (ci < 0) goto oom;
            st->key_conv[key] = ci;
            st->conv[ci].sum.orig_flow = (uint8_t)(((fl & (TH_SYN | TH_ACK)) == (TH_SYN | TH_ACK)) ? 1 - fi : fi);
        }
        conv_state *c = &st->conv[ci];
        flow_state *fwd = &c->f[fi], *rev = &c->f[1 - fi];
        if ((fl & (TH_SYN | TH_ACK)) == TH_SYN && fwd->base_set) {
            if (seq != fwd->base_seq) {
                ci = new_conv(st, (uint32_t)key, frame, now);
                if (ci < 0) goto oom;
                st->key_conv[key] = ci;
                c = &st->conv[ci];
                c->sum.orig_flow = (uint8_t)fi;
                fwd = &c->f[fi];
                rev = &c->f[1 - fi];
                v |= V_REUSED_PORTS;
            } else {
                fwd->nextseq = fwd->maxseqtobeacked; /* same-ISN SYN: a retransmission */
            }
        }
        if ((fl & (TH_SYN | TH_ACK)) == (TH_SYN | TH_ACK) && fwd->base_set && seq != fwd->base_seq) {
            fwd->base_seq = seq;
            v |= V_REUSED_PORTS;
        }
        if (!fwd->base_set) {
            fwd->base_seq = syn ? seq : seq - 1;
            fwd->base_set = 1;
        }
        if (!rev->base_set && (fl & TH_ACK)) {
            rev->base_seq = ack - 1;
            rev->base_set = 1;
        }
        out->stream[i] = (uint32_t)ci;
        out->seq_rel[i] = seq - fwd->base_seq;
        out->ack_rel[i] = (fl & TH_ACK) ? ack - rev->base_seq : ack; /* tshark shows the raw value without ACK */

        if (in->status[i] == ST_NO_ANALYSIS) { /* short segment: no analysis, absolute numbers shown */
            v |= V_NOT_ANALYZED;
            out->seq_rel[i] = seq;
            out->ack_rel[i] = ack;
            goto after_analysis;
        }

        /* --- tcp_analyze_sequence_number(), in Wireshark's order --- */
        /* 1. zero window probe */
        if (seglen == 1 && seq == fwd->nextseq && rev->window == 0) {
            v |= V_ZERO_WINDOW_PROBE;
            goto finished_fwd;
        }
        /* 2. zero window */
        if (window == 0 && !synfinrst) v |= V_ZERO_WINDOW;
        /* 3. previous segment not captured */
        if (fwd->nextseq && GT_SEQ(seq, fwd->nextseq) && !rst) v |= V_LOST_SEGMENT;
        /* 4. keep-alive */
        if (seglen <= 1 && seq == fwd->nextseq - 1u && !synfinrst) v |= V_KEEP_ALIVE;
        /* 5. window update */
        if (seglen == 0 && window && window != fwd->window && seq == fwd->nextseq &&
            ack == fwd->lastack && !synfinrst)
            v |= V_WINDOW_UPDATE;
        /* 6. window full */
        if (seglen > 0 && rev->win_scale != WS_UNKNOWN && !synfinrst) {
            int shift = rev->is_first_ack ? 0 : (rev->win_scale == WS_NONE ? 0 : rev->win_scale);
            if (seq + seglen == rev->lastack + (uint32_t)(rev->window << shift)) v |= V_WINDOW_FULL;
        }
        {
            const int common = seglen == 0 && seq == fwd->nextseq && ack == fwd->lastack && !synfinrst;
            /* 7. keep-alive ACK */
            if (common && window && window == fwd->window && (rev->lastsegmentflags & V_KEEP_ALIVE)) {
                v |= V_KEEP_ALIVE_ACK;
                goto finished_fwd;
            }
            /* 8. zero-window-probe ACK */
            if (common && window == 0 && fwd->window == 0 && (rev->lastsegmentflags & V_ZERO_WINDOW_PROBE)) {
                v |= V_ZERO_WINDOW_PROBE_ACK;
                goto finished_fwd;
            }
            /* 9. duplicate ACK (ACK flag not required, SACK ignored) */
            if (common && window && window == fwd->window) {
                fwd->dupacknum = fwd->dupacknum == 0xFFFFFFFFu ? 1 : fwd->dupacknum + 1;
                v |= V_DUPLICATE_ACK;
                out->dupack_num[i] = fwd->dupacknum;
                out->dupack_frame[i] = fwd->lastnondupack;
            }
        }
    finished_fwd:
        if (ack != fwd->lastack) {
            fwd->lastnondupack = frame;
            fwd->dupacknum = 0;
        }
        /* 10. ACKed unseen segment */
        if (rev->maxseqtobeacked && GT_SEQ(ack, rev->maxseqtobeacked) && (fl & TH_ACK)) {
            if (LT_SEQ(rev->maxseqtobeacked, rev->nextseq)) {
                rev->maxseqtobeacked = rev->nextseq;
                v |= V_ACK_LOST_SEGMENT;
            } else {
                if (rev->dupacknum == 0) v |= V_ACK_LOST_SEGMENT;
                rev->dupacknum = 0xFFFFFFFFu; /* quirk: "-1" in a guint32 */
            }
        }
        /* 11. retransmission family */
        if (seglen > 0 || syn || fin) {
            int seq_not_advanced = fwd->nextseq && LT_SEQ(seq, fwd->nextseq);
            if (v & V_KEEP_ALIVE) goto done;
            if (seglen > 1 && fwd->nextseq - 1u == seq) seq_not_advanced = 0;
            if (seglen > 0 && rev->lastack && LE_SEQ(seq + seglen, rev->lastack)) {
                v |= V_SPURIOUS_RETRANSMISSION | V_RETRANSMISSION;
                goto done;
            }
            uint64_t t = (uint64_t)(now - rev->lastacktime); /* quirk: unsigned delta */
            if (seq_not_advanced && rev->dupacknum >= 2 && rev->lastack == seq && t < FASTRT_WINDOW_NS) {
                v |= V_FAST_RETRANSMISSION | V_RETRANSMISSION;
                goto done;
            }
            t = (uint64_t)(now - fwd->nextseqtime);
            uint64_t thres = c->ts_first_rtt == 0 ? OOO_DEFAULT_NS : (uint64_t)c->ts_first_rtt;
            if (seq_not_advanced && t < thres && fwd->nextseq != seq + seglen + (uint32_t)(syn || fin)) {
                v |= V_OUT_OF_ORDER;
                goto done;
            }
            if (seq_not_advanced) {
                v |= V_RETRANSMISSION;
                out->rto[i] = fwd->nextseqtime ? now - fwd->nextseqtime : 0;
                if (fwd->nseg) out->rto[i] = now - fwd->segs[0].ts; /* oldest unacked wins */
            }
        }
    done: {
        uint32_t nextseq = seq + seglen;
        if ((seglen || syn || fin) && fwd->nseg < MAX_UNACKED) {
            if (syn || fin) nextseq += 1; /* quirk: only inside this branch */
            if (push_unacked(fwd, frame, seq, nextseq, now) < 0) goto oom;
        }
        if ((GT_SEQ(nextseq, fwd->nextseq) || fwd->nextseq == 0) && !(v & V_ZERO_WINDOW_PROBE)) {
            fwd->nextseq = nextseq;
            fwd->nextseqframe = frame;
            fwd->nextseqtime = now;
        }
        if ((seq == fwd->maxseqtobeacked || fwd->maxseqtobeacked == 0) && !(v & V_ZERO_WINDOW_PROBE))
            fwd->maxseqtobeacked = fwd->nextseq;
        fwd->window = window;
        fwd->lastack = ack;
        fwd->lastacktime = now;
        fwd->lastsegmentflags = v;
    }
        /* 12. ACK processing: acks_frame / ack_rtt on the reverse flow's unacked list */
        if (rev->nseg && !(rev->scan_clean && rev->scan_ack == ack)) {
            int32_t w = 0;
            int found = 0;
            for (int32_t k = 0; k < rev->nseg; k++) {
                unacked u = rev->segs[k];
                if (ack == u.nextseq) {
                    if (!found) { /* oldest match wins */
                        found = 1;
                        out->acks_frame[i] = u.frame;
                        out->ack_rtt[i] = now - u.ts;
                    }
                    continue;
                }
                if (GT_SEQ(ack, u.seq) && LE_SEQ(ack, u.nextseq)) u.seq = ack; /* partial ACK */
                else if (!GT_SEQ(u.nextseq, ack)) continue;                  /* fully acked */
                rev->segs[w++] = u;
            }
            rev->nseg = w;
            rev->scan_clean = 1;
            rev->scan_ack = ack;
        }

    after_analysis:
        /* --- after the analysis (dissect_tcp): iRTT, first ACK, window scale --- */
        if (syn) {
            if (!(fl & TH_ACK)) c->ts_mru_syn = now;
            fwd->is_first_ack = 1;
        }
        if ((fl & (TH_SYN | TH_ACK)) == TH_ACK) {
            if (c->ts_mru_syn != 0 && c->ts_first_rtt == 0) {
                c->ts_first_rtt = now - c->ts_mru_syn;
                c->sum.irtt = c->ts_first_rtt;
            }
            fwd->is_first_ack = 0;
        }
        if (in->status[i] == ST_HIDDEN || in->status[i] == ST_BOGUS_HLEN) {
            /* options cut by the snaplen, or a data offset below 5: the state is
             * updated but nothing is printed, and no window-scale option is read */
            v |= V_HIDDEN;
            if (in->status[i] == ST_BOGUS_HLEN) out->ack_rel[i] = 0; /* tshark prints no ack */
        } else {
            if (in->wscale[i] >= 0) fwd->win_scale = in->wscale[i] > 14 ? 14 : in->wscale[i];
            if (syn) {
                if (fwd->win_scale == WS_UNKNOWN) {
                    fwd->win_scale = WS_NONE;
                    rev->win_scale = WS_NONE;
                } else if ((fl & TH_ACK) && rev->win_scale == WS_NONE) {
                    fwd->win_scale = WS_NONE;
                }
            }
        }
        account(c, fi, fl, seglen, v, now, out->ack_rtt[i]);
        out->verdicts[i] = v;
    }
    return n;
oom:
    snprintf(st->error, sizeof st->error, "out of memory in TCP analysis");
    return -1;
}

int64_t tcpk_convs(const tcpk_state *st, tcpk_conv *out, int64_t max) {
    int64_t n = st->nconv < max ? st->nconv : max;
    for (int64_t i = 0; i < n; i++) out[i] = st->conv[i].sum;
    return n;
}
