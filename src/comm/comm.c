/* comm.c - the communicator (comm.h): the single process and the MPI backend (Open MPI's
 * MPI_COMM_WORLD); the NCCL device all-reduce is comm_nccl.c's. */
#include "src/comm/comm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/comm/comm_internal.h"
#include "src/core/err.h"

#ifdef FT_HAVE_MPI
#include <mpi.h>
#endif

int ft_comm_have_mpi(void)
{
#ifdef FT_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

int ft_comm_rank(const ft_comm *c) { return c ? c->rank : 0; }
int ft_comm_size(const ft_comm *c) { return c ? c->size : 1; }
int ft_comm_local_rank(const ft_comm *c) { return c ? c->local_rank : 0; }
const char *ft_comm_name(const ft_comm *c)
{
    static const char *names[] = {"single", "mpi", "nccl"};
    return c && c->kind >= 0 && c->kind <= 2 ? names[c->kind] : "single";
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ft_comm_busy(ft_comm *c, int on)
{
    if (c->wd_on) atomic_store(&c->busy_ns, on ? now_ns() : 0);
}

/* The watchdog thread: every 100 ms, whether the watched collective has waited too long. */
static void *watchdog(void *arg)
{
    ft_comm *c = arg;
    const struct timespec tick = {0, 100 * 1000 * 1000};
    while (!atomic_load(&c->wd_stop)) {
        nanosleep(&tick, NULL);
        int64_t t0 = atomic_load(&c->busy_ns);
        if (!t0 || (double)(now_ns() - t0) < c->timeout_s * 1e9) continue;
        char line[256];
        snprintf(line, sizeof line, "rank %d of %d: an all-reduce has waited %.0f s for the other ranks "
                 "(a rank died or hangs): ending the job", c->rank, c->size, c->timeout_s);
        if (c->on_timeout) c->on_timeout(c->user, line);
        ft_comm_abort(c, 1);
        _exit(1);
    }
    return NULL;
}

#ifdef FT_HAVE_MPI
/* The recorded line of a failed MPI call. */
static int mpi_fail(const ft_comm *c, const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return ft_err(-EIO, "mpi: %s failed on rank %d of %d: %s (a rank died or the network failed)",
                  what, c->rank, c->size, msg);
}
#define MPI_TRY(c, what, call)                       \
    do {                                             \
        int rc_ = (call);                            \
        if (rc_ != MPI_SUCCESS) return mpi_fail((c), (what), rc_); \
    } while (0)

static int mpi_open(ft_comm *c, const ft_comm_cfg *cfg)
{
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return ft_err(-EIO, "mpi: MPI_Init_thread failed (is this process started by mpirun or srun --mpi=pmix?)");
    c->mpi = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_TRY(c, "MPI_Comm_rank", MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
    MPI_TRY(c, "MPI_Comm_size", MPI_Comm_size(MPI_COMM_WORLD, &c->size));
    MPI_Comm node;
    MPI_TRY(c, "MPI_Comm_split_type", MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0,
                                                          MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &c->local_rank);
    MPI_Comm_free(&node);
    if ((cfg->size > 0 && cfg->size != c->size) || (cfg->rank >= 0 && cfg->rank != c->rank))
        return ft_err(FT_E_INVALID, "mpi: the launcher says rank %d of %d, MPI says rank %d of %d "
                      "(start ftune with the MPI library it was built with)",
                      cfg->rank, cfg->size, c->rank, c->size);
    return 0;
}

/* The scratch buffer holds at least bytes (grown here, so only the first step allocates). */
static int scratch(ft_comm *c, size_t bytes)
{
    if (c->scratch_bytes >= bytes) return 0;
    void *p = realloc(c->scratch, bytes);
    if (!p) return ft_err(-ENOMEM, "mpi: all-reduce scratch of %zu bytes", bytes);
    c->scratch = p;
    c->scratch_bytes = bytes;
    return 0;
}

/* The largest chunk (elements) one all-to-all round moves: MPI counts are ints. */
#define FT_COMM_CHUNK ((int64_t)1 << 26)

/* In-place rank-order sum of buf[0..m) (m <= FT_COMM_CHUNK) of esize-byte elements: the
 * all-to-all of segments, the ordered sum of this rank's segment, the all-gather (comm.h). */
static int mpi_allreduce_chunk(ft_comm *c, void *buf, int64_t m, size_t esize, MPI_Datatype t)
{
    const int P = c->size, me = c->rank;
    if (P < 1 || me < 0 || me >= P) return ft_err(FT_E_INVALID, "mpi: rank %d of %d", me, P);
    int cnt[P], dsp[P], rcnt[P], rdsp[P];
    for (int s = 0; s < P; s++) {
        dsp[s] = (int)(m * s / P);
        cnt[s] = (int)(m * (s + 1) / P) - dsp[s];
    }
    const int L = cnt[me];
    for (int s = 0; s < P; s++) {
        rcnt[s] = L;
        rdsp[s] = s * L;
    }
    FT_TRY(scratch(c, (size_t)P * (size_t)(L ? L : 1) * esize));
    MPI_TRY(c, "MPI_Alltoallv", MPI_Alltoallv(buf, cnt, dsp, t, c->scratch, rcnt, rdsp, t, MPI_COMM_WORLD));
    if (esize == sizeof(float)) {
        const float *in = c->scratch;
        float *out = (float *)buf + dsp[me];
        for (int i = 0; i < L; i++) {
            float acc = in[i];
            for (int s = 1; s < P; s++) acc += in[(size_t)s * L + i];
            out[i] = acc;
        }
    } else {
        const double *in = c->scratch;
        double *out = (double *)buf + dsp[me];
        for (int i = 0; i < L; i++) {
            double acc = in[i];
            for (int s = 1; s < P; s++) acc += in[(size_t)s * L + i];
            out[i] = acc;
        }
    }
    MPI_TRY(c, "MPI_Allgatherv", MPI_Allgatherv(MPI_IN_PLACE, 0, t, buf, cnt, dsp, t, MPI_COMM_WORLD));
    return 0;
}

static int mpi_allreduce(const ft_comm *cc, void *buf, int64_t n, size_t esize, MPI_Datatype t)
{
    ft_comm *c = (ft_comm *)cc; /* the scratch buffer and the watchdog's mark only */
    int rc = 0;
    ft_comm_busy(c, 1);
    for (int64_t at = 0; !rc && at < n; at += FT_COMM_CHUNK) {
        int64_t m = n - at < FT_COMM_CHUNK ? n - at : FT_COMM_CHUNK;
        rc = mpi_allreduce_chunk(c, (char *)buf + (size_t)at * esize, m, esize, t);
    }
    ft_comm_busy(c, 0);
    return rc;
}

int ft_comm_mpi_bcast(const ft_comm *c, void *buf, size_t bytes, int root)
{
    if (!c || !c->mpi || c->size == 1) return 0;
    for (size_t at = 0; at < bytes; at += (size_t)1 << 30) {
        size_t m = bytes - at < ((size_t)1 << 30) ? bytes - at : ((size_t)1 << 30);
        MPI_TRY(c, "MPI_Bcast", MPI_Bcast((char *)buf + at, (int)m, MPI_BYTE, root, MPI_COMM_WORLD));
    }
    return 0;
}
#else
int ft_comm_mpi_bcast(const ft_comm *c, void *buf, size_t bytes, int root) { return 0; }
#endif

int ft_comm_init(ft_comm **out, const ft_comm_cfg *cfg)
{
    *out = NULL;
    if (cfg->kind != FT_COMM_SINGLE && cfg->kind != FT_COMM_MPI && cfg->kind != FT_COMM_NCCL)
        return ft_err(FT_E_INVALID, "comm: unknown backend %d", cfg->kind);
    ft_comm *c = calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    c->kind = cfg->kind;
    c->size = 1;
    int rc = 0;
    if (cfg->kind == FT_COMM_MPI || (cfg->kind == FT_COMM_NCCL && !cfg->nccl_id_file)) {
#ifdef FT_HAVE_MPI
        rc = mpi_open(c, cfg);
#else
        rc = ft_err(FT_E_UNSUPPORTED, "mpi: not in this build (install Open MPI: apt-get install "
                    "libopenmpi-dev openmpi-bin, then rebuild; the [ftune] line says mpi=yes)");
#endif
    } else if (cfg->kind == FT_COMM_NCCL) {
        c->rank = cfg->rank;
        c->size = cfg->size;
        c->local_rank = cfg->local_rank < 0 ? 0 : cfg->local_rank;
        if (c->rank < 0 || c->size < 1 || c->rank >= c->size)
            rc = ft_err(FT_E_INVALID, "nccl: rank %d of %d from the launcher's environment", c->rank, c->size);
    }
    if (!rc && cfg->kind == FT_COMM_NCCL) rc = ft_comm_nccl_open(c, cfg);
    if (!rc && cfg->timeout_s > 0 && c->size > 1) {
        c->timeout_s = cfg->timeout_s;
        c->on_timeout = cfg->on_timeout;
        c->user = cfg->user;
        if (pthread_create(&c->wd, NULL, watchdog, c) == 0) c->wd_on = 1;
        else rc = ft_err(-EAGAIN, "comm: cannot start the all-reduce watchdog thread");
    }
    if (rc) {
        ft_comm_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void ft_comm_free(ft_comm *c)
{
    if (!c) return;
    if (c->wd_on) {
        atomic_store(&c->wd_stop, 1);
        pthread_join(c->wd, NULL);
    }
    if (c->nccl) ft_comm_nccl_close(c);
#ifdef FT_HAVE_MPI
    int fin = 0;
    if (c->mpi && MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
#endif
    free(c->scratch);
    free(c);
}

int ft_comm_allreduce_f32(const ft_comm *c, float *buf, int64_t n)
{
    if (!c || c->size == 1 || n <= 0) return 0;
#ifdef FT_HAVE_MPI
    if (c->mpi) return mpi_allreduce(c, buf, n, sizeof(float), MPI_FLOAT);
#endif
    if (c->nccl) {
        ft_comm_busy((ft_comm *)c, 1);
        int rc = ft_comm_nccl_host((ft_comm *)c, FT_NCCL_HOST_SUM_F32, buf, (size_t)n * sizeof *buf, n, NULL, 0);
        ft_comm_busy((ft_comm *)c, 0);
        return rc;
    }
    return ft_err(FT_E_UNSUPPORTED, "%s: a host all-reduce needs MPI (install libopenmpi-dev)", ft_comm_name(c));
}

int ft_comm_allreduce_f64(const ft_comm *c, double *buf, int64_t n)
{
    if (!c || c->size == 1 || n <= 0) return 0;
#ifdef FT_HAVE_MPI
    if (c->mpi) return mpi_allreduce(c, buf, n, sizeof(double), MPI_DOUBLE);
#endif
    if (c->nccl) {
        ft_comm_busy((ft_comm *)c, 1);
        int rc = ft_comm_nccl_host((ft_comm *)c, FT_NCCL_HOST_SUM_F64, buf, (size_t)n * sizeof *buf, n, NULL, 0);
        ft_comm_busy((ft_comm *)c, 0);
        return rc;
    }
    return ft_err(FT_E_UNSUPPORTED, "%s: a host all-reduce needs MPI (install libopenmpi-dev)", ft_comm_name(c));
}

int ft_comm_has_device_allreduce(const ft_comm *c) { return c && c->nccl; }

int ft_comm_allreduce_f32_device(const ft_comm *c, float *buf, int64_t n)
{
    if (!c || !c->nccl)
        return ft_err(FT_E_UNSUPPORTED, "%s: no device all-reduce (the NCCL backend has it)", ft_comm_name(c));
    ft_comm_busy((ft_comm *)c, 1);
    int rc = ft_comm_nccl_allreduce((ft_comm *)c, buf, n);
    ft_comm_busy((ft_comm *)c, 0);
    return rc;
}

int ft_comm_bcast(const ft_comm *c, void *buf, size_t bytes, int root)
{
    if (!c || c->size == 1) return 0;
    if (c->mpi) return ft_comm_mpi_bcast(c, buf, bytes, root);
    if (c->nccl) return ft_comm_nccl_host((ft_comm *)c, FT_NCCL_HOST_BCAST, buf, bytes, 0, NULL, root);
    return ft_err(FT_E_UNSUPPORTED, "%s: broadcast needs MPI (install libopenmpi-dev)", ft_comm_name(c));
}

int ft_comm_barrier(const ft_comm *c)
{
    if (!c || c->size == 1) return 0;
#ifdef FT_HAVE_MPI
    if (c->mpi) {
        MPI_TRY(c, "MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD));
        return 0;
    }
#endif
    if (c->nccl) {
        float one = 1;
        return ft_comm_nccl_host((ft_comm *)c, FT_NCCL_HOST_SUM_F32, &one, sizeof one, 1, NULL, 0);
    }
    return ft_err(FT_E_UNSUPPORTED, "%s: barrier needs MPI (install libopenmpi-dev)", ft_comm_name(c));
}

int ft_comm_gather(const ft_comm *c, const void *rec, size_t bytes, void *all, int root)
{
    if (!c || c->size == 1) {
        if (all && all != rec) memcpy(all, rec, bytes);
        return 0;
    }
    if (bytes > (1u << 30)) return ft_err(FT_E_RANGE, "comm: gather of %zu bytes per rank (small records only)", bytes);
#ifdef FT_HAVE_MPI
    if (c->mpi) {
        MPI_TRY(c, "MPI_Gather", MPI_Gather(rec, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD));
        return 0;
    }
#endif
    if (c->nccl) /* an all-gather: every rank gets the records, root keeps them */
        return ft_comm_nccl_host((ft_comm *)c, FT_NCCL_HOST_ALLGATHER, (void *)rec, bytes, 0,
                                 c->rank == root ? all : NULL, root);
    return ft_err(FT_E_UNSUPPORTED, "%s: gather needs MPI (install libopenmpi-dev)", ft_comm_name(c));
}

int ft_comm_allgather(const ft_comm *c, const void *rec, size_t bytes, void *all)
{
    if (!c || c->size == 1) {
        if (all != rec) memcpy(all, rec, bytes);
        return 0;
    }
    if (bytes > (1u << 30)) return ft_err(FT_E_RANGE, "comm: all-gather of %zu bytes per rank (small records only)", bytes);
#ifdef FT_HAVE_MPI
    if (c->mpi) {
        MPI_TRY(c, "MPI_Allgather", MPI_Allgather(rec, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD));
        return 0;
    }
#endif
    if (c->nccl) return ft_comm_nccl_host((ft_comm *)c, FT_NCCL_HOST_ALLGATHER, (void *)rec, bytes, 0, all, 0);
    return ft_err(FT_E_UNSUPPORTED, "%s: all-gather needs MPI (install libopenmpi-dev)", ft_comm_name(c));
}

void ft_comm_abort(const ft_comm *c, int code)
{
#ifdef FT_HAVE_MPI
    if (c && c->mpi && c->size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
}
