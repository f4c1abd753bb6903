/* omp_env.c - how long ftune's OpenMP threads spin before they sleep.
 *
 * A thread of an OpenMP team that waits (at a barrier, or for the next parallel region) spins
 * GOMP_SPINCOUNT rounds, then sleeps. libgomp's default when no variable is set is 300000
 * rounds, "3 msec" by its own estimate of 100000 rounds per ms (libgomp env.c,
 * initialize_env); only when a team has more threads than the CPUs it may use does it spin
 * less (gomp_throttled_spin_count_var, 100 rounds), and it cannot know of other processes.
 * A spinning thread takes the time slice of the thread it waits for when two ftune processes
 * share the cores, as a hyperparameter sweep run one process per trial does; so ftune spins
 * 1000 rounds (bench/omp_policy.sh, bench/results/cpu-omp-2026-11-28.md).
 *
 * libgomp reads the variable once, when it loads, before main: a setenv in main comes too
 * late, and so does one in the program's .preinit_array (it runs first, but libc's own
 * initializer then resets environ to the kernel's array). So ftune sets it and execs itself
 * once: the same process (pid, file descriptors, signal mask and dispositions) goes on with
 * it. Not when the user set a wait policy or spin count (theirs is kept) or a thread binding:
 * libgomp binds the main thread to the first place when it loads, and that CPU mask would
 * carry over the exec, leaving every thread of the second load on one CPU. */
#include "cli/omp_env.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

/* Variables whose presence (any suffix: _ALL, _DEV, _DEV_n of OpenMP 5.1) keeps libgomp's
 * load as it is. */
static const char *const kept[] = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND",
                                   "OMP_PLACES", "GOMP_CPU_AFFINITY"};

static int user_set(void)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        for (size_t k = 0; k < sizeof kept / sizeof *kept; k++) {
            size_t n = strlen(kept[k]);
            if (!strncmp(*e, kept[k], n) && ((*e)[n] == '=' || (*e)[n] == '_')) return 1;
        }
    return 0;
}

void ft_omp_env_reexec(char **argv)
{
    if (user_set()) return;
    /* AT_BASE 0: no interpreter was loaded for us, so we run as ld.so's argument (or static);
     * /proc/self/exe is then the loader, which would take argv[1] for the program */
    if (getauxval(AT_BASE) == 0) return;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || n >= (ssize_t)sizeof self - 1) return;
    self[n] = 0;
    if (setenv("GOMP_SPINCOUNT", "1000", 0) != 0) return;
    execv(self, argv); /* the file's own path: the process keeps its name (not "exe") */
    unsetenv("GOMP_SPINCOUNT"); /* the exec failed: go on as started */
}
