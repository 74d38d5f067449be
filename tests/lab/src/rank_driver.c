/* stallscope lab: one rank of a training-like job (sslab_rank).
 *
 * Reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT like a
 * torchrun worker, exchanges the ncclUniqueId through a tiny TCP store on
 * MASTER_ADDR:MASTER_PORT (what torch's TCPStore does), initialises one
 * communicator with ncclCommInitRank and then loops: "compute" (sleep), a
 * burst of collectives enqueued on one stream, cudaStreamSynchronize, check.
 *
 * Modes
 *   --mode train     the loop above (default); faults: --skip-op, --straggle-*, --pause-*, --stuck-*
 *   --mode selftest  every op x dtype x reduction checked against an
 *                    independently computed expectation; ncclCommSplit,
 *                    ncclCommInitAll, groups, send/recv and asynchrony too.
 * Events are JSON lines on stdout ({"ev": ...}); checks are "CHECK ..." lines.
 * A watchdog thread mirrors PyTorch's ProcessGroupNCCL watchdog: it polls
 * ncclCommGetAsyncError and a collective timeout, logs in the same format and
 * takes the process down. With TORCH_NCCL_TRACE_BUFFER_SIZE (TORCH_FR_BUFFER_SIZE)
 * > 0 it also keeps PyTorch's Flight Recorder: a ring of the last N collectives,
 * dumped as torch's pickle when its debug pipe is written to
 * (TORCH_NCCL_DEBUG_INFO_PIPE_FILE) or on a timeout/error (TORCH_NCCL_DUMP_ON_TIMEOUT).
 *
 * Launcher hooks: --gate-file (wait for a file before starting, so captures can
 * attach first), --stop-file (train until the step number written in it).
 */
#define _GNU_SOURCE
#include "nccl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int g_rank, g_world, g_local;
static ncclComm_t g_comm;
static cudaStream_t g_stream;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}
static void sleep_ms(double ms) {
  if (ms <= 0) return;
  struct timespec ts = {(time_t)(ms / 1000), (long)((ms - (time_t)(ms / 1000) * 1000) * 1e6)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}
/* --compute-busy: "compute" is host work (a Python loop, a data loader) that needs a CPU:
   spin until this thread has run ms of CPU time, so a CPU quota or contention stretches it */
static int g_compute_busy;
static void busy_ms(double ms) {
  if (ms <= 0) return;
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  uint64_t end = (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec + (uint64_t)(ms * 1e6);
  volatile uint64_t x = 0;
  for (;;) {
    for (int i = 0; i < 20000; i++) x += i;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    if ((uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec >= end) break;
  }
}
#define DIE(...) do { fprintf(stderr, "sslab_rank[%d]: ", g_rank); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(2); } while (0)
#define NCCLCHECK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) DIE("%s failed: %s (%s)", #x, ncclGetErrorString(r_), ncclGetLastError(NULL)); } while (0)

/* ---------------- unique id exchange (TCP store) ---------------- */
static int store_fd_connect(const char *addr, int port) {
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) DIE("bad MASTER_ADDR %s", addr);
  for (int i = 0; i < 3000; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) return fd;
    close(fd);
    sleep_ms(20);
  }
  DIE("cannot reach the store at %s:%d", addr, port);
}
static int full_io(int fd, void *p, size_t n, int snd) {
  char *c = p;
  while (n) {
    ssize_t r = snd ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
    if (r <= 0) { if (r < 0 && errno == EINTR) continue; return -1; }
    c += r; n -= r;
  }
  return 0;
}
struct store_arg { int fd; int n; ncclUniqueId id; };
static void *store_main(void *p) {
  struct store_arg *a = p;
  for (int served = 0; served < a->n;) {
    int c = accept(a->fd, NULL, NULL);
    if (c < 0) continue;
    int32_t who;
    if (full_io(c, &who, 4, 0) == 0 && full_io(c, &a->id, sizeof(a->id), 1) == 0) served++;
    close(c);
  }
  close(a->fd);
  return NULL;
}
static void exchange_id(ncclUniqueId *id) {
  const char *ma = getenv("MASTER_ADDR");
  const char *mp = getenv("MASTER_PORT");
  if (!ma) ma = "127.0.0.1";
  int port = mp ? atoi(mp) : 29500;
  if (g_rank == 0) {
    NCCLCHECK(ncclGetUniqueId(id));
    if (g_world == 1) return;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, ma, &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 64) != 0) DIE("store bind %s:%d: %s", ma, port, strerror(errno));
    struct store_arg *sa = calloc(1, sizeof(*sa));
    sa->fd = fd;
    sa->n = g_world - 1;
    sa->id = *id;
    pthread_t t;
    pthread_create(&t, NULL, store_main, sa);
    pthread_detach(t);
  } else {
    int fd = store_fd_connect(ma, port);
    int32_t me = g_rank;
    if (full_io(fd, &me, 4, 1) || full_io(fd, id, sizeof(*id), 0)) DIE("store exchange failed");
    close(fd);
  }
}

/* ---------------- data and expectations ---------------- */
static const struct { const char *name; ncclDataType_t t; size_t es; int is_float, is_unsigned; } DT[] = {
  {"int8", ncclInt8, 1, 0, 0}, {"uint8", ncclUint8, 1, 0, 1}, {"int32", ncclInt32, 4, 0, 0},
  {"uint32", ncclUint32, 4, 0, 1}, {"int64", ncclInt64, 8, 0, 0}, {"uint64", ncclUint64, 8, 0, 1},
  {"float16", ncclFloat16, 2, 1, 0}, {"float32", ncclFloat32, 4, 1, 0}, {"float64", ncclFloat64, 8, 1, 0},
  {"bfloat16", ncclBfloat16, 2, 1, 0}};
#define NDT (int)(sizeof(DT) / sizeof(DT[0]))
static const char *RED[] = {"sum", "prod", "max", "min", "avg"};

static int dt_index(const char *name) {
  for (int i = 0; i < NDT; i++) if (!strcmp(DT[i].name, name)) return i;
  return -1;
}
static uint16_t f_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
static float bf16_to_f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }

/* Input value of rank r, op tag k, element i: small integers, exact in every type. */
static int64_t val(int di, int red, int r, uint64_t k, size_t i) {
  uint64_t h = (uint64_t)r * 7 + k * 3 + i;
  if (red == ncclProd) { /* magnitude of a product over <= 8 ranks stays <= 256 */
    int64_t v = (h % 3 == 2) ? 2 : 1;
    if (!DT[di].is_unsigned && (h % 5 == 0)) v = -v;
    return v;
  }
  return DT[di].is_unsigned ? (int64_t)(h % 9) : (int64_t)(h % 9) - 4;
}
static void store(int di, void *buf, size_t i, int64_t v) {
  switch (DT[di].t) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)buf)[i] = v; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((_Float16 *)buf)[i] = (_Float16)v; break;
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    case ncclFloat64: ((double *)buf)[i] = (double)v; break;
    case ncclBfloat16: ((uint16_t *)buf)[i] = f_to_bf16((float)v); break;
    default: break;
  }
}
/* Expected element from the exact integer reduction over all ranks. */
static void expect(int di, int red, int nr, uint64_t k, size_t i, void *out, size_t oi) {
  int64_t acc = val(di, red, 0, k, i);
  for (int r = 1; r < nr; r++) {
    int64_t v = val(di, red, r, k, i);
    switch (red) {
      case ncclSum: case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: if (v > acc) acc = v; break;
      case ncclMin: if (v < acc) acc = v; break;
    }
  }
  if (red != ncclAvg) { store(di, out, oi, acc); return; }
  switch (DT[di].t) { /* same precision as the library's final division */
    case ncclFloat16: ((_Float16 *)out)[oi] = (_Float16)((float)acc / (float)nr); break;
    case ncclFloat32: ((float *)out)[oi] = (float)acc / (float)nr; break;
    case ncclFloat64: ((double *)out)[oi] = (double)acc / (double)nr; break;
    case ncclBfloat16: ((uint16_t *)out)[oi] = f_to_bf16(bf16_to_f(f_to_bf16((float)acc)) / (float)nr); break;
    default: store(di, out, oi, acc / nr); break;
  }
}
static void fill(int di, int red, int r, uint64_t k, void *buf, size_t n, size_t base) {
  for (size_t i = 0; i < n; i++) store(di, buf, i, val(di, red, r, k, base + i));
}
static size_t count_mismatch(const void *a, const void *b, size_t n, size_t es) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) if (memcmp((const char *)a + i * es, (const char *)b + i * es, es)) bad++;
  return bad;
}

/* ---------------- watchdog (PyTorch ProcessGroupNCCL style) ---------------- */
#define MAXWORK 4096
static pthread_mutex_t g_wmu = PTHREAD_MUTEX_INITIALIZER;
static struct { cudaEvent_t ev; uint64_t seq; uint64_t t_ns; const char *type; size_t numel_in, numel_out; } g_work[MAXWORK];
static int g_nwork;                 /* works of the current step */
static uint64_t g_last_enqueued, g_last_completed;
static double g_timeout_s = 600;

static void torch_vlog(char sev, const char *file, int line, const char *fmt, va_list ap) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  fprintf(stderr, "[rank%d]:[%c%02d%02d %02d:%02d:%02d.%06ld000 %s:%d] %s\n", g_rank, sev,
          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)tv.tv_usec, file, line, msg);
  fflush(stderr);
}
static void torch_log(char sev, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void torch_log(char sev, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  torch_vlog(sev, "ProcessGroupNCCL.cpp", line, fmt, ap);
  va_end(ap);
}
static void fr_log(char sev, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fr_log(char sev, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  torch_vlog(sev, "FlightRecorder.cpp", line, fmt, ap);
  va_end(ap);
}
/* ---------------- Flight Recorder (PyTorch c10d FlightRecorder, dump format 2.7) ----------------
 * What torch does, and what the lab does the same way:
 * - enabled when TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE (the first one set) > 0;
 *   a ring of that many entries, one per collective, oldest overwritten;
 * - an entry's start event exists only with TORCH_NCCL_ENABLE_TIMING=1 (or
 *   TORCH_NCCL_DESYNC_DEBUG=1): without it nothing is ever "started" and
 *   last_started_collective stays -1, as in torch;
 * - the watchdog retires completed entries (both discovery times = now, duration
 *   from the events with timing); a dump evaluates the others at dump time without
 *   storing it (torch's dump_entries works on copies);
 * - pg_status comes from the watchdog: last enqueued / started / completed seq (-1: none);
 * - all times are c10::getTime(): CLOCK_REALTIME ns on Linux;
 * - the dump goes to <TORCH_FR_DUMP_TEMP_FILE | TORCH_NCCL_DEBUG_INFO_TEMP_FILE | /tmp/nccl_trace_rank_><rank>.
 *   Torch writes it in place (ofstream); the lab writes .<name>.tmp.<pid> next to it and
 *   renames, so a reader never sees half a dump.
 * The pickle is protocol 2 with no memo: what torch's pickler writes, minus BINPUTs. */
struct fr_entry {
  uint64_t id, seq, created_ns;
  int64_t started_ns, completed_ns; /* 0: not discovered */
  const char *pname, *func;
  int line, retired, has_duration;
  size_t in_n, out_n;
  double duration_ms;
  cudaEvent_t start, end;
};
static struct fr_entry *g_fr;
static size_t g_fr_max, g_fr_len, g_fr_next;
static uint64_t g_fr_id;
static int g_fr_timing, g_fr_dump_on_timeout, g_fr_pipe_fd = -1;
static char g_fr_dump_path[4096], g_fr_pipe_path[4096];
static int64_t g_pg_enqueued = -1, g_pg_started = -1, g_pg_completed = -1;
static const char *g_fr_dtype = "Float";
static cudaEvent_t g_fr_pending_start;
static uint64_t g_fr_pending_created; /* when work_pre ran: the entry's time_created_ns */
static int g_fr_main_line;

static const char *env_first(const char *a, const char *b) {
  const char *v = getenv(a);
  if (v && *v) return v;
  v = b ? getenv(b) : NULL;
  return v && *v ? v : NULL;
}
static int env_true(const char *v) { return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")); }
static const char *torch_dtype(const char *lab) {
  static const char *map[][2] = {{"int8", "Char"}, {"uint8", "Byte"}, {"int32", "Int"}, {"uint32", "UInt32"},
    {"int64", "Long"}, {"uint64", "UInt64"}, {"float16", "Half"}, {"float32", "Float"}, {"float64", "Double"},
    {"bfloat16", "BFloat16"}};
  for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) if (!strcmp(map[i][0], lab)) return map[i][1];
  return "Float";
}

static void fr_init(const char *dtype) {
  const char *n = env_first("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE");
  long max = n ? atol(n) : 0;
  if (max <= 0) return;
  if (max > 100000) max = 100000;
  g_fr = calloc((size_t)max, sizeof(*g_fr));
  if (!g_fr) return;
  g_fr_max = (size_t)max;
  g_fr_dtype = torch_dtype(dtype);
  g_fr_timing = env_true(getenv("TORCH_NCCL_ENABLE_TIMING")) || env_true(getenv("TORCH_NCCL_DESYNC_DEBUG"));
  /* torch >= 2.4: on by default; it dumps on a timeout or any exception of the watchdog */
  const char *dot = env_first("TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_ON_TIMEOUT");
  g_fr_dump_on_timeout = dot ? env_true(dot) : 1;
  const char *stem = env_first("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE");
  snprintf(g_fr_dump_path, sizeof(g_fr_dump_path), "%s%d", stem ? stem : "/tmp/nccl_trace_rank_", g_rank);
  const char *pipe_stem = env_first("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE");
  if (pipe_stem) { /* torch's DumpPipe: <stem><rank>.pipe, mkfifo 0666, O_RDONLY|O_NONBLOCK */
    snprintf(g_fr_pipe_path, sizeof(g_fr_pipe_path), "%s%d.pipe", pipe_stem, g_rank);
    if (unlink(g_fr_pipe_path) != 0 && errno != ENOENT)
      fprintf(stderr, "sslab_rank[%d]: Error removing existing named pipe %s: %s\n", g_rank, g_fr_pipe_path, strerror(errno));
    mode_t old = umask(0);
    int rc = mkfifo(g_fr_pipe_path, 0666);
    umask(old);
    if (rc == 0) g_fr_pipe_fd = open(g_fr_pipe_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (g_fr_pipe_fd < 0)
      fprintf(stderr, "sslab_rank[%d]: Error creating named pipe %s: %s\n", g_rank, g_fr_pipe_path, strerror(errno));
  }
}

/* Before a collective is enqueued: its creation time and start event. torch creates the
 * entry (initWork) and records the start on the NCCL stream before the launch, so the stream
 * can never run the collective before the entry exists. */
static void work_pre(void) {
  if (!g_fr_max) return;
  uint64_t created = now_ns();
  cudaEvent_t e = NULL;
  if (g_fr_timing) {
    cudaEventCreateWithFlags(&e, cudaEventDefault);
    cudaEventRecord(e, g_stream);
  }
  pthread_mutex_lock(&g_wmu);
  g_fr_pending_created = created;
  if (e) g_fr_pending_start = e;
  pthread_mutex_unlock(&g_wmu);
}

/* caller holds g_wmu */
static void fr_record(uint64_t seq, const char *type, size_t in, size_t out, const char *func, int line) {
  if (!g_fr_max) return;
  struct fr_entry *e;
  if (g_fr_len < g_fr_max) e = &g_fr[g_fr_len++];
  else {
    e = &g_fr[g_fr_next]; /* overwritten: its events are leaked if never completed (never destroyed in flight) */
    if (e->retired) { if (e->start) cudaEventDestroy(e->start); if (e->end) cudaEventDestroy(e->end); }
    g_fr_next = (g_fr_next + 1) % g_fr_max;
  }
  memset(e, 0, sizeof(*e));
  e->id = g_fr_id++;
  e->seq = seq;
  e->created_ns = g_fr_pending_created ? g_fr_pending_created : now_ns();
  g_fr_pending_created = 0;
  e->pname = !strcmp(type, "ALLREDUCE") ? "nccl:all_reduce" : !strcmp(type, "BROADCAST") ? "nccl:broadcast"
           : !strcmp(type, "_ALLGATHER_BASE") ? "nccl:_allgather_base"
           : !strcmp(type, "_REDUCE_SCATTER_BASE") ? "nccl:_reduce_scatter_base" : "nccl:unknown";
  e->func = func;
  e->line = line;
  e->in_n = in;
  e->out_n = out;
  e->start = g_fr_pending_start;
  g_fr_pending_start = NULL;
  cudaEventCreateWithFlags(&e->end, g_fr_timing ? cudaEventDefault : cudaEventDisableTiming);
  cudaEventRecord(e->end, g_stream);
}

/* Watchdog side (caller holds g_wmu): torch's pg_status updates and retire_id. */
static void fr_watch(void) {
  if (!g_fr_max) return;
  for (size_t k = 0; k < g_fr_len; k++) {
    struct fr_entry *e = &g_fr[(g_fr_next + k) % g_fr_len];
    if (e->retired) continue;
    if (e->start && cudaEventQuery(e->start) == cudaSuccess && (int64_t)e->seq > g_pg_started) g_pg_started = (int64_t)e->seq;
    if (cudaEventQuery(e->end) != cudaSuccess) continue;
    int64_t t = (int64_t)now_ns();
    if (!e->started_ns) e->started_ns = t;
    e->completed_ns = t;
    if (e->start) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, e->start, e->end) == cudaSuccess) { e->duration_ms = ms; e->has_duration = 1; }
      cudaEventDestroy(e->start);
    }
    cudaEventDestroy(e->end);
    e->start = e->end = NULL;
    e->retired = 1;
    if ((int64_t)e->seq > g_pg_completed) g_pg_completed = (int64_t)e->seq;
  }
}

/* A minimal pickle writer (protocol 2). */
struct pk { unsigned char *b; size_t n, cap; int err; };
static void pk_raw(struct pk *p, const void *d, size_t n) {
  if (p->err) return;
  if (p->n + n > p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 65536;
    while (cap < p->n + n) cap *= 2;
    unsigned char *nb = realloc(p->b, cap);
    if (!nb) { p->err = 1; return; }
    p->b = nb;
    p->cap = cap;
  }
  memcpy(p->b + p->n, d, n);
  p->n += n;
}
static void pk_op(struct pk *p, unsigned char op) { pk_raw(p, &op, 1); }
static void pk_str(struct pk *p, const char *s) { /* BINUNICODE */
  uint32_t n = (uint32_t)strlen(s);
  unsigned char h[5] = {'X', n & 0xff, (n >> 8) & 0xff, (n >> 16) & 0xff, (n >> 24) & 0xff};
  pk_raw(p, h, 5);
  pk_raw(p, s, n);
}
static void pk_int(struct pk *p, int64_t v) {
  if (v >= 0 && v < 256) { unsigned char h[2] = {'K', (unsigned char)v}; pk_raw(p, h, 2); return; }          /* BININT1 */
  if (v >= INT32_MIN && v <= INT32_MAX) {                                                                  /* BININT */
    uint32_t u = (uint32_t)(int32_t)v;
    unsigned char h[5] = {'J', u & 0xff, (u >> 8) & 0xff, (u >> 16) & 0xff, (u >> 24) & 0xff};
    pk_raw(p, h, 5);
    return;
  }
  unsigned char h[10] = {0x8a, 8};                                                                         /* LONG1 */
  uint64_t u = (uint64_t)v;
  for (int i = 0; i < 8; i++) h[2 + i] = (u >> (8 * i)) & 0xff;
  pk_raw(p, h, 10);
}
static void pk_float(struct pk *p, double d) { /* BINFLOAT: big-endian IEEE 754 double */
  uint64_t u;
  memcpy(&u, &d, 8);
  unsigned char h[9] = {'G'};
  for (int i = 0; i < 8; i++) h[1 + i] = (u >> (56 - 8 * i)) & 0xff;
  pk_raw(p, h, 9);
}
static void pk_bool(struct pk *p, int v) { pk_op(p, v ? 0x88 : 0x89); }   /* NEWTRUE / NEWFALSE */
static void pk_none(struct pk *p) { pk_op(p, 'N'); }
static void pk_key(struct pk *p, const char *k) { pk_str(p, k); }
/* dicts: '}' '(' k v ... 'u'; lists: ']' '(' ... 'e' */
static void pk_dict_begin(struct pk *p) { pk_op(p, '}'); pk_op(p, '('); }
static void pk_dict_end(struct pk *p) { pk_op(p, 'u'); }
static void pk_list_begin(struct pk *p) { pk_op(p, ']'); pk_op(p, '('); }
static void pk_list_end(struct pk *p) { pk_op(p, 'e'); }
static void pk_sizes(struct pk *p, size_t n) { pk_list_begin(p); pk_list_begin(p); pk_int(p, (int64_t)n); pk_list_end(p); pk_list_end(p); }
static void pk_strlist1(struct pk *p, const char *s) { pk_list_begin(p); pk_str(p, s); pk_list_end(p); }
static void pk_frame(struct pk *p, const char *name, const char *file, int line) {
  pk_dict_begin(p);
  pk_key(p, "name"); pk_str(p, name);
  pk_key(p, "filename"); pk_str(p, file);
  pk_key(p, "line"); pk_int(p, line);
  pk_dict_end(p);
}

/* caller holds g_wmu; returns the number of entries dumped, -1 on error */
static int fr_dump(const char *why) {
  if (!g_fr_max) return -1;
  int64_t now = (int64_t)now_ns();
  struct pk p = {0};
  pk_op(&p, 0x80); pk_op(&p, 2); /* PROTO 2 */
  pk_dict_begin(&p);
  pk_key(&p, "version"); pk_str(&p, "2.7");
  pk_key(&p, "pg_config");
  {
    char ranks[1024];
    size_t o = 0;
    o += snprintf(ranks + o, sizeof(ranks) - o, "[");
    for (int r = 0; r < g_world && o < sizeof(ranks) - 16; r++) o += snprintf(ranks + o, sizeof(ranks) - o, "%s%d", r ? ", " : "", r);
    snprintf(ranks + o, sizeof(ranks) - o, "]");
    pk_dict_begin(&p);
    pk_key(&p, "0");
    pk_dict_begin(&p);
    pk_key(&p, "name"); pk_str(&p, "0");
    pk_key(&p, "desc"); pk_str(&p, "default_pg");
    pk_key(&p, "ranks"); pk_str(&p, ranks);
    pk_dict_end(&p);
    pk_dict_end(&p);
  }
  pk_key(&p, "nccl_version"); pk_str(&p, "2.21.5");
  pk_key(&p, "pg_status");
  pk_dict_begin(&p);
  pk_key(&p, "0");
  pk_dict_begin(&p);
  pk_key(&p, "last_enqueued_collective"); pk_int(&p, g_pg_enqueued);
  pk_key(&p, "last_started_collective"); pk_int(&p, g_pg_started);
  pk_key(&p, "last_completed_collective"); pk_int(&p, g_pg_completed);
  pk_dict_end(&p);
  pk_dict_end(&p);
  pk_key(&p, "entries");
  pk_list_begin(&p);
  for (size_t k = 0; k < g_fr_len; k++) {
    struct fr_entry *e = &g_fr[(g_fr_next + k) % g_fr_len];
    int64_t started = e->started_ns, completed = e->completed_ns;
    if (!e->retired) { /* update_state on a copy */
      if (e->start && !started && cudaEventQuery(e->start) == cudaSuccess) started = now;
      if (e->end && !completed && cudaEventQuery(e->end) == cudaSuccess) completed = now;
    }
    pk_dict_begin(&p);
    pk_key(&p, "frames");
    pk_list_begin(&p);
    pk_frame(&p, e->func, "tests/lab/src/rank_driver.c", e->line);
    pk_frame(&p, "main", "tests/lab/src/rank_driver.c", g_fr_main_line);
    pk_list_end(&p);
    pk_key(&p, "record_id"); pk_int(&p, (int64_t)e->id);
    pk_key(&p, "pg_id"); pk_int(&p, 0);
    pk_key(&p, "process_group"); pk_str(&p, "0"); pk_str(&p, "default_pg"); pk_op(&p, 0x86); /* TUPLE2 */
    pk_key(&p, "collective_seq_id"); pk_int(&p, (int64_t)e->seq);
    pk_key(&p, "p2p_seq_id"); pk_int(&p, 0);
    pk_key(&p, "op_id"); pk_int(&p, (int64_t)e->seq);
    pk_key(&p, "profiling_name"); pk_str(&p, e->pname);
    pk_key(&p, "time_created_ns"); pk_int(&p, (int64_t)e->created_ns);
    if (e->has_duration) { pk_key(&p, "duration_ms"); pk_float(&p, e->duration_ms); }
    pk_key(&p, "input_sizes"); pk_sizes(&p, e->in_n);
    pk_key(&p, "input_dtypes"); pk_strlist1(&p, g_fr_dtype);
    pk_key(&p, "output_sizes"); pk_sizes(&p, e->out_n);
    pk_key(&p, "output_dtypes"); pk_strlist1(&p, g_fr_dtype);
    pk_key(&p, "state"); pk_str(&p, completed ? "completed" : started ? "started" : "scheduled");
    pk_key(&p, "time_discovered_started_ns"); if (started) pk_int(&p, started); else pk_none(&p);
    pk_key(&p, "time_discovered_completed_ns"); if (completed) pk_int(&p, completed); else pk_none(&p);
    pk_key(&p, "retired"); pk_bool(&p, e->retired);
    pk_key(&p, "timeout_ms"); pk_int(&p, (int64_t)(g_timeout_s * 1000));
    pk_key(&p, "is_p2p"); pk_bool(&p, 0);
    pk_dict_end(&p);
  }
  pk_list_end(&p);
  pk_dict_end(&p);
  pk_op(&p, '.');
  int rc = -1;
  if (!p.err) {
    char tmp[4200], dir[4096], base[4096];
    snprintf(dir, sizeof(dir), "%s", g_fr_dump_path);
    snprintf(base, sizeof(base), "%s", g_fr_dump_path);
    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp.%d", dirname(dir), basename(base), (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      size_t off = 0;
      while (off < p.n) {
        ssize_t w = write(fd, p.b + off, p.n - off);
        if (w <= 0) { if (w < 0 && errno == EINTR) continue; break; }
        off += (size_t)w;
      }
      if (close(fd) == 0 && off == p.n && rename(tmp, g_fr_dump_path) == 0) rc = (int)g_fr_len;
      else unlink(tmp);
    }
  }
  free(p.b);
  if (rc >= 0) {
    fr_log('I', 116, "[PG ID 0 PG GUID 0(default_pg) Rank %d] Finished writing Flight Recorder debug info to %s "
              "(%s, %d entries)", g_rank, g_fr_dump_path, why, rc);
    printf("{\"ev\":\"fr_dump\",\"t_ns\":%llu,\"rank\":%d,\"reason\":\"%s\",\"file\":\"%s\",\"entries\":%d,"
           "\"last_enqueued\":%lld,\"last_started\":%lld,\"last_completed\":%lld}\n", (unsigned long long)now_ns(),
           g_rank, why, g_fr_dump_path, rc, (long long)g_pg_enqueued, (long long)g_pg_started, (long long)g_pg_completed);
    fflush(stdout);
  } else {
    fr_log('E', 103, "Error writing Flight Recorder debug info to file: %s", g_fr_dump_path);
  }
  return rc;
}

/* caller holds g_wmu: a write to the debug pipe asks for a dump (torch's DumpPipe::shouldDump) */
static void fr_poll_pipe(void) {
  if (g_fr_pipe_fd < 0) return;
  char buf[128];
  ssize_t n = read(g_fr_pipe_fd, buf, sizeof(buf));
  if (n > 0) {
    while (read(g_fr_pipe_fd, buf, sizeof(buf)) > 0) {}
    fr_dump("pipe");
  }
}

static void *watchdog_main(void *p) {
  (void)p;
  for (;;) {
    sleep_ms(100);
    ncclResult_t ae = ncclSuccess;
    pthread_mutex_lock(&g_wmu);
    if (!g_comm) { pthread_mutex_unlock(&g_wmu); continue; }
    fr_watch();
    fr_poll_pipe();
    ncclCommGetAsyncError(g_comm, &ae);
    int oldest = -1;
    for (int i = 0; i < g_nwork; i++)
      if (cudaEventQuery(g_work[i].ev) == cudaErrorNotReady) { oldest = i; break; }
      else if (g_work[i].seq > g_last_completed) g_last_completed = g_work[i].seq;
    int timed_out = oldest >= 0 && g_timeout_s > 0 && (now_ns() - g_work[oldest].t_ns) / 1e9 > g_timeout_s;
    if (ae != ncclSuccess || timed_out) {
      uint64_t seq = oldest >= 0 ? g_work[oldest].seq : g_last_completed + 1;
      if (timed_out)
        torch_log('E', 607, "[Rank %d] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=%lu, OpType=%s, "
                  "NumelIn=%zu, NumelOut=%zu, Timeout(ms)=%.0f) ran for %.0f milliseconds before timing out.", g_rank,
                  (unsigned long)seq, g_work[oldest].type, g_work[oldest].numel_in, g_work[oldest].numel_out,
                  g_timeout_s * 1000, (now_ns() - g_work[oldest].t_ns) / 1e6);
      else
        torch_log('E', 1600, "[PG 0 Rank %d] Process group watchdog thread terminated with exception: NCCL error: %s, "
                  "NCCL version 2.21.5\n%s\nLast error:\n%s", g_rank, ncclGetErrorString(ae),
                  ae == ncclRemoteError ? "ncclRemoteError: A call failed possibly due to a network error or a remote "
                                          "process exiting prematurely."
                  : ae == ncclInvalidUsage ? "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."
                  : "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device "
                    "error. It can be also caused by unexpected exit of a remote peer, you can check NCCL warnings "
                    "for failure reason and see if there is connection closure by a peer.",
                  ncclGetLastError(g_comm));
      torch_log('E', 1664, "[PG 0 Rank %d] Exception (either an error or timeout) detected by watchdog at work: %lu, "
                "last enqueued NCCL work: %lu, last completed NCCL work: %lu.", g_rank, (unsigned long)seq,
                (unsigned long)g_last_enqueued, (unsigned long)g_last_completed);
      torch_log('E', 698, "[Rank %d] To avoid data inconsistency, we are taking the entire process down.", g_rank);
      printf("{\"ev\":\"watchdog\",\"t_ns\":%llu,\"reason\":\"%s\",\"seq\":%lu}\n", (unsigned long long)now_ns(),
             timed_out ? "timeout" : "async_error", (unsigned long)seq);
      fflush(stdout);
      /* TORCH_NCCL_DUMP_ON_TIMEOUT: torch dumps on a timeout or an exception, before the abort */
      if (g_fr_dump_on_timeout) fr_dump(timed_out ? "timeout" : "async_error");
      pthread_mutex_unlock(&g_wmu);
      ncclCommAbort(g_comm);
      _exit(timed_out ? 3 : 4);
    }
    pthread_mutex_unlock(&g_wmu);
  }
  return NULL;
}
#define work_add(type, in, out) work_add_at(type, in, out, __func__, __LINE__)
static void work_add_at(const char *type, size_t in, size_t out, const char *func, int line) {
  pthread_mutex_lock(&g_wmu);
  if (g_nwork < MAXWORK) {
    if (!g_work[g_nwork].ev) cudaEventCreateWithFlags(&g_work[g_nwork].ev, cudaEventDisableTiming);
    cudaEventRecord(g_work[g_nwork].ev, g_stream);
    g_work[g_nwork].seq = ++g_last_enqueued;
    g_work[g_nwork].t_ns = now_ns();
    g_work[g_nwork].type = type;
    g_work[g_nwork].numel_in = in;
    g_work[g_nwork].numel_out = out;
    g_nwork++;
  } else ++g_last_enqueued;
  g_pg_enqueued = (int64_t)g_last_enqueued;
  fr_record(g_last_enqueued, type, in, out, func, line);
  pthread_mutex_unlock(&g_wmu);
}
static void work_step_done(void) {
  pthread_mutex_lock(&g_wmu);
  for (int i = 0; i < g_nwork; i++) if (g_work[i].seq > g_last_completed) g_last_completed = g_work[i].seq;
  g_nwork = 0;
  pthread_mutex_unlock(&g_wmu);
}

/* ---------------- selftest ---------------- */
static int g_fail;
static void report(const char *op, int di, const char *red, size_t count, int root, size_t bad) {
  printf("CHECK op=%s dtype=%s redop=%s count=%zu root=%d nranks=%d rank=%d result=%s mismatches=%zu\n", op,
         DT[di].name, red, count, root, g_world, g_rank, bad ? "FAIL" : "ok", bad);
  if (bad) g_fail = 1;
}

static void st_collectives(ncclComm_t comm, cudaStream_t s, int nr, int me, int di, size_t count, uint64_t *tag) {
  size_t es = DT[di].es;
  size_t big = count * nr;
  char *sb, *rb, *ex;
  cudaMalloc((void **)&sb, big * es);
  cudaMalloc((void **)&rb, big * es);
  ex = malloc(big * es);
  for (int red = 0; red < ncclNumOps; red++) {
    /* AllReduce (out of place, then in place) */
    uint64_t k = (*tag)++;
    fill(di, red, me, k, sb, count, 0);
    NCCLCHECK(ncclAllReduce(sb, rb, count, DT[di].t, red, comm, s));
    cudaStreamSynchronize(s);
    for (size_t i = 0; i < count; i++) expect(di, red, nr, k, i, ex, i);
    report("allreduce", di, RED[red], count, 0, count_mismatch(rb, ex, count, es));
    k = (*tag)++;
    fill(di, red, me, k, rb, count, 0);
    NCCLCHECK(ncclAllReduce(rb, rb, count, DT[di].t, red, comm, s));
    cudaStreamSynchronize(s);
    for (size_t i = 0; i < count; i++) expect(di, red, nr, k, i, ex, i);
    report("allreduce_inplace", di, RED[red], count, 0, count_mismatch(rb, ex, count, es));
    /* ReduceScatter: recvcount = count, input nr*count */
    k = (*tag)++;
    fill(di, red, me, k, sb, big, 0);
    NCCLCHECK(ncclReduceScatter(sb, rb, count, DT[di].t, red, comm, s));
    cudaStreamSynchronize(s);
    for (size_t i = 0; i < count; i++) expect(di, red, nr, k, (size_t)me * count + i, ex, i);
    report("reducescatter", di, RED[red], count, 0, count_mismatch(rb, ex, count, es));
    /* Reduce to a rotating root */
    int root = (int)(k % nr);
    k = (*tag)++;
    fill(di, red, me, k, sb, count, 0);
    memset(rb, 0x5a, count * es);
    NCCLCHECK(ncclReduce(sb, rb, count, DT[di].t, red, root, comm, s));
    cudaStreamSynchronize(s);
    if (me == root) {
      for (size_t i = 0; i < count; i++) expect(di, red, nr, k, i, ex, i);
      report("reduce", di, RED[red], count, root, count_mismatch(rb, ex, count, es));
    } else {
      memset(ex, 0x5a, count * es); /* non-roots: recvbuff untouched */
      report("reduce_nonroot", di, RED[red], count, root, count_mismatch(rb, ex, count, es));
    }
  }
  /* AllGather */
  uint64_t k = (*tag)++;
  fill(di, 0, me, k, sb, count, 0);
  NCCLCHECK(ncclAllGather(sb, rb, count, DT[di].t, comm, s));
  cudaStreamSynchronize(s);
  for (int r = 0; r < nr; r++) fill(di, 0, r, k, ex + (size_t)r * count * es, count, 0);
  report("allgather", di, "none", count, 0, count_mismatch(rb, ex, big, es));
  /* Broadcast (and the in-place ncclBcast) from a rotating root */
  int root = (int)(k % nr);
  k = (*tag)++;
  fill(di, 0, me, k, sb, count, 0);
  NCCLCHECK(ncclBroadcast(sb, rb, count, DT[di].t, root, comm, s));
  cudaStreamSynchronize(s);
  fill(di, 0, root, k, ex, count, 0);
  report("broadcast", di, "none", count, root, count_mismatch(rb, ex, count, es));
  root = (root + 1) % nr;
  k = (*tag)++;
  fill(di, 0, me, k, rb, count, 0);
  NCCLCHECK(ncclBcast(rb, count, DT[di].t, root, comm, s));
  cudaStreamSynchronize(s);
  fill(di, 0, root, k, ex, count, 0);
  report("bcast", di, "none", count, root, count_mismatch(rb, ex, count, es));
  /* Send/Recv: ring shift inside a group, then all-to-all pairs */
  k = (*tag)++;
  fill(di, 0, me, k, sb, count, 0);
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclSend(sb, count, DT[di].t, (me + 1) % nr, comm, s));
  NCCLCHECK(ncclRecv(rb, count, DT[di].t, (me - 1 + nr) % nr, comm, s));
  NCCLCHECK(ncclGroupEnd());
  cudaStreamSynchronize(s);
  fill(di, 0, (me - 1 + nr) % nr, k, ex, count, 0);
  report("sendrecv_ring", di, "none", count, (me - 1 + nr) % nr, count_mismatch(rb, ex, count, es));
  k = (*tag)++;
  NCCLCHECK(ncclGroupStart());
  for (int p = 0; p < nr; p++) {
    fill(di, 0, me * 16 + p, k, sb + (size_t)p * count * es, count, 0);
    NCCLCHECK(ncclSend(sb + (size_t)p * count * es, count, DT[di].t, p, comm, s));
    NCCLCHECK(ncclRecv(rb + (size_t)p * count * es, count, DT[di].t, p, comm, s));
  }
  NCCLCHECK(ncclGroupEnd());
  cudaStreamSynchronize(s);
  for (int p = 0; p < nr; p++) fill(di, 0, p * 16 + me, k, ex + (size_t)p * count * es, count, 0);
  report("alltoall_p2p", di, "none", count, 0, count_mismatch(rb, ex, big, es));
  cudaFree(sb);
  cudaFree(rb);
  free(ex);
}

static void *destroy_main(void *p) { ncclCommDestroy((ncclComm_t)p); return NULL; }

struct hold { sem_t go; };
static void hold_fn(void *p) { sem_wait(&((struct hold *)p)->go); }

static int selftest(const char *dtypes, size_t small, size_t large) {
  uint64_t tag = 1;
  int v = 0;
  NCCLCHECK(ncclGetVersion(&v));
  int cnt = -1, ur = -1;
  NCCLCHECK(ncclCommCount(g_comm, &cnt));
  NCCLCHECK(ncclCommUserRank(g_comm, &ur));
  printf("CHECK op=api dtype=none redop=none count=0 root=0 nranks=%d rank=%d result=%s mismatches=0 version=%d\n",
         g_world, g_rank, (cnt == g_world && ur == g_rank && v == 22105) ? "ok" : "FAIL", v);
  if (!(cnt == g_world && ur == g_rank && v == 22105)) g_fail = 1;
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", dtypes);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int di = dt_index(t);
    if (di < 0) DIE("unknown dtype %s", t);
    st_collectives(g_comm, g_stream, g_world, g_rank, di, small, &tag);
    if (large) st_collectives(g_comm, g_stream, g_world, g_rank, di, large, &tag);
  }
  /* Asynchrony: with the stream held by earlier work, the call must return at once. */
  struct hold h;
  sem_init(&h.go, 0, 0);
  cudaLaunchHostFunc(g_stream, hold_fn, &h);
  float *x;
  cudaMalloc((void **)&x, 64 * sizeof(float));
  for (int i = 0; i < 64; i++) x[i] = 1.0f;
  uint64_t t0 = now_ns();
  NCCLCHECK(ncclAllReduce(x, x, 64, ncclFloat32, ncclSum, g_comm, g_stream));
  uint64_t call_ns = now_ns() - t0;
  int pending = cudaStreamQuery(g_stream) == cudaErrorNotReady;
  sem_post(&h.go);
  cudaStreamSynchronize(g_stream);
  int ok = pending && call_ns < 50000000ull && x[0] == (float)g_world && x[63] == (float)g_world;
  printf("CHECK op=async dtype=float32 redop=sum count=64 root=0 nranks=%d rank=%d result=%s mismatches=%d call_us=%llu\n",
         g_world, g_rank, ok ? "ok" : "FAIL", ok ? 0 : 1, (unsigned long long)(call_ns / 1000));
  if (!ok) g_fail = 1;
  /* ncclCommSplit: even/odd ranks, reversed order by key */
  ncclComm_t sub = NULL;
  NCCLCHECK(ncclCommSplit(g_comm, g_rank % 2, -g_rank, &sub, NULL));
  int sn = 0, sr = 0;
  ncclCommCount(sub, &sn);
  ncclCommUserRank(sub, &sr);
  int expect_n = (g_world + 1 - g_rank % 2) / 2;
  int expect_r = expect_n - 1 - g_rank / 2;
  float y[16];
  for (int i = 0; i < 16; i++) y[i] = (float)(g_rank + i);
  NCCLCHECK(ncclAllReduce(y, y, 16, ncclFloat32, ncclSum, sub, g_stream));
  cudaStreamSynchronize(g_stream);
  float want = 0;
  for (int r = g_rank % 2; r < g_world; r += 2) want += (float)r;
  ok = sn == expect_n && sr == expect_r && y[0] == want && y[15] == want + 15 * sn;
  printf("CHECK op=split dtype=float32 redop=sum count=16 root=0 nranks=%d rank=%d result=%s mismatches=%d sub_nranks=%d sub_rank=%d\n",
         g_world, g_rank, ok ? "ok" : "FAIL", ok ? 0 : 1, sn, sr);
  if (!ok) g_fail = 1;
  NCCLCHECK(ncclCommDestroy(sub));
  /* ncclCommInitAll: two "devices" in this process, driven from one thread by a group */
  if (g_rank == 0) {
    ncclComm_t two[2];
    cudaStream_t ss[2];
    NCCLCHECK(ncclCommInitAll(two, 2, NULL));
    float a[2][8];
    NCCLCHECK(ncclGroupStart());
    for (int d = 0; d < 2; d++) {
      cudaStreamCreate(&ss[d]);
      for (int i = 0; i < 8; i++) a[d][i] = (float)(d * 10 + i);
      NCCLCHECK(ncclAllReduce(a[d], a[d], 8, ncclFloat32, ncclSum, two[d], ss[d]));
    }
    NCCLCHECK(ncclGroupEnd());
    cudaStreamSynchronize(ss[0]);
    cudaStreamSynchronize(ss[1]);
    ok = a[0][0] == 10.0f && a[1][7] == 24.0f;
    printf("CHECK op=initall dtype=float32 redop=sum count=8 root=0 nranks=2 rank=0 result=%s mismatches=%d\n",
           ok ? "ok" : "FAIL", ok ? 0 : 1);
    if (!ok) g_fail = 1;
    /* ncclCommDestroy is per communicator; with both in one process, destroy them concurrently */
    pthread_t dt;
    pthread_create(&dt, NULL, destroy_main, two[1]);
    ncclCommDestroy(two[0]);
    pthread_join(dt, NULL);
  }
  /* Invalid arguments are rejected, and leave an error string. */
  ncclResult_t bad = ncclAllReduce(x, x, 4, (ncclDataType_t)42, ncclSum, g_comm, g_stream);
  ok = bad == ncclInvalidArgument && strlen(ncclGetLastError(g_comm)) > 0 && strlen(ncclGetErrorString(bad)) > 0;
  printf("CHECK op=invalid dtype=none redop=none count=4 root=0 nranks=%d rank=%d result=%s mismatches=%d\n", g_world,
         g_rank, ok ? "ok" : "FAIL", ok ? 0 : 1);
  if (!ok) g_fail = 1;
  cudaFree(x);
  return g_fail;
}

/* ---------------- training loop ---------------- */
struct opts {
  const char *mode, *buckets, *dtype, *pattern, *skip_mode, *selftest_dtypes, *gate_file, *stop_file;
  int steps, check, skip_op;
  double compute_ms, straggle_ms, straggle_from_s, duration_s, pause_s, pause_from_s;
  size_t st_small, st_large;
  /* host-stuck: before enqueuing collective #stuck_op (or the first one --stuck-from-s after
     training began), spin or block in host code for stuck_s seconds (<= 0: forever) */
  const char *stuck_mode;
  long stuck_op;
  double stuck_from_s, stuck_s;
};

/* --pause-s: a slow checkpoint. The rank is busy in host code (here sleeping in 100 ms slices,
 * as a rank writing its shards would block in write(2)), outside every NCCL call, while its
 * peers have issued the next step's collectives and wait inside them. The name is kept out of
 * line so that a native stack shows where the rank is. */
static void __attribute__((noinline)) sslab_save_checkpoint(double seconds) {
  uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
  while (now_ns() < end) {
    double left_ms = (end - now_ns()) / 1e6;
    sleep_ms(left_ms < 100 ? left_ms : 100);
  }
}

/* --stuck-mode spin: a busy loop in host code (a Python `while not ready: pass`, a livelocked
 * data loader), on a CPU the whole time, outside every NCCL call. Out of line and not cloned so
 * that a native stack names it. */
static void __attribute__((noinline, noclone)) host_busy_loop(double seconds) {
  uint64_t end = seconds > 0 ? now_ns() + (uint64_t)(seconds * 1e9) : UINT64_MAX;
  volatile uint64_t x = 0;
  while (now_ns() < end)
    for (int i = 0; i < 200000; i++) x += i;
}

struct pipe_writer { int fd; double seconds; };
static void *pipe_writer_main(void *arg) {
  struct pipe_writer *w = arg;
  sleep_ms(w->seconds * 1e3);
  char c = 1;
  if (write(w->fd, &c, 1) != 1) { /* the reader then stays blocked: nothing better to do */ }
  return NULL;
}

/* --stuck-mode block: blocked in a syscall in host code: read(2) of a pipe nobody writes (a
 * data loader waiting on a dead worker, a lock never released), asleep, off CPU. A finite
 * --stuck-s has a thread write the byte that ends it. */
static void __attribute__((noinline, noclone)) host_blocked_read(double seconds) {
  int fds[2];
  if (pipe(fds) != 0) DIE("pipe: %s", strerror(errno));
  static struct pipe_writer w;
  if (seconds > 0) {
    pthread_t t;
    w.fd = fds[1];
    w.seconds = seconds;
    pthread_create(&t, NULL, pipe_writer_main, &w);
    pthread_detach(t);
  }
  char c;
  while (read(fds[0], &c, 1) < 0 && errno == EINTR) {}
  /* fds stay open: a writer thread may still hold the write end */
}

static void emit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emit(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  fflush(stdout);
}

struct pending { const char *op; int di; size_t n, out_n; char *rb; uint64_t k; };

static int train(struct opts *o) {
  int di = dt_index(o->dtype);
  if (di < 0) DIE("unknown dtype %s", o->dtype);
  size_t es = DT[di].es;
  size_t nb = 0, sizes[64];
  char bbuf[512];
  snprintf(bbuf, sizeof(bbuf), "%s", o->buckets);
  for (char *save = NULL, *t = strtok_r(bbuf, ",", &save); t && nb < 64; t = strtok_r(NULL, ",", &save))
    sizes[nb++] = (size_t)atoll(t);
  size_t maxn = 1;
  for (size_t i = 0; i < nb; i++) if (sizes[i] > maxn) maxn = sizes[i];
  size_t cap = maxn * g_world;
  char **sb = calloc(nb + 1, sizeof(char *)), **rb = calloc(nb + 1, sizeof(char *));
  for (size_t i = 0; i <= nb; i++) {
    cudaMalloc((void **)&sb[i], cap * es);
    cudaMalloc((void **)&rb[i], cap * es);
  }
  char *ex = malloc(cap * es);
  struct pending pend[160];
  uint64_t k = 0; /* global index of collectives issued on the world communicator */
  int skipped = 0, bad_total = 0;
  /* DDP-like start: parameters broadcast from rank 0. */
  {
    size_t n = sizes[0];
    fill(di, 0, g_rank, 1000000, sb[0], n, 0);
    work_pre();
    NCCLCHECK(ncclBroadcast(sb[0], rb[0], n, DT[di].t, 0, g_comm, g_stream));
    work_add("BROADCAST", n, n);
    k++;
    cudaStreamSynchronize(g_stream);
    fill(di, 0, 0, 1000000, ex, n, 0);
    if (o->check && count_mismatch(rb[0], ex, n, es)) { bad_total++; emit("{\"ev\":\"checkfail\",\"op\":\"broadcast\"}"); }
    work_step_done();
  }
  uint64_t t_start = now_ns();
  emit("{\"ev\":\"train_start\",\"t_ns\":%llu,\"rank\":%d,\"world_size\":%d,\"pid\":%d}",
       (unsigned long long)t_start, g_rank, g_world, (int)getpid());
  int straggling = 0, paused = 0, stuck = 0;
  long stop_at = -1; /* --stop-file: the step number to stop before, once the launcher wrote it */
  for (int step = 0; step < o->steps; step++) {
    if (o->duration_s > 0 && (now_ns() - t_start) / 1e9 > o->duration_s) break;
    if (o->stop_file && stop_at < 0) {
      FILE *f = fopen(o->stop_file, "r");
      if (f) {
        long v;
        if (fscanf(f, "%ld", &v) == 1 && v >= 0) {
          stop_at = v;
          emit("{\"ev\":\"stop_seen\",\"t_ns\":%llu,\"rank\":%d,\"step\":%d,\"stop_at\":%ld}",
               (unsigned long long)now_ns(), g_rank, step, v);
        }
        fclose(f);
      }
    }
    if (stop_at >= 0 && step >= stop_at) break;
    double compute = o->compute_ms;
    if (o->straggle_ms > 0 && (now_ns() - t_start) / 1e9 >= o->straggle_from_s) {
      if (!straggling) emit("{\"ev\":\"straggle\",\"t_ns\":%llu,\"rank\":%d,\"step\":%d,\"extra_ms\":%.1f}",
                            (unsigned long long)now_ns(), g_rank, step, o->straggle_ms);
      straggling = 1;
      compute += o->straggle_ms;
    }
    uint64_t c0 = now_ns();
    if (g_compute_busy) busy_ms(compute); else sleep_ms(compute);
    if (o->pause_s > 0 && !paused && (now_ns() - t_start) / 1e9 >= o->pause_from_s) {
      paused = 1;   /* after this step's compute, before its collectives: the peers wait inside them */
      uint64_t p0 = now_ns();
      emit("{\"ev\":\"checkpoint_start\",\"t_ns\":%llu,\"rank\":%d,\"step\":%d,\"ops_issued\":%llu,"
           "\"seconds\":%.3f}", (unsigned long long)p0, g_rank, step, (unsigned long long)k, o->pause_s);
      sslab_save_checkpoint(o->pause_s);
      emit("{\"ev\":\"checkpoint_end\",\"t_ns\":%llu,\"rank\":%d,\"step\":%d,\"held_ms\":%.3f}",
           (unsigned long long)now_ns(), g_rank, step, (now_ns() - p0) / 1e6);
    }
    uint64_t t_enter = now_ns();
    int np = 0;
    /* the burst: one entry per bucket (pattern decides the op), then the loss scalar */
    for (size_t b = 0; b <= nb && np < 150; b++) {
      size_t n = b < nb ? sizes[b] : 1;
      const char *kind;
      if (b == nb) kind = "allreduce";
      else if (!strcmp(o->pattern, "fsdp")) kind = (b % 2 == 0) ? "allgather" : "reducescatter";
      else if (!strcmp(o->pattern, "mixed")) kind = (b % 3 == 0) ? "allreduce" : (b % 3 == 1) ? "allgather" : "reducescatter";
      else kind = "allreduce";
      if (!stuck && ((o->stuck_op >= 0 && (int64_t)k == o->stuck_op) ||
                     (o->stuck_from_s >= 0 && b == 0 && (now_ns() - t_start) / 1e9 >= o->stuck_from_s))) {
        /* host-stuck: this rank stops before enqueuing collective #k (its peers enqueue it and
           wait inside it). From a time, before a burst's first collective: every earlier one was
           synchronized; at an op inside a burst, the burst's earlier ones complete on the GPU but
           no host wait of this rank ever returns for them */
        stuck = 1;
        int spin = !strcmp(o->stuck_mode, "spin");
        uint64_t s0 = now_ns();
        emit("{\"ev\":\"host_stuck\",\"t_ns\":%llu,\"rank\":%d,\"op_index\":%llu,\"op\":\"%s\",\"step\":%d,"
             "\"mode\":\"%s\",\"function\":\"%s\",\"syscall\":%s,\"tid\":%d,\"seconds\":%.3f}",
             (unsigned long long)s0, g_rank, (unsigned long long)k, kind, step, o->stuck_mode,
             spin ? "host_busy_loop" : "host_blocked_read", spin ? "null" : "\"read\"", (int)gettid(), o->stuck_s);
        if (spin) host_busy_loop(o->stuck_s); else host_blocked_read(o->stuck_s);
        emit("{\"ev\":\"host_unstuck\",\"t_ns\":%llu,\"rank\":%d,\"held_ms\":%.3f}", (unsigned long long)now_ns(),
             g_rank, (now_ns() - s0) / 1e6);
      }
      if (o->skip_op >= 0 && (int64_t)k == o->skip_op && !skipped) {
        skipped = 1;
        emit("{\"ev\":\"skip\",\"t_ns\":%llu,\"rank\":%d,\"op_index\":%llu,\"op\":\"%s\",\"step\":%d,\"mode\":\"%s\"}",
             (unsigned long long)now_ns(), g_rank, (unsigned long long)k, kind, step, o->skip_mode);
        if (!strcmp(o->skip_mode, "stop")) {
          /* The rank took another code path: it finishes what it issued and
           * then waits on something that never comes (no more collectives). */
          cudaStreamSynchronize(g_stream);
          work_step_done();
          emit("{\"ev\":\"diverged\",\"t_ns\":%llu,\"rank\":%d,\"ops_issued\":%llu}", (unsigned long long)now_ns(),
               g_rank, (unsigned long long)k);
          for (;;) pause();
        }
        k++;
        continue;
      }
      struct pending *p = &pend[np++];
      p->op = kind; p->di = di; p->n = n; p->rb = rb[b]; p->k = 5000 + k;
      if (!strcmp(kind, "allreduce")) {
        fill(di, 0, g_rank, p->k, sb[b], n, 0);
        work_pre();
        NCCLCHECK(ncclAllReduce(sb[b], rb[b], n, DT[di].t, ncclSum, g_comm, g_stream));
        p->out_n = n;
        work_add("ALLREDUCE", n, n);
      } else if (!strcmp(kind, "allgather")) {
        size_t per = n / g_world ? n / g_world : 1;
        fill(di, 0, g_rank, p->k, sb[b], per, 0);
        work_pre();
        NCCLCHECK(ncclAllGather(sb[b], rb[b], per, DT[di].t, g_comm, g_stream));
        p->n = per; p->out_n = per * g_world;
        work_add("_ALLGATHER_BASE", per, per * g_world);
      } else {
        size_t per = n / g_world ? n / g_world : 1;
        fill(di, 0, g_rank, p->k, sb[b], per * g_world, 0);
        work_pre();
        NCCLCHECK(ncclReduceScatter(sb[b], rb[b], per, DT[di].t, ncclSum, g_comm, g_stream));
        p->n = per; p->out_n = per;
        work_add("_REDUCE_SCATTER_BASE", per * g_world, per);
      }
      k++;
    }
    cudaStreamSynchronize(g_stream);
    uint64_t t_done = now_ns();
    work_step_done();
    int bad = 0;
    if (o->check && !skipped) {
      for (int i = 0; i < np; i++) {
        struct pending *p = &pend[i];
        if (!strcmp(p->op, "allreduce")) for (size_t j = 0; j < p->n; j++) expect(di, 0, g_world, p->k, j, ex, j);
        else if (!strcmp(p->op, "allgather")) for (int r = 0; r < g_world; r++) fill(di, 0, r, p->k, ex + (size_t)r * p->n * es, p->n, 0);
        else for (size_t j = 0; j < p->n; j++) expect(di, 0, g_world, p->k, (size_t)g_rank * p->n + j, ex, j);
        if (count_mismatch(p->rb, ex, p->out_n, es)) bad++;
      }
    }
    bad_total += bad;
    emit("{\"ev\":\"step\",\"t_ns\":%llu,\"rank\":%d,\"step\":%d,\"compute_start_ns\":%llu,\"enter_ns\":%llu,"
         "\"compute_ms\":%.3f,\"wait_ms\":%.3f,\"ops\":%d,\"ops_issued\":%llu,\"ok\":%s}",
         (unsigned long long)t_done, g_rank, step, (unsigned long long)c0, (unsigned long long)t_enter, compute,
         (t_done - t_enter) / 1e6, np, (unsigned long long)k, (o->check && !skipped) ? (bad ? "false" : "true") : "null");
  }
  emit("{\"ev\":\"done\",\"t_ns\":%llu,\"rank\":%d,\"ops_issued\":%llu,\"check_failures\":%d}",
       (unsigned long long)now_ns(), g_rank, (unsigned long long)k, bad_total);
  return bad_total ? 1 : 0;
}

int main(int argc, char **argv) {
  struct opts o = {"train", "1048576,1048576,262144", "float32", "ddp", "stop", "int8,uint8,int32,uint32,int64,uint64,float16,float32,float64,bfloat16",
                   NULL, NULL, 20, 1, -1, 50, 0, 0, 0, 0, 0, 1003, 0, "spin", -1, -1, 0};
  static struct option lo[] = {
    {"mode", 1, 0, 'm'}, {"steps", 1, 0, 's'}, {"compute-ms", 1, 0, 'c'}, {"buckets", 1, 0, 'b'},
    {"dtype", 1, 0, 'd'}, {"pattern", 1, 0, 'p'}, {"no-check", 0, 0, 'N'}, {"skip-op", 1, 0, 'k'},
    {"skip-mode", 1, 0, 'K'}, {"straggle-ms", 1, 0, 'S'}, {"straggle-from-s", 1, 0, 'F'},
    {"watchdog-timeout-s", 1, 0, 'W'}, {"duration-s", 1, 0, 'D'}, {"selftest-dtypes", 1, 0, 'T'},
    {"selftest-count", 1, 0, 'C'}, {"selftest-large", 1, 0, 'L'}, {"gate-file", 1, 0, 'G'},
    {"stop-file", 1, 0, 'P'}, {"compute-busy", 0, 0, 'B'}, {"pause-s", 1, 0, 'Z'}, {"pause-from-s", 1, 0, 'z'},
    {"stuck-at-op", 1, 0, 'o'}, {"stuck-from-s", 1, 0, 'f'}, {"stuck-mode", 1, 0, 'M'}, {"stuck-s", 1, 0, 'u'},
    {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 'm': o.mode = optarg; break;
      case 's': o.steps = atoi(optarg); break;
      case 'c': o.compute_ms = atof(optarg); break;
      case 'b': o.buckets = optarg; break;
      case 'd': o.dtype = optarg; break;
      case 'p': o.pattern = optarg; break;
      case 'N': o.check = 0; break;
      case 'k': o.skip_op = atoi(optarg); break;
      case 'K': o.skip_mode = optarg; break;
      case 'S': o.straggle_ms = atof(optarg); break;
      case 'F': o.straggle_from_s = atof(optarg); break;
      case 'W': g_timeout_s = atof(optarg); break;
      case 'D': o.duration_s = atof(optarg); break;
      case 'T': o.selftest_dtypes = optarg; break;
      case 'C': o.st_small = (size_t)atoll(optarg); break;
      case 'L': o.st_large = (size_t)atoll(optarg); break;
      case 'G': o.gate_file = optarg; break;
      case 'P': o.stop_file = optarg; break;
      case 'B': g_compute_busy = 1; break;
      case 'Z': o.pause_s = atof(optarg); break;
      case 'z': o.pause_from_s = atof(optarg); break;
      case 'o': o.stuck_op = atol(optarg); break;
      case 'f': o.stuck_from_s = atof(optarg); break;
      case 'M':
        if (strcmp(optarg, "spin") && strcmp(optarg, "block")) { fprintf(stderr, "--stuck-mode spin|block\n"); return 2; }
        o.stuck_mode = optarg;
        break;
      case 'u': o.stuck_s = atof(optarg); break;
      default: fprintf(stderr, "usage: sslab_rank [--mode train|selftest] [options]\n"); return 2;
    }
  }
  const char *e;
  g_rank = (e = getenv("RANK")) ? atoi(e) : 0;
  g_world = (e = getenv("WORLD_SIZE")) ? atoi(e) : 1;
  g_local = (e = getenv("LOCAL_RANK")) ? atoi(e) : 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  cudaSetDevice(g_local);
  cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
  if (o.gate_file) { /* the launcher opens the gate once its captures are attached */
    while (access(o.gate_file, F_OK) != 0) sleep_ms(20);
    emit("{\"ev\":\"gate_open\",\"t_ns\":%llu,\"rank\":%d}", (unsigned long long)now_ns(), g_rank);
  }
  ncclUniqueId id;
  exchange_id(&id);
  /* init-hang faults (the launcher sets them on the faulty rank only): SSLAB_INIT_HANG=1 never
     calls ncclCommInitRank (the rank got the id, then hangs in host code: its peers wait in
     init); SSLAB_INIT_DELAY_MS calls it that much later (the launcher drops its bootstrap
     traffic meanwhile) */
  if ((e = getenv("SSLAB_INIT_HANG")) && atoi(e) == 1) {
    emit("{\"ev\":\"init_skip\",\"t_ns\":%llu,\"rank\":%d}", (unsigned long long)now_ns(), g_rank);
    for (;;) sleep_ms(1000);
  }
  if ((e = getenv("SSLAB_INIT_DELAY_MS"))) sleep_ms(atoi(e));
  emit("{\"ev\":\"init_start\",\"t_ns\":%llu,\"rank\":%d}", (unsigned long long)now_ns(), g_rank);
  NCCLCHECK(ncclCommInitRank(&g_comm, g_world, id, g_rank));
  emit("{\"ev\":\"init_done\",\"t_ns\":%llu,\"rank\":%d,\"comm\":\"%p\",\"stream\":\"%p\"}", (unsigned long long)now_ns(),
       g_rank, (void *)g_comm, (void *)g_stream);
  fr_init(o.dtype);
  pthread_t wd;
  pthread_create(&wd, NULL, watchdog_main, NULL);
  pthread_setname_np(wd, "pt_nccl_watchdg"); /* the name torch gives its watchdog thread */
  int rc;
  if (!strcmp(o.mode, "selftest")) rc = selftest(o.selftest_dtypes, o.st_small, o.st_large);
  else { g_fr_main_line = __LINE__ + 1;
    rc = train(&o); }
  cudaStreamSynchronize(g_stream);
  pthread_mutex_lock(&g_wmu); /* stop the watchdog from acting on a destroyed comm */
  ncclComm_t c = g_comm;
  g_comm = NULL;
  pthread_mutex_unlock(&g_wmu);
  ncclCommDestroy(c);
  emit("{\"ev\":\"exit\",\"t_ns\":%llu,\"rank\":%d,\"rc\":%d}", (unsigned long long)now_ns(), g_rank, rc);
  return rc;
}
