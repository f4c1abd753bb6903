/* format_fixture.h - shared by the file-format tests (test_gguf.c, test_safetensors.c,
 * test_config.c): the check of a refusal's code and message, the removal of a file written
 * by t_write_tmp, the random stream of the header mutations. Include after harness.h. */
#ifndef FT_TEST_FORMAT_FIXTURE_H
#define FT_TEST_FORMAT_FIXTURE_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/core/err.h"

/* rc is want, and ft_errmsg() holds each of the fragments that follow (NULL-terminated
 * list); prints the message. */
static inline void expect_err(int rc, int want, ...)
{
    if (rc != want)
        fail_msg("rc %d (%s), expected %d (%s); message: %s", rc, ft_errname(rc), want,
                 ft_errname(want), ft_errmsg());
    va_list ap;
    va_start(ap, want);
    for (const char *s; (s = va_arg(ap, const char *));)
        if (!strstr(ft_errmsg(), s))
            fail_msg("message \"%s\" lacks \"%s\"", ft_errmsg(), s);
    va_end(ap);
    printf("  ok: %s\n", ft_errmsg());
}

/* Removes a file made by t_write_tmp and its temp directory, then frees the path (NULL: none). */
static inline void rm_tmp(char *p)
{
    if (!p) return;
    unlink(p);
    char *slash = strrchr(p, '/');
    if (slash) {
        *slash = 0;
        rmdir(p);
    }
    free(p);
}

/* The next value of the xorshift64 stream *s (Marsaglia 2003, shifts 13, 7, 17; *s != 0):
 * the byte mutations of the fuzz-style tests. */
static inline uint64_t t_xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#endif
