/*
 * Byte-level scanning of text logs: the part of reading a log that touches every byte.
 *
 * A merged job log is mostly lines no parser wants (progress bars, the application's own
 * output); the NCCL_DEBUG COLL lines, one per collective call, are the rest. Python reads
 * neither line by line: memmem finds the lines holding a marker (logscan_hits), their
 * bounds and line numbers come from one pass (logscan_spans), and COLL lines are parsed
 * here into columns (logscan_coll). Only the few remaining lines reach Python's regular
 * expressions (forensics/parsers/text.py).
 *
 * Lines end at "\n", "\r\n" or a lone "\r" (progress bars rewrite their line with "\r"),
 * as forensics.parsers.registry.split_lines counts them.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "logscan.h"

static inline int is_term(uint8_t c) { return c == '\n' || c == '\r'; }
static inline int is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
/* a host name's characters ([A-Za-z0-9._-]): a backtick, quote or word glued before it is no part of it */
static inline int is_host(uint8_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}
static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static inline int is_word(uint8_t c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static inline int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A 64-bit key of the n bytes at p (distinct texts: distinct keys, but for chance), 8 bytes
 * a step: the columns' texts are compared by these keys alone, never decoded per line. */
static uint64_t fnv1a(const uint8_t *p, int64_t n) {
    uint64_t h = 1469598103934665603ULL ^ ((uint64_t)n * 0x9E3779B97F4A7C15ULL);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    for (int64_t k = 0; i + k < n; k++) w |= (uint64_t)p[i + k] << (8 * k);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 32);
}

/* memmem's answer (the first occurrence of the m >= 1 bytes nd in the n at p) by memchr on
 * the first byte and memcmp: for the short stretches a line offers, where memmem's setup costs
 * more than the search (the needles here start with a byte that is rare in a line). */
static inline const uint8_t *find_short(const uint8_t *p, size_t n, const char *nd, size_t m) {
    const uint8_t *e = p + n;
    while ((size_t)(e - p) >= m) {
        const uint8_t *q = memchr(p, (uint8_t)nd[0], (size_t)(e - p) - m + 1);
        if (!q) return NULL;
        if (memcmp(q + 1, nd + 1, m - 1) == 0) return q;
        p = q + 1;
    }
    return NULL;
}

/* a column the caller asked for (NULL: not wanted) */
#define SET(col, i, v) do { if (o->col) o->col[i] = (v); } while (0)

/* Whether one of the 8 bytes of w is b (exact: the "has a zero byte" test of w ^ b...b). */
static inline int has_byte(uint64_t w, uint8_t b) {
    uint64_t v = w ^ (0x0101010101010101ULL * b);
    return ((v - 0x0101010101010101ULL) & ~v & 0x8080808080808080ULL) != 0;
}

static inline int has_term(uint64_t w) { return has_byte(w, '\n') || has_byte(w, '\r'); }

/* The start of the line holding pos, and the end (its terminator, or len) of the line holding
 * pos: 8 bytes a step up to the word holding a terminator, then byte by byte. */
static int64_t line_start(const uint8_t *buf, int64_t pos) {
    for (uint64_t w; pos >= 8; pos -= 8) {
        memcpy(&w, buf + pos - 8, 8);
        if (has_term(w)) break;
    }
    while (pos > 0 && !is_term(buf[pos - 1])) pos--;
    return pos;
}

static int64_t line_end(const uint8_t *buf, int64_t len, int64_t pos) {
    for (uint64_t w; pos + 8 <= len; pos += 8) {
        memcpy(&w, buf + pos, 8);
        if (has_term(w)) break;
    }
    while (pos < len && !is_term(buf[pos])) pos++;
    return pos;
}

/* A cursor over one line's bytes [p, end). Each reader returns 0 on a mismatch. */
typedef struct {
    const uint8_t *buf;
    int64_t p, end;
} cur;

static int lit(cur *c, const char *s) {
    int64_t n = (int64_t)strlen(s);
    if (c->end - c->p < n || memcmp(c->buf + c->p, s, (size_t)n) != 0) return 0;
    c->p += n;
    return 1;
}

/* \d+ into a signed value of at most 18 digits (a longer number goes to Python's path) */
static int dec(cur *c, int64_t *v, int allow_minus) {
    int neg = 0, n = 0;
    int64_t x = 0;
    if (allow_minus && c->p < c->end && c->buf[c->p] == '-') {
        neg = 1;
        c->p++;
    }
    while (c->p < c->end && is_digit(c->buf[c->p])) {
        if (++n > 18) return 0;
        x = x * 10 + (c->buf[c->p++] - '0');
    }
    if (!n) return 0;
    *v = neg ? -x : x;
    return 1;
}

/* [0-9a-fA-F]+ of at most 16 digits */
static int hex(cur *c, uint64_t *v) {
    int n = 0, d;
    uint64_t x = 0;
    while (c->p < c->end && (d = hexval(c->buf[c->p])) >= 0) {
        if (++n > 16) return 0;
        x = (x << 4) | (uint64_t)d;
        c->p++;
    }
    if (!n) return 0;
    *v = x;
    return 1;
}

/* A pointer token as glibc's %p prints it: "(nil)" or "0x" and lower-case hex without
 * leading zeros, followed by a space or the line's end. Anything else (Python's path
 * keeps such a token as printed) is a mismatch. */
static int ptr(cur *c, uint64_t *v) {
    if (lit(c, "(nil)")) {
        *v = 0;
    } else {
        if (!lit(c, "0x")) return 0;
        int64_t s = c->p;
        if (c->p < c->end && c->buf[c->p] == '0') return 0;
        for (int64_t i = s; i < c->end && !is_space(c->buf[i]); i++)
            if (c->buf[i] >= 'A' && c->buf[i] <= 'F') return 0;
        if (!hex(c, v)) return 0;
    }
    return c->p == c->end || is_space(c->buf[c->p]);
}

/* The "host:pid:tid [dev] " before "NCCL INFO " at h, read backwards (the first match of
 * forensics.parsers.nccl_debug.LINE_RE on such a line). */

/* Whether t[0..n) is the time NCCL >= 2.26 prints in brackets, as LINE_RE in
 * parsers/nccl_debug.py reads it: "YYYY-MM-DD" then ' ', 'T' or '_' then anything, or
 * "Mon ..." ending in a digit. Launcher tags ("[3]", "[Rank 3]") are not times. */
static int is_nccl_time(const uint8_t *t, int64_t n) {
    if (n >= 11 && is_digit(t[0]) && is_digit(t[1]) && is_digit(t[2]) && is_digit(t[3]) && t[4] == '-'
        && is_digit(t[5]) && is_digit(t[6]) && t[7] == '-' && is_digit(t[8]) && is_digit(t[9])
        && (t[10] == ' ' || t[10] == 'T' || t[10] == '_'))
        return 1;
    return n >= 5 && t[0] >= 'A' && t[0] <= 'Z' && t[1] >= 'a' && t[1] <= 'z' && t[2] >= 'a' && t[2] <= 'z'
        && t[3] == ' ' && is_digit(t[n - 1]);
}
static int prefix(const uint8_t *buf, int64_t ls, int64_t h, coll_cols *o, int64_t i) {
    int64_t q = h;
    if (q - ls < 2 || buf[q - 1] != ' ' || buf[q - 2] != ']') return 0;
    q -= 2;                                  /* at ']' */
    int64_t de = q;
    while (q > ls && is_digit(buf[q - 1])) q--;
    if (q == de || q - 1 < ls || buf[q - 1] != '[' || de - q > 9) return 0;
    int32_t dev = 0;
    for (int64_t k = q; k < de; k++) dev = dev * 10 + (buf[k] - '0');
    q--;                                     /* at '[' */
    if (q - 1 < ls || buf[q - 1] != ' ') return 0;
    q--;                                     /* at the space after tid */
    int64_t te = q;
    while (q > ls && is_digit(buf[q - 1])) q--;
    if (q == te || te - q > 18 || q - 1 < ls || buf[q - 1] != ':') return 0;
    int64_t tid = 0;
    for (int64_t k = q; k < te; k++) tid = tid * 10 + (buf[k] - '0');
    q--;                                     /* at ':' */
    int64_t pe = q;
    while (q > ls && is_digit(buf[q - 1])) q--;
    if (q == pe || pe - q > 18 || q - 1 < ls || buf[q - 1] != ':') return 0;
    int64_t pid = 0;
    for (int64_t k = q; k < pe; k++) pid = pid * 10 + (buf[k] - '0');
    q--;                                     /* at ':' */
    int64_t he = q;
    while (q > ls && is_host(buf[q - 1])) q--;
    int64_t hs = q;
    /* an NCCL >= 2.26 time "[%F %T] " just before the host */
    int64_t pre = hs;
    int32_t tslen = 0;
    int64_t r = hs;
    if (r - 1 >= ls && buf[r - 1] == ' ') r--;
    if (r - 1 >= ls && buf[r - 1] == ']') {
        int64_t b = r - 1;
        int64_t lim = b - 80 < ls ? ls : b - 80;
        while (b > lim && buf[b] != '[') b--;
        if (buf[b] == '[' && is_nccl_time(buf + b + 1, r - 1 - (b + 1))) {
            pre = b;
            tslen = (int32_t)(r - b);
        }
    }
    SET(pre, i, pre);
    SET(ts_len, i, tslen);
    SET(host_off, i, hs);
    SET(host_len, i, (int32_t)(he - hs));
    SET(host_hash, i, fnv1a(buf + hs, he - hs));
    SET(pid, i, pid);
    SET(tid, i, tid);
    SET(dev, i, dev);
    return 1;
}

/* "<Op>: opCount <hex> sendbuff <p> recvbuff <p> count <n> datatype <n> op <n> root <n>
 *  comm <p> [nranks=<n>] stream <p>" after "NCCL INFO ", then only blanks to the line end. */
static int fields(const uint8_t *buf, int64_t s, int64_t e, coll_cols *o, int64_t i) {
    cur c = {buf, s, e};
    int64_t v;
    uint64_t u;
    int64_t os = c.p;
    while (c.p < c.end && is_word(buf[c.p])) c.p++;
    if (c.p == os) return 0;
    SET(op_off, i, os);
    SET(op_len, i, (int32_t)(c.p - os));
    SET(op_hash, i, fnv1a(buf + os, c.p - os));
    if (!lit(&c, ": opCount ") || !hex(&c, &u)) return 0;
    SET(op_count, i, u);
    if (!lit(&c, " sendbuff ") || !ptr(&c, &u)) return 0;
    SET(sendbuff, i, u);
    if (!lit(&c, " recvbuff ") || !ptr(&c, &u)) return 0;
    SET(recvbuff, i, u);
    if (!lit(&c, " count ") || !dec(&c, &v, 0)) return 0;
    SET(count, i, v);
    if (!lit(&c, " datatype ") || !dec(&c, &v, 0) || v > 0x7fffffff) return 0;
    SET(datatype, i, (int32_t)v);
    if (!lit(&c, " op ") || !dec(&c, &v, 0) || v > 0x7fffffff) return 0;
    SET(red_op, i, (int32_t)v);
    if (!lit(&c, " root ") || !dec(&c, &v, 1)) return 0;
    SET(root, i, v);
    if (!lit(&c, " comm ") || !ptr(&c, &u)) return 0;
    SET(comm, i, u);
    if (!lit(&c, " [nranks=") || !dec(&c, &v, 0) || v > 0x7fffffff || !lit(&c, "]")) return 0;
    SET(nranks, i, (int32_t)v);
    if (!lit(&c, " stream ") || !ptr(&c, &u)) return 0;
    SET(stream, i, u);
    while (c.p < c.end && is_space(buf[c.p])) c.p++;
    return c.p == c.end;
}

int64_t logscan_coll(const uint8_t *buf, int64_t len, int64_t from, coll_cols *out, int64_t cap,
                     int64_t *other, int64_t other_cap, int64_t *n_other, int64_t *next) {
    static const char needle[] = "NCCL INFO ";
    const int64_t nl = (int64_t)sizeof(needle) - 1;
    int64_t n = 0, p = from;
    *n_other = 0;
    while (n < cap && *n_other < other_cap && p < len) {
        const uint8_t *hit = find_short(buf + p, (size_t)(len - p), needle, (size_t)nl);
        if (!hit) {
            p = len;
            break;
        }
        int64_t h = hit - buf;
        int64_t ls = line_start(buf, h);
        int64_t le = line_end(buf, len, h + nl);
        if (prefix(buf, ls, h, out, n) && fields(buf, h + nl, le, out, n)) {
            coll_cols *o = out;
            SET(start, n, ls);
            n++;
        } else {
            other[(*n_other)++] = h;     /* any other INFO line: Python's regular expressions */
        }
        p = le;
    }
    *next = p;
    return n;
}

int64_t logscan_hits(const uint8_t *buf, int64_t len, int64_t from, const uint8_t *needle, int64_t nlen,
                     int64_t *out, int64_t cap, int64_t *next) {
    int64_t n = 0, p = from;
    if (nlen <= 0) {
        *next = len;
        return 0;
    }
    while (n < cap && p < len) {
        const uint8_t *hit = memmem(buf + p, (size_t)(len - p), needle, (size_t)nlen);
        if (!hit) {
            p = len;
            break;
        }
        int64_t h = hit - buf;
        int64_t le = line_end(buf, len, h + nlen);
        out[n++] = h;
        p = le;   /* one hit per line */
    }
    *next = p;
    return n;
}

/* Line terminators in [a, b): "\n", "\r\n" (one) and a lone "\r". */
static int64_t count_lines(const uint8_t *buf, int64_t len, int64_t a, int64_t b) {
    int64_t n = 0;
    const uint8_t *p = buf + a, *e = buf + b;
    while (p < e && (p = memchr(p, '\n', (size_t)(e - p))) != NULL) {
        n++;
        p++;
    }
    p = buf + a;
    while (p < e && (p = memchr(p, '\r', (size_t)(e - p))) != NULL) {
        int64_t k = p - buf;
        if (k + 1 >= len || buf[k + 1] != '\n') n++;
        p++;
    }
    return n;
}

int64_t logscan_spans(const uint8_t *buf, int64_t len, const int64_t *pos, int64_t n, int64_t *start,
                      int64_t *end, int64_t *line) {
    int64_t cursor = 0, lines = 1, prev_end = -1;     /* the end of the line at cursor, once known */
    for (int64_t i = 0; i < n; i++) {
        int64_t q = pos[i];
        if (q < cursor || q > len) return -1;   /* positions must be sorted and inside */
        int64_t ls = line_start(buf, q);
        if (ls > cursor) {
            /* the line right after the one at cursor, past a "\n": one terminator between */
            if (prev_end >= 0 && ls == prev_end + 1 && buf[prev_end] == '\n') lines++;
            else lines += count_lines(buf, len, cursor, ls);
            cursor = ls;
        } else if (ls < cursor) {
            return -1;
        }
        start[i] = ls;
        end[i] = line_end(buf, len, q);
        line[i] = lines;
        prev_end = end[i];
    }
    return n;
}

/* Lines in the buffer (the last one counts without its terminator) and how many of them hold
 * something other than blanks. */
void logscan_count(const uint8_t *buf, int64_t len, int64_t *lines, int64_t *nonblank) {
    int64_t n = 0, full = 0;
    int any = 0;
    for (int64_t i = 0; i < len; i++) {
        uint8_t c = buf[i];
        if (c == '\n' || c == '\r') {
            if (c == '\r' && i + 1 < len && buf[i + 1] == '\n') i++;
            n++;
            full += any;
            any = 0;
        } else if (!any && !is_space(c)) {
            any = 1;
        }
        if (any) {                              /* the rest of a non-blank line: 8 bytes a step */
            while (i + 9 <= len) {
                uint64_t w;
                memcpy(&w, buf + i + 1, 8);
                if (has_byte(w, '\n') || has_byte(w, '\r')) break;
                i += 8;
            }
        }
    }
    if (len > 0 && !is_term(buf[len - 1])) {
        n++;
        full += any;
    }
    *lines = n;
    *nonblank = full;
}

/* A needle's first four bytes as a key of 16 bits (the bit logscan_presence tests first). */
static inline uint32_t quad_key(uint32_t q) { return (q * 0x9E3779B1u) >> 16; }

/* Whether the four bytes at byte b of w (little-endian) have their key's bit set in quads. */
static inline int quad_hit(const uint64_t *quads, uint64_t w, int b) {
    uint32_t k = quad_key((uint32_t)(w >> (8 * b)));
    return (int)((quads[k >> 6] >> (k & 63)) & 1);
}

/* The first offset of each of up to PRESENCE_MAX needles (of 2 bytes or more) in one pass. A
 * bit per key of four bytes (quad_key, 8 KiB: the cache's nearest level) rejects almost every
 * position where each needle has four bytes or more, four positions at a time from one 8-byte
 * load; otherwise a table of the needles' first two bytes (uses) does. At a position not
 * rejected, a table of the needles by their first two bytes (a bit per needle, W words a key)
 * and a needle's first 8 bytes sift the candidates before memcmp. first[i] = -1 where needle
 * i does not occur. Returns 0, or -1 on bad arguments. */
int logscan_presence(const uint8_t *buf, int64_t len, const uint8_t *needles, const int64_t *off,
                     const int32_t *nlen, int32_t n, int64_t *first) {
    if (n <= 0 || n > PRESENCE_MAX) return -1;
    const int32_t W = (n + 63) / 64;
    uint64_t *tab = calloc((size_t)65536 * (size_t)W, sizeof(uint64_t));
    uint64_t *word = malloc((size_t)n * sizeof(uint64_t)), *mask = malloc((size_t)n * sizeof(uint64_t));
    int32_t *uses = calloc(65536, sizeof(int32_t));    /* needles still looked for, by key */
    uint64_t *quads = calloc(1024, sizeof(uint64_t));  /* a bit per quad_key of the needles' heads */
    if (!tab || !word || !mask || !uses || !quads) {
        free(tab); free(word); free(mask); free(uses); free(quads);
        return -1;
    }
    int32_t left = 0, shortest = 8;
    for (int32_t i = 0; i < n; i++) {
        first[i] = -1;
        if (nlen[i] < 2) continue;
        const uint8_t *nd = needles + off[i];
        uint32_t key = ((uint32_t)nd[0] << 8) | nd[1];
        tab[(size_t)key * W + i / 64] |= 1ULL << (i % 64);
        uses[key]++;
        if (nlen[i] < shortest) shortest = nlen[i];
        if (nlen[i] >= 4) {
            uint32_t q = (uint32_t)nd[0] | (uint32_t)nd[1] << 8 | (uint32_t)nd[2] << 16 | (uint32_t)nd[3] << 24;
            uint32_t k = quad_key(q);
            quads[k >> 6] |= 1ULL << (k & 63);
        }
        word[i] = mask[i] = 0;
        for (int b = 0; b < 8 && b < nlen[i]; b++) {
            word[i] |= (uint64_t)nd[b] << (8 * b);
            mask[i] |= 0xFFULL << (8 * b);
        }
        left++;
    }
    for (int64_t p = 0; left > 0 && p + 1 < len; p++) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (shortest >= 4) {          /* four positions a step while none may start a needle */
            while (p + 8 <= len) {
                uint64_t w;
                memcpy(&w, buf + p, 8);
                if (quad_hit(quads, w, 0) | quad_hit(quads, w, 1) | quad_hit(quads, w, 2) | quad_hit(quads, w, 3))
                    break;
                p += 4;
            }
            if (p + 8 <= len) {                 /* the first of the four that may */
                uint64_t w;
                memcpy(&w, buf + p, 8);
                while (!quad_hit(quads, w, 0)) {
                    w >>= 8;
                    p++;
                }
            }
        }
#endif
        uint32_t key = ((uint32_t)buf[p] << 8) | buf[p + 1];
        if (!uses[key]) continue;
        uint64_t here = 0;                      /* the next 8 bytes (those before the end) */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (p + 8 <= len) memcpy(&here, buf + p, 8);    /* byte b at bits 8b, as word[] holds them */
        else
#endif
        for (int b = 0; b < 8 && p + b < len; b++) here |= (uint64_t)buf[p + b] << (8 * b);
        for (int32_t w = 0; w < W; w++) {
            uint64_t m = tab[(size_t)key * W + w];
            while (m) {
                int i = w * 64 + __builtin_ctzll(m);
                m &= m - 1;
                if ((here & mask[i]) != word[i]) continue;
                if (p + nlen[i] <= len && memcmp(buf + p, needles + off[i], (size_t)nlen[i]) == 0) {
                    first[i] = p;
                    tab[(size_t)key * W + w] &= ~(1ULL << (i % 64));
                    uses[key]--;
                    left--;
                }
            }
        }
    }
    free(tab); free(word); free(mask); free(uses); free(quads);
    return 0;
}

/* ---- Channel lines of NCCL's init (logscan_topo) ---------------------------------------- */

/* Python's str.isspace() on an ASCII byte (what \s, split() and rstrip() take) */
static inline int is_pyspace(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

static int digits(cur *c, int64_t *v) { return dec(c, v, 0); }

/* [0-9a-fA-F]+ as printed: (offset, length, hash) */
static int hexword(cur *c, int64_t *off, int32_t *len, uint64_t *h) {
    int64_t s = c->p;
    while (c->p < c->end && hexval(c->buf[c->p]) >= 0) c->p++;
    if (c->p == s || c->p - s > 64) return 0;
    *off = s;
    *len = (int32_t)(c->p - s);
    *h = fnv1a(c->buf + s, c->p - s);
    return 1;
}

/* Whether the NCCL prefix prefix() read at h is the one LINE_RE's search (parsers/nccl_debug.py)
 * finds first on the line: an ASCII line of at most LONG_LINE bytes, no other "NCCL" before h,
 * a host, and no "[...]" just before the host that LINE_RE would take as its time (or that
 * prefix() took as one while an unclosed '[' before it could start a longer one). */
static int prefix_is_first(const uint8_t *buf, int64_t ls, int64_t le, int64_t h, const topo_cols *o, int64_t i) {
    if (le - ls > 4096) return 0;
    int64_t k = ls;
    for (uint64_t w; k + 8 <= le; k += 8) {     /* ASCII: 8 bytes a step */
        memcpy(&w, buf + k, 8);
        if (w & 0x8080808080808080ULL) return 0;
    }
    for (; k < le; k++)
        if (buf[k] >= 0x80) return 0;
    if (h > ls && find_short(buf + ls, (size_t)(h - ls), "NCCL", 4) != NULL) return 0;
    if (o->host_len[i] <= 0) return 0;
    int64_t hs = o->host_off[i];
    if (o->ts_len[i] == 0) {
        int64_t r = hs;
        if (r - 1 >= ls && buf[r - 1] == ' ') r--;
        return !(r - 1 >= ls && buf[r - 1] == ']');
    }
    int64_t b = o->pre[i], e = b + o->ts_len[i] - 1;      /* '[' and ']' */
    for (int64_t k = b + 1; k < e; k++)
        if (buf[k] == ']') return 0;
    for (int64_t k = b - 1; k >= ls; k--) {
        if (buf[k] == ']') break;
        if (buf[k] == '[') return 0;
    }
    return 1;
}

/* "Channel CC[/II] : " then either a connection "r[dev] -> r[dev][ [send|receive]] via V" (kind 1)
 * or ring order "r r r ..." (kind 2), as CHANNEL_RE and RING_ORDER_RE read the rstripped message. */
static int topo_message(const uint8_t *buf, int64_t s, int64_t e, topo_cols *o, int64_t i) {
    cur c = {buf, s, e};
    int64_t v;
    if (!lit(&c, "Channel ") || !digits(&c, &v)) return 0;
    o->channel[i] = v;
    o->sub[i] = -1;
    if (lit(&c, "/")) {
        if (!digits(&c, &v)) return 0;
        o->sub[i] = v;
    }
    if (!lit(&c, " :")) return 0;
    cur save = c;
    if (lit(&c, " ") && c.p < c.end && is_digit(buf[c.p])) {
        int64_t a;
        cur t = c;
        if (digits(&t, &a) && t.p < t.end && buf[t.p] == '[') {    /* a connection */
            o->kind[i] = 1;
            o->src_rank[i] = a;
            c = t;
            if (!lit(&c, "[") || !hexword(&c, &o->src_dev_off[i], &o->src_dev_len[i], &o->src_dev_hash[i])) return 0;
            if (!lit(&c, "] -> ") || !digits(&c, &o->dst_rank[i])) return 0;
            if (!lit(&c, "[") || !hexword(&c, &o->dst_dev_off[i], &o->dst_dev_len[i], &o->dst_dev_hash[i])) return 0;
            if (!lit(&c, "]")) return 0;
            o->direction[i] = 0;
            if (lit(&c, " [send]")) o->direction[i] = 1;
            else if (lit(&c, " [receive]")) o->direction[i] = 2;
            if (!lit(&c, " via ") || c.p >= c.end || is_pyspace(buf[c.p])) return 0;
            /* Python's path reads " - Init " lines as Init lines first */
            if (find_short(buf + c.p, (size_t)(c.end - c.p), " - Init ", 8) != NULL) return 0;
            o->via_off[i] = c.p;
            o->via_len[i] = (int32_t)(c.end - c.p);
            o->via_hash[i] = fnv1a(buf + c.p, c.end - c.p);
            return 1;
        }
    }
    c = save;                                   /* ring order: (\s+\d+)+ to the end */
    int n = 0;
    int64_t os = c.p;
    while (c.p < c.end) {
        int64_t w = c.p;
        while (c.p < c.end && is_pyspace(buf[c.p])) c.p++;
        if (c.p == w) return 0;
        int64_t ds = c.p;
        while (c.p < c.end && is_digit(buf[c.p])) c.p++;
        if (c.p == ds) return 0;
        n++;
    }
    if (!n) return 0;
    o->kind[i] = 2;
    o->order_off[i] = os;
    o->order_len[i] = (int32_t)(c.end - os);
    o->order_hash[i] = fnv1a(buf + os, c.end - os);
    return 1;
}

/* "Trees" then " [c] d->r->u" items to the end, as TREES_ITEM_RE's finditer reads them there:
 * d the run of [-0-9/] before "->" (the run's last '-' is the arrow's), r and u -?\d+. */
static int64_t sdigits(cur *c, int64_t *v) {
    int neg = lit(c, "-");
    int64_t x;
    if (!digits(c, &x)) return 0;
    *v = neg ? -x : x;
    return 1;
}

static int trees_message(const uint8_t *buf, int64_t s, int64_t e, topo_cols *o, int64_t row) {
    cur c = {buf, s, e};
    int64_t n0 = o->n_items, n = n0, v;
    if (!lit(&c, "Trees")) return 0;
    while (c.p < c.end) {
        if (n >= o->item_cap) return 0;
        if (!lit(&c, " [") || !digits(&c, &v) || !lit(&c, "] ")) return 0;
        o->item_channel[n] = v;
        int64_t ds = c.p;
        while (c.p < c.end && (is_digit(buf[c.p]) || buf[c.p] == '-' || buf[c.p] == '/')) c.p++;
        if (c.p >= c.end || buf[c.p] != '>' || c.p - ds < 2 || buf[c.p - 1] != '-') return 0;
        o->item_down_off[n] = ds;
        o->item_down_len[n] = (int32_t)(c.p - 1 - ds);
        o->item_down_hash[n] = fnv1a(buf + ds, c.p - 1 - ds);
        c.p++;                                  /* '>' */
        if (!sdigits(&c, &o->item_rank[n]) || !lit(&c, "->") || !sdigits(&c, &o->item_up[n])) return 0;
        o->item_row[n] = row;
        n++;
    }
    if (n == n0) return 0;
    o->n_items = n;
    return 1;
}

int64_t logscan_topo(const uint8_t *buf, int64_t len, const int64_t *hits, int64_t n, int32_t any_message,
                     topo_cols *o, int64_t *rest, int64_t *n_rest) {
    static const char needle[] = "NCCL INFO ";
    const int64_t nl = (int64_t)sizeof(needle) - 1;
    coll_cols pc;
    memset(&pc, 0, sizeof(pc));
    pc.pre = o->pre; pc.ts_len = o->ts_len; pc.host_off = o->host_off; pc.host_len = o->host_len;
    pc.host_hash = o->host_hash; pc.pid = o->pid; pc.tid = o->tid; pc.dev = o->dev;
    int64_t k = 0, r = 0;
    o->n_items = 0;
    for (int64_t j = 0; j < n; j++) {
        int64_t h = hits[j];
        if (h < 0 || h + nl > len || memcmp(buf + h, needle, (size_t)nl) != 0) {
            rest[r++] = h;                      /* not a hit this scanner made: Python's path */
            continue;
        }
        int64_t ls = line_start(buf, h), le = line_end(buf, len, h + nl);
        int64_t me = le;
        while (me > h + nl && is_pyspace(buf[me - 1])) me--;
        int ok = prefix(buf, ls, h, &pc, k) && prefix_is_first(buf, ls, le, h, o, k);
        if (ok && trees_message(buf, h + nl, me, o, k)) {
            o->kind[k] = 4;
        } else if (ok && !topo_message(buf, h + nl, me, o, k)) {
            o->kind[k] = 3;                     /* another message: its prefix alone */
            ok = any_message;
        }
        if (ok) {
            o->start[k] = ls;
            o->pre_hash[k] = fnv1a(buf + ls, o->pre[k] - ls);
            o->msg_off[k] = h + nl;
            o->msg_len[k] = (int32_t)(me - (h + nl));
            o->msg_hash[k] = fnv1a(buf + h + nl, me - (h + nl));
            k++;
        } else {
            rest[r++] = h;
        }
    }
    *n_rest = r;
    return k;
}
