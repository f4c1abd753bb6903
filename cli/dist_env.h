/* dist_env.h - the ranks of a run started by a launcher (mpirun, srun), from the environment
 * the launcher sets, and the communicator (src/comm/comm.h) made from them. */
#ifndef FT_CLI_DIST_ENV_H
#define FT_CLI_DIST_ENV_H

#include "src/comm/comm.h"

/* The communicator of this process: NULL in *out when no launcher started several ranks (a
 * single process: nothing changes). Ranks from OMPI_COMM_WORLD_SIZE/_RANK/_LOCAL_RANK (Open
 * MPI's mpirun), PMI_SIZE/PMI_RANK (MPICH's and Slurm's PMI) or SLURM_NTASKS/SLURM_PROCID/
 * SLURM_LOCALID (srun); the backend from FTUNE_COMM ("mpi", the default, or "nccl"), with
 * FTUNE_NCCL_ID_FILE for NCCL without MPI (the unique id through a file on shared storage),
 * FTUNE_COMM_TIMEOUT for the all-reduce watchdog (seconds, default 600, 0 off: comm.h).
 * Several ranks on one node with CUDA_VISIBLE_DEVICES unset: it is set to the local rank, so
 * that each rank's CUDA backend sees its own GPU. Returns 0, or 1 after printing one line
 * ("ftune: rank R of N: ...") when the communicator cannot be made. */
int ft_cli_comm_open(ft_comm **out);

/* The error line of a failed command on rank r of a job of several ranks ("ftune: rank R of
 * N: MSG"), then every rank ended (MPI_Abort, status 1), so that no rank waits for a dead
 * one. Ranks > 0 wait 2 s first, so that an error all ranks meet is printed once (rank 0's
 * abort ends them). A single process just prints "ftune: MSG". */
void ft_cli_comm_fail(const ft_comm *c, const char *msg);

#endif
