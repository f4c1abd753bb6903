/* paths.c - canonical paths and the output-over-input check (see paths.h). */
#include "src/core/paths.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/err.h"

#define P_MAX 4096

static int no_path(const char *p)
{
    return !p || !*p || !strcmp(p, "-");
}

/* Appends component c (n bytes) to the canonical path in buf (len *k): "." is skipped, ".."
 * drops the last component ("/" stays "/"). Returns 0 or -1 (too long). */
static int push(char *buf, size_t *k, size_t cap, const char *c, size_t n)
{
    if (n == 1 && c[0] == '.') return 0;
    if (n == 2 && c[0] == '.' && c[1] == '.') {
        while (*k > 1 && buf[*k - 1] != '/') (*k)--;
        if (*k > 1) (*k)--; /* the '/' before it, unless it is the root's */
        buf[*k] = 0;
        return 0;
    }
    size_t need = *k + (*k > 1) + n + 1;
    if (need > cap) return -1;
    if (*k > 1) buf[(*k)++] = '/';
    memcpy(buf + *k, c, n);
    *k += n;
    buf[*k] = 0;
    return 0;
}

int ft_path_resolve(const char *path, char *out, size_t out_n)
{
    char abs[2 * P_MAX], cur[P_MAX], tmp[P_MAX];
    if (!path || !*path) return ft_err(FT_E_INVALID, "an empty path");
    if (path[0] == '/') {
        if (snprintf(abs, sizeof abs, "%s", path) >= (int)sizeof abs)
            return ft_err(FT_E_RANGE, "%.200s...: path too long", path);
    } else {
        if (!getcwd(cur, sizeof cur)) return ft_err(-errno, "getcwd: %s", strerror(errno));
        if (snprintf(abs, sizeof abs, "%s/%s", cur, path) >= (int)sizeof abs)
            return ft_err(FT_E_RANGE, "%.200s...: path too long", path);
    }
    /* components from the root: each one resolved by realpath while what it names exists,
     * the rest (not there yet) applied as written */
    size_t k = 1;
    strcpy(cur, "/");
    int exists = 1;
    for (const char *p = abs; *p;) {
        while (*p == '/') p++;
        const char *e = p;
        while (*e && *e != '/') e++;
        size_t n = (size_t)(e - p);
        if (!n) break;
        if (push(cur, &k, sizeof cur, p, n) < 0)
            return ft_err(FT_E_RANGE, "%.200s...: path too long", path);
        if (exists) {
            if (realpath(cur, tmp)) {
                snprintf(cur, sizeof cur, "%s", tmp);
                k = strlen(cur);
            } else {
                exists = 0; /* from here on nothing exists: taken as written */
            }
        }
        p = e;
    }
    if (k + 1 > out_n) return ft_err(FT_E_RANGE, "%.200s...: path too long", path);
    memcpy(out, cur, k + 1);
    return 0;
}

int ft_path_within(const char *child, const char *parent)
{
    if (no_path(child) || no_path(parent)) return 0;
    struct stat sp, sc;
    if (stat(parent, &sp) != 0) return 0; /* nothing there to replace */
    if (stat(child, &sc) == 0 && sc.st_dev == sp.st_dev && sc.st_ino == sp.st_ino) return 1;
    char c[P_MAX], p[P_MAX];
    FT_TRY(ft_path_resolve(child, c, sizeof c));
    FT_TRY(ft_path_resolve(parent, p, sizeof p));
    size_t n = strlen(p);
    if (!strcmp(p, "/")) return 1;
    return !strncmp(c, p, n) && (c[n] == 0 || c[n] == '/');
}

int ft_path_check_output(const char *out_flag, const char *out, const char *name,
                         const char *in_flag, const char *in)
{
    if (no_path(out) || no_path(in)) return 0;
    char w[P_MAX];
    if (name) {
        if (snprintf(w, sizeof w, "%s/%s", out, name) >= (int)sizeof w)
            return ft_err(FT_E_RANGE, "%s %.200s...: path too long", out_flag, out);
    } else {
        snprintf(w, sizeof w, "%s", out);
    }
    int r = ft_path_within(w, in);
    if (r < 0) return ft_err_prefix(r, "%s", out_flag);
    if (!r) return 0;
    struct stat si, sw;
    const int in_dir = stat(in, &si) == 0 && S_ISDIR(si.st_mode);
    const int same = ft_path_within(in, w) > 0 ||
                     (stat(w, &sw) == 0 && sw.st_dev == si.st_dev && sw.st_ino == si.st_ino);
    const char *kind = in_dir ? "folder" : "file";
    if (name)
        return ft_err(FT_E_INVALID, "%s %s: %s would %s the %s %s %s", out_flag, out, w,
                      same ? "replace" : "be written inside", in_flag, kind, in);
    if (same)
        return ft_err(FT_E_INVALID, "%s %s is the %s %s %s: writing there would replace %s",
                      out_flag, out, in_flag, kind, in, in_dir ? "its files" : "it");
    if (stat(w, &sw) == 0)
        return ft_err(FT_E_INVALID, "%s %s would replace %s, inside the %s folder %s", out_flag,
                      out, w, in_flag, in);
    return ft_err(FT_E_INVALID, "%s %s is inside the %s folder %s: writing there would mix the "
                  "output with its files", out_flag, out, in_flag, in);
}

int ft_paths_check(const ft_path_arg *outs, int n_out, const ft_path_arg *ins, int n_in)
{
    for (int o = 0; o < n_out; o++)
        for (int i = 0; i < n_in; i++)
            FT_TRY(ft_path_check_output(outs[o].flag, outs[o].path, outs[o].name, ins[i].flag,
                                        ins[i].path));
    return 0;
}

int ft_fd_is_path(int fd, const char *path)
{
    if (no_path(path)) return 0;
    struct stat sf, sp;
    if (fstat(fd, &sf) != 0 || !S_ISREG(sf.st_mode) || stat(path, &sp) != 0) return 0;
    return sf.st_dev == sp.st_dev && sf.st_ino == sp.st_ino;
}
