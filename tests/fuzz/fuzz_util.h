/* fuzz_util.h - helpers shared by the libFuzzer targets in tests/fuzz/ (header-only).
 *
 * Every reader of ftune takes a path, so a target writes its input into a private temporary
 * folder (under /dev/shm when it exists: no disk I/O per input) and calls the public API on
 * that path, exactly as the CLI does. A target checks the library's contract on every input:
 *   - no crash, leak or sanitizer report (libFuzzer with ASan/UBSan/LSan, or replay.c);
 *   - a failing call returns a negative code and records a non-empty message (err.h): an
 *     error the user would see as an empty line is a bug, and aborts with the input's rc.
 * Multi-file inputs are split at FUZZ_SEP ("\n--FTSEP--\n"), which no valid JSON text holds.
 */
#ifndef FT_FUZZ_UTIL_H
#define FT_FUZZ_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/err.h"

#define FUZZ_SEP "\n--FTSEP--\n"

/* Each input must finish reading in this many bytes of parser allocations at most; the
 * targets skip conversions of bigger tensors so a fuzzed shape cannot exhaust memory. */
#define FUZZ_MAX_ELEMS ((int64_t)1 << 22)

static char fuzz_dir_[256];

static void fuzz_rm_dir_(void)
{
    if (!fuzz_dir_[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_dir_);
}

/* The target's private folder, created on first use and removed at exit. */
static const char *fuzz_dir(void)
{
    if (fuzz_dir_[0]) return fuzz_dir_;
    struct stat st;
    const char *base = getenv("FTUNE_FUZZ_TMP");
    if (!base) base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(fuzz_dir_, sizeof fuzz_dir_, "%s/ftune-fuzz-XXXXXX", base);
    if (!mkdtemp(fuzz_dir_)) {
        fprintf(stderr, "fuzz: mkdtemp %s: %s\n", fuzz_dir_, strerror(errno));
        abort();
    }
    atexit(fuzz_rm_dir_);
    return fuzz_dir_;
}

/* dir/name into out (static storage per call site is the caller's). */
static void fuzz_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", fuzz_dir(), name);
}

/* Writes exactly len bytes to dir/name (truncating). Aborts on an I/O error: that is the
 * harness failing, not the parser. */
__attribute__((unused)) static void fuzz_write(const char *name, const void *data, size_t len)
{
    char p[512];
    fuzz_path(p, sizeof p, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "fuzz: open %s: %s\n", p, strerror(errno));
        abort();
    }
    const char *c = data;
    while (len) {
        ssize_t w = write(fd, c, len);
        if (w <= 0) {
            fprintf(stderr, "fuzz: write %s: %s\n", p, strerror(errno));
            abort();
        }
        c += w;
        len -= (size_t)w;
    }
    close(fd);
}

__attribute__((unused)) static void fuzz_unlink(const char *name)
{
    char p[512];
    fuzz_path(p, sizeof p, name);
    unlink(p);
}

/* Splits data at the first FUZZ_SEP: the part before in (*a, *an), after in (*b, *bn);
 * returns 0 (and *b = NULL) when there is no separator. */
__attribute__((unused)) static int fuzz_split(const uint8_t *data, size_t size, const uint8_t **a, size_t *an,
                      const uint8_t **b, size_t *bn)
{
    size_t k = sizeof FUZZ_SEP - 1;
    *a = data;
    *an = size;
    *b = NULL;
    *bn = 0;
    if (size < k) return 0;
    const uint8_t *s = memmem(data, size, FUZZ_SEP, k);
    if (!s) return 0;
    *an = (size_t)(s - data);
    *b = s + k;
    *bn = size - *an - k;
    return 1;
}

/* The error contract of err.h: rc is 0 or negative, and a negative rc carries a message. */
#define FUZZ_CHECK_RC(call, rc)                                                                 \
    do {                                                                                        \
        if ((rc) > 0) {                                                                         \
            fprintf(stderr, "fuzz: %s returned positive %d\n", call, (rc));                    \
            abort();                                                                            \
        }                                                                                       \
        if ((rc) < 0 && !ft_errmsg()[0]) {                                                      \
            fprintf(stderr, "fuzz: %s failed with %d (%s) but recorded no message\n", call,    \
                    (rc), ft_errname(rc));                                                      \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

/* FTUNE_FUZZ_VERBOSE=1 (replay only, to inspect a corpus): print every call's outcome. */
static int fuzz_verbose(void)
{
    static int v = -1;
    if (v < 0) v = getenv("FTUNE_FUZZ_VERBOSE") != NULL;
    return v;
}

/* Clears the last error, runs `expr` into rc and checks the contract above. */
#define FUZZ_CALL(rc, expr)                                                                     \
    do {                                                                                        \
        ft_err_clear();                                                                         \
        (rc) = (expr);                                                                          \
        FUZZ_CHECK_RC(#expr, rc);                                                               \
        if (fuzz_verbose())                                                                     \
            fprintf(stderr, "  %s -> %d%s%s\n", #expr, (rc), (rc) < 0 ? ": " : "",             \
                    (rc) < 0 ? ft_errmsg() : "");                                               \
    } while (0)

#endif
