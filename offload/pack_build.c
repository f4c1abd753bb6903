/* pack_build.c - the streaming pack builder (see pack.h ft_pack_build): layer blocks are
 * assembled in one buffer and written whole; the global block (embeddings, LM head) is
 * streamed in chunks and hashed as it is written. */
#include "offload/pack.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "offload/pack_internal.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/model/quant.h"

/* ---- building -------------------------------------------------------------------------- */

#define CHUNK_FLOATS ((int64_t)1 << 24)

typedef struct builder {
    const ft_model_config *c;
    const ft_pack_settings *s;
    const ft_pack_src *src;
    const char *path;
    int fd;
    float map[256];
    float *scratch;            /* chunk of fp32 source values */
    int64_t scratch_n;
    float *absmax;             /* per-tensor fp32 absmax (largest n_blocks) */
    int64_t absmax_n;
    uint8_t *block;            /* the largest layer block */
    int64_t block_n;
} builder;

static int pwrite_all(int fd, const void *buf, size_t n, int64_t off, const char *path)
{
    const char *p = buf;
    while (n) {
        size_t k = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t w = pwrite(fd, p, k, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            return ft_err(-e, "%s: write failed at offset %lld: %s", path, (long long)off, strerror(e));
        }
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* Rows per chunk: as many as fit CHUNK_FLOATS, a multiple that keeps NF4 blocks whole. */
static int64_t chunk_rows(int64_t rows, int64_t cols, int64_t bs, int64_t cap)
{
    int64_t r = cap / cols;
    if (bs > 0) {
        int64_t g = cols, b = bs; /* rows per whole number of blocks: bs / gcd(cols, bs) */
        while (b) { int64_t t = g % b; g = b; b = t; }
        int64_t unit = bs / g;
        r = r / unit * unit;
        if (r < unit) r = unit;
    }
    if (r < 1) r = 1;
    return r > rows ? rows : r;
}

static void to_bf16(const float *x, uint8_t *dst, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > 262144)
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = ft_quant_f32_to_bf16(x[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

/* Fills one tensor of a layer block in memory. */
static int fill_tensor(builder *b, int64_t l, ft_pack_tensor *r, int pre, uint8_t *blk)
{
    const ft_pack_src *src = b->src;
    const int64_t rows = r->rows, cols = r->cols, n = rows * cols;
    ft_nf4_view v;
    if (pre) {
        int k = src->read_nf4(src->user, l, (int)r->role, &v);
        if (k <= 0) return k < 0 ? k : ft_err(FT_E_INVALID, "pre-quantized tensor vanished");
    }
    if (r->dtype == FT_PACK_DT_NF4 && pre) { /* copy the bitsandbytes state verbatim */
        memcpy(blk + r->data_off, v.codes, (size_t)v.lay.code_bytes);
        if (v.lay.nested_blocksize) {
            memcpy(blk + r->absmax_off, v.qabsmax, (size_t)v.lay.n_blocks);
            memcpy(blk + r->nested_off, v.nested_absmax, (size_t)v.lay.n_nested * 4);
            memcpy(blk + r->map_off, v.nested_map, 256 * 4);
            r->offset = v.offset;
        } else {
            memcpy(blk + r->absmax_off, v.absmax, (size_t)v.lay.n_blocks * 4);
        }
        memcpy(blk + r->code_off, v.code, 16 * 4);
        return 0;
    }
    ft_nf4_layout lay;
    if (r->dtype == FT_PACK_DT_NF4) FT_TRY(ft_nf4_layout_init(&lay, n, r->blocksize, r->nested_blocksize));
    int64_t cr = chunk_rows(rows, cols, r->dtype == FT_PACK_DT_NF4 ? r->blocksize : 0, b->scratch_n);
    for (int64_t r0 = 0; r0 < rows; r0 += cr) {
        int64_t nr = r0 + cr <= rows ? cr : rows - r0, e0 = r0 * cols, cnt = nr * cols;
        if (pre) FT_TRY(ft_nf4_dequant_range(&v, e0, cnt, b->scratch));
        else FT_TRY(src->read_f32(src->user, l, (int)r->role, r0, nr, cols, b->scratch));
        if (r->dtype == FT_PACK_DT_BF16) {
            to_bf16(b->scratch, blk + r->data_off + 2 * e0, cnt);
        } else if (r->dtype == FT_PACK_DT_F32) {
            memcpy(blk + r->data_off + 4 * e0, b->scratch, (size_t)cnt * 4);
        } else {
            int rc = ft_nf4_quantize_part(b->scratch, &lay, e0, cnt, blk + r->data_off, b->absmax);
            if (rc < 0)
                return ft_err_prefix(rc, "layer %lld %s", (long long)l,
                                     ft_proj_name[r->role - FT_PACK_ROLE_W0]);
        }
    }
    if (r->dtype == FT_PACK_DT_NF4) {
        if (lay.nested_blocksize) {
            FT_TRY(ft_nf4_quantize_nested(b->absmax, &lay, b->map, blk + r->absmax_off,
                                          (float *)(blk + r->nested_off), &r->offset));
            memcpy(blk + r->map_off, b->map, sizeof b->map);
        } else {
            memcpy(blk + r->absmax_off, b->absmax, (size_t)lay.n_blocks * 4);
        }
        memcpy(blk + r->code_off, ft_nf4_code, sizeof ft_nf4_code);
    }
    return 0;
}

static int build_layer(builder *b, int64_t l, ft_pack_block *tb, int64_t off)
{
    ft_pack_tensor rec[FT_PACK_MAX_SLOTS];
    int pre[FT_PACK_MAX_SLOTS], n;
    int64_t bytes;
    FT_TRY(ft_pack_plan_block(b->c, b->s, b->src, l, rec, &n, &bytes, pre));
    memset(b->block, 0, (size_t)bytes);
    for (int i = 0; i < n; i++) {
        FT_TRY(fill_tensor(b, l, &rec[i], pre[i], b->block));
        if (b->src->release) b->src->release(b->src->user, l, (int)rec[i].role);
    }
    memcpy(b->block, rec, sizeof(ft_pack_tensor) * (size_t)n);
    *tb = (ft_pack_block){(uint64_t)off, (uint64_t)bytes, ft_pack_xxh64(b->block, (size_t)bytes, 0),
                          (uint32_t)l, (uint32_t)n};
    return pwrite_all(b->fd, b->block, (size_t)bytes, off, b->path);
}

/* The global block, streamed: directory, then each tensor in row chunks, hashed as written. */
static int build_global(builder *b, ft_pack_block *tb, int64_t off)
{
    ft_pack_tensor rec[FT_PACK_MAX_SLOTS];
    int pre[FT_PACK_MAX_SLOTS], n;
    int64_t bytes, pos = 0;
    FT_TRY(ft_pack_plan_block(b->c, b->s, b->src, -1, rec, &n, &bytes, pre));
    ft_xxh64 h;
    ft_xxh64_init(&h, 0);
    uint8_t *out = (uint8_t *)b->scratch; /* converted chunks go after the fp32 values */
    static const uint8_t zeros[4096];
    size_t dir = sizeof(ft_pack_tensor) * (size_t)n;
    FT_TRY(pwrite_all(b->fd, rec, dir, off, b->path));
    ft_xxh64_update(&h, rec, dir);
    pos = (int64_t)dir;
    for (int i = 0; i < n; i++) {
        ft_pack_tensor *r = &rec[i];
        while (pos < r->data_off) { /* alignment padding */
            size_t k = (size_t)(r->data_off - pos);
            FT_TRY(pwrite_all(b->fd, zeros, k, off + pos, b->path));
            ft_xxh64_update(&h, zeros, k);
            pos += (int64_t)k;
        }
        int esz = r->dtype == FT_PACK_DT_BF16 ? 2 : 4;
        /* fp32 values in the first half of the scratch, converted bytes in the second */
        int64_t cr = chunk_rows(r->rows, r->cols, 0, b->scratch_n / 2);
        for (int64_t r0 = 0; r0 < r->rows; r0 += cr) {
            int64_t nr = r0 + cr <= r->rows ? cr : r->rows - r0, cnt = nr * r->cols;
            FT_TRY(b->src->read_f32(b->src->user, -1, (int)r->role, r0, nr, r->cols, b->scratch));
            uint8_t *dst = out + (size_t)(b->scratch_n / 2) * 4;
            if (esz == 2) to_bf16(b->scratch, dst, cnt);
            else memcpy(dst, b->scratch, (size_t)cnt * 4);
            FT_TRY(pwrite_all(b->fd, dst, (size_t)(cnt * esz), off + pos, b->path));
            ft_xxh64_update(&h, dst, (size_t)(cnt * esz));
            pos += cnt * esz;
        }
        if (b->src->release) b->src->release(b->src->user, -1, (int)r->role);
    }
    while (pos < bytes) {
        size_t k = (size_t)(bytes - pos) < sizeof zeros ? (size_t)(bytes - pos) : sizeof zeros;
        FT_TRY(pwrite_all(b->fd, zeros, k, off + pos, b->path));
        ft_xxh64_update(&h, zeros, k);
        pos += (int64_t)k;
    }
    *tb = (ft_pack_block){(uint64_t)off, (uint64_t)bytes, ft_xxh64_digest(&h), FT_PACK_GLOBAL,
                          (uint32_t)n};
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sizes every block and the largest buffers the build needs. */
static int plan_all(builder *b, int64_t *blk_bytes, int64_t *max_layer, int64_t *max_src)
{
    const ft_model_config *c = b->c;
    int64_t L = c->num_hidden_layers, max_n = 1, max_nb = 1, max_need = 1;
    *max_layer = 0;
    *max_src = 0;
    for (int64_t l = -1; l < L; l++) {
        if (ft_pack_min_block_bytes(c, l, (uint32_t)b->s->quant) > ((uint64_t)1 << 50))
            return ft_err(FT_E_INVALID, "%s: the config's %s tensors are too large to pack "
                          "(over 1 PiB)", b->path, l < 0 ? "embedding/head" : "layer");
        ft_pack_tensor rec[FT_PACK_MAX_SLOTS];
        int pre[FT_PACK_MAX_SLOTS], n;
        FT_TRY(ft_pack_plan_block(c, b->s, b->src, l, rec, &n, &blk_bytes[l < 0 ? L : l], pre));
        int64_t src_bytes = 0;
        for (int i = 0; i < n; i++) {
            int64_t e = rec[i].rows * rec[i].cols;
            /* a chunk must hold two rows (global block halves) or one NF4 row unit */
            int64_t need = 2 * rec[i].cols;
            if (rec[i].dtype == FT_PACK_DT_NF4)
                need += chunk_rows(rec[i].rows, rec[i].cols, rec[i].blocksize, 1) * rec[i].cols;
            if (need > max_need) max_need = need;
            if (e > max_n) max_n = e;
            if (rec[i].dtype == FT_PACK_DT_NF4 && e / rec[i].blocksize + 1 > max_nb)
                max_nb = e / rec[i].blocksize + 1;
            src_bytes += 2 * e;
        }
        if (l >= 0 && blk_bytes[l] > *max_layer) *max_layer = blk_bytes[l];
        if (l >= 0 && src_bytes > *max_src) *max_src = src_bytes;
    }
    b->scratch_n = max_n < CHUNK_FLOATS ? max_n : CHUNK_FLOATS;
    if (b->scratch_n < 2048) b->scratch_n = 2048;
    if (b->scratch_n < max_need) b->scratch_n = max_need;
    b->absmax_n = max_nb;
    b->block_n = *max_layer;
    return 0;
}

int ft_pack_build(const char *path, const ft_model_config *cfg, const char *config_json,
                  size_t config_len, uint64_t identity, const ft_pack_settings *s,
                  const ft_pack_src *src, ft_pack_stats *st)
{
    double t0 = now_s();
    if (s->quant != FT_PACK_QUANT_NF4 && s->quant != FT_PACK_QUANT_BF16)
        return ft_err(FT_E_INVALID, "%s: unknown quantization %d", path, s->quant);
    if (cfg->num_hidden_layers < 1 || cfg->num_hidden_layers > 100000 || config_len > (1u << 24))
        return ft_err(FT_E_INVALID, "%s: bad model config (%lld layers)", path,
                      (long long)cfg->num_hidden_layers);
    builder b = {cfg, s, src, path, -1};
    ft_nf4_dynamic_map(b.map);
    const int64_t L = cfg->num_hidden_layers;
    int64_t *blk_bytes = calloc((size_t)(L + 1), sizeof *blk_bytes);
    ft_pack_block *tab = calloc((size_t)(L + 1), sizeof *tab);
    int64_t hb = (int64_t)sizeof(ft_pack_hdr) + (int64_t)config_len + (L + 1) * (int64_t)sizeof *tab;
    hb = align_up(hb, FT_PACK_ALIGN);
    uint8_t *hdr = calloc(1, (size_t)hb);
    char tmp[4200];
    int rc = 0;
    int64_t max_layer = 0, max_src = 0;
    if (!blk_bytes || !tab || !hdr) rc = ft_err(-ENOMEM, "%s: out of memory", path);
    if (!rc) rc = plan_all(&b, blk_bytes, &max_layer, &max_src);
    if (!rc) {
        b.scratch = malloc((size_t)b.scratch_n * 8); /* fp32 values + converted bytes */
        b.absmax = malloc((size_t)b.absmax_n * 4);
        if (posix_memalign((void **)&b.block, FT_PACK_ALIGN, (size_t)(b.block_n ? b.block_n : 4096)))
            b.block = NULL;
        if (!b.scratch || !b.absmax || !b.block)
            rc = ft_err(-ENOMEM, "%s: cannot allocate the build buffers (%.1f MiB)", path,
                        (b.scratch_n * 8.0 + b.absmax_n * 4.0 + b.block_n) / 1048576.0);
    }
    if (!rc && snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        rc = ft_err(FT_E_RANGE, "%s: path too long", path);
    if (!rc && (b.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
        rc = ft_err(-errno, "%s: cannot create: %s", tmp, strerror(errno));
    int64_t off = hb;
    for (int64_t l = 0; !rc && l < L; l++) {
        rc = build_layer(&b, l, &tab[l], off);
        off += blk_bytes[l];
    }
    if (!rc) rc = build_global(&b, &tab[L], off);
    if (!rc) {
        off += blk_bytes[L];
        ft_pack_hdr h;
        memset(&h, 0, sizeof h);
        memcpy(h.magic, FT_PACK_MAGIC, 8);
        h.version = FT_PACK_VERSION;
        h.header_bytes = (uint32_t)hb;
        h.quant = (uint32_t)s->quant;
        h.blocksize = (uint32_t)s->blocksize;
        h.nested_blocksize = (uint32_t)s->nested_blocksize;
        h.n_layers = (uint32_t)L;
        h.n_blocks = (uint32_t)(L + 1);
        h.config_bytes = (uint32_t)config_len;
        h.config_off = (int64_t)sizeof h;
        h.block_table_off = (int64_t)sizeof h + (int64_t)config_len;
        h.identity = identity;
        h.settings = ft_pack_settings_hash(s);
        h.file_bytes = (uint64_t)off;
        memcpy(hdr, &h, sizeof h);
        memcpy(hdr + h.config_off, config_json, config_len);
        memcpy(hdr + h.block_table_off, tab, (size_t)(L + 1) * sizeof *tab);
        h.header_sum = (uint32_t)ft_pack_xxh64(hdr, (size_t)hb, 0);
        memcpy(hdr, &h, sizeof h);
        rc = pwrite_all(b.fd, hdr, (size_t)hb, 0, tmp);
        if (!rc && fsync(b.fd) < 0) rc = ft_err(-errno, "%s: fsync: %s", tmp, strerror(errno));
        uint32_t done = FT_PACK_COMPLETE; /* the complete flag, last */
        if (!rc) rc = pwrite_all(b.fd, &done, 4, (int64_t)offsetof(ft_pack_hdr, complete), tmp);
        if (!rc && fsync(b.fd) < 0) rc = ft_err(-errno, "%s: fsync: %s", tmp, strerror(errno));
    }
    if (b.fd >= 0 && close(b.fd) < 0 && !rc) rc = ft_err(-errno, "%s: close: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) < 0)
        rc = ft_err(-errno, "%s: rename from %s: %s", path, tmp, strerror(errno));
    if (rc && b.fd >= 0) unlink(tmp);
    if (!rc) ft_fsync_parent(path);
    if (!rc && st) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        st->seconds = now_s() - t0;
        st->file_bytes = (uint64_t)off;
        st->peak_rss_bytes = (int64_t)ru.ru_maxrss * 1024;
        st->buffer_bytes = b.scratch_n * 8 + b.absmax_n * 4 + b.block_n;
        st->max_layer_bytes = max_layer;
        st->max_layer_src_bf16_bytes = max_src;
    }
    free(b.scratch);
    free(b.absmax);
    free(b.block);
    free(blk_bytes);
    free(tab);
    free(hdr);
    return rc;
}
