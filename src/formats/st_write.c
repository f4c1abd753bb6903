/* st_write.c - atomic safetensors writer (see safetensors.h; formats.md 1.1: compact JSON
 * header with "__metadata__" first, padded with spaces so the data starts 8-byte aligned,
 * offsets back to back in the order given). The data is streamed from the caller's
 * buffers to "<path>.tmp.<pid>", fsynced and renamed, so a failure (full disk, EFBIG) never
 * leaves a partial file under `path`. */
#include "src/formats/safetensors.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, long long v)
{
    char t[32];
    int k = snprintf(t, sizeof t, fmt, v);
    sb_put(b, t, (size_t)k);
}

/* A JSON string literal: quotes, backslashes and control bytes escaped; UTF-8 kept. */
static void sb_json(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            sb_put(b, e, 2);
        } else if (*c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", *c);
            sb_put(b, e, 6);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks every tensor and computes its byte size. */
static int check_tensors(const char *path, const ft_st_out *ts, int64_t n, int64_t *sizes)
{
    for (int64_t i = 0; i < n; i++) {
        const ft_st_out *t = &ts[i];
        if (!t->name || !t->name[0] || !strcmp(t->name, "__metadata__"))
            return ft_err(FT_E_INVALID, "%s: tensor %lld: empty or reserved name", path,
                          (long long)i);
        size_t es = ft_st_dtype_size(t->dtype);
        if (!es)
            return ft_err(FT_E_INVALID, "%s: tensor \"%s\": dtype %d cannot be written", path,
                          t->name, t->dtype);
        if (t->n_dims < 0 || t->n_dims > FT_ST_MAX_DIMS)
            return ft_err(FT_E_INVALID, "%s: tensor \"%s\": %d dims, expected 0..%d", path,
                          t->name, t->n_dims, FT_ST_MAX_DIMS);
        int64_t bytes = (int64_t)es;
        for (int d = 0; d < t->n_dims; d++)
            if (t->shape[d] < 0 || __builtin_mul_overflow(bytes, t->shape[d], &bytes))
                return ft_err(FT_E_INVALID, "%s: tensor \"%s\": shape[%d] = %lld is negative "
                              "or the size overflows", path, t->name, d, (long long)t->shape[d]);
        if (bytes > 0 && !t->data)
            return ft_err(FT_E_INVALID, "%s: tensor \"%s\": no data", path, t->name);
        sizes[i] = bytes;
    }
    const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    if (!names) return ft_err(-ENOMEM, "%s: out of memory", path);
    for (int64_t i = 0; i < n; i++) names[i] = ts[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int64_t i = 1; i < n; i++)
        if (!strcmp(names[i - 1], names[i])) {
            int rc = ft_err(FT_E_INVALID, "%s: duplicate tensor name \"%s\"", path, names[i]);
            free(names);
            return rc;
        }
    free(names);
    return 0;
}

static int write_all(int fd, const void *data, size_t len, const char *path, int64_t *off)
{
    const char *p = data;
    while (len) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : len;
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            return ft_err(-e, "%s: write failed at offset %lld: %s", path, (long long)*off,
                          strerror(e));
        }
        p += w;
        len -= (size_t)w;
        *off += w;
    }
    return 0;
}

int ft_st_write(const char *path, const ft_st_out *tensors, int64_t n,
                const char *const *meta_keys, const char *const *meta_vals, int n_meta)
{
    if (n < 0 || (n > 0 && !tensors) || n_meta < 0 || (n_meta > 0 && (!meta_keys || !meta_vals)))
        return ft_err(FT_E_INVALID, "%s: bad arguments to ft_st_write", path);
    for (int i = 0; i < n_meta; i++)
        if (!meta_keys[i] || !meta_vals[i])
            return ft_err(FT_E_INVALID, "%s: metadata entry %d is NULL", path, i);
    int64_t *sizes = malloc((size_t)(n ? n : 1) * sizeof *sizes);
    if (!sizes) return ft_err(-ENOMEM, "%s: out of memory", path);
    int rc = check_tensors(path, tensors, n, sizes);
    if (rc < 0) {
        free(sizes);
        return rc;
    }

    sbuf h = {0};
    sb_str(&h, "{");
    if (n_meta > 0) {
        sb_str(&h, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i) sb_str(&h, ",");
            sb_json(&h, meta_keys[i]);
            sb_str(&h, ":");
            sb_json(&h, meta_vals[i]);
        }
        sb_str(&h, "}");
    }
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const ft_st_out *t = &tensors[i];
        if (i || n_meta > 0) sb_str(&h, ",");
        sb_json(&h, t->name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, ft_st_dtype_name(t->dtype));
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < t->n_dims; d++)
            sb_fmt(&h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        sb_fmt(&h, "],\"data_offsets\":[%lld", (long long)off);
        off += sizes[i];
        sb_fmt(&h, ",%lld]}", (long long)off);
    }
    sb_str(&h, "}");
    while (h.n % 8) sb_str(&h, " ");
    if (h.oom) {
        free(h.p);
        free(sizes);
        return ft_err(-ENOMEM, "%s: out of memory building the header", path);
    }

    char tmp[4200];
    int fd = ft_tmp_open(path, tmp, sizeof tmp);
    if (fd < 0) {
        free(h.p);
        free(sizes);
        return fd;
    }
    uint64_t hlen = h.n; /* little-endian host */
    int64_t pos = 0;
    rc = write_all(fd, &hlen, 8, path, &pos);
    if (!rc) rc = write_all(fd, h.p, h.n, path, &pos);
    for (int64_t i = 0; i < n && !rc; i++)
        rc = write_all(fd, tensors[i].data, (size_t)sizes[i], path, &pos);
    free(h.p);
    free(sizes);
    return ft_tmp_commit(fd, tmp, path, rc);
}
