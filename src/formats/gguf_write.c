/* gguf_write.c - streaming GGUF v3 writer (see gguf_write.h; formats.md 4.3).
 * Metadata and tensor infos are serialized into memory as they are added; ft_gguf_w_begin_data
 * writes them; tensor bytes then go through a 1 MiB buffer to "<path>.tmp.<pid>", which
 * ft_gguf_w_close fsyncs and renames. */
#include "src/formats/gguf_write.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/numeric/quant.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_write.c writes host values as little-endian GGUF: a big-endian host needs byte swaps"
#endif

#define WBUF_BYTES ((size_t)1 << 20)

typedef struct {
    char *name;
    int type, n_dims;
    int64_t ne[FT_GGUF_MAX_DIMS];
    uint64_t offset, nbytes;
} w_tensor;

typedef struct {
    uint8_t *p;
    size_t n, cap;
} w_buf;

struct ft_gguf_w {
    char *path, *tmp;
    int fd;
    uint32_t align;
    int err;               /* first error: the writer is poisoned after it */
    w_buf meta;            /* serialized key/values */
    int64_t n_kv;
    char **keys;
    int64_t keys_cap;
    w_tensor *t;
    int64_t n_t, t_cap;
    uint64_t data_bytes;   /* running padded sum */
    int began;
    int64_t cur;           /* tensor being written */
    uint64_t cur_done;     /* bytes of it written */
    uint8_t *wbuf;
    size_t wn;
    int64_t pos;           /* bytes handed to the file (buffer included) */
    uint8_t *conv;         /* conversion scratch for ft_gguf_w_data_f32 */
    size_t conv_cap;
};

static int poison(ft_gguf_w *w, int rc)
{
    if (rc < 0 && !w->err) w->err = rc;
    return rc;
}

static int buf_put(w_buf *b, const void *s, size_t n)
{
    if (n > SIZE_MAX - b->n - 1) return -ENOMEM;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap = cap > SIZE_MAX / 2 ? b->n + n : cap * 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) return -ENOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static int buf_u32(w_buf *b, uint32_t v) { return buf_put(b, &v, 4); }
static int buf_u64(w_buf *b, uint64_t v) { return buf_put(b, &v, 8); }
static int buf_str(w_buf *b, const char *s, size_t n)
{
    int rc = buf_u64(b, (uint64_t)n);
    return rc ? rc : buf_put(b, s, n);
}

/* ---- file output ----------------------------------------------------------------------- */

static int flush(ft_gguf_w *w)
{
    const uint8_t *p = w->wbuf;
    size_t len = w->wn;
    int64_t at = w->pos - (int64_t)w->wn;
    while (len) {
        ssize_t k = write(w->fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            return poison(w, ft_err(-e, "%s: write failed at offset %lld: %s", w->path,
                                    (long long)at, strerror(e)));
        }
        p += k;
        len -= (size_t)k;
        at += k;
    }
    w->wn = 0;
    return 0;
}

static int out(ft_gguf_w *w, const void *data, size_t n)
{
    const uint8_t *p = data;
    while (n) {
        size_t k = WBUF_BYTES - w->wn < n ? WBUF_BYTES - w->wn : n;
        memcpy(w->wbuf + w->wn, p, k);
        w->wn += k;
        w->pos += (int64_t)k;
        p += k;
        n -= k;
        if (w->wn == WBUF_BYTES) FT_TRY(flush(w));
    }
    return 0;
}

static int out_zeros(ft_gguf_w *w, size_t n)
{
    static const uint8_t z[64];
    while (n) {
        size_t k = n < sizeof z ? n : sizeof z;
        FT_TRY(out(w, z, k));
        n -= k;
    }
    return 0;
}

/* ---- open / metadata ------------------------------------------------------------------- */

static int add_key(ft_gguf_w *w, const char *key, size_t klen, int allow_alignment);

int ft_gguf_w_open(ft_gguf_w **outp, const char *path, uint32_t alignment)
{
    *outp = NULL;
    if (alignment == 0) alignment = FT_GGUF_DEFAULT_ALIGNMENT;
    if ((alignment & (alignment - 1)) || alignment > (1u << 30))
        return ft_err(FT_E_INVALID, "%s: GGUF alignment %u is not a power of two <= 2^30", path,
                      alignment);
    ft_gguf_w *w = calloc(1, sizeof *w);
    size_t tl = strlen(path) + 32;
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(tl)) ||
        !(w->wbuf = malloc(WBUF_BYTES))) {
        if (w) { free(w->path); free(w->tmp); }
        free(w);
        return ft_err(-ENOMEM, "%s: out of memory", path);
    }
    w->align = alignment;
    w->fd = ft_tmp_open(path, w->tmp, tl);
    if (w->fd < 0) {
        int rc = w->fd;
        free(w->wbuf);
        free(w->tmp);
        free(w->path);
        free(w);
        return rc;
    }
    if (alignment != FT_GGUF_DEFAULT_ALIGNMENT) {
        static const char k[] = "general.alignment";
        int rc = add_key(w, k, sizeof k - 1, 1);
        if (!rc) rc = buf_u32(&w->meta, FT_GGUF_U32) ? -ENOMEM : buf_u32(&w->meta, alignment) ? -ENOMEM : 0;
        if (rc) {
            ft_gguf_w_abort(w);
            return rc == -ENOMEM ? ft_err(rc, "%s: out of memory", path) : rc;
        }
    }
    *outp = w;
    return 0;
}

/* Checks the key (length, duplicates, state), records it and serializes it into meta. */
static int add_key(ft_gguf_w *w, const char *key, size_t klen, int allow_alignment)
{
    if (w->err) return w->err;
    if (w->began)
        return poison(w, ft_err(FT_E_INVALID, "%s: metadata key \"%.64s\" added after the data "
                                "began", w->path, key));
    if (klen == 0 || klen > 65535)
        return poison(w, ft_err(FT_E_INVALID, "%s: metadata key of %zu bytes (1..65535 allowed)",
                                w->path, klen));
    if (!allow_alignment && !strcmp(key, "general.alignment"))
        return poison(w, ft_err(FT_E_INVALID, "%s: general.alignment is set by ft_gguf_w_open, "
                                "not as a key", w->path));
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return poison(w, ft_err(FT_E_INVALID, "%s: duplicate metadata key \"%s\"", w->path, key));
    if (w->n_kv == w->keys_cap) {
        int64_t cap = w->keys_cap ? 2 * w->keys_cap : 32;
        char **k = realloc(w->keys, (size_t)cap * sizeof *k);
        if (!k) return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
        w->keys = k;
        w->keys_cap = cap;
    }
    if (!(w->keys[w->n_kv] = strdup(key)) || buf_str(&w->meta, key, klen))
        return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
    w->n_kv++;
    return 0;
}

static int kv_scalar(ft_gguf_w *w, const char *key, int type, const void *v)
{
    FT_TRY(add_key(w, key, strlen(key), 0));
    if (buf_u32(&w->meta, (uint32_t)type) || buf_put(&w->meta, v, ft_gguf_vtype_size(type)))
        return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
    return 0;
}

int ft_gguf_w_kv_u8(ft_gguf_w *w, const char *k, uint8_t v) { return kv_scalar(w, k, FT_GGUF_U8, &v); }
int ft_gguf_w_kv_i8(ft_gguf_w *w, const char *k, int8_t v) { return kv_scalar(w, k, FT_GGUF_I8, &v); }
int ft_gguf_w_kv_u16(ft_gguf_w *w, const char *k, uint16_t v) { return kv_scalar(w, k, FT_GGUF_U16, &v); }
int ft_gguf_w_kv_i16(ft_gguf_w *w, const char *k, int16_t v) { return kv_scalar(w, k, FT_GGUF_I16, &v); }
int ft_gguf_w_kv_u32(ft_gguf_w *w, const char *k, uint32_t v) { return kv_scalar(w, k, FT_GGUF_U32, &v); }
int ft_gguf_w_kv_i32(ft_gguf_w *w, const char *k, int32_t v) { return kv_scalar(w, k, FT_GGUF_I32, &v); }
int ft_gguf_w_kv_u64(ft_gguf_w *w, const char *k, uint64_t v) { return kv_scalar(w, k, FT_GGUF_U64, &v); }
int ft_gguf_w_kv_i64(ft_gguf_w *w, const char *k, int64_t v) { return kv_scalar(w, k, FT_GGUF_I64, &v); }
int ft_gguf_w_kv_f32(ft_gguf_w *w, const char *k, float v) { return kv_scalar(w, k, FT_GGUF_F32, &v); }
int ft_gguf_w_kv_f64(ft_gguf_w *w, const char *k, double v) { return kv_scalar(w, k, FT_GGUF_F64, &v); }

int ft_gguf_w_kv_bool(ft_gguf_w *w, const char *k, int v)
{
    uint8_t b = v != 0;
    return kv_scalar(w, k, FT_GGUF_BOOL, &b);
}

int ft_gguf_w_kv_strn(ft_gguf_w *w, const char *key, const char *v, size_t n)
{
    FT_TRY(add_key(w, key, strlen(key), 0));
    if (buf_u32(&w->meta, FT_GGUF_STRING) || buf_str(&w->meta, v, n))
        return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
    return 0;
}

int ft_gguf_w_kv_str(ft_gguf_w *w, const char *key, const char *v)
{
    return ft_gguf_w_kv_strn(w, key, v, strlen(v));
}

int ft_gguf_w_kv_arr(ft_gguf_w *w, const char *key, int elem_type, const void *data, int64_t n)
{
    size_t es = ft_gguf_vtype_size(elem_type);
    if (w->err) return w->err;
    if (!es || n < 0 || (n > 0 && !data))
        return poison(w, ft_err(FT_E_INVALID, "%s: key \"%s\": array of %lld elements of type %s "
                                "cannot be written (numeric or bool elements expected)", w->path,
                                key, (long long)n, ft_gguf_vtype_name(elem_type)));
    FT_TRY(add_key(w, key, strlen(key), 0));
    if ((uint64_t)n > SIZE_MAX / es || buf_u32(&w->meta, FT_GGUF_ARRAY) ||
        buf_u32(&w->meta, (uint32_t)elem_type) || buf_u64(&w->meta, (uint64_t)n) ||
        buf_put(&w->meta, data, (size_t)n * es))
        return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
    return 0;
}

int ft_gguf_w_kv_arr_str(ft_gguf_w *w, const char *key, const char *const *v, int64_t n)
{
    if (w->err) return w->err;
    if (n < 0 || (n > 0 && !v))
        return poison(w, ft_err(FT_E_INVALID, "%s: key \"%s\": bad string array", w->path, key));
    FT_TRY(add_key(w, key, strlen(key), 0));
    int rc = buf_u32(&w->meta, FT_GGUF_ARRAY) || buf_u32(&w->meta, FT_GGUF_STRING) ||
             buf_u64(&w->meta, (uint64_t)n);
    for (int64_t i = 0; i < n && !rc; i++) {
        if (!v[i])
            return poison(w, ft_err(FT_E_INVALID, "%s: key \"%s\": element %lld is NULL", w->path,
                                    key, (long long)i));
        rc = buf_str(&w->meta, v[i], strlen(v[i]));
    }
    if (rc) return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
    return 0;
}

int ft_gguf_w_kv_copy(ft_gguf_w *w, const ft_gguf_kv *kv)
{
    switch (kv->type) {
    case FT_GGUF_U8: return ft_gguf_w_kv_u8(w, kv->key, (uint8_t)kv->u);
    case FT_GGUF_I8: return ft_gguf_w_kv_i8(w, kv->key, (int8_t)kv->i);
    case FT_GGUF_U16: return ft_gguf_w_kv_u16(w, kv->key, (uint16_t)kv->u);
    case FT_GGUF_I16: return ft_gguf_w_kv_i16(w, kv->key, (int16_t)kv->i);
    case FT_GGUF_U32: return ft_gguf_w_kv_u32(w, kv->key, (uint32_t)kv->u);
    case FT_GGUF_I32: return ft_gguf_w_kv_i32(w, kv->key, (int32_t)kv->i);
    case FT_GGUF_U64: return ft_gguf_w_kv_u64(w, kv->key, kv->u);
    case FT_GGUF_I64: return ft_gguf_w_kv_i64(w, kv->key, kv->i);
    case FT_GGUF_F32: return ft_gguf_w_kv_f32(w, kv->key, (float)kv->f);
    case FT_GGUF_F64: return ft_gguf_w_kv_f64(w, kv->key, kv->f);
    case FT_GGUF_BOOL: return ft_gguf_w_kv_bool(w, kv->key, kv->i != 0);
    case FT_GGUF_STRING: return ft_gguf_w_kv_strn(w, kv->key, kv->str, kv->str_len);
    case FT_GGUF_ARRAY:
        if (kv->arr_type == FT_GGUF_STRING)
            return ft_gguf_w_kv_arr_str(w, kv->key, (const char *const *)kv->arr_str, kv->arr_n);
        return ft_gguf_w_kv_arr(w, kv->key, kv->arr_type, kv->arr_data, kv->arr_n);
    default:
        return poison(w, ft_err(FT_E_INVALID, "%s: key \"%s\": value type %d cannot be copied",
                                w->path, kv->key, kv->type));
    }
}

/* ---- tensors --------------------------------------------------------------------------- */

int64_t ft_gguf_w_tensor(ft_gguf_w *w, const char *name, int type, int n_dims, const int64_t *ne)
{
    if (w->err) return w->err;
    size_t nl = name ? strlen(name) : 0;
    if (w->began)
        return poison(w, ft_err(FT_E_INVALID, "%s: tensor \"%.63s\" declared after the data began",
                                w->path, name ? name : ""));
    if (nl == 0 || nl >= FT_GGUF_MAX_NAME)
        return poison(w, ft_err(FT_E_INVALID, "%s: tensor name \"%.80s\" has %zu bytes (1..%d "
                                "allowed, GGML_MAX_NAME)", w->path, name ? name : "", nl,
                                FT_GGUF_MAX_NAME - 1));
    if (n_dims < 1 || n_dims > FT_GGUF_MAX_DIMS)
        return poison(w, ft_err(FT_E_INVALID, "%s: tensor \"%s\": %d dims (1..%d allowed)",
                                w->path, name, n_dims, FT_GGUF_MAX_DIMS));
    int64_t bn, bb, n = 1;
    if (ft_quant_block(type, &bn, &bb) < 0)
        return poison(w, ft_err(FT_E_INVALID, "%s: tensor \"%s\": unknown ggml type %d", w->path,
                                name, type));
    for (int d = 0; d < n_dims; d++)
        if (ne[d] < 0 || __builtin_mul_overflow(n, ne[d], &n))
            return poison(w, ft_err(FT_E_INVALID, "%s: tensor \"%s\": ne[%d] = %lld is negative or "
                                    "the element count overflows", w->path, name, d,
                                    (long long)ne[d]));
    if (ne[0] % bn)
        return poison(w, ft_err(FT_E_INVALID, "%s: tensor \"%s\": ne[0] = %lld is not a multiple of "
                                "the %s block size %lld", w->path, name, (long long)ne[0],
                                ft_quant_name(type), (long long)bn));
    int64_t nbytes = ft_quant_bytes(type, n);
    if (nbytes < 0 || (uint64_t)nbytes > UINT64_MAX / 2 - w->data_bytes)
        return poison(w, ft_err(FT_E_INVALID, "%s: tensor \"%s\": byte size overflows", w->path, name));
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return poison(w, ft_err(FT_E_INVALID, "%s: duplicate tensor name \"%s\"", w->path, name));
    if (w->n_t == w->t_cap) {
        int64_t cap = w->t_cap ? 2 * w->t_cap : 64;
        w_tensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
        w->t = t;
        w->t_cap = cap;
    }
    w_tensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < FT_GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = (uint64_t)nbytes;
    t->offset = w->data_bytes;
    w->data_bytes += ((uint64_t)nbytes + w->align - 1) / w->align * w->align;
    return w->n_t++;
}

int ft_gguf_w_begin_data(ft_gguf_w *w)
{
    if (w->err) return w->err;
    if (w->began) return poison(w, ft_err(FT_E_INVALID, "%s: header written twice", w->path));
    w_buf h = {0};
    int rc = buf_put(&h, "GGUF", 4) || buf_u32(&h, 3) || buf_u64(&h, (uint64_t)w->n_t) ||
             buf_u64(&h, (uint64_t)w->n_kv) || buf_put(&h, w->meta.p, w->meta.n);
    for (int64_t i = 0; i < w->n_t && !rc; i++) {
        const w_tensor *t = &w->t[i];
        rc = buf_str(&h, t->name, strlen(t->name)) || buf_u32(&h, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims && !rc; d++) rc = buf_u64(&h, (uint64_t)t->ne[d]);
        rc = rc || buf_u32(&h, (uint32_t)t->type) || buf_u64(&h, t->offset);
    }
    if (rc) {
        free(h.p);
        return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
    }
    w->began = 1;
    rc = out(w, h.p, h.n);
    free(h.p);
    if (!rc) rc = out_zeros(w, (size_t)((w->align - (uint64_t)w->pos % w->align) % w->align));
    w->cur = 0;
    w->cur_done = 0;
    /* skip leading empty tensors */
    while (!rc && w->cur < w->n_t && w->t[w->cur].nbytes == 0) w->cur++;
    return rc;
}

static int cur_check(ft_gguf_w *w, size_t n)
{
    if (w->err) return w->err;
    if (!w->began)
        return poison(w, ft_err(FT_E_INVALID, "%s: tensor data before ft_gguf_w_begin_data", w->path));
    if (w->cur >= w->n_t)
        return poison(w, ft_err(FT_E_INVALID, "%s: %zu bytes of tensor data after the last tensor",
                                w->path, n));
    const w_tensor *t = &w->t[w->cur];
    if (n > t->nbytes - w->cur_done)
        return poison(w, ft_err(FT_E_INVALID, "%s: tensor \"%s\": %zu bytes given with %llu left "
                                "of its %llu", w->path, t->name, n,
                                (unsigned long long)(t->nbytes - w->cur_done),
                                (unsigned long long)t->nbytes));
    return 0;
}

static int advance(ft_gguf_w *w, size_t n)
{
    w_tensor *t = &w->t[w->cur];
    w->cur_done += n;
    if (w->cur_done < t->nbytes) return 0;
    FT_TRY(out_zeros(w, (size_t)((w->align - t->nbytes % w->align) % w->align)));
    w->cur++;
    w->cur_done = 0;
    while (w->cur < w->n_t && w->t[w->cur].nbytes == 0) w->cur++;
    return 0;
}

int ft_gguf_w_data(ft_gguf_w *w, const void *data, size_t n)
{
    FT_TRY(cur_check(w, n));
    if (n == 0) return 0;
    FT_TRY(out(w, data, n));
    return advance(w, n);
}

int ft_gguf_w_data_f32(ft_gguf_w *w, const float *x, int64_t n)
{
    if (w->err) return w->err;
    if (!w->began || w->cur >= w->n_t) return cur_check(w, (size_t)n);
    const w_tensor *t = &w->t[w->cur];
    int64_t nb = ft_quant_bytes(t->type, n);
    if (nb < 0)
        return poison(w, ft_err(FT_E_INVALID, "%s: tensor \"%s\": %lld values are not whole %s "
                                "blocks", w->path, t->name, (long long)n, ft_quant_name(t->type)));
    FT_TRY(cur_check(w, (size_t)nb));
    if ((size_t)nb > w->conv_cap) {
        uint8_t *c = realloc(w->conv, (size_t)nb);
        if (!c) return poison(w, ft_err(-ENOMEM, "%s: out of memory", w->path));
        w->conv = c;
        w->conv_cap = (size_t)nb;
    }
    int rc = ft_gguf_from_f32(t->type, x, w->conv, n);
    if (rc < 0) return poison(w, ft_err_prefix(rc, "%s: tensor \"%s\"", w->path, t->name));
    FT_TRY(out(w, w->conv, (size_t)nb));
    return advance(w, (size_t)nb);
}

int64_t ft_gguf_w_bytes(const ft_gguf_w *w) { return w->pos; }

static void release(ft_gguf_w *w, int remove_tmp)
{
    if (w->fd >= 0) close(w->fd);
    if (remove_tmp) unlink(w->tmp);
    for (int64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (int64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->meta.p);
    free(w->wbuf);
    free(w->conv);
    free(w->tmp);
    free(w->path);
    free(w);
}

void ft_gguf_w_abort(ft_gguf_w *w)
{
    if (w) release(w, 1);
}

int ft_gguf_w_close(ft_gguf_w *w)
{
    int rc = w->err;
    if (!rc && !w->began) rc = ft_gguf_w_begin_data(w);
    if (!rc && w->cur < w->n_t)
        rc = ft_err(FT_E_INVALID, "%s: tensor \"%s\" incomplete (%llu of %llu bytes written)",
                    w->path, w->t[w->cur].name, (unsigned long long)w->cur_done,
                    (unsigned long long)w->t[w->cur].nbytes);
    if (!rc) rc = flush(w);
    rc = ft_tmp_commit(w->fd, w->tmp, w->path, rc);
    w->fd = -1;
    release(w, 0); /* ft_tmp_commit removed the temp file on failure */
    return rc;
}

/* ---- fp32 conversion ------------------------------------------------------------------- */

/* ggml quantize_row_q8_0_ref: d = amax/127, id = 1/d, q = roundf(x*id). */
static void q8_0_block(const float *x, uint8_t *dst)
{
    float amax = 0.0f;
    for (int j = 0; j < FT_QK8_0; j++) {
        float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint16_t h = ft_quant_f32_to_f16(d);
    memcpy(dst, &h, 2);
    for (int j = 0; j < FT_QK8_0; j++) dst[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

int ft_gguf_from_f32(int type, const float *src, void *dst, int64_t n)
{
    uint8_t *o = dst;
    switch (type) {
    case FT_GGML_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    case FT_GGML_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = ft_quant_f32_to_f16(src[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        return 0;
    case FT_GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = ft_quant_f32_to_bf16(src[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        return 0;
    case FT_GGML_Q8_0:
        if (n % FT_QK8_0)
            return ft_err(FT_E_INVALID, "Q8_0: %lld values are not whole blocks of %d", (long long)n,
                          FT_QK8_0);
        for (int64_t b = 0; b < n / FT_QK8_0; b++) q8_0_block(src + b * FT_QK8_0, o + b * 34);
        return 0;
    default:
        return ft_err(FT_E_UNSUPPORTED, "conversion from fp32 to ggml type %s (%d) is not "
                      "supported (F32, F16, BF16, Q8_0)", ft_quant_name(type), type);
    }
}
