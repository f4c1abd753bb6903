/* comm_nccl.c - the NCCL part of the communicator (comm.h): libnccl.so.2 opened with dlopen
 * when an NCCL communicator is made (so that CPU runs never map it, as kernels/cuda/backend.cu
 * opens cuBLAS), the unique id shared over MPI or through a file on shared storage (llm.c's
 * two ways, llmc/zero.cuh), ncclCommInitRank, and the in-place sum of device fp32 buffers on
 * the default stream. The NCCL types and values used are those of nccl.h (NCCL 2.x:
 * ncclUniqueId is 128 bytes, ncclFloat32 7, ncclSum 0). */
#include "src/comm/comm_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/core/err.h"

#ifdef FT_HAVE_CUDA
/* cudart (linked statically in a CUDA build): the default stream's end */
extern int cudaStreamSynchronize(void *stream);
extern int cudaMalloc(void **p, size_t bytes);
extern int cudaFree(void *p);
extern int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind); /* 4: cudaMemcpyDefault */
extern int cudaGetDeviceCount(int *count);
#endif

#ifdef FT_HAVE_CUDA
typedef struct { char internal[128]; } nccl_id;
typedef void *nccl_comm_t;

struct ft_comm_nccl {
    void *lib;
    nccl_comm_t comm;
    int (*GetUniqueId)(nccl_id *);
    int (*CommInitRank)(nccl_comm_t *, int, nccl_id, int);
    int (*AllReduce)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    int (*AllGather)(const void *, void *, size_t, int, nccl_comm_t, void *);
    int (*Broadcast)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    void *dev;                  /* device scratch of the host collectives without MPI */
    size_t dev_bytes;
    int (*CommDestroy)(nccl_comm_t);
    const char *(*GetErrorString)(int);
};

static int nccl_fail(const ft_comm_nccl *n, const char *what, int rc)
{
    return ft_err(-EIO, "nccl: %s: %s (%d)", what, n->GetErrorString ? n->GetErrorString(rc) : "?", rc);
}

static int nccl_dl(ft_comm_nccl *n)
{
    const char *names[] = {"libnccl.so.2", "libnccl.so"};
    for (int i = 0; i < 2 && !n->lib; i++) n->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!n->lib)
        return ft_err(FT_E_UNSUPPORTED, "nccl: cannot load libnccl.so.2 (install NVIDIA's libnccl2, "
                      "or use the MPI backend): %s", dlerror());
#define SYM(field, name)                                                          \
    if (!(*(void **)&n->field = dlsym(n->lib, name)))                             \
        return ft_err(FT_E_UNSUPPORTED, "nccl: libnccl.so.2 lacks %s", name);
    SYM(GetUniqueId, "ncclGetUniqueId");
    SYM(CommInitRank, "ncclCommInitRank");
    SYM(AllReduce, "ncclAllReduce");
    SYM(AllGather, "ncclAllGather");
    SYM(Broadcast, "ncclBroadcast");
    SYM(CommDestroy, "ncclCommDestroy");
    SYM(GetErrorString, "ncclGetErrorString");
#undef SYM
    return 0;
}

/* The id through a file: rank 0 writes path.tmp and renames it to path; the others poll for
 * path (every 100 ms, up to timeout_s) and read it. */
static int id_file(const ft_comm *c, const char *path, double timeout_s, nccl_id *id)
{
    if (c->rank == 0) {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0)
            return ft_err(-errno ? -errno : -EIO, "nccl: %s: cannot write the unique id", tmp);
        if (rename(tmp, path) != 0) return ft_err(-errno, "nccl: %s: cannot rename into place", path);
        return 0;
    }
    double waited = 0;
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1) return 0;
        }
        if (waited >= timeout_s)
            return ft_err(FT_E_NOTFOUND, "nccl: %s: no unique id from rank 0 after %.0f s", path, waited);
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        waited += 0.1;
    }
}

#else
struct ft_comm_nccl {
    void *lib;
};
#endif

int ft_comm_nccl_open(ft_comm *c, const ft_comm_cfg *cfg)
{
#ifndef FT_HAVE_CUDA
    return ft_err(FT_E_UNSUPPORTED, "nccl: this build has no CUDA backend (build with nvcc found)");
#else
    /* a GPU first: libnccl loaded on a machine without one starts threads of its own and fails
     * later, and its teardown at exit can then crash the process */
    int n_dev = 0, crc = cudaGetDeviceCount(&n_dev);
    if (crc != 0 || n_dev < 1)
        return ft_err(FT_E_UNSUPPORTED, "nccl: no CUDA device (cudaGetDeviceCount: error %d, %d devices)",
                      crc, n_dev);
    ft_comm_nccl *n = calloc(1, sizeof *n);
    if (!n) return -ENOMEM;
    c->nccl = n;
    FT_TRY(nccl_dl(n));
    nccl_id id;
    memset(&id, 0, sizeof id);
    int rc = 0;
    if (c->rank == 0 && (rc = n->GetUniqueId(&id)) != 0) return nccl_fail(n, "ncclGetUniqueId", rc);
    if (cfg->nccl_id_file)
        FT_TRY(id_file(c, cfg->nccl_id_file, cfg->nccl_id_timeout_s > 0 ? cfg->nccl_id_timeout_s : 300, &id));
    else
        FT_TRY(ft_comm_mpi_bcast(c, &id, sizeof id, 0));
    if ((rc = n->CommInitRank(&n->comm, c->size, id, c->rank)) != 0) {
        n->comm = NULL;
        return nccl_fail(n, "ncclCommInitRank", rc);
    }
    return 0;
#endif
}

int ft_comm_nccl_allreduce(ft_comm *c, float *buf, int64_t count)
{
#ifndef FT_HAVE_CUDA
    return ft_err(FT_E_UNSUPPORTED, "nccl: this build has no CUDA backend");
#else
    ft_comm_nccl *n = c->nccl;
    if (count <= 0) return 0; /* one rank too: FTUNE_COMM=nccl's one-rank check runs it */
    int rc = n->AllReduce(buf, buf, (size_t)count, 7 /* ncclFloat32 */, 0 /* ncclSum */, n->comm, NULL);
    if (rc) return nccl_fail(n, "ncclAllReduce", rc);
    if ((rc = cudaStreamSynchronize(NULL)) != 0) return ft_err(-EIO, "nccl: cudaStreamSynchronize: error %d", rc);
    return 0;
#endif
}

#ifdef FT_HAVE_CUDA
/* The device scratch holds at least bytes (grown here: the first call of each size allocates). */
static int dev_scratch(ft_comm_nccl *n, size_t bytes)
{
    if (n->dev_bytes >= bytes) return 0;
    if (n->dev) cudaFree(n->dev);
    n->dev = NULL;
    n->dev_bytes = 0;
    if (cudaMalloc(&n->dev, bytes) != 0) return ft_err(-ENOMEM, "nccl: device scratch of %zu bytes", bytes);
    n->dev_bytes = bytes;
    return 0;
}

static int copy(void *dst, const void *src, size_t bytes)
{
    return cudaMemcpy(dst, src, bytes, 4) ? ft_err(-EIO, "nccl: cudaMemcpy of %zu bytes", bytes) : 0;
}

static int done(ft_comm_nccl *n, const char *what, int rc)
{
    if (rc) return nccl_fail(n, what, rc);
    if ((rc = cudaStreamSynchronize(NULL)) != 0) return ft_err(-EIO, "nccl: %s: cudaStreamSynchronize: error %d", what, rc);
    return 0;
}
#endif

int ft_comm_nccl_host(ft_comm *c, int op, void *buf, size_t bytes, int64_t n_elem, void *all, int root)
{
#ifndef FT_HAVE_CUDA
    return ft_err(FT_E_UNSUPPORTED, "nccl: this build has no CUDA backend");
#else
    ft_comm_nccl *n = c->nccl;
    const size_t P = (size_t)c->size;
    switch (op) {
    case FT_NCCL_HOST_SUM_F32:
    case FT_NCCL_HOST_SUM_F64:
        FT_TRY(dev_scratch(n, bytes));
        FT_TRY(copy(n->dev, buf, bytes));
        FT_TRY(done(n, "ncclAllReduce", n->AllReduce(n->dev, n->dev, (size_t)n_elem,
                                                   op == FT_NCCL_HOST_SUM_F32 ? 7 : 8, 0, n->comm, NULL)));
        return copy(buf, n->dev, bytes);
    case FT_NCCL_HOST_BCAST:
        FT_TRY(dev_scratch(n, bytes ? bytes : 1));
        if (c->rank == root) FT_TRY(copy(n->dev, buf, bytes));
        FT_TRY(done(n, "ncclBroadcast", n->Broadcast(n->dev, n->dev, bytes, 1 /* ncclUint8 */, root, n->comm, NULL)));
        return copy(buf, n->dev, bytes);
    case FT_NCCL_HOST_ALLGATHER: {
        FT_TRY(dev_scratch(n, P * bytes > 0 ? P * bytes : 1));
        char *mine = (char *)n->dev + (size_t)c->rank * bytes;
        FT_TRY(copy(mine, buf, bytes));
        FT_TRY(done(n, "ncclAllGather", n->AllGather(mine, n->dev, bytes, 1, n->comm, NULL)));
        return all ? copy(all, n->dev, P * bytes) : 0;
    }
    }
    return ft_err(FT_E_INVALID, "nccl: host collective %d", op);
#endif
}

void ft_comm_nccl_close(ft_comm *c)
{
    ft_comm_nccl *n = c->nccl;
#ifdef FT_HAVE_CUDA
    if (n->dev) cudaFree(n->dev);
    if (n->comm && n->CommDestroy) n->CommDestroy(n->comm);
#endif
    if (n->lib) dlclose(n->lib);
    free(n);
    c->nccl = NULL;
}
