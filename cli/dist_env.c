/* dist_env.c - the launcher's environment into a communicator (dist_env.h). */
#include "cli/dist_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/core/err.h"

/* The integer value of the first set variable of names (-1 when none is set). */
static int env_int(const char *const *names, int n)
{
    for (int i = 0; i < n; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return -1;
}

/* The watchdog's line (src/comm/comm.h ft_comm_cfg.on_timeout). */
static void on_timeout(void *user, const char *line)
{
    fprintf(stderr, "ftune: %s\n", line);
    fflush(stderr);
}

int ft_cli_comm_open(ft_comm **out)
{
    *out = NULL;
    static const char *const size_v[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    static const char *const rank_v[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
    static const char *const local_v[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    static const char *const lsize_v[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    int size = env_int(size_v, 3);
    const char *kind = getenv("FTUNE_COMM");
    /* one process: no communicator, unless FTUNE_COMM asks for one (a 1-rank NCCL check) */
    if (size <= 1 && !(kind && *kind)) return 0;
    if (size < 1) size = 1;
    int rank = env_int(rank_v, 3);
    ft_comm_cfg cfg = {.kind = FT_COMM_MPI, .rank = rank < 0 && size == 1 ? 0 : rank, .size = size,
                       .local_rank = env_int(local_v, 3)};
    if (kind && !strcmp(kind, "nccl")) cfg.kind = FT_COMM_NCCL;
    else if (kind && *kind && strcmp(kind, "mpi")) {
        fprintf(stderr, "ftune: FTUNE_COMM=%s: expected mpi or nccl\n", kind);
        return 1;
    }
    const char *idf = getenv("FTUNE_NCCL_ID_FILE");
    if (cfg.kind == FT_COMM_NCCL && idf && *idf) cfg.nccl_id_file = idf;
    /* the all-reduce watchdog: FTUNE_COMM_TIMEOUT seconds (default 600; 0: off) */
    const char *to = getenv("FTUNE_COMM_TIMEOUT");
    cfg.timeout_s = to && *to ? atof(to) : 600;
    cfg.on_timeout = on_timeout;
    int lsize = env_int(lsize_v, 3);
    if (lsize > 1 && cfg.local_rank >= 0 && !getenv("CUDA_VISIBLE_DEVICES")) {
        char dev[16];
        snprintf(dev, sizeof dev, "%d", cfg.local_rank);
        setenv("CUDA_VISIBLE_DEVICES", dev, 0);
    }
    if (ft_comm_init(out, &cfg) < 0) {
        fprintf(stderr, "ftune: rank %d of %d: %s\n", cfg.rank, size, ft_errmsg());
        return 1;
    }
    return 0;
}

void ft_cli_comm_fail(const ft_comm *c, const char *msg)
{
    if (ft_comm_size(c) > 1) {
        /* an error every rank meets (a refused resume) is printed once: rank 0's abort ends
         * the others while they wait; an error of one rank > 0 is printed after the wait */
        if (ft_comm_rank(c) > 0) sleep(2);
        fprintf(stderr, "ftune: rank %d of %d: %s\n", ft_comm_rank(c), ft_comm_size(c), msg);
        fflush(stderr);
        ft_comm_abort(c, 1);
        return;
    }
    fprintf(stderr, "ftune: %s\n", msg);
}
