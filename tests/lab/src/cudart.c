/* stallscope lab: host-only CUDA runtime shim (libcudart.so.12).
 *
 * A stream is a FIFO of host callbacks drained in order by one worker thread,
 * so work enqueued on it runs asynchronously to the caller, like kernels on a
 * GPU. cudaStreamSynchronize / cudaEventSynchronize block the caller until the
 * work is done; a collective that never finishes therefore leaves the caller
 * blocked inside cudaStreamSynchronize, exactly where a real job hangs.
 */
#define _GNU_SOURCE
#include "cuda_runtime.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

struct work {
  cudaHostFn_t fn;
  void *arg;
  struct work *next;
};

struct CUstream_st {
  pthread_mutex_t mu;
  pthread_cond_t cv_work; /* worker waits for work */
  pthread_cond_t cv_done; /* synchronizers wait for completion */
  struct work *head, *tail;
  uint64_t enqueued, completed;
  int stop;
  pthread_t thread;
  struct CUstream_st *next_stream; /* registry, for cudaDeviceSynchronize */
};

struct CUevent_st {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t recorded; /* number of records */
  uint64_t fired;    /* number of records that completed */
  struct timespec when;
  unsigned int flags;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *g_streams;
static struct CUstream_st *g_default;
static __thread int t_device;
static __thread cudaError_t t_last_error;

static cudaError_t seterr(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

static void *stream_main(void *p) {
  struct CUstream_st *s = p;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->cv_work, &s->mu);
    if (!s->head && s->stop) break;
    struct work *w = s->head;
    pthread_mutex_unlock(&s->mu);
    w->fn(w->arg);
    pthread_mutex_lock(&s->mu);
    s->head = w->next;
    if (!s->head) s->tail = NULL;
    s->completed++;
    free(w);
    pthread_cond_broadcast(&s->cv_done);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static struct CUstream_st *stream_new(void) {
  struct CUstream_st *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv_work, NULL);
  pthread_cond_init(&s->cv_done, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    free(s);
    return NULL;
  }
  pthread_setname_np(s->thread, "cuda-stream");
  pthread_mutex_lock(&g_mu);
  s->next_stream = g_streams;
  g_streams = s;
  pthread_mutex_unlock(&g_mu);
  return s;
}

static struct CUstream_st *resolve(cudaStream_t s) {
  if (s && s != cudaStreamLegacy && s != cudaStreamPerThread) return s;
  pthread_mutex_lock(&g_mu);
  struct CUstream_st *d = g_default;
  pthread_mutex_unlock(&g_mu);
  if (d) return d;
  d = stream_new();
  pthread_mutex_lock(&g_mu);
  if (!g_default) g_default = d; /* a racing creator's stream just stays idle */
  d = g_default;
  pthread_mutex_unlock(&g_mu);
  return d;
}

static cudaError_t enqueue(struct CUstream_st *s, cudaHostFn_t fn, void *arg) {
  struct work *w = malloc(sizeof(*w));
  if (!w) return seterr(cudaErrorMemoryAllocation);
  w->fn = fn;
  w->arg = arg;
  w->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = w; else s->head = w;
  s->tail = w;
  s->enqueued++;
  pthread_cond_signal(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  return cudaSuccess;
}

EXPORT cudaError_t cudaGetDeviceCount(int *count) {
  const char *e = getenv("SSLAB_GPUS_PER_NODE");
  *count = e ? atoi(e) : 8;
  if (*count < 1) *count = 1;
  return cudaSuccess;
}
EXPORT cudaError_t cudaSetDevice(int device) {
  if (device < 0) return seterr(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}
EXPORT cudaError_t cudaGetDevice(int *device) { *device = t_device; return cudaSuccess; }

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  struct CUstream_st *s = resolve(stream);
  if (!s) return seterr(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&s->mu);
  uint64_t target = s->enqueued;
  while (s->completed < target) pthread_cond_wait(&s->cv_done, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void) {
  pthread_mutex_lock(&g_mu);
  struct CUstream_st *list[256];
  int n = 0;
  for (struct CUstream_st *s = g_streams; s && n < 256; s = s->next_stream) list[n++] = s;
  pthread_mutex_unlock(&g_mu);
  for (int i = 0; i < n; i++) cudaStreamSynchronize(list[i]);
  return cudaSuccess;
}

EXPORT cudaError_t cudaMalloc(void **ptr, size_t size) {
  void *p = NULL;
  if (posix_memalign(&p, 256, size ? size : 1) != 0) return seterr(cudaErrorMemoryAllocation);
  *ptr = p;
  return cudaSuccess;
}
EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaMalloc(ptr, size); }
EXPORT cudaError_t cudaFree(void *ptr) { free(ptr); return cudaSuccess; }
EXPORT cudaError_t cudaFreeHost(void *ptr) { free(ptr); return cudaSuccess; }

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind) {
  (void)kind;
  cudaDeviceSynchronize(); /* cudaMemcpy synchronizes with the legacy stream */
  memmove(dst, src, count);
  return cudaSuccess;
}
EXPORT cudaError_t cudaMemset(void *ptr, int value, size_t count) {
  cudaDeviceSynchronize();
  memset(ptr, value, count);
  return cudaSuccess;
}

struct memop { void *dst; const void *src; size_t n; int value; int is_set; };
static void memop_run(void *p) {
  struct memop *m = p;
  if (m->is_set) memset(m->dst, m->value, m->n); else memmove(m->dst, m->src, m->n);
  free(m);
}
EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  (void)kind;
  struct memop *m = calloc(1, sizeof(*m));
  if (!m) return seterr(cudaErrorMemoryAllocation);
  m->dst = dst; m->src = src; m->n = count;
  return enqueue(resolve(stream), memop_run, m);
}
EXPORT cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
  struct memop *m = calloc(1, sizeof(*m));
  if (!m) return seterr(cudaErrorMemoryAllocation);
  m->dst = ptr; m->value = value; m->n = count; m->is_set = 1;
  return enqueue(resolve(stream), memop_run, m);
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  struct CUstream_st *s = stream_new();
  if (!s) return seterr(cudaErrorMemoryAllocation);
  *stream = s;
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  (void)flags;
  return cudaStreamCreate(stream);
}
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  struct CUstream_st *s = stream;
  if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) return seterr(cudaErrorInvalidResourceHandle);
  /* Like CUDA: pending work still completes; the handle is released after. */
  cudaStreamSynchronize(s);
  pthread_mutex_lock(&g_mu);
  for (struct CUstream_st **pp = &g_streams; *pp; pp = &(*pp)->next_stream)
    if (*pp == s) { *pp = s->next_stream; break; }
  pthread_mutex_unlock(&g_mu);
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_signal(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  free(s);
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream) {
  struct CUstream_st *s = resolve(stream);
  pthread_mutex_lock(&s->mu);
  int busy = s->completed < s->enqueued;
  pthread_mutex_unlock(&s->mu);
  return busy ? cudaErrorNotReady : cudaSuccess;
}
EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
  struct CUstream_st *s = resolve(stream);
  if (!s || !fn) return seterr(cudaErrorInvalidValue);
  return enqueue(s, fn, userData);
}

/* ---- events ---- */
EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  struct CUevent_st *e = calloc(1, sizeof(*e));
  if (!e) return seterr(cudaErrorMemoryAllocation);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  e->flags = flags;
  *event = e;
  return cudaSuccess;
}
EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }
EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event) {
  /* Like CUDA, destroying a recorded event is allowed; we leak it if still pending. */
  if (!event) return seterr(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&event->mu);
  int pending = event->fired < event->recorded;
  pthread_mutex_unlock(&event->mu);
  if (!pending) free(event);
  return cudaSuccess;
}
struct evrec { struct CUevent_st *e; uint64_t seq; };
static void event_fire(void *p) {
  struct evrec *r = p;
  pthread_mutex_lock(&r->e->mu);
  if (r->seq > r->e->fired) r->e->fired = r->seq;
  clock_gettime(CLOCK_MONOTONIC, &r->e->when);
  pthread_cond_broadcast(&r->e->cv);
  pthread_mutex_unlock(&r->e->mu);
  free(r);
}
EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event) return seterr(cudaErrorInvalidResourceHandle);
  struct evrec *r = malloc(sizeof(*r));
  if (!r) return seterr(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&event->mu);
  r->e = event;
  r->seq = ++event->recorded;
  pthread_mutex_unlock(&event->mu);
  return enqueue(resolve(stream), event_fire, r);
}
EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return seterr(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&event->mu);
  uint64_t target = event->recorded;
  while (event->fired < target) pthread_cond_wait(&event->cv, &event->mu);
  pthread_mutex_unlock(&event->mu);
  return cudaSuccess;
}
EXPORT cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return seterr(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&event->mu);
  int pending = event->fired < event->recorded;
  pthread_mutex_unlock(&event->mu);
  return pending ? cudaErrorNotReady : cudaSuccess;
}
EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end) return seterr(cudaErrorInvalidResourceHandle);
  if (cudaEventQuery(start) != cudaSuccess || cudaEventQuery(end) != cudaSuccess) return cudaErrorNotReady;
  double d = (end->when.tv_sec - start->when.tv_sec) * 1e3 + (end->when.tv_nsec - start->when.tv_nsec) / 1e6;
  *ms = (float)d;
  return cudaSuccess;
}
struct evwait { struct CUevent_st *e; uint64_t seq; };
static void event_wait(void *p) {
  struct evwait *w = p;
  pthread_mutex_lock(&w->e->mu);
  while (w->e->fired < w->seq) pthread_cond_wait(&w->e->cv, &w->e->mu);
  pthread_mutex_unlock(&w->e->mu);
  free(w);
}
EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)flags;
  if (!event) return seterr(cudaErrorInvalidResourceHandle);
  struct evwait *w = malloc(sizeof(*w));
  if (!w) return seterr(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&event->mu);
  w->e = event;
  w->seq = event->recorded;
  pthread_mutex_unlock(&event->mu);
  return enqueue(resolve(stream), event_wait, w);
}

EXPORT cudaError_t cudaGetLastError(void) { cudaError_t e = t_last_error; t_last_error = cudaSuccess; return e; }
EXPORT cudaError_t cudaPeekAtLastError(void) { return t_last_error; }
EXPORT const char *cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}
EXPORT const char *cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error";
  }
}
EXPORT cudaError_t cudaRuntimeGetVersion(int *version) { *version = 12040; return cudaSuccess; }
EXPORT cudaError_t cudaDriverGetVersion(int *version) { *version = 12040; return cudaSuccess; }
