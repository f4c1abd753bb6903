/* comm.h - the communicator of a run over several processes (ranks): who this process is
 * (rank, size, local rank on its node) and the collectives data-parallel training needs.
 *
 * Backends (ft_comm_cfg.kind):
 *   FT_COMM_SINGLE  one process, no library: every collective is the identity (size 1). A
 *                   NULL ft_comm * is the same and is what a run without a launcher passes.
 *   FT_COMM_MPI     Open MPI (MPI_Init_thread, MPI_COMM_WORLD with MPI_ERRORS_RETURN, so that
 *                   a lost rank is an error returned here, never a hang in silence). Linked
 *                   when the Makefile finds it (mpi=yes in its probe line; Debian:
 *                   libopenmpi-dev, openmpi-bin).
 *   FT_COMM_NCCL    NCCL for the device buffers of ft_comm_allreduce_f32_device (libnccl.so.2
 *                   opened with dlopen when the communicator is made, as the CUDA backend
 *                   opens cuBLAS), MPI for everything else and for broadcasting NCCL's unique
 *                   id; without MPI (Slurm without PMIx) the id is written by rank 0 to
 *                   ft_comm_cfg.nccl_id_file on shared storage and read there by the others,
 *                   and the host collectives go through NCCL too (a small device buffer).
 *
 * Determinism: ft_comm_allreduce_f32/_f64 add the ranks' buffers in rank order,
 * ((b0 + b1) + b2) + ..., on every rank, so every rank gets the same bits and the sum is the
 * one a single process accumulating the ranks' parts in that order gets (how 2 ranks of
 * gradient accumulation 1 give the adapter of 1 rank of gradient accumulation 2). The MPI
 * backend does it as an all-to-all of segments (rank s gets every rank's segment s and adds
 * them in rank order) then an all-gather of the sums: each rank sends and receives
 * 2 (size - 1) / size of the buffer, as a ring all-reduce does. NCCL's device all-reduce is
 * deterministic for one topology but its order is NCCL's (ring or tree), not rank order.
 *
 * Every function returns 0 or a negative code with one line recorded (src/core/err.h); a
 * collective that fails names the backend, the collective and the library's message (a rank
 * that died: "MPI_Alltoallv: ... process failure"). */
#ifndef FT_COMM_H
#define FT_COMM_H

#include <stddef.h>
#include <stdint.h>

enum ft_comm_kind { FT_COMM_SINGLE = 0, FT_COMM_MPI = 1, FT_COMM_NCCL = 2 };

typedef struct ft_comm_cfg {
    int kind;                   /* enum ft_comm_kind */
    /* The launcher's view (cli/ reads OMPI_COMM_WORLD_*, PMI_*, SLURM_*): checked against
     * MPI's own with MPI, and the only source of rank/size for NCCL without MPI. -1: unknown */
    int rank, size, local_rank;
    const char *nccl_id_file;   /* NCCL without MPI: the unique id's file on shared storage */
    double nccl_id_timeout_s;   /* how long ranks > 0 wait for that file (0: 300 s) */
    /* The watchdog of the all-reduces (ft_comm_allreduce_f32/_f64, the step loop's): one that
     * has waited timeout_s for the other ranks (a rank that hangs, or died where the launcher
     * does not end the job) calls on_timeout with one line, then ends every rank
     * (ft_comm_abort; _exit(1) without MPI). The set-up collectives (gather, all-gather,
     * broadcast, barrier) are not watched: a rank may wait there while another tokenizes or
     * builds its node's pack. 0: no watchdog. */
    double timeout_s;
    void (*on_timeout)(void *user, const char *line);
    void *user;
} ft_comm_cfg;

typedef struct ft_comm ft_comm;

/* 1 when this build has the MPI backend (linked), 0 otherwise. */
int ft_comm_have_mpi(void);

/* Makes the communicator of cfg into *out. MPI: MPI_Init_thread (once per process). NCCL:
 * libnccl.so.2 opened, the unique id shared, ncclCommInitRank (a CUDA device must be current).
 * Errors: FT_E_UNSUPPORTED naming the package when the backend is missing from this build or
 * the machine ("MPI: not in this build (install libopenmpi-dev and rebuild)", "NCCL: cannot
 * load libnccl.so.2 (install libnccl2)"), FT_E_INVALID when the launcher's rank/size
 * disagree with MPI's, -ENOMEM. */
int ft_comm_init(ft_comm **out, const ft_comm_cfg *cfg);
/* Ends the communicator (MPI_Finalize, ncclCommDestroy). NULL-safe. */
void ft_comm_free(ft_comm *c);

/* This process's rank (0 .. size - 1), the number of ranks, the rank among this node's ranks,
 * the backend's name ("single", "mpi", "nccl"). A NULL c is the single process: 0, 1, 0. */
int ft_comm_rank(const ft_comm *c);
int ft_comm_size(const ft_comm *c);
int ft_comm_local_rank(const ft_comm *c);
const char *ft_comm_name(const ft_comm *c);

/* buf[0..n) (host memory, fp32 / fp64) becomes the sum over the ranks of their buf, added in
 * rank order (see above); n must be the same on every rank. */
int ft_comm_allreduce_f32(const ft_comm *c, float *buf, int64_t n);
int ft_comm_allreduce_f64(const ft_comm *c, double *buf, int64_t n);
/* 1 when ft_comm_allreduce_f32_device can take device pointers (the NCCL backend), else 0:
 * the caller copies device buffers to host memory and uses ft_comm_allreduce_f32. */
int ft_comm_has_device_allreduce(const ft_comm *c);
/* The sum over the ranks of the CUDA device buffer buf[0..n), in place, NCCL's order; the
 * device work before it must be finished (the caller syncs its backend) and the call returns
 * once the sum is in buf. FT_E_UNSUPPORTED without the NCCL backend. */
int ft_comm_allreduce_f32_device(const ft_comm *c, float *buf, int64_t n);

/* buf[0..bytes) of rank root becomes every rank's. */
int ft_comm_bcast(const ft_comm *c, void *buf, size_t bytes, int root);
/* Returns once every rank has called it. */
int ft_comm_barrier(const ft_comm *c);
/* Gathers one small record of `bytes` bytes (the same on every rank) from each rank into
 * all[rank * bytes ..] on rank root (all: size * bytes bytes there; ignored elsewhere, may be
 * NULL). For the per-rank lines of `ftune plan` and a sweep's trial records. */
int ft_comm_gather(const ft_comm *c, const void *rec, size_t bytes, void *all, int root);
/* Like ft_comm_gather, with the records on every rank. */
int ft_comm_allgather(const ft_comm *c, const void *rec, size_t bytes, void *all);

/* Ends every rank of the job with exit status code (MPI_Abort); the caller has printed its
 * one line first. The single process (or NULL c) returns at once and the caller exits. */
void ft_comm_abort(const ft_comm *c, int code);

#endif
