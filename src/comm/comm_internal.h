/* comm_internal.h - what comm.c and its NCCL part (comm_nccl.c) share: the communicator's
 * state. Not for other folders: they use comm.h. */
#ifndef FT_COMM_INTERNAL_H
#define FT_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "src/comm/comm.h"

typedef struct ft_comm_nccl ft_comm_nccl; /* comm_nccl.c */

struct ft_comm {
    int kind;                   /* enum ft_comm_kind */
    int rank, size, local_rank;
    int mpi;                    /* 1: MPI_COMM_WORLD is ours (this build has MPI, initialized) */
    void *scratch;              /* the all-reduce's receive segments, grown once to the largest */
    size_t scratch_bytes;
    ft_comm_nccl *nccl;         /* FT_COMM_NCCL */
    /* the watchdog (comm.h ft_comm_cfg.timeout_s) */
    double timeout_s;
    void (*on_timeout)(void *user, const char *line);
    void *user;
    pthread_t wd;
    int wd_on;
    atomic_int wd_stop;
    _Atomic int64_t busy_ns;    /* CLOCK_MONOTONIC start of the watched collective; 0: none */
};

/* Marks the start / end of a watched collective. */
void ft_comm_busy(ft_comm *c, int on);

/* NCCL (comm_nccl.c): opens libnccl, shares the unique id (over MPI when c->mpi, else through
 * cfg->nccl_id_file) and makes the NCCL communicator of c->rank, c->size. */
int ft_comm_nccl_open(ft_comm *c, const ft_comm_cfg *cfg);
int ft_comm_nccl_allreduce(ft_comm *c, float *buf, int64_t n);
void ft_comm_nccl_close(ft_comm *c);

/* The host collectives over NCCL when there is no MPI (the unique id through a file): buf
 * copied to a device scratch buffer, the NCCL collective, the result copied back. SUM_F32 /
 * SUM_F64: buf[0..n_elem) summed in place (NCCL's order); BCAST: bytes of root's buf;
 * ALLGATHER: each rank's bytes of buf into all[rank * bytes] (all may be NULL). */
enum { FT_NCCL_HOST_SUM_F32, FT_NCCL_HOST_SUM_F64, FT_NCCL_HOST_BCAST, FT_NCCL_HOST_ALLGATHER };
int ft_comm_nccl_host(ft_comm *c, int op, void *buf, size_t bytes, int64_t n_elem, void *all, int root);

/* comm.c's MPI broadcast for comm_nccl.c (the unique id); 0 on a build without MPI. */
int ft_comm_mpi_bcast(const ft_comm *c, void *buf, size_t bytes, int root);

#endif
