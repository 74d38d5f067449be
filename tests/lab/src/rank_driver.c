/* stallscope lab: one rank of a training-like job (sslab_rank).
 *
 * Reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT like a
 * torchrun worker, exchanges the ncclUniqueId through a tiny TCP store on
 * MASTER_ADDR:MASTER_PORT (what torch's TCPStore does), initialises one
 * communicator with ncclCommInitRank and then loops: "compute" (sleep), a
 * burst of collectives enqueued on one stream, cudaStreamSynchronize, check.
 *
 * Modes
 *   --mode train     the loop above (default); faults: --skip-op, --straggle-*
 *   --mode selftest  every op x dtype x reduction checked against an
 *                    independently computed expectation; ncclCommSplit,
 *                    ncclCommInitAll, groups, send/recv and asynchrony too.
 * Events are JSON lines on stdout ({"ev": ...}); checks are "CHECK ..." lines.
 * A watchdog thread mirrors PyTorch's ProcessGroupNCCL watchdog: it polls
 * ncclCommGetAsyncError and a collective timeout, logs in the same format and
 * takes the process down.
 */
#define _GNU_SOURCE
#include "nccl.h"

#include <arpa/inet.h>
#include <errno.h>
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

static void torch_log(char sev, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void torch_log(char sev, int line, const char *fmt, ...) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "[rank%d]:[%c%02d%02d %02d:%02d:%02d.%06ld000 ProcessGroupNCCL.cpp:%d] %s\n", g_rank, sev,
          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)tv.tv_usec, line, msg);
  fflush(stderr);
}
static void *watchdog_main(void *p) {
  (void)p;
  for (;;) {
    sleep_ms(100);
    ncclResult_t ae = ncclSuccess;
    pthread_mutex_lock(&g_wmu);
    if (!g_comm) { pthread_mutex_unlock(&g_wmu); continue; }
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
      pthread_mutex_unlock(&g_wmu);
      ncclCommAbort(g_comm);
      _exit(timed_out ? 3 : 4);
    }
    pthread_mutex_unlock(&g_wmu);
  }
  return NULL;
}
static void work_add(const char *type, size_t in, size_t out) {
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
  }
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
  const char *mode, *buckets, *dtype, *pattern, *skip_mode, *selftest_dtypes;
  int steps, check, skip_op;
  double compute_ms, straggle_ms, straggle_from_s, duration_s;
  size_t st_small, st_large;
};

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
  int straggling = 0;
  for (int step = 0; step < o->steps; step++) {
    if (o->duration_s > 0 && (now_ns() - t_start) / 1e9 > o->duration_s) break;
    double compute = o->compute_ms;
    if (o->straggle_ms > 0 && (now_ns() - t_start) / 1e9 >= o->straggle_from_s) {
      if (!straggling) emit("{\"ev\":\"straggle\",\"t_ns\":%llu,\"rank\":%d,\"step\":%d,\"extra_ms\":%.1f}",
                            (unsigned long long)now_ns(), g_rank, step, o->straggle_ms);
      straggling = 1;
      compute += o->straggle_ms;
    }
    uint64_t c0 = now_ns();
    sleep_ms(compute);
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
        NCCLCHECK(ncclAllReduce(sb[b], rb[b], n, DT[di].t, ncclSum, g_comm, g_stream));
        p->out_n = n;
        work_add("ALLREDUCE", n, n);
      } else if (!strcmp(kind, "allgather")) {
        size_t per = n / g_world ? n / g_world : 1;
        fill(di, 0, g_rank, p->k, sb[b], per, 0);
        NCCLCHECK(ncclAllGather(sb[b], rb[b], per, DT[di].t, g_comm, g_stream));
        p->n = per; p->out_n = per * g_world;
        work_add("_ALLGATHER_BASE", per, per * g_world);
      } else {
        size_t per = n / g_world ? n / g_world : 1;
        fill(di, 0, g_rank, p->k, sb[b], per * g_world, 0);
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
                   20, 1, -1, 50, 0, 0, 0, 1003, 0};
  static struct option lo[] = {
    {"mode", 1, 0, 'm'}, {"steps", 1, 0, 's'}, {"compute-ms", 1, 0, 'c'}, {"buckets", 1, 0, 'b'},
    {"dtype", 1, 0, 'd'}, {"pattern", 1, 0, 'p'}, {"no-check", 0, 0, 'N'}, {"skip-op", 1, 0, 'k'},
    {"skip-mode", 1, 0, 'K'}, {"straggle-ms", 1, 0, 'S'}, {"straggle-from-s", 1, 0, 'F'},
    {"watchdog-timeout-s", 1, 0, 'W'}, {"duration-s", 1, 0, 'D'}, {"selftest-dtypes", 1, 0, 'T'},
    {"selftest-count", 1, 0, 'C'}, {"selftest-large", 1, 0, 'L'}, {0, 0, 0, 0}};
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
  ncclUniqueId id;
  exchange_id(&id);
  emit("{\"ev\":\"init_start\",\"t_ns\":%llu,\"rank\":%d}", (unsigned long long)now_ns(), g_rank);
  NCCLCHECK(ncclCommInitRank(&g_comm, g_world, id, g_rank));
  emit("{\"ev\":\"init_done\",\"t_ns\":%llu,\"rank\":%d,\"comm\":\"%p\",\"stream\":\"%p\"}", (unsigned long long)now_ns(),
       g_rank, (void *)g_comm, (void *)g_stream);
  pthread_t wd;
  pthread_create(&wd, NULL, watchdog_main, NULL);
  int rc;
  if (!strcmp(o.mode, "selftest")) rc = selftest(o.selftest_dtypes, o.st_small, o.st_large);
  else rc = train(&o);
  cudaStreamSynchronize(g_stream);
  pthread_mutex_lock(&g_wmu); /* stop the watchdog from acting on a destroyed comm */
  ncclComm_t c = g_comm;
  g_comm = NULL;
  pthread_mutex_unlock(&g_wmu);
  ncclCommDestroy(c);
  emit("{\"ev\":\"exit\",\"t_ns\":%llu,\"rank\":%d,\"rc\":%d}", (unsigned long long)now_ns(), g_rank, rc);
  return rc;
}
