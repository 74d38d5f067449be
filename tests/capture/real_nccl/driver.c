/* A tiny program that calls a real libnccl on a machine without a GPU (tests/capture/
 * test_real_libnccl.py): dlopen(argv[1]), print "ready", wait for the gate file argv[2] (the
 * tracer attaches in between), then ncclGetVersion, ncclGetUniqueId, ncclCommInitRank (fails
 * without a GPU; NCCL logs WARN lines under NCCL_DEBUG=INFO), ncclAllReduce, ncclBroadcast and
 * ncclCommDestroy on a NULL communicator (rejected), and exit 0. Each call's result goes to
 * stdout as "call NAME rc=N". No NCCL or CUDA header is needed: the prototypes are declared here. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;

typedef int (*get_version_t)(int *);
typedef int (*get_unique_id_t)(ncclUniqueId *);
typedef int (*comm_init_rank_t)(ncclComm_t *, int, ncclUniqueId, int);
typedef int (*all_reduce_t)(const void *, void *, size_t, int, int, ncclComm_t, void *);
typedef int (*broadcast_t)(const void *, void *, size_t, int, int, ncclComm_t, void *);
typedef int (*comm_destroy_t)(ncclComm_t);

static void *sym(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "driver: %s not exported: %s\n", name, dlerror());
        exit(3);
    }
    return f;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIBNCCL GATE_FILE\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "driver: dlopen: %s\n", dlerror());
        return 3;
    }
    printf("ready\n");
    for (int i = 0; i < 1200 && access(argv[2], F_OK) != 0; i++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    int version = 0;
    int rc = ((get_version_t)sym(lib, "ncclGetVersion"))(&version);
    printf("call ncclGetVersion rc=%d version=%d\n", rc, version);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    rc = ((get_unique_id_t)sym(lib, "ncclGetUniqueId"))(&id);
    printf("call ncclGetUniqueId rc=%d\n", rc);
    ncclComm_t comm = NULL;
    rc = ((comm_init_rank_t)sym(lib, "ncclCommInitRank"))(&comm, 1, id, 0);
    printf("call ncclCommInitRank rc=%d comm=%p\n", rc, comm);
    /* whatever the init did, the collectives get a NULL communicator: rejected, never launched */
    float buf[4] = {0};
    rc = ((all_reduce_t)sym(lib, "ncclAllReduce"))(buf, buf, 4, 7 /* ncclFloat32 */, 0 /* ncclSum */, NULL, NULL);
    printf("call ncclAllReduce rc=%d\n", rc);
    rc = ((broadcast_t)sym(lib, "ncclBroadcast"))(buf, buf, 4, 7, 0, NULL, NULL);
    printf("call ncclBroadcast rc=%d\n", rc);
    rc = ((comm_destroy_t)sym(lib, "ncclCommDestroy"))(NULL);
    printf("call ncclCommDestroy rc=%d\n", rc);
    /* stay a moment: the tracer reads the returns of a live process */
    sleep(1);
    return 0;
}
