/* err.c - thread-local last-error message (see err.h). */
#include "src/core/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[1024];
static _Thread_local int g_code;

int ft_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    g_code = code;
    return code;
}

int ft_err_prefix(int code, const char *fmt, ...)
{
    char pre[256], old[sizeof g_msg - 256 - 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    size_t k = strnlen(g_msg, sizeof old - 1);
    memcpy(old, g_msg, k);
    old[k] = 0;
    /* a system error code returned bare (return -ENOMEM) under an older message of another
     * code: that message is stale (an error handled and ignored before), not this one's */
    int stale = g_code != code && code < 0 && code > -4096;
    if (old[0] && !stale)
        snprintf(g_msg, sizeof g_msg, "%s: %s", pre, old);
    else
        snprintf(g_msg, sizeof g_msg, "%s: %s", pre, ft_errname(code));
    g_code = code;
    return code;
}

const char *ft_errname(int code)
{
    switch (code) {
    case 0: return "ok";
    case FT_E_INVALID: return "invalid input";
    case FT_E_CORRUPT: return "corrupt file";
    case FT_E_UNSUPPORTED: return "unsupported";
    case FT_E_NOTFOUND: return "not found";
    case FT_E_RANGE: return "out of range";
    case FT_E_NUMERIC: return "non-finite value";
    default: return code < 0 && code > -4096 ? strerror(-code) : "unknown error";
    }
}

const char *ft_errmsg(void)
{
    if (!g_msg[0] && g_code)
        return ft_errname(g_code);
    return g_msg;
}

void ft_err_clear(void)
{
    g_msg[0] = 0;
    g_code = 0;
}
