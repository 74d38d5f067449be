/* stallscope lab: libnccl.so.2, NCCL's public ABI over plain TCP sockets.
 *
 * What is real: the exported symbols and their signatures/enum values (nccl.h),
 * the 128-byte ncclUniqueId passed by value and carrying the bootstrap root's
 * socket address (magic + sockaddr, like ncclBootstrapHandle), a bootstrap
 * phase through that root, ring connections between neighbours (rank r sends
 * to (r+1)%N) with TCP_NODELAY and chunked sends, one TCP connection per
 * channel per direction, lazily connected p2p sockets for ncclSend/ncclRecv,
 * asynchronous execution on the caller's CUDA stream (cudaLaunchHostFunc of
 * the lab's libcudart), per-communicator opCount semantics of NCCL >= 2.12
 * (one increment per launch; ops of one group share it), and NCCL_DEBUG /
 * NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE output in NCCL 2.21's line formats.
 *
 * What is not: GPUs, kernels, tree/NVLS algorithms, the proxy thread, IB.
 *
 * Lab-only extra: with SSLAB_TRUTH_FILE set, a JSON line is appended per init,
 * enqueue, completion and error (ground truth for the tests and scenarios).
 * Lab-only fault: SSLAB_GPU_HANG_AT_OP=<opCount> (or SSLAB_GPU_HANG_TRIGGER=<path>:
 * the first launch that starts once <path> exists) makes the stream thread, the
 * "GPU", hang inside that launch of a communicator made by ncclCommInitRank*:
 * it never sends its share and never completes (sslab_gpu_kernel_hang()).
 */
#define _GNU_SOURCE
#include "nccl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define NCCL_VERSION_STRING "2.21.5"
#define CUDA_VERSION_STRING "12.4"
/* as NCCL's src/init.cc: one literal, so that the library itself tells its version ("strings") */
#define VERSION_STRING "NCCL version " NCCL_VERSION_STRING "+cuda" CUDA_VERSION_STRING
#define LAB_MAGIC 0x53534c41425f4e43ULL /* "SSLAB_NC" */
#define MAXCH 8

/* ------------------------------------------------------------------ */
/* time, logging                                                        */
/* ------------------------------------------------------------------ */
static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

enum { LOG_NONE = 0, LOG_VERSION = 1, LOG_WARN = 2, LOG_INFO = 3, LOG_ABORT = 4, LOG_TRACE = 5 };
enum {
  S_INIT = 0x1, S_COLL = 0x2, S_P2P = 0x4, S_SHM = 0x8, S_NET = 0x10, S_GRAPH = 0x20, S_TUNING = 0x40,
  S_ENV = 0x80, S_ALLOC = 0x100, S_CALL = 0x200, S_PROXY = 0x400, S_NVLS = 0x800, S_BOOTSTRAP = 0x1000,
  S_REG = 0x2000, S_ALL = ~0
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_level = LOG_NONE;
static uint64_t g_mask = S_INIT | S_ENV;
static FILE *g_log;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_host[256];
static int g_truth_fd = -1;
static __thread char t_last_error[2048];

static void debug_init(void) {
  gethostname(g_host, sizeof(g_host) - 1);
  char *dot = strchr(g_host, '.');
  if (dot) *dot = 0;
  const char *lv = getenv("NCCL_DEBUG");
  if (lv) {
    if (!strcasecmp(lv, "VERSION")) g_level = LOG_VERSION;
    else if (!strcasecmp(lv, "WARN")) g_level = LOG_WARN;
    else if (!strcasecmp(lv, "INFO")) g_level = LOG_INFO;
    else if (!strcasecmp(lv, "ABORT")) g_level = LOG_ABORT;
    else if (!strcasecmp(lv, "TRACE")) g_level = LOG_TRACE;
  }
  const char *ss = getenv("NCCL_DEBUG_SUBSYS");
  if (ss) {
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", ss);
    int invert = buf[0] == '^';
    uint64_t m = invert ? (uint64_t)S_ALL : 0;
    static const struct { const char *n; uint64_t v; } names[] = {
      {"INIT", S_INIT}, {"COLL", S_COLL}, {"P2P", S_P2P}, {"SHM", S_SHM}, {"NET", S_NET},
      {"GRAPH", S_GRAPH}, {"TUNING", S_TUNING}, {"ENV", S_ENV}, {"ALLOC", S_ALLOC}, {"CALL", S_CALL},
      {"PROXY", S_PROXY}, {"NVLS", S_NVLS}, {"BOOTSTRAP", S_BOOTSTRAP}, {"REG", S_REG}, {"ALL", (uint64_t)S_ALL}};
    char *save = NULL;
    for (char *t = strtok_r(buf + invert, ",", &save); t; t = strtok_r(NULL, ",", &save))
      for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcasecmp(t, names[i].n)) m = invert ? (m & ~names[i].v) : (m | names[i].v);
    g_mask = m;
  }
  const char *df = getenv("NCCL_DEBUG_FILE");
  if (df && g_level > LOG_NONE) {
    char path[4096];
    size_t o = 0;
    for (const char *p = df; *p && o < sizeof(path) - 64; p++) {
      if (p[0] == '%' && p[1] == 'h') { o += snprintf(path + o, sizeof(path) - o, "%s", g_host); p++; }
      else if (p[0] == '%' && p[1] == 'p') { o += snprintf(path + o, sizeof(path) - o, "%d", (int)getpid()); p++; }
      else path[o++] = *p;
    }
    path[o] = 0;
    g_log = fopen(path, "a");
  }
  if (!g_log) g_log = stdout;
  else setvbuf(g_log, NULL, _IOLBF, 0);
  const char *tf = getenv("SSLAB_TRUTH_FILE");
  if (tf && *tf) g_truth_fd = open(tf, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}
static void ensure_init(void) { pthread_once(&g_once, debug_init); }

static int cur_dev(void) {
  int d = 0;
  cudaGetDevice(&d);
  return d;
}

static void vlog(int level, uint64_t mask, const char *file, int line, const char *fmt, va_list ap) {
  ensure_init();
  if (level > g_level) return;
  if (level == LOG_INFO && !(mask & g_mask)) return;
  char msg[2048];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  int tid = (int)syscall(SYS_gettid);
  pthread_mutex_lock(&g_log_mu);
  if (level == LOG_WARN)
    fprintf(g_log, "\n%s:%d:%d [%d] %s:%d NCCL WARN %s\n", g_host, (int)getpid(), tid, cur_dev(), file, line, msg);
  else
    fprintf(g_log, "%s:%d:%d [%d] NCCL INFO %s\n", g_host, (int)getpid(), tid, cur_dev(), msg);
  fflush(g_log);
  pthread_mutex_unlock(&g_log_mu);
  if (level == LOG_WARN) snprintf(t_last_error, sizeof(t_last_error), "%s", msg);
}
static void INFO(uint64_t mask, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void INFO(uint64_t mask, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(LOG_INFO, mask, NULL, 0, fmt, ap);
  va_end(ap);
}
static void warn_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void warn_at(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(LOG_WARN, 0, file, line, fmt, ap);
  va_end(ap);
}
#define WARN_AT(file, line, ...) warn_at(file, line, __VA_ARGS__)

static void truth(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void truth(const char *fmt, ...) {
  ensure_init();
  if (g_truth_fd < 0) return;
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf) - 2, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > (int)sizeof(buf) - 2) n = sizeof(buf) - 2;
  buf[n++] = '\n';
  ssize_t w = write(g_truth_fd, buf, n); /* O_APPEND: one atomic line */
  (void)w;
}

/* ------------------------------------------------------------------ */
/* communicator ids                                                     */
/* ------------------------------------------------------------------ */
static uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* stallscope's comm_id_hash (tests/lab/ids.py comm_id_fold). */
static uint64_t comm_id_fold(const ncclUniqueId *id) {
  uint64_t h = 0, w;
  for (int i = 0; i < 16; i++) {
    memcpy(&w, id->internal + 8 * i, 8);
    h = splitmix64(h ^ w);
  }
  return h;
}
/* NCCL's getHash() as printed in "commId 0x..." (DJB2a over signed chars). */
static uint64_t nccl_comm_hash(const ncclUniqueId *id) {
  uint64_t h = 5381;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) h = ((h << 5) + h) ^ (uint64_t)(int64_t)(signed char)id->internal[i];
  return h;
}

/* The id's layout, like NCCL's ncclBootstrapHandle: magic + socket address. */
struct boot_handle {
  uint64_t magic;
  union { struct sockaddr sa; struct sockaddr_in sin; struct sockaddr_in6 sin6; } addr;
};

/* ------------------------------------------------------------------ */
/* sockets                                                              */
/* ------------------------------------------------------------------ */
static const char *addr_str(const struct sockaddr_in *a, char *buf, size_t n) {
  char ip[64];
  inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
  snprintf(buf, n, "%s<%d>", ip, ntohs(a->sin_port));
  return buf;
}
static int send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w; n -= (size_t)w;
  }
  return 0;
}
static int recv_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t r = recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r; n -= (size_t)r;
  }
  return 0;
}
static void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}
static void set_nonblock(int fd, int on) {
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}
static int listen_on(struct sockaddr_in *addr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (struct sockaddr *)addr, sizeof(*addr)) != 0 || listen(fd, 512) != 0) {
    close(fd);
    return -1;
  }
  socklen_t l = sizeof(*addr);
  getsockname(fd, (struct sockaddr *)addr, &l);
  return fd;
}
/* Connect with retries (peers may not listen yet), like NCCL's ncclSocketConnect. */
static int connect_retry(const struct sockaddr_in *addr, int timeout_ms) {
  uint64_t t0 = mono_ns();
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0) return fd;
    int e = errno;
    close(fd);
    if ((e != ECONNREFUSED && e != ETIMEDOUT && e != EHOSTUNREACH && e != ENETUNREACH && e != EINTR) ||
        (mono_ns() - t0) / 1000000 > (uint64_t)timeout_ms) {
      errno = e;
      return -1;
    }
    usleep(20000);
  }
}

/* Local interface selection: NCCL_SOCKET_IFNAME (prefix match, "=" exact,
 * "^" exclude) or the first non-loopback IPv4 interface that is up. */
static int ifname_match(const char *name, const char *spec) {
  if (!spec || !*spec) return strncmp(name, "lo", 2) != 0 && strncmp(name, "docker", 6) != 0;
  int exclude = 0, exact = 0;
  if (*spec == '^') { exclude = 1; spec++; }
  if (*spec == '=') { exact = 1; spec++; }
  int hit = 0;
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", spec);
  char *save = NULL;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
    if (exact ? !strcmp(name, t) : !strncmp(name, t, strlen(t))) hit = 1;
  return exclude ? !hit : hit;
}
static int find_interface(char *ifname, size_t n, struct sockaddr_in *out) {
  const char *spec = getenv("NCCL_SOCKET_IFNAME");
  struct ifaddrs *ifs = NULL, *best = NULL;
  if (getifaddrs(&ifs) != 0) return -1;
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    if (ifname_match(i->ifa_name, spec)) { best = i; break; }
  }
  if (!best && !spec)
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP)) { best = i; break; }
  int rc = -1;
  if (best) {
    snprintf(ifname, n, "%s", best->ifa_name);
    memset(out, 0, sizeof(*out));
    memcpy(out, best->ifa_addr, sizeof(*out));
    out->sin_port = 0;
    rc = 0;
  }
  freeifaddrs(ifs);
  return rc;
}

static pthread_once_t g_net_once = PTHREAD_ONCE_INIT;
static char g_ifname[64];
static struct sockaddr_in g_ifaddr;
static int g_net_ok;
static void net_init(void) {
  ensure_init();
  const char *ib = getenv("NCCL_IB_DISABLE");
  if (ib) INFO(S_ENV, "NCCL_IB_DISABLE set by environment to %s.", ib);
  const char *spec = getenv("NCCL_SOCKET_IFNAME");
  if (spec) INFO(S_ENV, "NCCL_SOCKET_IFNAME set by environment to %s", spec);
  INFO(S_INIT | S_NET, "NET/Plugin: No plugin found (libnccl-net.so)");
  INFO(S_INIT | S_NET, "NET/Plugin: Using internal network plugin.");
  if (find_interface(g_ifname, sizeof(g_ifname), &g_ifaddr) == 0) {
    char ip[64];
    inet_ntop(AF_INET, &g_ifaddr.sin_addr, ip, sizeof(ip));
    INFO(S_INIT | S_NET, "NET/Socket : Using [0]%s:%s<0>", g_ifname, ip);
    INFO(S_INIT | S_NET, "Using network Socket");
    g_net_ok = 1;
  } else {
    WARN_AT("net.cc", 1061, "NET/Socket : no interface found");
  }
}

/* ------------------------------------------------------------------ */
/* bootstrap root                                                       */
/* ------------------------------------------------------------------ */
struct peer_info {
  uint64_t magic;
  int32_t rank, nranks, dev, pad;
  struct sockaddr_in boot, data;
};
struct root_arg {
  int fd;
  uint64_t magic;
};
static void *root_main(void *p) {
  struct root_arg *a = p;
  int nranks = -1, got = 0;
  int *fds = NULL;
  struct peer_info *info = NULL;
  while (nranks < 0 || got < nranks) {
    int c = accept4(a->fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) { if (errno == EINTR) continue; break; }
    struct peer_info pi;
    if (recv_all(c, &pi, sizeof(pi)) != 0 || pi.magic != a->magic || pi.nranks <= 0 || pi.rank < 0 ||
        pi.rank >= pi.nranks || (nranks > 0 && pi.nranks != nranks)) {
      WARN_AT("bootstrap.cc", 260, "Bootstrap Root : mismatch in rank count from procs %d : %d", nranks, pi.nranks);
      close(c);
      continue;
    }
    if (nranks < 0) {
      nranks = pi.nranks;
      fds = calloc(nranks, sizeof(int));
      info = calloc(nranks, sizeof(*info));
      for (int i = 0; i < nranks; i++) fds[i] = -1;
    }
    if (fds[pi.rank] >= 0) close(fds[pi.rank]); else got++;
    fds[pi.rank] = c;
    info[pi.rank] = pi;
  }
  if (nranks > 0 && got == nranks) {
    INFO(S_BOOTSTRAP, "Bootstrap Root : All %d ranks have checked in", nranks);
    for (int i = 0; i < nranks; i++) send_all(fds[i], info, sizeof(*info) * nranks);
  }
  if (fds) for (int i = 0; i < nranks; i++) if (fds[i] >= 0) close(fds[i]);
  free(fds);
  free(info);
  close(a->fd);
  free(a);
  return NULL;
}
static ncclResult_t start_root(ncclUniqueId *id, const struct sockaddr_in *where, uint64_t magic) {
  struct sockaddr_in a = *where;
  int fd = listen_on(&a);
  if (fd < 0) {
    WARN_AT("misc/socket.cc", 440, "Net : Socket creation failed : %s", strerror(errno));
    return ncclSystemError;
  }
  memset(id, 0, sizeof(*id));
  struct boot_handle h;
  memset(&h, 0, sizeof(h));
  h.magic = magic;
  h.addr.sin = a;
  memcpy(id->internal, &h, sizeof(h));
  struct root_arg *ra = malloc(sizeof(*ra));
  ra->fd = fd;
  ra->magic = magic;
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &at, root_main, ra) != 0) {
    close(fd);
    free(ra);
    return ncclSystemError;
  }
  pthread_setname_np(t, "NCCL BootstrapR");
  return ncclSuccess;
}
static uint64_t random64(void) {
  uint64_t r = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) { if (read(fd, &r, sizeof(r)) != sizeof(r)) r = 0; close(fd); }
  if (!r) r = mono_ns() ^ ((uint64_t)getpid() << 32);
  return r;
}
static int parse_comm_id_env(struct sockaddr_in *out) {
  const char *e = getenv("NCCL_COMM_ID");
  if (!e) return 0;
  char buf[128];
  snprintf(buf, sizeof(buf), "%s", e);
  char *colon = strrchr(buf, ':');
  if (!colon) return 0;
  *colon = 0;
  memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  out->sin_port = htons((uint16_t)atoi(colon + 1));
  return inet_pton(AF_INET, buf, &out->sin_addr) == 1;
}

/* ------------------------------------------------------------------ */
/* communicator                                                         */
/* ------------------------------------------------------------------ */
struct ncclComm {
  uint64_t magic;
  int rank, nranks, cudaDev, nch;
  int64_t busId;
  ncclUniqueId id;
  uint64_t commIdHash, ncclCommId;
  uint64_t opCount; /* next opCount (incremented per launch) */
  uint64_t seq;     /* per-communicator count of collective/p2p calls */
  struct peer_info *peers;
  int listen_fd, boot_listen_fd;
  int boot_send, boot_recv;
  int ring_send[MAXCH], ring_recv[MAXCH];
  int *p2p_send, *p2p_recv;
  int abort_pipe[2];
  int aborted;
  ncclResult_t async_error;
  int inflight;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t chunk_bytes;
  int world;        /* made by ncclCommInitRank*: the communicator SSLAB_GPU_HANG_* applies to */
  char last_error[2048];
};

struct hello { uint64_t magic; int32_t rank; int32_t type; int32_t ch; int32_t pad; };
enum { CONN_RING = 1, CONN_P2P = 2, CONN_BOOT = 3 };

static int64_t fake_bus_id(int dev) {
  static const int64_t ids[8] = {0x18000, 0x2a000, 0x3a000, 0x5d000, 0x9a000, 0xab000, 0xba000, 0xdb000};
  return ids[(dev < 0 ? 0 : dev) % 8];
}

/* accept one connection with a hello from the listener; blocking */
static int accept_hello(int lfd, struct hello *h) {
  for (;;) {
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) { if (errno == EINTR || errno == EAGAIN) { struct pollfd p = {lfd, POLLIN, 0}; poll(&p, 1, 1000); continue; } return -1; }
    set_nonblock(c, 0);
    if (recv_all(c, h, sizeof(*h)) != 0 || h->magic != LAB_MAGIC) {
      WARN_AT("misc/socket.cc", 441, "socketFinalizeAccept: wrong magic %lx != %llx", (unsigned long)h->magic, LAB_MAGIC);
      close(c);
      continue;
    }
    return c;
  }
}
static int connect_hello(const struct sockaddr_in *to, int rank, int type, int ch) {
  int fd = connect_retry(to, 60000);
  if (fd < 0) return -1;
  struct hello h = {LAB_MAGIC, rank, type, ch, 0};
  if (send_all(fd, &h, sizeof(h)) != 0) { close(fd); return -1; }
  return fd;
}

/* Peer address of each connected socket, remembered at setup: after a reset
 * getpeername() no longer answers, but the WARN line must still name the peer. */
#define FD_CACHE 4096
static char g_fd_peer[FD_CACHE][96];
static void remember_peer(int fd) {
  if (fd < 0 || fd >= FD_CACHE) return;
  struct sockaddr_in pa;
  socklen_t l = sizeof(pa);
  if (getpeername(fd, (struct sockaddr *)&pa, &l) == 0) addr_str(&pa, g_fd_peer[fd], sizeof(g_fd_peer[fd]));
}
static void peer_str(int fd, char *buf, size_t n) {
  struct sockaddr_in pa;
  socklen_t l = sizeof(pa);
  if (fd >= 0 && fd < FD_CACHE && g_fd_peer[fd][0]) snprintf(buf, n, "%s", g_fd_peer[fd]);
  else if (getpeername(fd, (struct sockaddr *)&pa, &l) == 0) addr_str(&pa, buf, n);
  else snprintf(buf, n, "unknown");
}

/* Pending p2p connections accepted while waiting for another one. */
static int stash_p2p(struct ncclComm *c, int fd, const struct hello *h) {
  if (h->type == CONN_P2P && h->rank >= 0 && h->rank < c->nranks && c->p2p_recv[h->rank] < 0) {
    set_nonblock(fd, 1);
    set_nodelay(fd);
    remember_peer(fd);
    c->p2p_recv[h->rank] = fd;
    return 1;
  }
  close(fd);
  return 0;
}

static void ring_channel_lines(struct ncclComm *c) {
  char line[1024];
  size_t o = 0;
  for (int i = 0; i < c->nranks && o < sizeof(line) - 8; i++) o += snprintf(line + o, sizeof(line) - o, " %3d", i);
  for (int ch = 0; ch < c->nch; ch++) INFO(S_INIT, "Channel %02d/%02d :%s", ch, c->nch, line);
  int prev = (c->rank - 1 + c->nranks) % c->nranks, next = (c->rank + 1) % c->nranks;
  for (int ch = 0; ch < c->nch; ch++)
    INFO(S_INIT | S_GRAPH, "Ring %02d : %d -> %d -> %d", ch, prev, c->rank, next);
  if (c->nranks > 1)
    for (int ch = 0; ch < c->nch; ch++) {
      INFO(S_INIT | S_NET, "Channel %02d/0 : %d[%d] -> %d[%d] [receive] via NET/Socket/%d", ch, prev,
           c->peers[prev].dev, c->rank, c->cudaDev, ch);
      INFO(S_INIT | S_NET, "Channel %02d/0 : %d[%d] -> %d[%d] [send] via NET/Socket/%d", ch, c->rank, c->cudaDev,
           next, c->peers[next].dev, ch);
    }
}

static ncclResult_t comm_init(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank, const char *func,
                              struct ncclComm *parent, int color, int key) {
  ensure_init();
  pthread_once(&g_net_once, net_init);
  if (!out || nranks < 1 || rank < 0 || rank >= nranks) {
    WARN_AT("init.cc", 1700, "Invalid rank requested : %d/%d", rank, nranks);
    return ncclInvalidArgument;
  }
  if (!g_net_ok) return ncclSystemError;
  struct ncclComm *c = calloc(1, sizeof(*c));
  c->magic = LAB_MAGIC;
  c->rank = rank;
  c->nranks = nranks;
  c->cudaDev = cur_dev();
  c->busId = fake_bus_id(c->cudaDev);
  c->id = *id;
  c->commIdHash = comm_id_fold(id);
  c->ncclCommId = nccl_comm_hash(id);
  const char *ch_env = getenv("NCCL_MIN_NCHANNELS");
  c->nch = ch_env ? atoi(ch_env) : 2;
  const char *mx = getenv("NCCL_MAX_NCHANNELS");
  if (mx && atoi(mx) > 0 && atoi(mx) < c->nch) c->nch = atoi(mx);
  if (c->nch < 1) c->nch = 1;
  if (c->nch > MAXCH) c->nch = MAXCH;
  const char *cb = getenv("NCCL_BUFFSIZE");
  c->chunk_bytes = cb ? (size_t)atoll(cb) : (size_t)(1 << 20);
  if (c->chunk_bytes < 4096) c->chunk_bytes = 4096;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  if (pipe2(c->abort_pipe, O_CLOEXEC | O_NONBLOCK) != 0) { free(c); return ncclSystemError; }
  c->boot_send = c->boot_recv = c->listen_fd = c->boot_listen_fd = -1;
  for (int i = 0; i < MAXCH; i++) c->ring_send[i] = c->ring_recv[i] = -1;
  c->p2p_send = malloc(sizeof(int) * nranks);
  c->p2p_recv = malloc(sizeof(int) * nranks);
  for (int i = 0; i < nranks; i++) c->p2p_send[i] = c->p2p_recv[i] = -1;

  if (parent)
    INFO(S_INIT, "comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx parent %p color %d key %d - Init START",
         (void *)c, rank, nranks, c->cudaDev, c->cudaDev, (long)c->busId, (void *)parent, color, key);
  else
    INFO(S_INIT, "comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx - Init START", (void *)c,
         rank, nranks, c->cudaDev, c->cudaDev, (long)c->busId, (unsigned long long)c->ncclCommId);
  uint64_t t0 = mono_ns();

  struct boot_handle h;
  memcpy(&h, id->internal, sizeof(h));
  if (h.addr.sa.sa_family != AF_INET) {
    WARN_AT("bootstrap.cc", 200, "Invalid NCCL unique id (address family %d)", h.addr.sa.sa_family);
    goto fail_inval;
  }
  /* NCCL_COMM_ID: rank 0 hosts the root itself. */
  struct sockaddr_in env_root;
  if (parse_comm_id_env(&env_root) && rank == 0 && env_root.sin_addr.s_addr == h.addr.sin.sin_addr.s_addr &&
      env_root.sin_port == h.addr.sin.sin_port) {
    ncclUniqueId tmp;
    if (start_root(&tmp, &env_root, h.magic) != ncclSuccess) goto fail;
  }
  struct sockaddr_in me = g_ifaddr;
  me.sin_port = 0;
  c->listen_fd = listen_on(&me);
  struct sockaddr_in meb = g_ifaddr;
  meb.sin_port = 0;
  c->boot_listen_fd = listen_on(&meb);
  if (c->listen_fd < 0 || c->boot_listen_fd < 0) {
    WARN_AT("misc/socket.cc", 440, "Net : Socket creation failed : %s", strerror(errno));
    goto fail;
  }
  char abuf[96];
  int rfd = connect_retry(&h.addr.sin, 120000);
  if (rfd < 0) {
    WARN_AT("misc/socket.cc", 570, "socketStartConnect: Connect to %s failed : %s",
            addr_str(&h.addr.sin, abuf, sizeof(abuf)), strerror(errno));
    goto fail;
  }
  struct peer_info mine = {h.magic, rank, nranks, c->cudaDev, 0, meb, me};
  c->peers = calloc(nranks, sizeof(struct peer_info));
  if (send_all(rfd, &mine, sizeof(mine)) != 0 || recv_all(rfd, c->peers, sizeof(struct peer_info) * nranks) != 0) {
    WARN_AT("bootstrap.cc", 300, "Bootstrap : no response from root %s", addr_str(&h.addr.sin, abuf, sizeof(abuf)));
    close(rfd);
    goto fail;
  }
  close(rfd);
  int next = (rank + 1) % nranks, prev = (rank - 1 + nranks) % nranks;
  /* bootstrap ring */
  c->boot_send = connect_hello(&c->peers[next].boot, rank, CONN_BOOT, 0);
  struct hello hh;
  if (c->boot_send < 0) goto fail_conn;
  c->boot_recv = accept_hello(c->boot_listen_fd, &hh);
  if (c->boot_recv < 0 || hh.rank != prev) goto fail_conn;
  INFO(S_BOOTSTRAP, "Bootstrap timings total %f (create %f, send %f, recv %f, ring %f, delay %f)",
       (mono_ns() - t0) / 1e9, 0.0, 0.0, 0.0, 0.0, 0.0);
  /* data ring, one connection per channel */
  if (nranks > 1) {
    for (int ch = 0; ch < c->nch; ch++) {
      c->ring_send[ch] = connect_hello(&c->peers[next].data, rank, CONN_RING, ch);
      if (c->ring_send[ch] < 0) goto fail_conn;
      set_nodelay(c->ring_send[ch]);
    }
    int have = 0;
    while (have < c->nch) {
      int fd = accept_hello(c->listen_fd, &hh);
      if (fd < 0) goto fail_conn;
      if (hh.type == CONN_RING && hh.rank == prev && hh.ch >= 0 && hh.ch < c->nch && c->ring_recv[hh.ch] < 0) {
        set_nodelay(fd);
        c->ring_recv[hh.ch] = fd;
        have++;
      } else stash_p2p(c, fd, &hh);
    }
    for (int ch = 0; ch < c->nch; ch++) {
      set_nonblock(c->ring_send[ch], 1);
      set_nonblock(c->ring_recv[ch], 1);
      remember_peer(c->ring_send[ch]);
      remember_peer(c->ring_recv[ch]);
    }
  }
  set_nonblock(c->listen_fd, 1);
  ring_channel_lines(c);
  INFO(S_INIT, "Connected all rings");
  INFO(S_INIT, "%d coll channels, 0 collnet channels, 0 nvls channels, %d p2p channels, %d p2p channels per peer",
       c->nch, c->nch, 1);
  double total = (mono_ns() - t0) / 1e9;
  INFO(S_INIT, "Init timings: rank %d nranks %d total %.2f (kernels 0.00, bootstrap %.2f, allgathers 0.00, topo 0.00, "
       "graphs 0.00, connections %.2f, rest 0.00)", rank, nranks, total, total / 2, total / 2);
  if (parent)
    INFO(S_INIT, "%s comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx parent %p color %d key %d - Init COMPLETE",
         func, (void *)c, rank, nranks, c->cudaDev, c->cudaDev, (long)c->busId, (void *)parent, color, key);
  else
    INFO(S_INIT, "%s comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx - Init COMPLETE", func,
         (void *)c, rank, nranks, c->cudaDev, c->cudaDev, (long)c->busId, (unsigned long long)c->ncclCommId);
  {
    char hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)id->internal[i]);
    char ip[64];
    inet_ntop(AF_INET, &g_ifaddr.sin_addr, ip, sizeof(ip));
    truth("{\"ev\":\"init\",\"t_ns\":%llu,\"func\":\"%s\",\"comm\":\"%p\",\"rank\":%d,\"nranks\":%d,"
          "\"comm_id_hash\":\"0x%016llx\",\"nccl_comm_id\":\"0x%llx\",\"parent\":\"%p\",\"color\":%d,\"key\":%d,"
          "\"pid\":%d,\"tid\":%d,\"host\":\"%s\",\"iface\":\"%s\",\"addr\":\"%s\",\"cuda_dev\":%d,\"nch\":%d,"
          "\"unique_id\":\"%s\"}",
          (unsigned long long)now_ns(), func, (void *)c, rank, nranks, (unsigned long long)c->commIdHash,
          (unsigned long long)c->ncclCommId, (void *)parent, color, key, (int)getpid(), (int)syscall(SYS_gettid),
          g_host, g_ifname, ip, c->cudaDev, c->nch, hex);
  }
  c->world = parent == NULL && !strncmp(func, "ncclCommInitRank", 16);
  *out = c;
  return ncclSuccess;
fail_conn:
  WARN_AT("transport/net_socket.cc", 440, "NET/Socket : connection setup failed : %s", strerror(errno));
fail:
  INFO(S_INIT, "init.cc:1626 -> %d", ncclSystemError);
  return ncclSystemError; /* leak on failure: the process is going down */
fail_inval:
  return ncclInvalidArgument;
}

/* ------------------------------------------------------------------ */
/* reductions                                                           */
/* ------------------------------------------------------------------ */
static size_t dtype_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}
static float bf16_to_f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
#define RED_LOOP(T, EXPR)                                             \
  do {                                                                \
    T *d = (T *)dst; const T *s = (const T *)src;                      \
    for (size_t i = 0; i < n; i++) { T a = d[i], b = s[i]; d[i] = (EXPR); } \
  } while (0)
#define RED_TYPE(T)                                                   \
  switch (op) {                                                       \
    case ncclSum: case ncclAvg: RED_LOOP(T, (T)(a + b)); break;       \
    case ncclProd: RED_LOOP(T, (T)(a * b)); break;                    \
    case ncclMax: RED_LOOP(T, a > b ? a : b); break;                  \
    case ncclMin: RED_LOOP(T, a < b ? a : b); break;                  \
    default: return -1;                                               \
  }
static int reduce_into(void *dst, const void *src, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: RED_TYPE(int8_t); break;
    case ncclUint8: RED_TYPE(uint8_t); break;
    case ncclInt32: RED_TYPE(int32_t); break;
    case ncclUint32: RED_TYPE(uint32_t); break;
    case ncclInt64: RED_TYPE(int64_t); break;
    case ncclUint64: RED_TYPE(uint64_t); break;
    case ncclFloat16: RED_TYPE(_Float16); break;
    case ncclFloat32: RED_TYPE(float); break;
    case ncclFloat64: RED_TYPE(double); break;
    case ncclBfloat16: {
      uint16_t *d = dst; const uint16_t *s = src;
      for (size_t i = 0; i < n; i++) {
        float a = bf16_to_f(d[i]), b = bf16_to_f(s[i]), r;
        switch (op) {
          case ncclSum: case ncclAvg: r = a + b; break;
          case ncclProd: r = a * b; break;
          case ncclMax: r = a > b ? a : b; break;
          case ncclMin: r = a < b ? a : b; break;
          default: return -1;
        }
        d[i] = f_to_bf16(r);
      }
      break;
    }
    default: return -1;
  }
  return 0;
}
/* ncclAvg: sum, then divide by nranks (integers truncate, floats in their precision). */
#define DIV_LOOP(T) do { T *d = buf; for (size_t i = 0; i < n; i++) d[i] = (T)(d[i] / (T)nr); } while (0)
static void avg_finish(void *buf, size_t n, ncclDataType_t t, int nr) {
  switch (t) {
    case ncclInt8: DIV_LOOP(int8_t); break;
    case ncclUint8: DIV_LOOP(uint8_t); break;
    case ncclInt32: DIV_LOOP(int32_t); break;
    case ncclUint32: DIV_LOOP(uint32_t); break;
    case ncclInt64: DIV_LOOP(int64_t); break;
    case ncclUint64: DIV_LOOP(uint64_t); break;
    case ncclFloat16: { _Float16 *d = buf; for (size_t i = 0; i < n; i++) d[i] = (_Float16)((float)d[i] / (float)nr); break; }
    case ncclFloat32: DIV_LOOP(float); break;
    case ncclFloat64: DIV_LOOP(double); break;
    case ncclBfloat16: { uint16_t *d = buf; for (size_t i = 0; i < n; i++) d[i] = f_to_bf16(bf16_to_f(d[i]) / (float)nr); break; }
    default: break;
  }
}
static int redop_ok(ncclDataType_t t, ncclRedOp_t op) {
  if ((int)op < 0 || op >= ncclNumOps) return 0;
  return t != ncclFloat8e4m3 && t != ncclFloat8e5m2 && dtype_size(t) > 0;
}

/* ------------------------------------------------------------------ */
/* transfer engine                                                      */
/* ------------------------------------------------------------------ */
/* A transfer of one slice over one connection. Like NCCL's network
 * transports, data is receiver-driven: the receiver first sends a clear-to-send
 * (the size it posted) back over the same connection and only then does the
 * sender transmit, so data never arrives at a rank that is not reading it. */
struct xfer {
  int fd;      /* -1: p2p recv not yet connected */
  int send;
  int peer;
  char *buf;
  size_t len, off;
  int phase;   /* 0: clear-to-send exchange, 1: data */
  uint64_t cts;
  size_t cts_off;
};

static size_t g_send_slice = 128 * 1024; /* bytes per send() call ("chunked sends") */

static ncclResult_t sock_error(struct ncclComm *c, int fd, int is_send, ssize_t r, int err) {
  char abuf[96];
  peer_str(fd, abuf, sizeof(abuf));
  ncclResult_t res;
  if (r == 0) {
    WARN_AT("misc/socket.cc", 49, "socketProgress: Connection closed by remote peer %s", abuf);
    INFO(S_ALL, "misc/socket.cc:749 -> %d", ncclRemoteError);
    res = ncclRemoteError;
  } else {
    WARN_AT("misc/socket.cc", 54, "socketProgressOpt: Call to %s %s failed : %s", is_send ? "send to" : "recv from",
            abuf, strerror(err));
    INFO(S_ALL, "misc/socket.cc:749 -> %d", ncclSystemError);
    res = ncclSystemError;
  }
  INFO(S_ALL, "transport/net_socket.cc:563 -> %d", res);
  INFO(S_ALL, "transport/net.cc:1221 -> %d", res);
  INFO(S_ALL, "proxy.cc:731 -> %d", res);
  INFO(S_ALL, "proxy.cc:911 -> %d [Progress Thread]", res);
  pthread_mutex_lock(&c->mu);
  if (c->async_error == ncclSuccess) c->async_error = res;
  snprintf(c->last_error, sizeof(c->last_error), "%s", t_last_error);
  pthread_mutex_unlock(&c->mu);
  truth("{\"ev\":\"error\",\"t_ns\":%llu,\"comm\":\"%p\",\"rank\":%d,\"result\":%d,\"msg\":\"%s %s\"}",
        (unsigned long long)now_ns(), (void *)c, c->rank, res, r == 0 ? "closed by" : strerror(err), abuf);
  return res;
}

static int p2p_connect(struct ncclComm *c, int peer) {
  if (c->p2p_send[peer] >= 0) return 0;
  int fd = connect_hello(&c->peers[peer].data, c->rank, CONN_P2P, 0);
  if (fd < 0) return -1;
  set_nodelay(fd);
  set_nonblock(fd, 1);
  remember_peer(fd);
  c->p2p_send[peer] = fd;
  INFO(S_P2P | S_NET, "Channel %02d/1 : %d[%d] -> %d[%d] [send] via NET/Socket/0/Shared", 0, c->rank, c->cudaDev, peer,
       c->peers[peer].dev);
  return 0;
}

/* Progress all transfers concurrently until done, aborted or failed. For each
 * (fd, direction) only the first unfinished transfer is active, preserving
 * per-connection ordering. */
static ncclResult_t run_xfers(struct ncclComm *c, struct xfer *xs, int n) {
  struct pollfd *pf = malloc(sizeof(struct pollfd) * (n + 2));
  int *map = malloc(sizeof(int) * (n + 2));
  ncclResult_t res = ncclSuccess;
  for (;;) {
    if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) { res = ncclInternalError; break; }
    int np = 0, pending = 0, need_accept = 0;
    for (int i = 0; i < n; i++) {
      struct xfer *x = &xs[i];
      if (x->off >= x->len) continue;
      pending++;
      if (!x->send && x->fd < 0) {
        x->fd = c->p2p_recv[x->peer];
        if (x->fd < 0) { need_accept = 1; continue; }
      }
      int active = 1;
      for (int j = 0; j < i; j++)
        if (xs[j].off < xs[j].len && xs[j].fd == x->fd && xs[j].send == x->send) { active = 0; break; }
      if (!active) continue;
      pf[np].fd = x->fd;
      /* phase 0 runs against the data direction: the sender waits for input */
      pf[np].events = (x->send ^ (x->phase == 0)) ? POLLOUT : POLLIN;
      pf[np].revents = 0;
      map[np++] = i;
    }
    if (!pending) break;
    int acc_idx = -1;
    if (need_accept) { pf[np].fd = c->listen_fd; pf[np].events = POLLIN; pf[np].revents = 0; map[np] = -1; acc_idx = np++; }
    pf[np].fd = c->abort_pipe[0]; pf[np].events = POLLIN; pf[np].revents = 0; map[np++] = -2;
    int r = poll(pf, np, 1000);
    if (r < 0) { if (errno == EINTR) continue; res = ncclSystemError; break; }
    if (r == 0) continue;
    for (int k = 0; k < np && res == ncclSuccess; k++) {
      if (!pf[k].revents) continue;
      if (map[k] == -2) { res = ncclInternalError; break; }
      if (k == acc_idx) {
        struct hello hh;
        int fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
          set_nonblock(fd, 0);
          if (recv_all(fd, &hh, sizeof(hh)) == 0 && hh.magic == LAB_MAGIC) stash_p2p(c, fd, &hh); else close(fd);
        }
        continue;
      }
      struct xfer *x = &xs[map[k]];
      for (;;) {
        ssize_t got;
        if (x->phase == 0) {
          /* receiver: send the posted size; sender: read it */
          if (!x->send && x->cts_off == 0) x->cts = (uint64_t)x->len;
          if (x->send) got = recv(x->fd, (char *)&x->cts + x->cts_off, 8 - x->cts_off, 0);
          else got = send(x->fd, (char *)&x->cts + x->cts_off, 8 - x->cts_off, MSG_NOSIGNAL);
          if (got > 0) {
            x->cts_off += (size_t)got;
            if (x->cts_off < 8) continue;
            x->phase = 1;
            if (x->send && x->cts != (uint64_t)x->len) {
              WARN_AT("transport/net_socket.cc", 534, "NET/Socket : peer message truncated : receiving %llu bytes "
                      "instead of %zu. This may be the result of a mismatch in the collective sizes or "
                      "environment settings.", (unsigned long long)x->cts, x->len);
              pthread_mutex_lock(&c->mu);
              if (c->async_error == ncclSuccess) c->async_error = ncclInvalidUsage;
              snprintf(c->last_error, sizeof(c->last_error), "%s", t_last_error);
              pthread_mutex_unlock(&c->mu);
              truth("{\"ev\":\"error\",\"t_ns\":%llu,\"comm\":\"%p\",\"rank\":%d,\"result\":%d,"
                    "\"msg\":\"size mismatch %llu != %zu\"}", (unsigned long long)now_ns(), (void *)c, c->rank,
                    ncclInvalidUsage, (unsigned long long)x->cts, x->len);
              res = ncclInvalidUsage;
              break;
            }
            break; /* re-poll for the data direction */
          }
          if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
          res = sock_error(c, x->fd, !x->send, got, errno);
          break;
        }
        size_t want = x->len - x->off;
        if (x->send) {
          if (want > g_send_slice) want = g_send_slice;
          got = send(x->fd, x->buf + x->off, want, MSG_NOSIGNAL);
        } else {
          got = recv(x->fd, x->buf + x->off, want, 0);
        }
        if (got > 0) { x->off += (size_t)got; if (x->off >= x->len) break; continue; }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        if (got == 0 && x->send) break;
        res = sock_error(c, x->fd, x->send, got, errno);
        break;
      }
    }
    if (res != ncclSuccess) break;
  }
  free(pf);
  free(map);
  return res;
}

/* ------------------------------------------------------------------ */
/* algorithms                                                           */
/* ------------------------------------------------------------------ */
static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* Sub-range of [0,len) for channel ch of nch, in whole elements. */
static void ch_split(size_t len, size_t es, int ch, int nch, size_t *off, size_t *n) {
  size_t elems = len / es;
  size_t a = elems * ch / nch, b = elems * (ch + 1) / nch;
  *off = a * es;
  *n = (b - a) * es;
}

/* One ring phase over chunk descriptors choff/chlen (bytes, within buf).
 * reduce: step s sends chunk (r-s+k), receives chunk (r-s-1+k) into tmp and
 * reduces it in; gather: same schedule, received directly into place. */
static ncclResult_t ring_phase(struct ncclComm *c, char *buf, const size_t *choff, const size_t *chlen, int k,
                               int reduce, char *tmp, ncclDataType_t dt, ncclRedOp_t op) {
  int N = c->nranks, r = c->rank, nch = c->nch;
  size_t es = dtype_size(dt);
  struct xfer xs[2 * MAXCH];
  for (int s = 0; s < N - 1; s++) {
    int sc = mod(r - s + k, N), rc = mod(r - s - 1 + k, N);
    int nx = 0;
    for (int ch = 0; ch < nch; ch++) {
      size_t so, sn, ro, rn;
      ch_split(chlen[sc], es, ch, nch, &so, &sn);
      ch_split(chlen[rc], es, ch, nch, &ro, &rn);
      if (sn) xs[nx++] = (struct xfer){c->ring_send[ch], 1, -1, buf + choff[sc] + so, sn, 0, 0, 0, 0};
      if (rn) xs[nx++] = (struct xfer){c->ring_recv[ch], 0, -1, reduce ? tmp + ro : buf + choff[rc] + ro, rn, 0, 0, 0, 0};
    }
    ncclResult_t res = run_xfers(c, xs, nx);
    if (res != ncclSuccess) return res;
    if (reduce && chlen[rc]) reduce_into(buf + choff[rc], tmp, chlen[rc] / es, dt, op);
  }
  return ncclSuccess;
}

static ncclResult_t do_allreduce(struct ncclComm *c, const void *sb, void *rb, size_t count, ncclDataType_t dt,
                                 ncclRedOp_t op) {
  size_t es = dtype_size(dt);
  int N = c->nranks;
  if (sb != rb) memmove(rb, sb, count * es);
  if (N > 1 && count > 0) {
    size_t per = c->chunk_bytes / es;
    if (per < 1) per = 1;
    size_t piece = per * N;
    char *tmp = malloc(per * es + es);
    size_t *choff = malloc(sizeof(size_t) * N), *chlen = malloc(sizeof(size_t) * N);
    for (size_t base = 0; base < count; base += piece) {
      size_t pc = count - base < piece ? count - base : piece;
      for (int i = 0; i < N; i++) {
        size_t a = pc * i / N, b = pc * (i + 1) / N;
        choff[i] = (base + a) * es;
        chlen[i] = (b - a) * es;
      }
      ncclResult_t res = ring_phase(c, rb, choff, chlen, 0, 1, tmp, dt, op);
      if (res == ncclSuccess) res = ring_phase(c, rb, choff, chlen, 1, 0, NULL, dt, op);
      if (res != ncclSuccess) { free(tmp); free(choff); free(chlen); return res; }
    }
    free(tmp); free(choff); free(chlen);
  }
  if (op == ncclAvg) avg_finish(rb, count, dt, N);
  return ncclSuccess;
}

/* Blocked layout (AllGather / ReduceScatter): chunk i = block i of `blk` elements. */
static ncclResult_t do_blocked(struct ncclComm *c, char *work, size_t blk, ncclDataType_t dt, ncclRedOp_t op,
                               int reduce) {
  size_t es = dtype_size(dt);
  int N = c->nranks;
  if (N == 1 || blk == 0) return ncclSuccess;
  size_t per = c->chunk_bytes / es;
  if (per < 1) per = 1;
  char *tmp = reduce ? malloc(per * es + es) : NULL;
  size_t *choff = malloc(sizeof(size_t) * N), *chlen = malloc(sizeof(size_t) * N);
  ncclResult_t res = ncclSuccess;
  for (size_t p0 = 0; p0 < blk && res == ncclSuccess; p0 += per) {
    size_t pl = blk - p0 < per ? blk - p0 : per;
    for (int i = 0; i < N; i++) { choff[i] = ((size_t)i * blk + p0) * es; chlen[i] = pl * es; }
    res = ring_phase(c, work, choff, chlen, reduce ? -1 : 0, reduce, tmp, dt, op);
  }
  free(tmp); free(choff); free(chlen);
  return res;
}

static ncclResult_t do_allgather(struct ncclComm *c, const void *sb, void *rb, size_t sendcount, ncclDataType_t dt) {
  size_t es = dtype_size(dt);
  char *dst = (char *)rb + (size_t)c->rank * sendcount * es;
  if (dst != sb) memmove(dst, sb, sendcount * es);
  return do_blocked(c, rb, sendcount, dt, ncclSum, 0);
}

static ncclResult_t do_reducescatter(struct ncclComm *c, const void *sb, void *rb, size_t recvcount, ncclDataType_t dt,
                                     ncclRedOp_t op) {
  size_t es = dtype_size(dt);
  size_t total = recvcount * es * c->nranks;
  char *work = malloc(total ? total : 1);
  memcpy(work, sb, total);
  ncclResult_t res = do_blocked(c, work, recvcount, dt, op, 1);
  if (res == ncclSuccess) {
    memmove(rb, work + (size_t)c->rank * recvcount * es, recvcount * es);
    if (op == ncclAvg) avg_finish(rb, recvcount, dt, c->nranks);
  }
  free(work);
  return res;
}

/* Add channel-split transfers of [p, p+len) on the ring to xs. */
static int add_ring_xfers(struct ncclComm *c, struct xfer *xs, int nx, int send, char *p, size_t len, size_t es) {
  for (int ch = 0; ch < c->nch; ch++) {
    size_t o, n;
    ch_split(len, es, ch, c->nch, &o, &n);
    if (n) xs[nx++] = (struct xfer){send ? c->ring_send[ch] : c->ring_recv[ch], send, -1, p + o, n, 0, 0, 0, 0};
  }
  return nx;
}

/* Pipelined ring broadcast: iteration i receives piece i and forwards i-1. */
static ncclResult_t do_broadcast(struct ncclComm *c, const void *sb, void *rb, size_t count, ncclDataType_t dt, int root) {
  size_t es = dtype_size(dt);
  int N = c->nranks, r = c->rank;
  if (r == root && sb != rb) memmove(rb, sb, count * es);
  if (N == 1 || count == 0) return ncclSuccess;
  size_t per = c->chunk_bytes / es;
  if (per < 1) per = 1;
  size_t np = (count + per - 1) / per;
  int next = (r + 1) % N;
  struct xfer xs[2 * MAXCH];
  for (size_t i = 0; i <= np; i++) {
    int nx = 0;
    if (r == root) {
      if (i < np) nx = add_ring_xfers(c, xs, nx, 1, (char *)rb + i * per * es, (i + 1 < np ? per : count - i * per) * es, es);
    } else {
      if (i < np) nx = add_ring_xfers(c, xs, nx, 0, (char *)rb + i * per * es, (i + 1 < np ? per : count - i * per) * es, es);
      if (i >= 1 && next != root)
        nx = add_ring_xfers(c, xs, nx, 1, (char *)rb + (i - 1) * per * es, (i < np ? per : count - (i - 1) * per) * es, es);
    }
    ncclResult_t res = run_xfers(c, xs, nx);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

/* Pipelined ring reduce towards root, starting at root+1. */
static ncclResult_t do_reduce(struct ncclComm *c, const void *sb, void *rb, size_t count, ncclDataType_t dt,
                              ncclRedOp_t op, int root) {
  size_t es = dtype_size(dt);
  int N = c->nranks, r = c->rank;
  int pos = mod(r - root - 1, N); /* 0: first in chain; N-1: root */
  char *acc = r == root ? (char *)rb : malloc(count * es + es);
  if (acc != sb) memmove(acc, sb, count * es);
  ncclResult_t res = ncclSuccess;
  if (N > 1 && count > 0) {
    size_t per = c->chunk_bytes / es;
    if (per < 1) per = 1;
    size_t np = (count + per - 1) / per;
    char *tmp = malloc(per * es + es);
    struct xfer xs[2 * MAXCH];
    if (pos == 0) {
      for (size_t i = 0; i < np && res == ncclSuccess; i++) {
        int nx = add_ring_xfers(c, xs, 0, 1, acc + i * per * es, (i + 1 < np ? per : count - i * per) * es, es);
        res = run_xfers(c, xs, nx);
      }
    } else {
      for (size_t i = 0; i <= np && res == ncclSuccess; i++) {
        int nx = 0;
        size_t plen = i < np ? (i + 1 < np ? per : count - i * per) : 0;
        if (i < np) nx = add_ring_xfers(c, xs, nx, 0, tmp, plen * es, es);
        if (i >= 1 && pos < N - 1)
          nx = add_ring_xfers(c, xs, nx, 1, acc + (i - 1) * per * es, (i < np ? per : count - (i - 1) * per) * es, es);
        res = run_xfers(c, xs, nx);
        if (res == ncclSuccess && i < np) reduce_into(acc + i * per * es, tmp, plen, dt, op);
      }
    }
    free(tmp);
  }
  if (res == ncclSuccess && r == root && op == ncclAvg) avg_finish(rb, count, dt, N);
  if (acc != rb) free(acc);
  return res;
}

/* ------------------------------------------------------------------ */
/* ops, groups, launches                                                */
/* ------------------------------------------------------------------ */
enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_BROADCAST, OP_REDUCE, OP_SEND, OP_RECV };
static const char *op_names[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send", "Recv"};

struct op {
  int kind;
  const void *sb;
  void *rb;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t red;
  int root; /* root, or peer for p2p */
  struct ncclComm *comm;
  cudaStream_t stream;
  uint64_t seq;
};
struct launch {
  struct ncclComm *comm;
  uint64_t opCount;
  int nops;
  struct op ops[];
};

static ncclResult_t run_p2p_batch(struct ncclComm *c, struct op *ops, int n) {
  struct xfer *xs = calloc(n > 0 ? n : 1, sizeof(struct xfer));
  int nx = 0;
  char *done_self = calloc(n > 0 ? n : 1, 1);
  /* self send/recv pairs are local copies, matched in order */
  for (int i = 0; i < n; i++) {
    if (ops[i].kind != OP_SEND || ops[i].root != c->rank) continue;
    for (int j = 0; j < n; j++)
      if (ops[j].kind == OP_RECV && ops[j].root == c->rank && !done_self[j]) {
        size_t nb = ops[i].count * dtype_size(ops[i].dt);
        memmove(ops[j].rb, ops[i].sb, nb);
        done_self[i] = done_self[j] = 1;
        break;
      }
  }
  for (int i = 0; i < n; i++) {
    if (done_self[i]) continue;
    struct op *o = &ops[i];
    size_t nb = o->count * dtype_size(o->dt);
    if (!nb) continue;
    if (o->kind == OP_SEND) {
      if (p2p_connect(c, o->root) != 0) {
        WARN_AT("misc/socket.cc", 570, "socketStartConnect: Connect to rank %d failed : %s", o->root, strerror(errno));
        free(xs); free(done_self);
        return ncclSystemError;
      }
      xs[nx++] = (struct xfer){c->p2p_send[o->root], 1, o->root, (char *)o->sb, nb, 0, 0, 0, 0};
    } else {
      xs[nx++] = (struct xfer){c->p2p_recv[o->root], 0, o->root, (char *)o->rb, nb, 0, 0, 0, 0};
    }
  }
  ncclResult_t res = run_xfers(c, xs, nx);
  free(xs);
  free(done_self);
  return res;
}

static ncclResult_t run_op(struct ncclComm *c, struct op *o) {
  switch (o->kind) {
    case OP_ALLREDUCE: return do_allreduce(c, o->sb, o->rb, o->count, o->dt, o->red);
    case OP_ALLGATHER: return do_allgather(c, o->sb, o->rb, o->count, o->dt);
    case OP_REDUCESCATTER: return do_reducescatter(c, o->sb, o->rb, o->count, o->dt, o->red);
    case OP_BROADCAST: return do_broadcast(c, o->sb, o->rb, o->count, o->dt, o->root);
    case OP_REDUCE: return do_reduce(c, o->sb, o->rb, o->count, o->dt, o->red, o->root);
    default: return ncclInternalError;
  }
}

static void launch_done(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  c->inflight--;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* Lab fault (SSLAB_GPU_HANG_*): a "kernel" that never finishes. The stream
 * thread stays here forever, in a function whose name a native stack shows,
 * sleeping so that it costs no CPU; abort does not reach it (a hung kernel
 * ignores NCCL's abort flag), so neither ncclCommAbort nor the process ends
 * cleanly: only a kill does. */
__attribute__((noinline, used)) void sslab_gpu_kernel_hang(unsigned long long opCount) {
  volatile unsigned long long spins = 0, op = opCount;
  (void)op;
  for (;;) {
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    spins++;
    __asm__ volatile("" ::: "memory");
  }
}

static int gpu_hang_due(struct ncclComm *c, uint64_t opCount) {
  static int parsed;
  static long long at_op = -1;
  static const char *trigger;
  static int fired;
  if (!c->world || fired) return 0;
  if (!parsed) { /* only the stream thread of this process reads these */
    const char *e = getenv("SSLAB_GPU_HANG_AT_OP");
    if (e && *e) at_op = atoll(e);
    trigger = getenv("SSLAB_GPU_HANG_TRIGGER");
    if (trigger && !*trigger) trigger = NULL;
    parsed = 1;
  }
  if ((at_op >= 0 && (long long)opCount == at_op) || (trigger && access(trigger, F_OK) == 0)) {
    fired = 1;
    return 1;
  }
  return 0;
}

/* Runs on the stream's thread: the "kernel" of one launch. */
static void launch_run(void *p) {
  struct launch *L = p;
  struct ncclComm *c = L->comm;
  ncclResult_t res = ncclSuccess;
  if (gpu_hang_due(c, L->opCount)) {
    truth("{\"ev\":\"gpu_hang\",\"t_ns\":%llu,\"comm\":\"%p\",\"rank\":%d,\"opCount\":%llu,\"seq_first\":%llu,"
          "\"op\":\"%s\",\"tid\":%d,\"func\":\"sslab_gpu_kernel_hang\"}", (unsigned long long)now_ns(), (void *)c,
          c->rank, (unsigned long long)L->opCount, (unsigned long long)L->ops[0].seq, op_names[L->ops[0].kind],
          (int)syscall(SYS_gettid));
    sslab_gpu_kernel_hang(L->opCount);
  }
  if (!__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
    for (int i = 0; i < L->nops && res == ncclSuccess;) {
      if (L->ops[i].kind == OP_SEND || L->ops[i].kind == OP_RECV) {
        int j = i;
        while (j < L->nops && (L->ops[j].kind == OP_SEND || L->ops[j].kind == OP_RECV)) j++;
        res = run_p2p_batch(c, L->ops + i, j - i);
        i = j;
      } else {
        res = run_op(c, &L->ops[i]);
        i++;
      }
    }
  } else res = ncclInternalError;
  if (res == ncclSuccess) {
    truth("{\"ev\":\"complete\",\"t_ns\":%llu,\"comm\":\"%p\",\"rank\":%d,\"opCount\":%llu,\"seq_first\":%llu,"
          "\"nops\":%d}", (unsigned long long)now_ns(), (void *)c, c->rank, (unsigned long long)L->opCount,
          (unsigned long long)L->ops[0].seq, L->nops);
  } else if (!__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
    /* Like a GPU kernel whose proxy failed: the work never completes; the
     * stream stays blocked until the application aborts the communicator. */
    pthread_mutex_lock(&c->mu);
    while (!c->aborted) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
  }
  launch_done(c);
  free(L);
}

static __thread int t_group_depth;
static __thread struct op *t_group_ops;
static __thread int t_group_n, t_group_cap;

static ncclResult_t launch_ops(struct ncclComm *c, struct op *ops, int n) {
  struct launch *L = malloc(sizeof(*L) + sizeof(struct op) * n);
  L->comm = c;
  L->nops = n;
  memcpy(L->ops, ops, sizeof(struct op) * n);
  pthread_mutex_lock(&c->mu);
  L->opCount = c->opCount++;
  c->inflight++;
  pthread_mutex_unlock(&c->mu);
  if (cudaLaunchHostFunc(ops[0].stream, launch_run, L) != cudaSuccess) {
    launch_done(c);
    free(L);
    WARN_AT("enqueue.cc", 1100, "Cuda failure 'invalid resource handle'");
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

static ncclResult_t enqueue_check(struct op *o) {
  ensure_init();
  struct ncclComm *c = o->comm;
  if (!c || c->magic != LAB_MAGIC) {
    WARN_AT("enqueue.cc", 1950, "Invalid comm argument");
    return ncclInvalidArgument;
  }
  if (dtype_size(o->dt) == 0) {
    WARN_AT("enqueue.cc", 1960, "%s : invalid type %d", op_names[o->kind], (int)o->dt);
    return ncclInvalidArgument;
  }
  if ((o->kind == OP_ALLREDUCE || o->kind == OP_REDUCESCATTER || o->kind == OP_REDUCE) && !redop_ok(o->dt, o->red)) {
    WARN_AT("enqueue.cc", 1966, "%s : invalid reduction operation %d", op_names[o->kind], (int)o->red);
    return ncclInvalidArgument;
  }
  if (o->root < 0 || o->root >= c->nranks) {
    WARN_AT("enqueue.cc", 1970, "%s : invalid root %d (root should be in the 0..%d range)", op_names[o->kind], o->root,
            c->nranks);
    return ncclInvalidArgument;
  }
  pthread_mutex_lock(&c->mu);
  uint64_t opc = c->opCount;
  o->seq = c->seq++;
  pthread_mutex_unlock(&c->mu);
  INFO(S_COLL, "%s: opCount %lx sendbuff %p recvbuff %p count %zu datatype %d op %d root %d comm %p [nranks=%d] stream %p",
       op_names[o->kind], (unsigned long)opc, o->sb, o->rb, o->count, (int)o->dt, (int)o->red, o->root, (void *)c,
       c->nranks, (void *)o->stream);
  truth("{\"ev\":\"enqueue\",\"t_ns\":%llu,\"comm\":\"%p\",\"rank\":%d,\"op\":\"%s\",\"opCount\":%llu,\"seq\":%llu,"
        "\"count\":%zu,\"datatype\":%d,\"redop\":%d,\"root\":%d,\"stream\":\"%p\",\"tid\":%d,\"group\":%d}",
        (unsigned long long)now_ns(), (void *)c, c->rank, op_names[o->kind], (unsigned long long)opc,
        (unsigned long long)o->seq, o->count, (int)o->dt, (int)o->red, o->root, (void *)o->stream,
        (int)syscall(SYS_gettid), t_group_depth > 0);
  if (t_group_depth > 0) {
    if (t_group_n == t_group_cap) {
      t_group_cap = t_group_cap ? 2 * t_group_cap : 16;
      t_group_ops = realloc(t_group_ops, sizeof(struct op) * t_group_cap);
    }
    t_group_ops[t_group_n++] = *o;
    return ncclSuccess;
  }
  return launch_ops(c, o, 1);
}

/* ------------------------------------------------------------------ */
/* public API                                                           */
/* ------------------------------------------------------------------ */
EXPORT ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *out) {
  ensure_init();
  pthread_once(&g_net_once, net_init);
  if (!out) return ncclInvalidArgument;
  struct sockaddr_in env;
  if (parse_comm_id_env(&env)) {
    /* NCCL_COMM_ID: deterministic id; rank 0 hosts the root at init. */
    memset(out, 0, sizeof(*out));
    struct boot_handle h;
    memset(&h, 0, sizeof(h));
    h.magic = 0x4e43434c5f434f4dull ^ ((uint64_t)env.sin_addr.s_addr << 16) ^ env.sin_port;
    h.addr.sin = env;
    memcpy(out->internal, &h, sizeof(h));
    INFO(S_ENV, "NCCL_COMM_ID set by environment to %s", getenv("NCCL_COMM_ID"));
    return ncclSuccess;
  }
  if (!g_net_ok) return ncclSystemError;
  struct sockaddr_in a = g_ifaddr;
  a.sin_port = 0;
  return start_root(out, &a, random64());
}

static void show_version(int rank) {
  ensure_init();
  if (rank != 0 || g_level < LOG_VERSION) return;
  static int shown;
  if (__atomic_exchange_n(&shown, 1, __ATOMIC_ACQ_REL)) return;
  printf("%s\n", VERSION_STRING);
  fflush(stdout);
  if (g_log != stdout) INFO(S_ALL, "%s", VERSION_STRING);
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  show_version(rank);
  return comm_init(comm, nranks, &commId, rank, "ncclCommInitRank", NULL, 0, 0);
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                           ncclConfig_t *config) {
  if (config && config->magic != 0xcafebeef) {
    WARN_AT("init.cc", 1800, "ncclCommInitRankConfig: invalid config magic %x", config->magic);
    return ncclInvalidArgument;
  }
  show_version(rank);
  return comm_init(comm, nranks, &commId, rank, "ncclCommInitRankConfig", NULL, 0, 0);
}

struct initall_arg { ncclComm_t *out; int n; ncclUniqueId id; int rank; int dev; ncclResult_t res; };
static void *initall_main(void *p) {
  struct initall_arg *a = p;
  cudaSetDevice(a->dev);
  a->res = comm_init(a->out, a->n, &a->id, a->rank, "ncclCommInitAll", NULL, 0, 0);
  return NULL;
}
EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  if (!comms || ndev < 1) return ncclInvalidArgument;
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  if (res != ncclSuccess) return res;
  show_version(0);
  struct initall_arg *a = calloc(ndev, sizeof(*a));
  pthread_t *t = calloc(ndev, sizeof(pthread_t));
  for (int i = 0; i < ndev; i++) {
    a[i] = (struct initall_arg){&comms[i], ndev, id, i, devlist ? devlist[i] : i, ncclSuccess};
    pthread_create(&t[i], NULL, initall_main, &a[i]);
  }
  for (int i = 0; i < ndev; i++) {
    pthread_join(t[i], NULL);
    if (a[i].res != ncclSuccess) res = a[i].res;
  }
  free(a);
  free(t);
  return res;
}

/* Allgather of fixed-size records over the bootstrap ring (blocking). */
static int boot_allgather(struct ncclComm *c, char *data, size_t sz) {
  int N = c->nranks, r = c->rank;
  for (int s = 0; s < N - 1; s++) {
    int si = mod(r - s, N), ri = mod(r - s - 1, N);
    if (send_all(c->boot_send, data + si * sz, sz) != 0) return -1;
    if (recv_all(c->boot_recv, data + ri * sz, sz) != 0) return -1;
  }
  return 0;
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  (void)config;
  if (!comm || comm->magic != LAB_MAGIC || !newcomm) return ncclInvalidArgument;
  int N = comm->nranks;
  struct { int32_t color, key; } *ck = calloc(N, sizeof(*ck));
  ck[comm->rank].color = color;
  ck[comm->rank].key = key;
  if (boot_allgather(comm, (char *)ck, sizeof(*ck)) != 0) { free(ck); return ncclSystemError; }
  int newN = 0, newRank = -1, leader = -1;
  if (color != NCCL_SPLIT_NOCOLOR) {
    for (int i = 0; i < N; i++) {
      if (ck[i].color != color) continue;
      newN++;
      /* order by (key, rank) */
      int before = 0;
      for (int j = 0; j < N; j++)
        if (ck[j].color == color && (ck[j].key < ck[i].key || (ck[j].key == ck[i].key && j < i))) before++;
      if (i == comm->rank) newRank = before;
      if (before == 0) leader = i;
    }
  }
  ncclUniqueId *ids = calloc(N, sizeof(ncclUniqueId));
  ncclResult_t res = ncclSuccess;
  if (leader == comm->rank) res = ncclGetUniqueId(&ids[comm->rank]);
  if (boot_allgather(comm, (char *)ids, sizeof(ncclUniqueId)) != 0) res = ncclSystemError;
  if (res == ncclSuccess) {
    if (color == NCCL_SPLIT_NOCOLOR) *newcomm = NULL;
    else res = comm_init(newcomm, newN, &ids[leader], newRank, "ncclCommSplit", comm, color, key);
  }
  free(ids);
  free(ck);
  return res;
}

static void comm_free(struct ncclComm *c) {
  close(c->abort_pipe[0]);
  close(c->abort_pipe[1]);
  int fds[] = {c->listen_fd, c->boot_listen_fd, c->boot_send, c->boot_recv};
  for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) if (fds[i] >= 0) close(fds[i]);
  for (int i = 0; i < MAXCH; i++) {
    if (c->ring_send[i] >= 0) close(c->ring_send[i]);
    if (c->ring_recv[i] >= 0) close(c->ring_recv[i]);
  }
  for (int i = 0; i < c->nranks; i++) {
    if (c->p2p_send[i] >= 0) close(c->p2p_send[i]);
    if (c->p2p_recv[i] >= 0) close(c->p2p_recv[i]);
  }
  free(c->p2p_send);
  free(c->p2p_recv);
  free(c->peers);
  c->magic = 0;
  free(c);
}

/* Orderly close: a bootstrap barrier (bounded), then every connection is
 * half-closed at about the same moment on all ranks and drained to EOF. A FIN
 * that reaches a peer which is not itself closing is ACKed late (CLOSE_WAIT is
 * in delayed-ACK "pingpong" mode) and the sender's tail-loss probe would
 * retransmit it: a clean job must not show retransmissions at its end. */
static void comm_graceful_close(struct ncclComm *c) {
  if (c->nranks > 1 && c->boot_send >= 0 && c->boot_recv >= 0 && c->async_error == ncclSuccess && !c->aborted) {
    struct timeval tv = {1, 0};
    setsockopt(c->boot_recv, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int32_t *tok = calloc(c->nranks, sizeof(int32_t));
    boot_allgather(c, (char *)tok, sizeof(int32_t));
    free(tok);
  }
  int n = 0, cap = 2 * MAXCH + 2 * c->nranks + 2;
  int *fds = malloc(sizeof(int) * cap);
  for (int i = 0; i < MAXCH; i++) {
    if (c->ring_send[i] >= 0) fds[n++] = c->ring_send[i];
    if (c->ring_recv[i] >= 0) fds[n++] = c->ring_recv[i];
  }
  for (int i = 0; i < c->nranks; i++) {
    if (c->p2p_send[i] >= 0) fds[n++] = c->p2p_send[i];
    if (c->p2p_recv[i] >= 0) fds[n++] = c->p2p_recv[i];
  }
  if (c->boot_send >= 0) fds[n++] = c->boot_send;
  if (c->boot_recv >= 0) fds[n++] = c->boot_recv;
  for (int i = 0; i < n; i++) { set_nonblock(fds[i], 1); shutdown(fds[i], SHUT_WR); }
  struct pollfd *pf = malloc(sizeof(struct pollfd) * (n ? n : 1));
  int open_n = n;
  char sink[4096];
  uint64_t deadline = mono_ns() + 1000000000ull;
  while (open_n > 0 && mono_ns() < deadline) {
    int np = 0;
    for (int i = 0; i < n; i++) if (fds[i] >= 0) { pf[np].fd = fds[i]; pf[np].events = POLLIN; pf[np].revents = 0; np++; }
    if (poll(pf, np, 100) <= 0) continue;
    for (int k = 0; k < np; k++) {
      if (!pf[k].revents) continue;
      ssize_t r = recv(pf[k].fd, sink, sizeof(sink), 0);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
        for (int i = 0; i < n; i++) if (fds[i] == pf[k].fd) { fds[i] = -1; open_n--; }
    }
  }
  free(pf);
  free(fds);
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm || comm->magic != LAB_MAGIC) return ncclInvalidArgument;
  pthread_mutex_lock(&comm->mu);
  while (comm->inflight > 0 && !comm->aborted) pthread_cond_wait(&comm->cv, &comm->mu);
  pthread_mutex_unlock(&comm->mu);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (comm->magic != LAB_MAGIC) return ncclInvalidArgument;
  INFO(S_INIT, "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL 0 - Destroy COMPLETE",
       (void *)comm, comm->rank, comm->nranks, comm->nranks, 1, 0);
  ncclCommFinalize(comm);
  comm_graceful_close(comm);
  truth("{\"ev\":\"destroy\",\"t_ns\":%llu,\"comm\":\"%p\",\"rank\":%d}", (unsigned long long)now_ns(), (void *)comm,
        comm->rank);
  comm_free(comm);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (comm->magic != LAB_MAGIC) return ncclInvalidArgument;
  pthread_mutex_lock(&comm->mu);
  __atomic_store_n(&comm->aborted, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&comm->cv);
  pthread_mutex_unlock(&comm->mu);
  ssize_t w = write(comm->abort_pipe[1], "x", 1);
  (void)w;
  INFO(S_INIT, "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL 0 - Abort COMPLETE",
       (void *)comm, comm->rank, comm->nranks, comm->nranks, 1, 0);
  truth("{\"ev\":\"abort\",\"t_ns\":%llu,\"comm\":\"%p\",\"rank\":%d}", (unsigned long long)now_ns(), (void *)comm,
        comm->rank);
  /* Queued launches drain (they see `aborted` and return); then release. */
  pthread_mutex_lock(&comm->mu);
  while (comm->inflight > 0) pthread_cond_wait(&comm->cv, &comm->mu);
  pthread_mutex_unlock(&comm->mu);
  comm_free(comm);
  return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

EXPORT const char *ncclGetLastError(ncclComm_t comm) {
  if (comm && comm->magic == LAB_MAGIC && comm->last_error[0]) return comm->last_error;
  return t_last_error;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!comm || comm->magic != LAB_MAGIC || !asyncError) return ncclInvalidArgument;
  pthread_mutex_lock(&comm->mu);
  *asyncError = comm->async_error;
  pthread_mutex_unlock(&comm->mu);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm || comm->magic != LAB_MAGIC || !count) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm || comm->magic != LAB_MAGIC || !device) return ncclInvalidArgument;
  *device = comm->cudaDev;
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || comm->magic != LAB_MAGIC || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

#define MKOP(K, SB, RB, CNT, DT, RED, ROOT)                                                        \
  struct op o = {K, SB, RB, CNT, DT, RED, ROOT, comm, stream, 0};                                   \
  return enqueue_check(&o)

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  MKOP(OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0);
}
EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream) {
  MKOP(OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0);
}
EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  MKOP(OP_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0);
}
EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream) {
  MKOP(OP_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root);
}
EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                              cudaStream_t stream) {
  MKOP(OP_BROADCAST, buff, buff, count, datatype, ncclSum, root);
}
EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  MKOP(OP_REDUCE, sendbuff, recvbuff, count, datatype, op, root);
}
EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  MKOP(OP_SEND, sendbuff, NULL, count, datatype, ncclSum, peer);
}
EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  MKOP(OP_RECV, NULL, recvbuff, count, datatype, ncclSum, peer);
}

EXPORT ncclResult_t ncclGroupStart(void) {
  t_group_depth++;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
  if (t_group_depth <= 0) {
    WARN_AT("group.cc", 400, "ncclGroupEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  if (--t_group_depth > 0) return ncclSuccess;
  ncclResult_t res = ncclSuccess;
  int n = t_group_n;
  char *used = calloc(n > 0 ? n : 1, 1);
  struct op *batch = malloc(sizeof(struct op) * (n > 0 ? n : 1));
  for (int i = 0; i < n; i++) {
    if (used[i]) continue;
    int nb = 0;
    for (int j = i; j < n; j++)
      if (!used[j] && t_group_ops[j].comm == t_group_ops[i].comm) { batch[nb++] = t_group_ops[j]; used[j] = 1; }
    ncclResult_t r = launch_ops(t_group_ops[i].comm, batch, nb);
    if (r != ncclSuccess) res = r;
  }
  free(used);
  free(batch);
  t_group_n = 0;
  return res;
}

/* The profiling interface: pncclXxx aliases, as exported by real NCCL. */
#define PALIAS(name) extern __typeof__(name) p##name __attribute__((alias(#name), visibility("default")));
PALIAS(ncclGetVersion)
PALIAS(ncclGetUniqueId)
PALIAS(ncclCommInitRank)
PALIAS(ncclCommInitRankConfig)
PALIAS(ncclCommInitAll)
PALIAS(ncclCommSplit)
PALIAS(ncclCommDestroy)
PALIAS(ncclCommAbort)
PALIAS(ncclCommCount)
PALIAS(ncclCommUserRank)
PALIAS(ncclAllReduce)
PALIAS(ncclAllGather)
PALIAS(ncclReduceScatter)
PALIAS(ncclBroadcast)
PALIAS(ncclBcast)
PALIAS(ncclReduce)
PALIAS(ncclSend)
PALIAS(ncclRecv)
PALIAS(ncclGroupStart)
PALIAS(ncclGroupEnd)
PALIAS(ncclGetErrorString)
PALIAS(ncclGetLastError)
PALIAS(ncclCommGetAsyncError)
