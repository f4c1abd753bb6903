/* err.h - status codes and the last-error message.
 *
 * Library code never prints or exits (STYLE C2): a function returns 0 on success or a
 * negative code: -errno for system errors, or one of the FT_E_* values below -4095. The
 * function that detects an error records one line of text with ft_err(), naming the file,
 * the offset or line, what was expected and what was found; callers that add context use
 * ft_err_prefix(). The CLI prints ft_errmsg() and exits non-zero.
 */
#ifndef FT_ERR_H
#define FT_ERR_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FT_E_INVALID     = -4096, /* malformed input: bad JSON, bad header, bad record */
    FT_E_CORRUPT     = -4097, /* a file fails its own consistency checks (offsets, sizes) */
    FT_E_UNSUPPORTED = -4098, /* well-formed but not handled (dtype, architecture, schema) */
    FT_E_NOTFOUND    = -4099, /* a named tensor, key or token is missing */
    FT_E_RANGE       = -4100, /* a value outside its allowed range (budget, length) */
    FT_E_NUMERIC     = -4101, /* NaN or Inf where a finite value is required */
};

/* Records a printf-style message as the last error and returns `code` unchanged, so that
 * `return ft_err(FT_E_INVALID, "%s: offset %lld: ...", path, off);` reads naturally. */
int ft_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "<prefix>: " to the last error message; returns `code`. When `code` is a system
 * error (-errno) other than the last message's code, that message is stale (an error that
 * was handled) and "<prefix>: <strerror>" is recorded instead. */
int ft_err_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last error message of this thread ("" if none). For -errno codes recorded without a
 * message, strerror text is returned. */
const char *ft_errmsg(void);

/* A short name for a code: "invalid input", "corrupt file", strerror(-code), ... */
const char *ft_errname(int code);

/* Clears the last error message. */
void ft_err_clear(void);

/* Propagate a non-zero status. */
#define FT_TRY(x) do { int ft_rc_ = (x); if (ft_rc_ < 0) return ft_rc_; } while (0)

#ifdef __cplusplus
}
#endif

#endif
