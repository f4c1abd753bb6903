/* gguf.c - GGUF v2/v3 reader (see gguf.h; formats.md 4.3, ggml src/gguf.cpp).
 * The file is mmap'ed read-only; a cursor reads the header with every length checked
 * against the bytes left, so a truncated or hostile file yields FT_E_CORRUPT, not a crash. */
#include "src/formats/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/numeric/quant.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian GGUF files by memcpy: a big-endian host needs byte swaps"
#endif

struct ft_gguf {
    char *path;
    const uint8_t *map;
    size_t size;
    uint32_t version, alignment;
    int64_t data_off;
    ft_gguf_kv *kv;
    int64_t n_kv;
    ft_gguf_tensor *t;
    int64_t n_t;
    int64_t *kv_by_name; /* indices sorted by key */
    int64_t *t_by_name;  /* indices sorted by name */
};

typedef struct {
    const uint8_t *p;
    size_t size, off;
    const char *path;
} cursor;

static const char *const k_vtype_names[] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *ft_gguf_vtype_name(int type)
{
    if (type < 0 || type > FT_GGUF_F64) return "unknown";
    return k_vtype_names[type];
}

size_t ft_gguf_vtype_size(int type)
{
    switch (type) {
    case FT_GGUF_U8: case FT_GGUF_I8: case FT_GGUF_BOOL: return 1;
    case FT_GGUF_U16: case FT_GGUF_I16: return 2;
    case FT_GGUF_U32: case FT_GGUF_I32: case FT_GGUF_F32: return 4;
    case FT_GGUF_U64: case FT_GGUF_I64: case FT_GGUF_F64: return 8;
    default: return 0;
    }
}

static int is_int_type(int type)
{
    return ft_gguf_vtype_size(type) && type != FT_GGUF_F32 && type != FT_GGUF_F64 && type != FT_GGUF_BOOL;
}

/* Decodes one scalar of a numeric/bool type at p. */
static void decode_scalar(int type, const uint8_t *p, int64_t *i, uint64_t *u, double *f)
{
    uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
    uint64_t u64; int64_t i64; float f32; double f64;
    switch (type) {
    case FT_GGUF_U8: case FT_GGUF_BOOL: memcpy(&u8, p, 1); *i = u8; break;
    case FT_GGUF_I8: memcpy(&i8, p, 1); *i = i8; break;
    case FT_GGUF_U16: memcpy(&u16, p, 2); *i = u16; break;
    case FT_GGUF_I16: memcpy(&i16, p, 2); *i = i16; break;
    case FT_GGUF_U32: memcpy(&u32, p, 4); *i = u32; break;
    case FT_GGUF_I32: memcpy(&i32, p, 4); *i = i32; break;
    case FT_GGUF_I64: memcpy(&i64, p, 8); *i = i64; break;
    case FT_GGUF_U64:
        memcpy(&u64, p, 8);
        *u = u64;
        *i = u64 > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u64;
        *f = (double)u64;
        return;
    case FT_GGUF_F32: memcpy(&f32, p, 4); *f = f32; *i = 0; *u = 0; return;
    case FT_GGUF_F64: memcpy(&f64, p, 8); *f = f64; *i = 0; *u = 0; return;
    default: *i = 0; *u = 0; *f = 0; return;
    }
    *u = (uint64_t)*i;
    *f = (double)*i;
}

static int need(cursor *c, size_t n, const char *what)
{
    if (n > c->size - c->off)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: file ends while reading %s "
                      "(%zu bytes needed, %zu left of %zu)", c->path, c->off, what, n,
                      c->size - c->off, c->size);
    return 0;
}

static int rd(cursor *c, void *dst, size_t n, const char *what)
{
    FT_TRY(need(c, n, what));
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return 0;
}

/* A gguf_string: u64 length + bytes. *s points into the mapping (not NUL-terminated). */
static int rd_str(cursor *c, const char **s, uint64_t *len, const char *what)
{
    size_t at = c->off;
    FT_TRY(rd(c, len, 8, what));
    if (*len > c->size - c->off)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: %s has length %llu but only %zu bytes "
                      "are left in the file", c->path, at, what, (unsigned long long)*len,
                      c->size - c->off);
    *s = (const char *)c->p + c->off;
    c->off += (size_t)*len;
    return 0;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static int parse_kv(cursor *c, ft_gguf_kv *kv)
{
    const char *s;
    uint64_t len;
    size_t at = c->off;
    kv->file_offset = (int64_t)at;
    FT_TRY(rd_str(c, &s, &len, "a metadata key"));
    if (len == 0 || len > 65535)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: metadata key length %llu, expected "
                      "1..65535", c->path, at, (unsigned long long)len);
    if (!(kv->key = dup_n(s, (size_t)len)))
        return ft_err(-ENOMEM, "%s: out of memory", c->path);
    uint32_t type;
    FT_TRY(rd(c, &type, 4, "a metadata value type"));
    kv->type = (int)type;
    if (type == FT_GGUF_STRING) {
        FT_TRY(rd_str(c, &s, &len, "a string value"));
        kv->str_len = (size_t)len;
        if (!(kv->str = dup_n(s, (size_t)len)))
            return ft_err(-ENOMEM, "%s: out of memory", c->path);
        return 0;
    }
    if (type == FT_GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        FT_TRY(rd(c, &et, 4, "an array element type"));
        FT_TRY(rd(c, &n, 8, "an array length"));
        kv->arr_type = (int)et;
        if (et == FT_GGUF_STRING) {
            /* each string takes at least its 8-byte length */
            if (n > (c->size - c->off) / 8)
                return ft_err(FT_E_CORRUPT, "%s: offset %zu: key \"%s\": array of %llu "
                              "strings cannot fit in the %zu bytes left", c->path, at,
                              kv->key, (unsigned long long)n, c->size - c->off);
            kv->arr_n = (int64_t)n;
            kv->arr_str = calloc(n ? n : 1, sizeof *kv->arr_str);
            if (!kv->arr_str) return ft_err(-ENOMEM, "%s: out of memory", c->path);
            for (uint64_t k = 0; k < n; k++) {
                FT_TRY(rd_str(c, &s, &len, "a string array element"));
                if (!(kv->arr_str[k] = dup_n(s, (size_t)len)))
                    return ft_err(-ENOMEM, "%s: out of memory", c->path);
            }
            return 0;
        }
        size_t es = ft_gguf_vtype_size((int)et);
        if (!es)
            return ft_err(FT_E_CORRUPT, "%s: offset %zu: key \"%s\": invalid array element "
                          "type %u (%s)", c->path, at, kv->key, et, ft_gguf_vtype_name((int)et));
        if (n > (c->size - c->off) / es)
            return ft_err(FT_E_CORRUPT, "%s: offset %zu: key \"%s\": array of %llu %s "
                          "extends past the end of the file (%zu bytes left)", c->path, at,
                          kv->key, (unsigned long long)n, ft_gguf_vtype_name((int)et),
                          c->size - c->off);
        kv->arr_n = (int64_t)n;
        kv->arr_data = c->p + c->off;
        c->off += (size_t)n * es;
        return 0;
    }
    size_t es = ft_gguf_vtype_size((int)type);
    if (!es)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: key \"%s\": invalid value type %u",
                      c->path, at, kv->key, type);
    FT_TRY(need(c, es, "a metadata value"));
    decode_scalar((int)type, c->p + c->off, &kv->i, &kv->u, &kv->f);
    c->off += es;
    return 0;
}

static int parse_tensor_info(cursor *c, ft_gguf_tensor *t)
{
    const char *s;
    uint64_t len;
    size_t at = c->off;
    FT_TRY(rd_str(c, &s, &len, "a tensor name"));
    if (len == 0 || len >= FT_GGUF_MAX_NAME)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: tensor name length %llu, expected 1..%d",
                      c->path, at, (unsigned long long)len, FT_GGUF_MAX_NAME - 1);
    if (!(t->name = dup_n(s, (size_t)len)))
        return ft_err(-ENOMEM, "%s: out of memory", c->path);
    uint32_t nd;
    FT_TRY(rd(c, &nd, 4, "a tensor's n_dims"));
    if (nd > FT_GGUF_MAX_DIMS)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: tensor \"%s\" has %u dims, at most %d "
                      "allowed", c->path, at, t->name, nd, FT_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    int64_t n = 1;
    for (int d = 0; d < FT_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        FT_TRY(rd(c, &t->ne[d], 8, "a tensor dim"));
        if (t->ne[d] < 0 || __builtin_mul_overflow(n, t->ne[d], &n))
            return ft_err(FT_E_CORRUPT, "%s: offset %zu: tensor \"%s\": dim %u = %lld is "
                          "negative or overflows the element count", c->path, at, t->name, d,
                          (long long)t->ne[d]);
    }
    t->n_elems = n;
    uint32_t type;
    FT_TRY(rd(c, &type, 4, "a tensor's ggml type"));
    t->type = (int)type;
    int64_t bn, bb;
    if (ft_quant_block((int)type, &bn, &bb) < 0)
        return ft_err(FT_E_UNSUPPORTED, "%s: offset %zu: tensor \"%s\" has unknown ggml type "
                      "%u", c->path, at, t->name, type);
    if (t->ne[0] % bn != 0)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: tensor \"%s\": ne[0] = %lld is not a "
                      "multiple of the %s block size %lld", c->path, at, t->name,
                      (long long)t->ne[0], ft_quant_name((int)type), (long long)bn);
    int64_t nbytes = ft_quant_bytes((int)type, n);
    if (nbytes < 0)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: tensor \"%s\": byte size overflows",
                      c->path, at, t->name);
    t->nbytes = (size_t)nbytes;
    FT_TRY(rd(c, &t->offset, 8, "a tensor's data offset"));
    return 0;
}

/* Sorts indices by name (merge sort, no globals: safe with threads). */
static void sort_idx(int64_t *idx, int64_t *tmp, int64_t n, const ft_gguf *g, int tensors)
{
    if (n < 2) return;
    int64_t h = n / 2;
    sort_idx(idx, tmp, h, g, tensors);
    sort_idx(idx + h, tmp, n - h, g, tensors);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        const char *a = tensors ? g->t[idx[i]].name : g->kv[idx[i]].key;
        const char *b = tensors ? g->t[idx[j]].name : g->kv[idx[j]].key;
        tmp[k++] = strcmp(a, b) <= 0 ? idx[i++] : idx[j++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

static int build_index(ft_gguf *g)
{
    int64_t m = g->n_kv > g->n_t ? g->n_kv : g->n_t;
    int64_t *tmp = malloc((size_t)(m ? m : 1) * sizeof *tmp);
    g->kv_by_name = malloc((size_t)(g->n_kv ? g->n_kv : 1) * sizeof(int64_t));
    g->t_by_name = malloc((size_t)(g->n_t ? g->n_t : 1) * sizeof(int64_t));
    if (!tmp || !g->kv_by_name || !g->t_by_name) {
        free(tmp);
        return ft_err(-ENOMEM, "%s: out of memory", g->path);
    }
    for (int64_t i = 0; i < g->n_kv; i++) g->kv_by_name[i] = i;
    for (int64_t i = 0; i < g->n_t; i++) g->t_by_name[i] = i;
    sort_idx(g->kv_by_name, tmp, g->n_kv, g, 0);
    sort_idx(g->t_by_name, tmp, g->n_t, g, 1);
    free(tmp);
    for (int64_t i = 1; i < g->n_kv; i++) {
        const ft_gguf_kv *a = &g->kv[g->kv_by_name[i - 1]], *b = &g->kv[g->kv_by_name[i]];
        if (!strcmp(a->key, b->key))
            return ft_err(FT_E_CORRUPT, "%s: offset %lld: duplicate metadata key \"%s\" (first "
                          "at offset %lld)", g->path, (long long)b->file_offset, b->key,
                          (long long)a->file_offset);
    }
    for (int64_t i = 1; i < g->n_t; i++) {
        const char *a = g->t[g->t_by_name[i - 1]].name, *b = g->t[g->t_by_name[i]].name;
        if (!strcmp(a, b))
            return ft_err(FT_E_CORRUPT, "%s: duplicate tensor name \"%s\"", g->path, b);
    }
    return 0;
}

static int parse(ft_gguf *g)
{
    cursor c = {g->map, g->size, 0, g->path};
    char magic[4];
    FT_TRY(rd(&c, magic, 4, "the magic"));
    if (memcmp(magic, "GGUF", 4))
        return ft_err(FT_E_INVALID, "%s: offset 0: not a GGUF file (magic %02x %02x %02x %02x, "
                      "expected \"GGUF\")", g->path, (uint8_t)magic[0], (uint8_t)magic[1],
                      (uint8_t)magic[2], (uint8_t)magic[3]);
    FT_TRY(rd(&c, &g->version, 4, "the version"));
    if (g->version == 0x02000000u || g->version == 0x03000000u)
        return ft_err(FT_E_UNSUPPORTED, "%s: offset 4: a big-endian GGUF file (version %u "
                      "byte-swapped); only little-endian files are supported", g->path,
                      g->version >> 24);
    if (g->version < 2 || g->version > 3)
        return ft_err(FT_E_UNSUPPORTED, "%s: offset 4: GGUF version %u, supported: 2 and 3",
                      g->path, g->version);
    uint64_t n_t, n_kv;
    FT_TRY(rd(&c, &n_t, 8, "the tensor count"));
    FT_TRY(rd(&c, &n_kv, 8, "the metadata count"));
    /* a key/value needs >= 13 bytes, a tensor info >= 24: reject absurd counts early */
    if (n_kv > (c.size - c.off) / 13 || n_t > (c.size - c.off) / 24)
        return ft_err(FT_E_CORRUPT, "%s: offset 8: %llu tensors and %llu metadata entries "
                      "cannot fit in a %zu-byte file", g->path, (unsigned long long)n_t,
                      (unsigned long long)n_kv, g->size);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->t = calloc(n_t ? n_t : 1, sizeof *g->t);
    if (!g->kv || !g->t)
        return ft_err(-ENOMEM, "%s: out of memory", g->path);
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv = (int64_t)i + 1;
        FT_TRY(parse_kv(&c, &g->kv[i]));
    }
    g->alignment = FT_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        const ft_gguf_kv *kv = &g->kv[i];
        if (strcmp(kv->key, "general.alignment")) continue;
        if (kv->type != FT_GGUF_U32 || kv->u == 0 || (kv->u & (kv->u - 1)) || kv->u > (1u << 30))
            return kv->type == FT_GGUF_U32
                       ? ft_err(FT_E_CORRUPT, "%s: offset %lld: general.alignment must be a power "
                                "of two, found %llu", g->path, (long long)kv->file_offset,
                                (unsigned long long)kv->u)
                       : ft_err(FT_E_CORRUPT, "%s: offset %lld: general.alignment must be a u32, "
                                "found %s", g->path, (long long)kv->file_offset,
                                ft_gguf_vtype_name(kv->type));
        g->alignment = (uint32_t)kv->u;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        g->n_t = (int64_t)i + 1;
        FT_TRY(parse_tensor_info(&c, &g->t[i]));
    }
    size_t data_off = (c.off + g->alignment - 1) / g->alignment * g->alignment;
    if (data_off > g->size && n_t > 0)
        return ft_err(FT_E_CORRUPT, "%s: data section would start at offset %zu, past the end "
                      "of the %zu-byte file", g->path, data_off, g->size);
    g->data_off = (int64_t)data_off;
    uint64_t expect = 0;
    for (int64_t i = 0; i < g->n_t; i++) {
        ft_gguf_tensor *t = &g->t[i];
        if (t->offset != expect)
            return ft_err(FT_E_CORRUPT, "%s: tensor \"%s\" has offset %llu, expected %llu (the "
                          "running sum of sizes padded to %u)", g->path, t->name,
                          (unsigned long long)t->offset, (unsigned long long)expect, g->alignment);
        if (t->nbytes > g->size - data_off || t->offset > g->size - data_off - t->nbytes)
            return ft_err(FT_E_CORRUPT, "%s: tensor \"%s\": data [%llu, %llu) extends past the "
                          "end of the %zu-byte file (truncated?)", g->path, t->name,
                          (unsigned long long)(data_off + t->offset),
                          (unsigned long long)(data_off + t->offset + t->nbytes), g->size);
        t->file_offset = (int64_t)(data_off + t->offset);
        t->data = g->map + data_off + t->offset;
        expect += (t->nbytes + g->alignment - 1) / g->alignment * g->alignment;
    }
    return build_index(g);
}

int ft_gguf_open(ft_gguf **out, const char *path)
{
    *out = NULL;
    const void *map;
    size_t size;
    FT_TRY(ft_map_file(path, "a .gguf file", &map, &size));
    if (size < 24) {
        ft_unmap_file(map, size);
        return ft_err(FT_E_CORRUPT, "%s: file is %zu bytes, shorter than the 24-byte GGUF "
                      "header", path, size);
    }
    ft_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        ft_unmap_file(map, size);
        return ft_err(-ENOMEM, "%s: out of memory", path);
    }
    g->map = map;
    g->size = size;
    int rc = parse(g);
    if (rc < 0) {
        ft_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

void ft_gguf_close(ft_gguf *g)
{
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        ft_gguf_kv *kv = &g->kv[i];
        free(kv->key);
        free(kv->str);
        if (kv->arr_str)
            for (int64_t k = 0; k < kv->arr_n; k++) free(kv->arr_str[k]);
        free(kv->arr_str);
    }
    for (int64_t i = 0; i < g->n_t; i++) free(g->t[i].name);
    free(g->kv);
    free(g->t);
    free(g->kv_by_name);
    free(g->t_by_name);
    ft_unmap_file(g->map, g->size);
    free(g->path);
    free(g);
}

const char *ft_gguf_path(const ft_gguf *g) { return g->path; }
uint32_t ft_gguf_version(const ft_gguf *g) { return g->version; }
uint32_t ft_gguf_alignment(const ft_gguf *g) { return g->alignment; }
int64_t ft_gguf_data_offset(const ft_gguf *g) { return g->data_off; }
int64_t ft_gguf_n_kv(const ft_gguf *g) { return g->n_kv; }
int64_t ft_gguf_n_tensors(const ft_gguf *g) { return g->n_t; }

const ft_gguf_kv *ft_gguf_kv_at(const ft_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const ft_gguf_tensor *ft_gguf_tensor_at(const ft_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_t ? &g->t[i] : NULL;
}

const ft_gguf_kv *ft_gguf_find_kv(const ft_gguf *g, const char *key)
{
    int64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->kv[g->kv_by_name[mid]].key, key);
        if (!c) return &g->kv[g->kv_by_name[mid]];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

const ft_gguf_tensor *ft_gguf_find_tensor(const ft_gguf *g, const char *name)
{
    int64_t lo = 0, hi = g->n_t;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->t[g->t_by_name[mid]].name, name);
        if (!c) return &g->t[g->t_by_name[mid]];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

static int get_kv(const ft_gguf *g, const char *key, const ft_gguf_kv **kv)
{
    *kv = ft_gguf_find_kv(g, key);
    if (!*kv)
        return ft_err(FT_E_NOTFOUND, "%s: metadata key \"%s\" not found", g->path, key);
    return 0;
}

static int type_err(const ft_gguf *g, const ft_gguf_kv *kv, const char *expected)
{
    return ft_err(FT_E_INVALID, "%s: offset %lld: metadata key \"%s\": expected %s, found %s",
                  g->path, (long long)kv->file_offset, kv->key, expected,
                  ft_gguf_vtype_name(kv->type));
}

int ft_gguf_get_int(const ft_gguf *g, const char *key, int64_t *v)
{
    const ft_gguf_kv *kv;
    FT_TRY(get_kv(g, key, &kv));
    if (!is_int_type(kv->type))
        return type_err(g, kv, "an integer");
    if (kv->type == FT_GGUF_U64 && kv->u > (uint64_t)INT64_MAX)
        return ft_err(FT_E_INVALID, "%s: metadata key \"%s\": value %llu out of range", g->path,
                      key, (unsigned long long)kv->u);
    *v = kv->i;
    return 0;
}

int ft_gguf_get_float(const ft_gguf *g, const char *key, double *v)
{
    const ft_gguf_kv *kv;
    FT_TRY(get_kv(g, key, &kv));
    if (!ft_gguf_vtype_size(kv->type) || kv->type == FT_GGUF_BOOL)
        return type_err(g, kv, "a number");
    *v = kv->f;
    return 0;
}

int ft_gguf_get_bool(const ft_gguf *g, const char *key, int *v)
{
    const ft_gguf_kv *kv;
    FT_TRY(get_kv(g, key, &kv));
    if (kv->type != FT_GGUF_BOOL && !is_int_type(kv->type))
        return type_err(g, kv, "a bool");
    *v = kv->i != 0;
    return 0;
}

int ft_gguf_get_str(const ft_gguf *g, const char *key, const char **v)
{
    const ft_gguf_kv *kv;
    FT_TRY(get_kv(g, key, &kv));
    if (kv->type != FT_GGUF_STRING)
        return type_err(g, kv, "a string");
    *v = kv->str;
    return 0;
}

int ft_gguf_arr_f32(const ft_gguf_kv *kv, float *out)
{
    size_t es = ft_gguf_vtype_size(kv->arr_type);
    if (kv->type != FT_GGUF_ARRAY || !es)
        return ft_err(FT_E_INVALID, "metadata key \"%s\": expected a numeric array, found %s "
                      "of %s", kv->key, ft_gguf_vtype_name(kv->type),
                      ft_gguf_vtype_name(kv->arr_type));
    for (int64_t k = 0; k < kv->arr_n; k++) {
        int64_t i; uint64_t u; double f;
        decode_scalar(kv->arr_type, kv->arr_data + (size_t)k * es, &i, &u, &f);
        out[k] = (float)f;
    }
    return 0;
}

int ft_gguf_arr_i32(const ft_gguf_kv *kv, int32_t *out)
{
    size_t es = ft_gguf_vtype_size(kv->arr_type);
    if (kv->type != FT_GGUF_ARRAY || !is_int_type(kv->arr_type))
        return ft_err(FT_E_INVALID, "metadata key \"%s\": expected an integer array, found %s "
                      "of %s", kv->key, ft_gguf_vtype_name(kv->type),
                      ft_gguf_vtype_name(kv->arr_type));
    for (int64_t k = 0; k < kv->arr_n; k++) {
        int64_t i; uint64_t u; double f;
        decode_scalar(kv->arr_type, kv->arr_data + (size_t)k * es, &i, &u, &f);
        if (i < INT32_MIN || i > INT32_MAX || (kv->arr_type == FT_GGUF_U64 && u > INT32_MAX))
            return ft_err(FT_E_INVALID, "metadata key \"%s\": element %lld = %lld does not fit "
                          "int32", kv->key, (long long)k, (long long)i);
        out[k] = (int32_t)i;
    }
    return 0;
}

int ft_gguf_tensor_f32(const ft_gguf *g, const ft_gguf_tensor *t, float *out)
{
    if (!ft_quant_can_dequant(t->type))
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor \"%s\" has ggml type %s (%d); supported: "
                      FT_QUANT_DEQUANT_LIST, g->path, t->name,
                      ft_quant_name(t->type), t->type);
    int rc = ft_quant_dequant(t->type, t->data, out, t->n_elems);
    if (rc < 0)
        return ft_err_prefix(rc, "%s: tensor \"%s\"", g->path, t->name);
    return 0;
}
