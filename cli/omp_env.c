/* omp_env.c - how long ftune's OpenMP threads spin before they sleep.
 *
 * A thread of an OpenMP team that waits (at a barrier, or for the next parallel region) spins
 * GOMP_SPINCOUNT rounds, then sleeps. libgomp's default, 300000 rounds (milliseconds), assumes
 * the cores are the program's own; 1000 is the count libgomp falls back to itself when a team
 * has more threads than cores (libgomp env.c, gomp_throttled_spin_count_var), and it cannot
 * know of other processes. Measured on the project's 2-core VM (bench/omp_policy.sh,
 * bench/results/cpu-omp-2026-11-28.md): two trainings side by side, as a hyperparameter sweep
 * runs them, got 42 tok/s each with the default spin (a spinning thread takes the slice of the
 * thread it waits for) and 81-85 with 1000 rounds (86-89 passive); alone on the machine 141
 * tok/s with 1000 rounds and 145 with the default (run to run: 137-160), 128 passive (its
 * wake-up after every sleep).
 *
 * libgomp reads the variable once, when it loads, before main: a setenv in main comes too
 * late, and so does one in the program's .preinit_array (it runs first, but libc's own
 * initializer then resets environ to the kernel's array). So ftune sets it and execs itself
 * once; the same process (pid, file descriptors, signal mask) goes on with it. */
#include "cli/omp_env.h"

#include <stdlib.h>
#include <unistd.h>

void ft_omp_env_reexec(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("GOMP_SPINCOUNT", "1000", 0) != 0) return;
    execv("/proc/self/exe", argv);
    /* the exec failed: go on as started (the variable set now changes nothing) */
}
