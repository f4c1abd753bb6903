/* omp_env.h - the OpenMP spin count ftune runs with (cli/omp_env.c). */
#ifndef FT_CLI_OMP_ENV_H
#define FT_CLI_OMP_ENV_H

/* When the user set none of libgomp's wait or thread-binding variables: sets
 * GOMP_SPINCOUNT=1000 and execs this program's file again with the same argv (libgomp reads
 * the variable only when it loads), so the call does not return. Returns when one of them is
 * set, when the program was started through the dynamic loader (ld.so ftune ...), or when the
 * exec failed: the run then goes on with libgomp's default. Under valgrind (whose tracing stops
 * at the exec unless --trace-children=yes) set GOMP_SPINCOUNT to run without it. */
void ft_omp_env_reexec(char **argv);

#endif
