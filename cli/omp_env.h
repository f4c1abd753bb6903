/* omp_env.h - the OpenMP spin count ftune runs with (cli/omp_env.c). */
#ifndef FT_CLI_OMP_ENV_H
#define FT_CLI_OMP_ENV_H

/* When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set: sets GOMP_SPINCOUNT=1000 and execs
 * this program again with the same argv (libgomp reads the variable only when it loads), so
 * the call does not return. Returns when either variable is set, or when the exec failed (no
 * /proc, the binary replaced meanwhile): the run then goes on with libgomp's default. */
void ft_omp_env_reexec(char **argv);

#endif
