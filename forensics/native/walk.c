/*
 * Record walker for pcap and pcapng: the one inherently sequential part of
 * reading a capture (each record's length tells where the next one starts).
 *
 * It turns a chunk of file bytes into columns (data offset, captured length,
 * original length, timestamp in ns, link type) and stops at the last complete
 * record so the caller can continue with the next chunk. Header fields are
 * decoded afterwards by numpy (forensics/pcap/decode.py).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "walk.h"

#define PCAPNG_SHB 0x0A0D0D0Au
#define PCAPNG_IDB 0x00000001u
#define PCAPNG_PB 0x00000002u /* obsolete Packet Block */
#define PCAPNG_SPB 0x00000003u
#define PCAPNG_EPB 0x00000006u
#define BOM 0x1A2B3C4Du
#define MAX_BLOCK (256u * 1024u * 1024u)

struct walk_state {
    int fmt;       /* WALK_PCAP or WALK_PCAPNG */
    int swapped;   /* pcap: whole file; pcapng: current section */
    int ts_ns_per_tick; /* pcap: 1000 (usec) or 1 (nsec) */
    int32_t linktype;   /* pcap */
    uint32_t snaplen;   /* pcap; pcapng: of interface 0 (for SPB) */
    int n_if, cap_if;
    int32_t *if_linktype;
    uint32_t *if_snaplen;
    uint8_t *if_tsresol;
    int64_t *if_tsoffset_ns;
    int64_t records, blocks_skipped, blocks_unknown, sections;
    char error[256];
};

static inline uint32_t bswap32(uint32_t v) { return __builtin_bswap32(v); }
static inline uint16_t bswap16(uint16_t v) { return __builtin_bswap16(v); }

static inline uint32_t rd32(const uint8_t *p, int swapped) {
    uint32_t v;
    memcpy(&v, p, 4);
    return swapped ? bswap32(v) : v;
}
static inline uint16_t rd16(const uint8_t *p, int swapped) {
    uint16_t v;
    memcpy(&v, p, 2);
    return swapped ? bswap16(v) : v;
}

walk_state *walk_new(int fmt, int swapped, int nsec, int32_t linktype, uint32_t snaplen) {
    walk_state *st = calloc(1, sizeof(*st));
    if (!st) return NULL;
    st->fmt = fmt;
    st->swapped = swapped;
    st->ts_ns_per_tick = nsec ? 1 : 1000;
    st->linktype = linktype;
    st->snaplen = snaplen;
    return st;
}

void walk_free(walk_state *st) {
    if (!st) return;
    free(st->if_linktype);
    free(st->if_snaplen);
    free(st->if_tsresol);
    free(st->if_tsoffset_ns);
    free(st);
}

const char *walk_error(const walk_state *st) { return st->error; }

void walk_counters(const walk_state *st, int64_t *out) {
    out[0] = st->records;
    out[1] = st->blocks_skipped;
    out[2] = st->blocks_unknown;
    out[3] = st->sections;
    out[4] = st->n_if;
}

static int add_interface(walk_state *st, int32_t linktype, uint32_t snaplen) {
    if (st->n_if == st->cap_if) {
        int cap = st->cap_if ? st->cap_if * 2 : 8;
        if (cap > 65536) {
            snprintf(st->error, sizeof st->error, "pcapng: more than 65536 interfaces");
            return -1;
        }
        int32_t *lt = realloc(st->if_linktype, cap * sizeof *lt);
        if (lt) st->if_linktype = lt;
        uint32_t *sl = realloc(st->if_snaplen, cap * sizeof *sl);
        if (sl) st->if_snaplen = sl;
        uint8_t *rs = realloc(st->if_tsresol, cap * sizeof *rs);
        if (rs) st->if_tsresol = rs;
        int64_t *of = realloc(st->if_tsoffset_ns, cap * sizeof *of);
        if (of) st->if_tsoffset_ns = of;
        if (!lt || !sl || !rs || !of) {
            snprintf(st->error, sizeof st->error, "out of memory");
            return -1;
        }
        st->cap_if = cap;
    }
    st->if_linktype[st->n_if] = linktype;
    st->if_snaplen[st->n_if] = snaplen;
    st->if_tsresol[st->n_if] = 6; /* default: microseconds */
    st->if_tsoffset_ns[st->n_if] = 0;
    return st->n_if++;
}

/* Convert pcapng ticks to nanoseconds for an if_tsresol byte. */
static int64_t ticks_to_ns(uint64_t ticks, uint8_t resol) {
    unsigned exp = resol & 0x7f;
    if (resol & 0x80) { /* negative power of two */
        if (exp >= 64) return 0;
        unsigned __int128 v = (unsigned __int128)ticks * 1000000000u;
        return (int64_t)(v >> exp);
    }
    if (exp <= 9) {
        static const uint64_t p10[] = {1000000000ull, 100000000ull, 10000000ull, 1000000ull,
                                       100000ull,     10000ull,     1000ull,     100ull,
                                       10ull,         1ull};
        return (int64_t)(ticks * p10[exp]);
    }
    uint64_t d = 1;
    for (unsigned i = 9; i < exp && i < 29; i++) d *= 10;
    return (int64_t)(ticks / d);
}

static void parse_idb_options(walk_state *st, int ifidx, const uint8_t *opt, uint32_t len) {
    uint32_t pos = 0;
    while (pos + 4 <= len) {
        uint16_t code = rd16(opt + pos, st->swapped);
        uint16_t olen = rd16(opt + pos + 2, st->swapped);
        pos += 4;
        if (code == 0) break; /* opt_endofopt */
        if (pos + olen > len) break;
        if (code == 9 && olen >= 1) { /* if_tsresol */
            st->if_tsresol[ifidx] = opt[pos];
        } else if (code == 14 && olen >= 8) { /* if_tsoffset, seconds */
            uint64_t v;
            memcpy(&v, opt + pos, 8);
            if (st->swapped) v = __builtin_bswap64(v);
            st->if_tsoffset_ns[ifidx] = (int64_t)v * 1000000000ll;
        }
        pos += (olen + 3u) & ~3u;
    }
}

static int64_t walk_pcap(walk_state *st, const uint8_t *buf, int64_t len, int64_t base,
                         walk_cols *out, int64_t max_out, int64_t *consumed) {
    int64_t pos = 0, n = 0;
    while (n < max_out && pos + 16 <= len) {
        const uint8_t *h = buf + pos;
        uint32_t sec = rd32(h, st->swapped), frac = rd32(h + 4, st->swapped);
        uint32_t incl = rd32(h + 8, st->swapped), orig = rd32(h + 12, st->swapped);
        if (incl > MAX_BLOCK) {
            if (n) break; /* hand back the good records first; the error comes next call */
            snprintf(st->error, sizeof st->error,
                     "corrupt pcap record at byte %lld: captured length %u is implausible",
                     (long long)(base + pos), incl);
            *consumed = pos;
            return -1;
        }
        if (pos + 16 + (int64_t)incl > len) break; /* incomplete: next chunk */
        out->data_off[n] = base + pos + 16;
        out->caplen[n] = incl;
        out->origlen[n] = orig < incl ? incl : orig;
        out->ts_ns[n] = (int64_t)sec * 1000000000ll + (int64_t)frac * st->ts_ns_per_tick;
        out->linktype[n] = st->linktype;
        n++;
        pos += 16 + incl;
    }
    st->records += n;
    *consumed = pos;
    return n;
}

static int64_t walk_pcapng(walk_state *st, const uint8_t *buf, int64_t len, int64_t base,
                           walk_cols *out, int64_t max_out, int64_t *consumed) {
    int64_t pos = 0, n = 0;
    while (n < max_out && pos + 12 <= len) {
        const uint8_t *b = buf + pos;
        uint32_t type_native;
        memcpy(&type_native, b, 4);
        if (type_native == PCAPNG_SHB) { /* byte-order independent value */
            uint32_t bom;
            memcpy(&bom, b + 8, 4);
            int swapped;
            if (bom == BOM) swapped = 0;
            else if (bom == bswap32(BOM)) swapped = 1;
            else {
                snprintf(st->error, sizeof st->error,
                         "corrupt pcapng section header at byte %lld: bad byte-order magic",
                         (long long)(base + pos));
                *consumed = pos;
                return -1;
            }
            uint32_t blen = rd32(b + 4, swapped);
            if (blen < 28 || (blen & 3) || blen > MAX_BLOCK) goto bad_len;
            if (pos + blen > len) break;
            if (rd32(b + blen - 4, swapped) != blen) goto bad_trailer;
            st->swapped = swapped;
            st->n_if = 0; /* interfaces are per section */
            st->sections++;
            pos += blen;
            continue;
        }
        uint32_t type = rd32(b, st->swapped), blen = rd32(b + 4, st->swapped);
        if (blen < 12 || (blen & 3) || blen > MAX_BLOCK) goto bad_len;
        if (pos + blen > len) break;
        if (rd32(b + blen - 4, st->swapped) != blen) goto bad_trailer;
        if (st->sections == 0) {
            if (n) goto good_so_far;
            snprintf(st->error, sizeof st->error, "corrupt pcapng: block before the section header");
            *consumed = pos;
            return -1;
        }
        const uint8_t *body = b + 8;
        uint32_t body_len = blen - 12;
        if (type == PCAPNG_IDB) {
            if (body_len < 8) goto bad_body;
            int idx = add_interface(st, rd16(body, st->swapped), rd32(body + 4, st->swapped));
            if (idx < 0) {
                if (n) goto good_so_far;
                *consumed = pos;
                return -1;
            }
            parse_idb_options(st, idx, body + 8, body_len - 8);
        } else if (type == PCAPNG_EPB || type == PCAPNG_PB) {
            if (body_len < 20) goto bad_body;
            uint32_t ifid = type == PCAPNG_EPB ? rd32(body, st->swapped) : rd16(body, st->swapped);
            uint64_t ticks = ((uint64_t)rd32(body + 4, st->swapped) << 32) | rd32(body + 8, st->swapped);
            uint32_t incl = rd32(body + 12, st->swapped), orig = rd32(body + 16, st->swapped);
            if ((int64_t)ifid >= st->n_if) {
                if (n) goto good_so_far;
                snprintf(st->error, sizeof st->error,
                         "corrupt pcapng packet block at byte %lld: interface %u not declared",
                         (long long)(base + pos), ifid);
                *consumed = pos;
                return -1;
            }
            if (incl > body_len - 20) goto bad_body;
            out->data_off[n] = base + pos + 28;
            out->caplen[n] = incl;
            out->origlen[n] = orig < incl ? incl : orig;
            out->ts_ns[n] = ticks_to_ns(ticks, st->if_tsresol[ifid]) + st->if_tsoffset_ns[ifid];
            out->linktype[n] = st->if_linktype[ifid];
            n++;
        } else if (type == PCAPNG_SPB) {
            if (body_len < 4 || st->n_if == 0) goto bad_body;
            uint32_t orig = rd32(body, st->swapped);
            uint32_t incl = orig;
            if (st->if_snaplen[0] && incl > st->if_snaplen[0]) incl = st->if_snaplen[0];
            if (incl > body_len - 4) incl = body_len - 4;
            out->data_off[n] = base + pos + 12;
            out->caplen[n] = incl;
            out->origlen[n] = orig < incl ? incl : orig;
            out->ts_ns[n] = 0; /* SPBs carry no timestamp */
            out->linktype[n] = st->if_linktype[0];
            n++;
        } else if (type == 0xBAD || type == 0x40000BAD || type == 9) {
            /* custom and systemd-journal blocks are frames to Wireshark (numbered,
             * not packets): keep the frame numbering identical */
            out->data_off[n] = base + pos + 8;
            out->caplen[n] = 0;
            out->origlen[n] = body_len;
            out->ts_ns[n] = 0;
            out->linktype[n] = WALK_NOT_A_PACKET;
            n++;
        } else if (type == 4 || type == 5 || type == 0xA) {
            st->blocks_skipped++; /* NRB, ISB, DSB: nothing we need */
        } else {
            st->blocks_unknown++;
        }
        pos += blen;
    }
good_so_far:
    st->records += n;
    *consumed = pos;
    return n;

bad_len:
    if (n) goto good_so_far;
    snprintf(st->error, sizeof st->error, "corrupt pcapng block at byte %lld: invalid block length",
             (long long)(base + pos));
    *consumed = pos;
    return -1;
bad_trailer:
    if (n) goto good_so_far;
    snprintf(st->error, sizeof st->error,
             "corrupt pcapng block at byte %lld: trailing length does not match",
             (long long)(base + pos));
    *consumed = pos;
    return -1;
bad_body:
    if (n) goto good_so_far;
    snprintf(st->error, sizeof st->error, "corrupt pcapng block at byte %lld: body too short",
             (long long)(base + pos));
    *consumed = pos;
    return -1;
}

int64_t walk_records(walk_state *st, const uint8_t *buf, int64_t len, int64_t base,
                     walk_cols *out, int64_t max_out, int64_t *consumed) {
    st->error[0] = 0;
    if (st->fmt == WALK_PCAP) return walk_pcap(st, buf, len, base, out, max_out, consumed);
    return walk_pcapng(st, buf, len, base, out, max_out, consumed);
}
