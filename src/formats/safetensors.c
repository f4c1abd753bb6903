/* safetensors.c - mmap'ed, bounds-checked safetensors reader and sharded sets (see
 * safetensors.h; formats.md 1.1 and 1.2, huggingface/safetensors tensor.rs
 * Metadata::validate). The writer is st_write.c. */
#include "src/formats/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/err.h"
#include "src/core/json.h"
#include "src/core/fsutil.h"
#include "src/numeric/quant.h"

#define ST_MAX_HEADER 100000000ull /* tensor.rs MAX_HEADER_SIZE */
#define ST_MAX_JSON_INT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact */

typedef struct {
    ft_st_tensor t;       /* first member: ft_st_at returns &entry->t */
    char dtype_name[16];
    int64_t begin, end;   /* data_offsets */
} st_entry;

struct ft_st_file {
    char *path;
    const uint8_t *map;
    size_t size;
    int64_t n;
    st_entry *e;          /* sorted by data offset */
    st_entry **by_name;   /* sorted by name */
    char **meta_k, **meta_v;
    int n_meta;
};

/* The safetensors dtype list (formats.md 1.1) with bit sizes and our enum. */
static const struct { const char *name; int bits; int dtype; } k_dtypes[] = {
    {"BOOL", 8, FT_ST_BOOL}, {"F4", 4, FT_ST_OTHER}, {"F6_E2M3", 6, FT_ST_OTHER},
    {"F6_E3M2", 6, FT_ST_OTHER}, {"U8", 8, FT_ST_U8}, {"I8", 8, FT_ST_I8},
    {"F8_E5M2", 8, FT_ST_OTHER}, {"F8_E4M3", 8, FT_ST_OTHER}, {"F8_E8M0", 8, FT_ST_OTHER},
    {"F8_E4M3FNUZ", 8, FT_ST_OTHER}, {"F8_E5M2FNUZ", 8, FT_ST_OTHER}, {"I16", 16, FT_ST_I16},
    {"U16", 16, FT_ST_U16}, {"F16", 16, FT_ST_F16}, {"BF16", 16, FT_ST_BF16},
    {"I32", 32, FT_ST_I32}, {"U32", 32, FT_ST_OTHER}, {"F32", 32, FT_ST_F32},
    {"C64", 64, FT_ST_OTHER}, {"F64", 64, FT_ST_F64}, {"I64", 64, FT_ST_I64},
    {"U64", 64, FT_ST_OTHER},
};

size_t ft_st_dtype_size(int dtype)
{
    switch (dtype) {
    case FT_ST_F32: case FT_ST_I32: return 4;
    case FT_ST_F16: case FT_ST_BF16: case FT_ST_I16: case FT_ST_U16: return 2;
    case FT_ST_U8: case FT_ST_I8: case FT_ST_BOOL: return 1;
    case FT_ST_I64: case FT_ST_F64: return 8;
    default: return 0;
    }
}

const char *ft_st_dtype_name(int dtype)
{
    switch (dtype) {
    case FT_ST_F32: return "F32";
    case FT_ST_F16: return "F16";
    case FT_ST_BF16: return "BF16";
    case FT_ST_U8: return "U8";
    case FT_ST_I8: return "I8";
    case FT_ST_I32: return "I32";
    case FT_ST_I64: return "I64";
    case FT_ST_F64: return "F64";
    case FT_ST_I16: return "I16";
    case FT_ST_U16: return "U16";
    case FT_ST_BOOL: return "BOOL";
    default: return "OTHER";
    }
}

/* A JSON number that is a non-negative integer <= 2^53. */
static int json_uint(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= ST_MAX_JSON_INT) || d != (double)(int64_t)d) return 0;
    *out = (int64_t)d;
    return 1;
}

static int cmp_offset(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(st_entry *const *)a)->t.name, (*(st_entry *const *)b)->t.name);
}

static int parse_meta(ft_st_file *f, const cJSON *m)
{
    if (!cJSON_IsObject(m))
        return ft_err(FT_E_INVALID, "%s: header: \"__metadata__\" must be an object of strings",
                      f->path);
    int n = cJSON_GetArraySize(m);
    f->meta_k = calloc((size_t)n + 1, sizeof(char *));
    f->meta_v = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_k || !f->meta_v) return ft_err(-ENOMEM, "%s: out of memory", f->path);
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return ft_err(FT_E_INVALID, "%s: header: __metadata__ value of key \"%s\" is not a "
                          "string (safetensors metadata maps strings to strings)", f->path,
                          c->string);
        f->meta_k[f->n_meta] = strdup(c->string);
        f->meta_v[f->n_meta] = strdup(c->valuestring);
        if (!f->meta_k[f->n_meta] || !f->meta_v[f->n_meta])
            return ft_err(-ENOMEM, "%s: out of memory", f->path);
        f->n_meta++;
    }
    return 0;
}

static int parse_tensor(ft_st_file *f, const cJSON *o, st_entry *e, int64_t data_len)
{
    const char *nm = o->string;
    if (!(e->t.name = strdup(nm))) return ft_err(-ENOMEM, "%s: out of memory", f->path);
    if (!cJSON_IsObject(o))
        return ft_err(FT_E_INVALID, "%s: header: tensor \"%s\" is not an object", f->path, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
    if (!cJSON_IsString(dt))
        return ft_err(FT_E_INVALID, "%s: header: tensor \"%s\": \"dtype\" missing or not a string",
                      f->path, nm);
    int bits = 0;
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (!strcmp(dt->valuestring, k_dtypes[i].name)) {
            bits = k_dtypes[i].bits;
            e->t.dtype = k_dtypes[i].dtype;
        }
    if (!bits)
        return ft_err(FT_E_INVALID, "%s: header: tensor \"%s\": unknown dtype \"%.40s\"", f->path,
                      nm, dt->valuestring);
    snprintf(e->dtype_name, sizeof e->dtype_name, "%s", dt->valuestring);
    if (!cJSON_IsArray(sh))
        return ft_err(FT_E_INVALID, "%s: header: tensor \"%s\": \"shape\" missing or not an array",
                      f->path, nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > FT_ST_MAX_DIMS)
        return ft_err(FT_E_UNSUPPORTED, "%s: header: tensor \"%s\" has %d dims, at most %d "
                      "supported", f->path, nm, nd, FT_ST_MAX_DIMS);
    e->t.n_dims = nd;
    int64_t numel = 1;
    int d = 0;
    for (const cJSON *c = sh->child; c; c = c->next, d++) {
        if (!json_uint(c, &e->t.shape[d]))
            return ft_err(FT_E_INVALID, "%s: header: tensor \"%s\": shape[%d] is not a "
                          "non-negative integer", f->path, nm, d);
        if (__builtin_mul_overflow(numel, e->t.shape[d], &numel))
            return ft_err(FT_E_INVALID, "%s: header: tensor \"%s\": element count overflows",
                          f->path, nm);
    }
    int64_t nbits;
    if (__builtin_mul_overflow(numel, (int64_t)bits, &nbits) || nbits % 8)
        return ft_err(FT_E_INVALID, "%s: header: tensor \"%s\": %lld elements of %s are not a "
                      "whole number of bytes", f->path, nm, (long long)numel, e->dtype_name);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        !json_uint(cJSON_GetArrayItem(off, 0), &e->begin) ||
        !json_uint(cJSON_GetArrayItem(off, 1), &e->end) || e->end < e->begin)
        return ft_err(FT_E_INVALID, "%s: header: tensor \"%s\": \"data_offsets\" must be "
                      "[BEGIN, END] with 0 <= BEGIN <= END", f->path, nm);
    if (e->end - e->begin != nbits / 8)
        return ft_err(FT_E_CORRUPT, "%s: tensor \"%s\": data_offsets [%lld, %lld] hold %lld bytes "
                      "but %lld elements of %s need %lld", f->path, nm, (long long)e->begin,
                      (long long)e->end, (long long)(e->end - e->begin), (long long)numel,
                      e->dtype_name, (long long)(nbits / 8));
    if (e->end > data_len)
        return ft_err(FT_E_CORRUPT, "%s: tensor \"%s\": data_offsets [%lld, %lld] extend past the "
                      "end of the data section (%lld bytes at file offset %lld, file size "
                      "%zu; truncated?)", f->path, nm, (long long)e->begin, (long long)e->end,
                      (long long)data_len, (long long)(f->size - data_len), f->size);
    e->t.nbytes = (size_t)(nbits / 8);
    return 0;
}

static int parse_header(ft_st_file *f)
{
    if (f->size < 8)
        return ft_err(FT_E_CORRUPT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                      f->path, f->size);
    uint64_t n;
    memcpy(&n, f->map, 8); /* little-endian host (x86-64, aarch64) */
    if (n > ST_MAX_HEADER)
        return ft_err(FT_E_CORRUPT, "%s: header length %llu exceeds the limit of %llu bytes",
                      f->path, (unsigned long long)n, ST_MAX_HEADER);
    if (n > f->size - 8)
        return ft_err(FT_E_CORRUPT, "%s: header length %llu exceeds file size %zu", f->path,
                      (unsigned long long)n, f->size);
    int64_t data_len = (int64_t)(f->size - 8 - n);
    char *js = malloc(n + 1);
    if (!js) return ft_err(-ENOMEM, "%s: out of memory for a %llu-byte header", f->path,
                           (unsigned long long)n);
    memcpy(js, f->map + 8, n);
    js[n] = 0;
    size_t k = 0;
    while (k < n && strchr(" \t\r\n", js[k]) && js[k]) k++;
    if (k == n || js[k] != '{') {
        free(js);
        return ft_err(FT_E_INVALID, "%s: offset %zu: header must be a JSON object starting "
                      "with '{'", f->path, 8 + k);
    }
    const char *end = NULL;
    unsigned long oom = ft_json_oom_mark();
    cJSON *root = cJSON_ParseWithOpts(js, &end, 0);
    if (!root && ft_json_oom_since(oom)) {
        free(js);
        return ft_err(-ENOMEM, "%s: out of memory while parsing its %zu-byte header", f->path, n);
    }
    if (!root) {
        size_t at = end ? (size_t)(end - js) : 0;
        free(js);
        return ft_err(FT_E_INVALID, "%s: offset %zu: header JSON does not parse", f->path, 8 + at);
    }
    size_t at = (size_t)(end - js);
    while (at < n && js[at] && strchr(" \t\r\n", js[at])) at++;
    int rc = 0;
    if (at < n || !cJSON_IsObject(root)) {
        rc = ft_err(FT_E_INVALID, "%s: offset %zu: unexpected bytes after the header's JSON "
                    "object (padding must be spaces)", f->path, 8 + at);
        goto done;
    }
    int cnt = cJSON_GetArraySize(root);
    f->e = calloc((size_t)cnt + 1, sizeof *f->e);
    f->by_name = calloc((size_t)cnt + 1, sizeof *f->by_name);
    if (!f->e || !f->by_name) {
        rc = ft_err(-ENOMEM, "%s: out of memory", f->path);
        goto done;
    }
    for (const cJSON *c = root->child; c && !rc; c = c->next) {
        if (!strcmp(c->string, "__metadata__")) {
            if (f->meta_k) {
                rc = ft_err(FT_E_INVALID, "%s: header: duplicate \"__metadata__\"", f->path);
                break;
            }
            rc = parse_meta(f, c);
            continue;
        }
        st_entry *e = &f->e[f->n++];
        rc = parse_tensor(f, c, e, data_len);
    }
    if (rc) goto done;
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_offset);
    int64_t pos = 0;
    for (int64_t i = 0; i < f->n; i++) {
        st_entry *e = &f->e[i];
        if (e->begin != pos) {
            if (i == 0)
                rc = ft_err(FT_E_CORRUPT, "%s: tensor \"%s\" starts at data offset %lld; the "
                            "first tensor must start at 0 (the buffer must be fully indexed)",
                            f->path, e->t.name, (long long)e->begin);
            else
                rc = ft_err(FT_E_CORRUPT, "%s: tensors are not contiguous: \"%s\" ends at data "
                            "offset %lld but \"%s\" has data_offsets [%lld, %lld]", f->path,
                            f->e[i - 1].t.name, (long long)pos, e->t.name, (long long)e->begin,
                            (long long)e->end);
            goto done;
        }
        pos = e->end;
        e->t.data = f->map + 8 + n + e->begin;
        e->t.file_offset = (int64_t)(8 + n) + e->begin;
        f->by_name[i] = e;
    }
    if (pos != data_len) {
        rc = ft_err(FT_E_CORRUPT, "%s: %lld bytes after the last tensor (data section is %lld "
                    "bytes, tensors cover %lld)", f->path, (long long)(data_len - pos),
                    (long long)data_len, (long long)pos);
        goto done;
    }
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
    for (int64_t i = 1; i < f->n; i++)
        if (!strcmp(f->by_name[i - 1]->t.name, f->by_name[i]->t.name)) {
            rc = ft_err(FT_E_INVALID, "%s: header: duplicate tensor name \"%s\"", f->path,
                        f->by_name[i]->t.name);
            goto done;
        }
done:
    cJSON_Delete(root);
    free(js);
    return rc;
}

int ft_st_open(ft_st_file **out, const char *path)
{
    *out = NULL;
    const void *map;
    size_t size;
    FT_TRY(ft_map_file(path, "a .safetensors file", &map, &size));
    ft_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        ft_unmap_file(map, size);
        return ft_err(-ENOMEM, "%s: out of memory", path);
    }
    f->map = map;
    f->size = size;
    int rc = parse_header(f);
    if (rc < 0) {
        ft_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

void ft_st_close(ft_st_file *f)
{
    if (!f) return;
    for (int64_t i = 0; i < f->n; i++) free(f->e[i].t.name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_k[i]);
        free(f->meta_v[i]);
    }
    free(f->meta_k);
    free(f->meta_v);
    free(f->e);
    free(f->by_name);
    ft_unmap_file(f->map, f->size);
    free(f->path);
    free(f);
}

int64_t ft_st_count(const ft_st_file *f) { return f->n; }
const char *ft_st_path(const ft_st_file *f) { return f->path; }

const ft_st_tensor *ft_st_at(const ft_st_file *f, int64_t i)
{
    return i >= 0 && i < f->n ? &f->e[i].t : NULL;
}

const ft_st_tensor *ft_st_find(const ft_st_file *f, const char *name)
{
    int64_t lo = 0, hi = f->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->t.name, name);
        if (!c) return &f->by_name[mid]->t;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

const char *ft_st_meta(const ft_st_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_k[i], key)) return f->meta_v[i];
    return NULL;
}

/* FT_E_CORRUPT naming the tensor and the first element of out (n values) that is not finite,
 * or 0. No checkpoint holds an inf or NaN weight: one found at load is refused there rather
 * than surfacing steps later as NaN losses (the GGUF loader's rule, loader.c check_finite). */
static int check_finite(const ft_st_tensor *t, const float *out, int64_t n)
{
    const int64_t bad = ft_quant_first_nonfinite(out, n);
    if (bad == n) return 0;
    return ft_err(FT_E_CORRUPT, "offset %lld: tensor \"%s\" element %lld is %s, where a model "
                  "or adapter file holds only finite values (a corrupt or diverged file)",
                  (long long)(t->file_offset + bad * (int64_t)ft_st_dtype_size(t->dtype)), t->name,
                  (long long)bad, isnan(out[bad]) ? "NaN" : "infinite");
}

int ft_st_to_f32(const ft_st_tensor *t, float *out, int64_t n)
{
    int64_t numel = 1;
    for (int d = 0; d < t->n_dims; d++) numel *= t->shape[d];
    if (n < 0 || n > numel)
        return ft_err(FT_E_RANGE, "tensor \"%s\": %lld elements requested, it has %lld", t->name,
                      (long long)n, (long long)numel);
    const uint8_t *s = t->data;
    switch (t->dtype) {
    case FT_ST_F32:
        memcpy(out, s, (size_t)n * 4);
        return check_finite(t, out, n);
    case FT_ST_F16:
    case FT_ST_BF16: {
        int bf = t->dtype == FT_ST_BF16;
#pragma omp parallel for schedule(static) if (n > 262144)
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            out[i] = bf ? ft_quant_bf16_to_f32(h) : ft_quant_f16_to_f32(h);
        }
        return check_finite(t, out, n);
    }
    default:
        return ft_err(FT_E_UNSUPPORTED, "tensor \"%s\": dtype %s cannot be converted to fp32 "
                      "(F32, F16 and BF16 can)", t->name, ft_st_dtype_name(t->dtype));
    }
}

/* ---- sharded sets ---------------------------------------------------------------------- */

typedef struct {
    char *name;
    int file;
} st_map_entry;

struct ft_st_set {
    char *dir;
    ft_st_file **files;
    int n_files;
    st_map_entry *map;    /* weight_map sorted by name; empty for a single file */
    int64_t n_map;
};

static int cmp_map(const void *a, const void *b)
{
    return strcmp(((const st_map_entry *)a)->name, ((const st_map_entry *)b)->name);
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int set_add_file(ft_st_set *s, const char *path)
{
    ft_st_file **nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
    if (!nf) return ft_err(-ENOMEM, "%s: out of memory", path);
    s->files = nf;
    FT_TRY(ft_st_open(&s->files[s->n_files], path));
    s->n_files++;
    return 0;
}

static int open_index(ft_st_set *s, const char *index)
{
    char *txt;
    size_t len;
    FT_TRY(ft_read_file(index, &txt, &len));
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    int rc = 0;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!root || !cJSON_IsObject(wm)) {
        rc = ft_err(FT_E_INVALID, "%s: %s", index, root ? "missing \"weight_map\" object"
                                                         : "not valid JSON");
        goto done;
    }
    int n = cJSON_GetArraySize(wm);
    s->map = calloc((size_t)n + 1, sizeof *s->map);
    char **shards = calloc((size_t)n + 1, sizeof *shards);
    if (!s->map || !shards) {
        free(shards);
        rc = ft_err(-ENOMEM, "%s: out of memory", index);
        goto done;
    }
    int n_shards = 0;
    for (const cJSON *c = wm->child; c; c = c->next) {
        if (!cJSON_IsString(c) || !c->valuestring[0]) {
            rc = ft_err(FT_E_INVALID, "%s: weight_map[\"%s\"] is not a file name", index,
                        c->string);
            break;
        }
        int k = 0;
        while (k < n_shards && strcmp(shards[k], c->valuestring)) k++;
        if (k == n_shards) {
            char p[4096];
            if ((rc = ft_path_join(p, sizeof p, s->dir, c->valuestring)) < 0) break;
            if (!file_exists(p)) {
                rc = ft_err(-ENOENT, "%s: shard \"%s\" (holding \"%s\") not found: %s", index,
                            c->valuestring, c->string, p);
                break;
            }
            shards[n_shards++] = c->valuestring;
            if ((rc = set_add_file(s, p)) < 0) {
                ft_err_prefix(rc, "%s", index);
                break;
            }
        }
        s->map[s->n_map].file = k;
        if (!(s->map[s->n_map].name = strdup(c->string))) {
            rc = ft_err(-ENOMEM, "%s: out of memory", index);
            break;
        }
        s->n_map++;
    }
    free(shards);
    if (rc) goto done;
    qsort(s->map, (size_t)s->n_map, sizeof *s->map, cmp_map);
    for (int64_t i = 0; i < s->n_map; i++) {
        if (i && !strcmp(s->map[i - 1].name, s->map[i].name)) {
            rc = ft_err(FT_E_INVALID, "%s: weight_map lists \"%s\" twice", index, s->map[i].name);
            goto done;
        }
        const ft_st_file *f = s->files[s->map[i].file];
        if (!ft_st_find(f, s->map[i].name)) {
            rc = ft_err(FT_E_CORRUPT, "%s: weight_map puts \"%s\" in %s, which does not hold it",
                        index, s->map[i].name, f->path);
            goto done;
        }
    }
done:
    cJSON_Delete(root);
    return rc;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int ft_st_set_open(ft_st_set **out, const char *dir)
{
    *out = NULL;
    DIR *dp = opendir(dir);
    if (!dp)
        return ft_err(-errno, "%s: cannot open model folder: %s", dir, strerror(errno));
    char single[4096] = "", other[4096] = "", bin[256] = "";
    int n_st = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        if (ends_with(de->d_name, ".safetensors")) {
            if (!n_st++) snprintf(other, sizeof other, "%s", de->d_name);
        } else if (ends_with(de->d_name, ".bin") || ends_with(de->d_name, ".pt") ||
                   ends_with(de->d_name, ".pth")) {
            snprintf(bin, sizeof bin, "%s", de->d_name);
        }
    }
    closedir(dp);
    ft_st_set *s = calloc(1, sizeof *s);
    if (!s || !(s->dir = strdup(dir))) {
        free(s);
        return ft_err(-ENOMEM, "%s: out of memory", dir);
    }
    char p[4096];
    int rc = ft_path_join(p, sizeof p, dir, "model.safetensors");
    if (!rc && file_exists(p)) {
        rc = set_add_file(s, p);
    } else if (!rc && !ft_path_join(p, sizeof p, dir, "model.safetensors.index.json") &&
               file_exists(p)) {
        rc = open_index(s, p);
    } else if (!rc && n_st == 1) {
        rc = ft_path_join(single, sizeof single, dir, other);
        if (!rc) rc = set_add_file(s, single);
    } else if (!rc && n_st > 1) {
        rc = ft_err(FT_E_INVALID, "%s: %d *.safetensors files (e.g. %s) but no model.safetensors "
                    "or model.safetensors.index.json saying which hold the model", dir, n_st,
                    other);
    } else if (!rc && bin[0]) {
        rc = ft_err(FT_E_UNSUPPORTED, "%s: only PyTorch pickle weights (%s) found; ftune reads "
                    "safetensors. Convert once with transformers: AutoModelForCausalLM."
                    "from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True)", dir, bin);
    } else if (!rc) {
        rc = ft_err(-ENOENT, "%s: no model.safetensors, model.safetensors.index.json or "
                    "*.safetensors file", dir);
    }
    if (rc < 0) {
        ft_st_set_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void ft_st_set_close(ft_st_set *s)
{
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) ft_st_close(s->files[i]);
    for (int64_t i = 0; i < s->n_map; i++) free(s->map[i].name);
    free(s->files);
    free(s->map);
    free(s->dir);
    free(s);
}

const ft_st_tensor *ft_st_set_find(const ft_st_set *s, const char *name, const ft_st_file **file)
{
    if (s->n_map) {
        st_map_entry key = {(char *)name, 0};
        const st_map_entry *m = bsearch(&key, s->map, (size_t)s->n_map, sizeof *s->map, cmp_map);
        if (m) {
            if (file) *file = s->files[m->file];
            return ft_st_find(s->files[m->file], name);
        }
    }
    for (int i = 0; i < s->n_files; i++) {
        const ft_st_tensor *t = ft_st_find(s->files[i], name);
        if (t) {
            if (file) *file = s->files[i];
            return t;
        }
    }
    return NULL;
}
