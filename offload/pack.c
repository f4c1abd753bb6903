/* pack.c - the pack file: XXH64, the block layout, the streaming builder and the reader
 * (see pack.h for the format). */
#include "offload/pack.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "offload/pack_internal.h"
#include "offload/uring.h"
#include "src/numeric/quant.h"

/* ---- settings ---------------------------------------------------------------------------- */

void ft_pack_settings_default(ft_pack_settings *s, int quant)
{
    s->quant = quant;
    s->blocksize = quant == FT_PACK_QUANT_NF4 ? FT_NF4_BLOCK : 0;
    s->nested_blocksize = quant == FT_PACK_QUANT_NF4 ? FT_NF4_NESTED_BLOCK : 0;
}

int ft_pack_quant_parse(const char *name, int *quant)
{
    if (name && !strcmp(name, "nf4")) *quant = FT_PACK_QUANT_NF4;
    else if (name && !strcmp(name, "bf16")) *quant = FT_PACK_QUANT_BF16;
    else return ft_err(FT_E_INVALID, "unknown quantization '%s' (nf4, bf16)", name ? name : "");
    return 0;
}

const char *ft_pack_quant_name(int quant)
{
    return quant == FT_PACK_QUANT_NF4 ? "nf4" : quant == FT_PACK_QUANT_BF16 ? "bf16" : "unknown";
}

int ft_pack_quant_of_path(const char *path)
{
    const char *nm = strrchr(path, '/');
    return strstr(nm ? nm + 1 : path, "bf16") ? FT_PACK_QUANT_BF16 : FT_PACK_QUANT_NF4;
}

uint64_t ft_pack_settings_hash(const ft_pack_settings *s)
{
    /* everything that changes the bytes: format version, quant type, block sizes, and the
     * dynamic map the nested absmax codes index */
    char buf[160];
    float map[256];
    ft_nf4_dynamic_map(map);
    int k = snprintf(buf, sizeof buf, "ftune-pack v%u quant=%s bs=%lld nbs=%lld map=%016llx",
                     FT_PACK_VERSION, ft_pack_quant_name(s->quant), (long long)s->blocksize,
                     (long long)s->nested_blocksize,
                     (unsigned long long)ft_xxh64(map, sizeof map, 0));
    return ft_xxh64(buf, (size_t)k, 0);
}


/* ---- layout ---------------------------------------------------------------------------- */


/* A pack's o_proj has a bias with attention_bias for llama-type models, never for qwen2
 * (the layout follows the config alone; pack_src.c). */
static int o_bias(const ft_model_config *c) { return strcmp(c->model_type, "qwen2") != 0; }

int ft_pack_has_bias(const ft_model_config *c, int p)
{
    return ft_proj_has_bias(c, p, o_bias(c));
}

/* The tensors of block l (l = -1: global) in directory order: role, rows, cols, and
 * whether it is a quantizable linear weight. Returns the count. */
int ft_pack_block_slots(const ft_model_config *c, int64_t l, ft_pack_slot *out)
{
    int n = 0;
    const int64_t C = c->hidden_size;
    if (l < 0) {
        out[n++] = (ft_pack_slot){FT_PACK_ROLE_EMBED, c->vocab_size, C, 0};
        out[n++] = (ft_pack_slot){FT_PACK_ROLE_FINAL_NORM, C, 1, 0};
        if (!c->tie_word_embeddings) out[n++] = (ft_pack_slot){FT_PACK_ROLE_LM_HEAD, c->vocab_size, C, 0};
        return n;
    }
    out[n++] = (ft_pack_slot){FT_PACK_ROLE_ATTN_NORM, C, 1, 0};
    out[n++] = (ft_pack_slot){FT_PACK_ROLE_FFN_NORM, C, 1, 0};
    if (c->qk_norm) {
        out[n++] = (ft_pack_slot){FT_PACK_ROLE_Q_NORM, c->head_dim, 1, 0};
        out[n++] = (ft_pack_slot){FT_PACK_ROLE_K_NORM, c->head_dim, 1, 0};
    }
    for (int p = 0; p < FT_N_PROJ; p++) {
        int64_t o, i;
        ft_proj_dims(c, p, &o, &i);
        out[n++] = (ft_pack_slot){FT_PACK_ROLE_W0 + p, o, i, 1};
        if (ft_pack_has_bias(c, p)) out[n++] = (ft_pack_slot){FT_PACK_ROLE_B0 + p, o, 1, 0};
    }
    return n;
}

/* Fills the record of one tensor (offsets from *pos, advanced) for its storage dtype. */
int ft_pack_place(ft_pack_tensor *r, const ft_pack_slot *sl, int dtype, int64_t bs, int64_t nbs,
                 int64_t *pos)
{
    memset(r, 0, sizeof *r);
    r->role = (uint32_t)sl->role;
    r->dtype = (uint32_t)dtype;
    r->rows = sl->rows;
    r->cols = sl->cols;
    int64_t n = sl->rows * sl->cols;
    r->data_off = *pos = align_up(*pos, 64);
    if (dtype != FT_PACK_DT_NF4) {
        r->data_bytes = n * (dtype == FT_PACK_DT_BF16 ? 2 : 4);
        *pos += r->data_bytes;
        return 0;
    }
    ft_nf4_layout lay;
    FT_TRY(ft_nf4_layout_init(&lay, n, bs, nbs));
    r->blocksize = (uint32_t)bs;
    r->nested_blocksize = (uint32_t)nbs;
    r->data_bytes = lay.code_bytes;
    *pos += lay.code_bytes;
    r->absmax_off = *pos = align_up(*pos, 64);
    *pos += nbs ? lay.n_blocks : 4 * lay.n_blocks;
    if (nbs) {
        r->nested_off = *pos = align_up(*pos, 64);
        *pos += 4 * lay.n_nested;
        r->map_off = *pos = align_up(*pos, 64);
        *pos += 4 * 256;
    }
    r->code_off = *pos = align_up(*pos, 64);
    *pos += 4 * 16;
    return 0;
}

/* Plans block l: records (with pre-quantized sources taking their own block sizes) and
 * the block's padded size. */
int ft_pack_plan_block(const ft_model_config *c, const ft_pack_settings *s, const ft_pack_src *src,
                      int64_t l, ft_pack_tensor *rec, int *n_rec, int64_t *bytes, int *pre)
{
    ft_pack_slot sl[FT_PACK_MAX_SLOTS];
    int n = ft_pack_block_slots(c, l, sl);
    int64_t pos = (int64_t)n * (int64_t)sizeof(ft_pack_tensor);
    for (int i = 0; i < n; i++) {
        int dt = sl[i].linear ? (s->quant == FT_PACK_QUANT_NF4 ? FT_PACK_DT_NF4 : FT_PACK_DT_BF16)
                              : sl[i].cols == 1 ? FT_PACK_DT_F32 : FT_PACK_DT_BF16;
        int64_t bs = s->blocksize, nbs = s->nested_blocksize;
        pre[i] = 0;
        if (sl[i].linear && src->read_nf4) {
            ft_nf4_view v;
            int k = src->read_nf4(src->user, l, sl[i].role, &v);
            if (k < 0) return k;
            if (k > 0) {
                if (v.lay.n != sl[i].rows * sl[i].cols)
                    return ft_err(FT_E_INVALID, "layer %lld %s: pre-quantized weight has %lld "
                                  "elements, expected %lld", (long long)l,
                                  ft_proj_name[sl[i].role - FT_PACK_ROLE_W0], (long long)v.lay.n,
                                  (long long)(sl[i].rows * sl[i].cols));
                pre[i] = 1;
                if (dt == FT_PACK_DT_NF4) {
                    bs = v.lay.blocksize;
                    nbs = v.lay.nested_blocksize;
                }
            }
        }
        FT_TRY(ft_pack_place(&rec[i], &sl[i], dt, bs, nbs, &pos));
    }
    *n_rec = n;
    *bytes = align_up(pos, FT_PACK_ALIGN);
    return 0;
}

/* ---- reading ---------------------------------------------------------------------------- */

struct ft_pack_file {
    char path[4200];
    int fd;
    ft_reader *rd;             /* layer blocks: io_uring + O_DIRECT where possible (uring.h) */
    ft_pack_hdr hdr;
    ft_pack_block *blocks;     /* n_blocks */
    ft_model_config cfg;
    ft_pack_tensor gdir[FT_PACK_MAX_SLOTS]; /* the global block's directory, read at open */
    int gdir_ok;               /* 1: gdir read and validated (else read_global reports why) */
    int partial;               /* 1: a partial pack (FT_PACK_PARTIAL): no global block */
    uint32_t n_lay;            /* layer blocks held: n_layers, or a partial pack's n_blocks */
    uint64_t bytes_before;     /* read by readers replaced with ft_pack_set_reader */
};

static int pread_all(int fd, void *buf, size_t n, int64_t off, const char *path)
{
    char *p = buf;
    while (n) {
        size_t k = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t r = pread(fd, p, k, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ft_err(-errno, "%s: read failed at offset %lld: %s", path, (long long)off,
                                 strerror(errno));
        if (r == 0) return ft_err(FT_E_CORRUPT, "%s: unexpected end of file at offset %lld "
                                  "(truncated pack)", path, (long long)off);
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

uint64_t ft_pack_min_block_bytes(const ft_model_config *c, int64_t l, uint32_t quant)
{
    ft_pack_slot sl[FT_PACK_MAX_SLOTS];
    int n = ft_pack_block_slots(c, l, sl);
    uint64_t sum = (uint64_t)n * sizeof(ft_pack_tensor);
    for (int i = 0; i < n; i++) {
        uint64_t e; /* heads * head_dim can reach 2^60 within config.c's bounds: check */
        if (__builtin_mul_overflow((uint64_t)sl[i].rows, (uint64_t)sl[i].cols, &e) ||
            e > UINT64_MAX / 4)
            return UINT64_MAX;
        uint64_t b = sl[i].linear ? (quant == FT_PACK_QUANT_NF4 ? (e + 1) / 2 : 2 * e)
                                  : sl[i].cols == 1 ? 4 * e : 2 * e;
        sum = sum > UINT64_MAX - b ? UINT64_MAX : sum + b;
    }
    return sum;
}

static int check_header(ft_pack_file *p, const uint8_t *raw, int64_t size, int partial)
{
    const ft_pack_hdr *h = &p->hdr;
    const char *path = p->path;
    ft_pack_hdr z = *h;
    z.complete = 0;
    z.header_sum = 0;
    uint8_t *tmp = malloc(h->header_bytes);
    if (!tmp) return ft_err(-ENOMEM, "%s: out of memory", path);
    memcpy(tmp, raw, h->header_bytes);
    memcpy(tmp, &z, sizeof z);
    uint32_t sum = (uint32_t)ft_xxh64(tmp, h->header_bytes, 0);
    free(tmp);
    if (sum != h->header_sum)
        return ft_err(FT_E_CORRUPT, "%s: offset 0: header checksum %08x, expected %08x (corrupt "
                      "header)", path, sum, h->header_sum);
    if (!partial && h->complete == FT_PACK_PARTIAL)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: a partial pack (the first %u of %u layer "
                      "blocks, no embeddings: `ftune plan`'s probe), not a whole pack", path,
                      offsetof(ft_pack_hdr, complete), h->n_blocks, h->n_layers);
    if (partial && h->complete == FT_PACK_COMPLETE)
        return ft_err(FT_E_INVALID, "%s: a whole pack, not a partial one", path);
    if (h->complete != (partial ? FT_PACK_PARTIAL : FT_PACK_COMPLETE))
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: complete flag is %08x, expected %08x (the "
                      "build did not finish)", path, offsetof(ft_pack_hdr, complete), h->complete,
                      partial ? FT_PACK_PARTIAL : FT_PACK_COMPLETE);
    if ((int64_t)h->file_bytes != size)
        return ft_err(FT_E_CORRUPT, "%s: file is %lld bytes, the header says %llu (truncated or "
                      "extended)", path, (long long)size, (unsigned long long)h->file_bytes);
    if (h->quant != FT_PACK_QUANT_NF4 && h->quant != FT_PACK_QUANT_BF16)
        return ft_err(FT_E_CORRUPT, "%s: offset %zu: quant %u unknown", path,
                      offsetof(ft_pack_hdr, quant), h->quant);
    int blocks_ok = partial ? h->n_blocks >= 1 && h->n_blocks <= h->n_layers
                            : (uint64_t)h->n_blocks == (uint64_t)h->n_layers + 1;
    if (h->n_layers < 1 || h->n_layers > 100000 || !blocks_ok ||
        h->block_table_off < (int64_t)sizeof *h || h->config_off < (int64_t)sizeof *h ||
        h->config_off > (int64_t)h->header_bytes ||
        (int64_t)h->config_bytes > (int64_t)h->header_bytes - h->config_off ||
        h->block_table_off > (int64_t)h->header_bytes ||
        (int64_t)h->n_blocks * 32 > (int64_t)h->header_bytes - h->block_table_off)
        return ft_err(FT_E_CORRUPT, "%s: header fields out of range (n_layers %u, n_blocks %u, "
                      "config at %lld+%u, block table at %lld, header %u bytes)", path, h->n_layers,
                      h->n_blocks, (long long)h->config_off, h->config_bytes,
                      (long long)h->block_table_off, h->header_bytes);
    FT_TRY(ft_config_parse(&p->cfg, (const char *)raw + h->config_off, h->config_bytes, path));
    if (p->cfg.num_hidden_layers != h->n_layers)
        return ft_err(FT_E_CORRUPT, "%s: %u layers in the header, %lld in the stored config", path,
                      h->n_layers, (long long)p->cfg.num_hidden_layers);
    p->blocks = malloc(sizeof *p->blocks * h->n_blocks);
    if (!p->blocks) return ft_err(-ENOMEM, "%s: out of memory", path);
    memcpy(p->blocks, raw + h->block_table_off, sizeof *p->blocks * h->n_blocks);
    uint64_t pos = h->header_bytes;
    for (uint32_t i = 0; i < h->n_blocks; i++) {
        const ft_pack_block *b = &p->blocks[i];
        uint32_t want = i < h->n_layers ? i : FT_PACK_GLOBAL;
        if (b->offset != pos || b->offset % FT_PACK_ALIGN || b->bytes % FT_PACK_ALIGN ||
            b->bytes < FT_PACK_ALIGN || b->bytes > h->file_bytes - b->offset || b->layer != want ||
            b->n_tensors < 1 || b->n_tensors > FT_PACK_MAX_SLOTS ||
            b->n_tensors * sizeof(ft_pack_tensor) > b->bytes)
            return ft_err(FT_E_CORRUPT, "%s: block table entry %u (offset %llu, %llu bytes, layer "
                          "%u, %u tensors): expected the block of layer %u at offset %llu", path, i,
                          (unsigned long long)b->offset, (unsigned long long)b->bytes, b->layer,
                          b->n_tensors, want, (unsigned long long)pos);
        uint64_t need = ft_pack_min_block_bytes(&p->cfg, i < h->n_layers ? (int64_t)i : -1, h->quant);
        if (b->bytes < need)
            return ft_err(FT_E_CORRUPT, "%s: block table entry %u (%s %d): %llu bytes, but the "
                          "stored config's tensors need at least %llu", path, i,
                          i < h->n_layers ? "layer" : "embeddings/head",
                          i < h->n_layers ? (int)i : -1, (unsigned long long)b->bytes,
                          (unsigned long long)need);
        pos += b->bytes;
    }
    if (pos != h->file_bytes)
        return ft_err(FT_E_CORRUPT, "%s: blocks end at %llu, the file at %llu", path,
                      (unsigned long long)pos, (unsigned long long)h->file_bytes);
    return 0;
}

/* ft_pack_open, and with partial != 0 ft_pack_open_partial. */
static int open_pack(ft_pack_file **out, const char *path, int verify, int partial)
{
    *out = NULL;
    ft_pack_file *p = calloc(1, sizeof *p);
    if (!p) return ft_err(-ENOMEM, "%s: out of memory", path);
    snprintf(p->path, sizeof p->path, "%s", path);
    p->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (p->fd < 0) {
        int e = errno;
        free(p);
        return ft_err(-e, "%s: cannot open pack: %s", path, strerror(e));
    }
    struct stat sb;
    int rc = fstat(p->fd, &sb) < 0 ? ft_err(-errno, "%s: stat: %s", path, strerror(errno)) : 0;
    if (!rc && (int64_t)sb.st_size < (int64_t)sizeof p->hdr)
        rc = ft_err(FT_E_CORRUPT, "%s: %lld bytes, too short for a pack header (%zu)", path,
                    (long long)sb.st_size, sizeof p->hdr);
    if (!rc) rc = pread_all(p->fd, &p->hdr, sizeof p->hdr, 0, path);
    if (!rc && memcmp(p->hdr.magic, FT_PACK_MAGIC, 8))
        rc = ft_err(FT_E_CORRUPT, "%s: offset 0: not an ftune pack (bad magic)", path);
    if (!rc && p->hdr.version != FT_PACK_VERSION)
        rc = ft_err(FT_E_UNSUPPORTED, "%s: offset 8: pack version %u, this ftune reads %u", path,
                    p->hdr.version, FT_PACK_VERSION);
    if (!rc && (p->hdr.header_bytes % FT_PACK_ALIGN || p->hdr.header_bytes == 0 ||
                p->hdr.header_bytes > (64u << 20) || (int64_t)p->hdr.header_bytes > sb.st_size))
        rc = ft_err(FT_E_CORRUPT, "%s: offset 12: header size %u (expected a multiple of %d within "
                    "the file)", path, p->hdr.header_bytes, FT_PACK_ALIGN);
    uint8_t *raw = NULL;
    if (!rc && !(raw = malloc(p->hdr.header_bytes))) rc = ft_err(-ENOMEM, "%s: out of memory", path);
    if (!rc) rc = pread_all(p->fd, raw, p->hdr.header_bytes, 0, path);
    if (!rc) rc = check_header(p, raw, (int64_t)sb.st_size, partial);
    free(raw);
    p->partial = partial;
    p->n_lay = partial ? p->hdr.n_blocks : p->hdr.n_layers;
    if (!rc && verify) rc = ft_pack_verify(p);
    if (!rc) rc = ft_reader_open(&p->rd, path, 8, (size_t)1 << 20, 1);
    if (rc < 0) {
        ft_pack_close(p);
        return rc;
    }
    /* the global directory, for ft_pack_read_global (a bad one is reported there, not here) */
    const ft_pack_tensor *d;
    int64_t nd;
    const ft_pack_block *g = partial ? NULL : &p->blocks[p->hdr.n_layers];
    if (g && pread_all(p->fd, p->gdir, sizeof(ft_pack_tensor) * g->n_tensors, (int64_t)g->offset, path) == 0 &&
        ft_pack_block_dir(p, -1, p->gdir, &d, &nd) == 0)
        p->gdir_ok = 1;
    ft_err_clear();
    *out = p;
    return 0;
}

int ft_pack_open(ft_pack_file **out, const char *path, int verify)
{
    return open_pack(out, path, verify, 0);
}

int ft_pack_open_partial(ft_pack_file **out, const char *path)
{
    return open_pack(out, path, 1, 1);
}

const char *ft_pack_read_mode(const ft_pack_file *p) { return ft_reader_mode(p->rd); }
uint64_t ft_pack_bytes_read(const ft_pack_file *p) { return p->bytes_before + ft_reader_bytes(p->rd); }

int ft_pack_set_reader(ft_pack_file *p, int queue_depth, size_t chunk_bytes)
{
    ft_reader *r;
    FT_TRY(ft_reader_open(&r, p->path, queue_depth, chunk_bytes, 1));
    p->bytes_before += ft_reader_bytes(p->rd);
    ft_reader_close(p->rd);
    p->rd = r;
    return 0;
}

void ft_pack_reader_params(const ft_pack_file *p, int *queue_depth, size_t *chunk_bytes)
{
    *queue_depth = ft_reader_depth(p->rd);
    *chunk_bytes = ft_reader_chunk(p->rd);
}

void ft_pack_close(ft_pack_file *p)
{
    if (!p) return;
    ft_reader_close(p->rd);
    if (p->fd >= 0) close(p->fd);
    free(p->blocks);
    free(p);
}

const ft_pack_hdr *ft_pack_header(const ft_pack_file *p) { return &p->hdr; }
const ft_model_config *ft_pack_config(const ft_pack_file *p) { return &p->cfg; }
const char *ft_pack_path(const ft_pack_file *p) { return p->path; }

static const ft_pack_block *block_of(const ft_pack_file *p, int64_t l)
{
    if (l < -1 || l >= (int64_t)p->n_lay || (l < 0 && p->partial)) return NULL;
    return &p->blocks[l < 0 ? p->hdr.n_layers : (uint32_t)l];
}

size_t ft_pack_block_bytes(const ft_pack_file *p, int64_t l)
{
    const ft_pack_block *b = block_of(p, l);
    return b ? (size_t)b->bytes : 0;
}

int ft_pack_block_extent(const ft_pack_file *p, int64_t l, uint64_t *off, uint64_t *bytes)
{
    const ft_pack_block *b = block_of(p, l);
    if (!b) return ft_err(FT_E_RANGE, "%s: no layer %lld", p->path, (long long)l);
    *off = b->offset;
    *bytes = b->bytes;
    return 0;
}

size_t ft_pack_max_layer_bytes(const ft_pack_file *p)
{
    size_t m = 0;
    for (uint32_t i = 0; i < p->n_lay; i++)
        if (p->blocks[i].bytes > m) m = (size_t)p->blocks[i].bytes;
    return m;
}

int ft_pack_read_block(ft_pack_file *p, int64_t l, void *buf, size_t buf_bytes, int verify)
{
    const ft_pack_block *b = block_of(p, l);
    if (!b) return ft_err(FT_E_RANGE, "%s: no layer %lld", p->path, (long long)l);
    if (buf_bytes < b->bytes)
        return ft_err(FT_E_RANGE, "%s: layer %lld block is %llu bytes, buffer %zu", p->path,
                      (long long)l, (unsigned long long)b->bytes, buf_bytes);
    FT_TRY(ft_reader_read(p->rd, buf, (size_t)b->bytes, b->offset));
    if (verify) {
        uint64_t h = ft_xxh64(buf, (size_t)b->bytes, 0);
        if (h != b->checksum)
            return ft_err(FT_E_CORRUPT, "%s: block of layer %lld (offset %llu, %llu bytes): checksum "
                          "%016llx, expected %016llx (corrupt pack)", p->path, (long long)l,
                          (unsigned long long)b->offset, (unsigned long long)b->bytes,
                          (unsigned long long)h, (unsigned long long)b->checksum);
    }
    return 0;
}

int ft_pack_verify(ft_pack_file *p)
{
    const size_t chunk = (size_t)8 << 20;
    uint8_t *buf = malloc(chunk);
    if (!buf) return ft_err(-ENOMEM, "%s: out of memory", p->path);
    int rc = 0;
    for (uint32_t i = 0; i < p->hdr.n_blocks && !rc; i++) {
        const ft_pack_block *b = &p->blocks[i];
        ft_xxh64_state h;
        ft_xxh64_init(&h, 0);
        for (uint64_t o = 0; o < b->bytes && !rc; o += chunk) {
            size_t k = b->bytes - o < chunk ? (size_t)(b->bytes - o) : chunk;
            rc = pread_all(p->fd, buf, k, (int64_t)(b->offset + o), p->path);
            if (!rc) ft_xxh64_update(&h, buf, k);
        }
        uint64_t d = ft_xxh64_digest(&h);
        char what[40];
        if (b->layer == FT_PACK_GLOBAL) snprintf(what, sizeof what, "embeddings and LM head");
        else snprintf(what, sizeof what, "layer %u", b->layer);
        if (!rc && d != b->checksum)
            rc = ft_err(FT_E_CORRUPT, "%s: block %u (%s, offset %llu, %llu bytes): checksum "
                        "%016llx, expected %016llx (corrupt pack)", p->path, i, what,
                        (unsigned long long)b->offset, (unsigned long long)b->bytes,
                        (unsigned long long)d, (unsigned long long)b->checksum);
    }
    free(buf);
    return rc;
}

int64_t ft_pack_layer_floats(const ft_model_config *cfg)
{
    return ft_layer_floats(cfg, o_bias(cfg));
}

/* 1 if [start, start + len) lies inside a block of blk bytes and start is 4-aligned
 * (written without an addition that could overflow: the offsets come from the file). */
static int in_block(int64_t start, int64_t len, uint64_t blk)
{
    return start >= 0 && start % 4 == 0 && len >= 0 && (uint64_t)start <= blk &&
           (uint64_t)len <= blk - (uint64_t)start;
}

/* Checks one record against its expected slot and the block bounds. */
static int check_record(const ft_pack_file *p, int64_t l, const ft_pack_tensor *r, const ft_pack_slot *sl,
                        uint64_t blk_bytes)
{
    const char *path = p->path;
    int ok = r->role == (uint32_t)sl->role && r->rows == sl->rows && r->cols == sl->cols;
    int64_t n = sl->rows * sl->cols; /* bounded by the block size (check_header) */
    /* the dtype the format gives the slot (ft_pack_plan_block): vectors (norms, biases) F32,
     * projections BF16 or NF4, the embeddings and LM head BF16; the readers rely on it (the
     * bf16 tables of a pack-only model, tiers.c, keep the stored bits) */
    const uint32_t dt = r->dtype;
    if (ok) ok = sl->linear ? dt == FT_PACK_DT_BF16 || dt == FT_PACK_DT_NF4
                 : sl->cols == 1 ? dt == FT_PACK_DT_F32 : dt == FT_PACK_DT_BF16;
    if (!ok && r->role == (uint32_t)sl->role && r->rows == sl->rows && r->cols == sl->cols)
        return ft_err(FT_E_CORRUPT, "%s: layer %lld: tensor record (role %d, %lld x %lld) has dtype "
                      "%u, where the format stores %s", path, (long long)l, sl->role,
                      (long long)sl->rows, (long long)sl->cols, dt,
                      sl->linear ? "BF16 (1) or NF4 (3)" : sl->cols == 1 ? "F32 (2)" : "BF16 (1)");
    if (ok && r->dtype == FT_PACK_DT_BF16) ok = r->data_bytes == 2 * n;
    else if (ok && r->dtype == FT_PACK_DT_F32) ok = r->data_bytes == 4 * n;
    else if (ok && r->dtype == FT_PACK_DT_NF4 && sl->linear) {
        ft_nf4_layout lay;
        ok = ft_nf4_layout_init(&lay, n, r->blocksize, r->nested_blocksize) == 0 &&
             r->data_bytes == lay.code_bytes;
        if (ok) {
            int nested = lay.nested_blocksize != 0;
            ok = in_block(r->absmax_off, nested ? lay.n_blocks : 4 * lay.n_blocks, blk_bytes) &&
                 in_block(r->code_off, 4 * 16, blk_bytes) &&
                 (!nested || (in_block(r->nested_off, 4 * lay.n_nested, blk_bytes) &&
                              in_block(r->map_off, 4 * 256, blk_bytes)));
        }
    } else {
        ok = 0;
    }
    if (ok) ok = in_block(r->data_off, r->data_bytes, blk_bytes);
    if (!ok)
        return ft_err(FT_E_CORRUPT, "%s: layer %lld: tensor record (role %u, dtype %u, %lld x %lld, "
                      "data %lld+%lld) does not match the expected role %d of shape %lld x %lld "
                      "within a %llu-byte block", path, (long long)l, r->role, r->dtype,
                      (long long)r->rows, (long long)r->cols, (long long)r->data_off,
                      (long long)r->data_bytes, sl->role, (long long)sl->rows, (long long)sl->cols,
                      (unsigned long long)blk_bytes);
    return 0;
}

int ft_pack_block_dir(const ft_pack_file *p, int64_t l, const void *buf, const ft_pack_tensor **dir,
                      int64_t *n)
{
    const ft_pack_block *b = block_of(p, l);
    if (!b) return ft_err(FT_E_RANGE, "%s: no layer %lld", p->path, (long long)l);
    ft_pack_slot sl[FT_PACK_MAX_SLOTS];
    int ns = ft_pack_block_slots(&p->cfg, l, sl);
    if ((int)b->n_tensors != ns)
        return ft_err(FT_E_CORRUPT, "%s: layer %lld block has %u tensors, expected %d", p->path,
                      (long long)l, b->n_tensors, ns);
    const ft_pack_tensor *d = buf;
    for (int i = 0; i < ns; i++) FT_TRY(check_record(p, l, &d[i], &sl[i], b->bytes));
    *dir = d;
    *n = ns;
    return 0;
}

/* fp32 values of one record into dst. */
static int record_f32(const ft_pack_tensor *r, const uint8_t *blk, float *dst)
{
    int64_t n = r->rows * r->cols;
    if (r->dtype == FT_PACK_DT_F32) {
        memcpy(dst, blk + r->data_off, (size_t)n * 4);
        return 0;
    }
    if (r->dtype == FT_PACK_DT_BF16) {
        ft_quant_bf16_to_f32_n(dst, (const uint16_t *)(blk + r->data_off), n); /* 4-aligned */
        return 0;
    }
    ft_nf4_view v;
    FT_TRY(ft_nf4_layout_init(&v.lay, n, r->blocksize, r->nested_blocksize));
    v.codes = blk + r->data_off;
    v.qabsmax = r->nested_blocksize ? blk + r->absmax_off : NULL;
    v.absmax = r->nested_blocksize ? NULL : (const float *)(blk + r->absmax_off);
    v.nested_absmax = r->nested_blocksize ? (const float *)(blk + r->nested_off) : NULL;
    v.nested_map = r->nested_blocksize ? (const float *)(blk + r->map_off) : NULL;
    v.code = (const float *)(blk + r->code_off);
    v.offset = r->offset;
    return ft_nf4_dequant(&v, dst);
}

void ft_pack_record_nf4(const ft_pack_tensor *r, const void *blk, struct ft_nf4_tensor *t)
{
    const uint8_t *b = blk;
    const int nested = r->nested_blocksize != 0;
    *t = (ft_nf4_tensor){r->rows * r->cols, r->blocksize, r->nested_blocksize, b + r->data_off,
                         nested ? b + r->absmax_off : NULL,
                         nested ? NULL : (const float *)(b + r->absmax_off),
                         nested ? (const float *)(b + r->nested_off) : NULL,
                         nested ? (const float *)(b + r->map_off) : NULL,
                         (const float *)(b + r->code_off), r->offset};
}

/* ft_pack_layer_weights, and with nf4 != NULL ft_pack_layer_weights_nf4. */
static int layer_weights(const ft_pack_file *p, int64_t l, const void *buf, float *dst,
                         ft_layer_weights *w, struct ft_nf4_tensor *nf4)
{
    if (l < 0 || l >= (int64_t)p->hdr.n_layers)
        return ft_err(FT_E_RANGE, "%s: no layer %lld", p->path, (long long)l);
    const ft_pack_tensor *d;
    int64_t n;
    FT_TRY(ft_pack_block_dir(p, l, buf, &d, &n));
    const ft_model_config *c = &p->cfg;
    ft_layer_carve(c, o_bias(c), dst, w);
    for (int64_t i = 0; i < n; i++) {
        const ft_pack_tensor *r = &d[i];
        if (nf4 && r->dtype == FT_PACK_DT_NF4 && r->role >= FT_PACK_ROLE_W0 &&
            r->role < FT_PACK_ROLE_B0 &&
            ft_nf4_fusable(r->rows, r->cols, r->blocksize, r->nested_blocksize)) {
            int k = (int)(r->role - FT_PACK_ROLE_W0);
            ft_pack_record_nf4(r, buf, &nf4[k]);
            w->proj[k].wtype = FT_WTYPE_NF4;
            w->proj[k].nf4 = &nf4[k];
            w->proj[k].w = NULL;
            continue;
        }
        float *to = r->role == FT_PACK_ROLE_ATTN_NORM ? w->attn_norm
                  : r->role == FT_PACK_ROLE_FFN_NORM  ? w->ffn_norm
                  : r->role == FT_PACK_ROLE_Q_NORM    ? w->q_norm
                  : r->role == FT_PACK_ROLE_K_NORM    ? w->k_norm
                  : r->role < FT_PACK_ROLE_B0         ? w->proj[r->role - FT_PACK_ROLE_W0].w
                                                      : w->proj[r->role - FT_PACK_ROLE_B0].b;
        FT_TRY(record_f32(r, buf, to));
    }
    return 0;
}

int ft_pack_layer_weights(const ft_pack_file *p, int64_t l, const void *buf, float *dst,
                          ft_layer_weights *w)
{
    return layer_weights(p, l, buf, dst, w, NULL);
}

int ft_pack_layer_weights_nf4(const ft_pack_file *p, int64_t l, const void *buf, float *dst,
                              ft_layer_weights *w, struct ft_nf4_tensor *nf4)
{
    return layer_weights(p, l, buf, dst, w, nf4);
}

/* ---- the global block, row ranges ------------------------------------------------------- */

static const char *global_role_name(int role)
{
    return role == FT_PACK_ROLE_EMBED ? "embed_tokens" : role == FT_PACK_ROLE_FINAL_NORM ? "norm"
         : role == FT_PACK_ROLE_LM_HEAD ? "lm_head" : NULL;
}

/* Reads and checks the global block's directory; *rec = the record of `role` or NULL when
 * the block has none (a tied LM head). */
static int global_record(ft_pack_file *p, int role, ft_pack_tensor *out, int *found)
{
    if (!global_role_name(role))
        return ft_err(FT_E_INVALID, "%s: role %d is not a global tensor (embed_tokens %d, norm %d, "
                      "lm_head %d)", p->path, role, FT_PACK_ROLE_EMBED, FT_PACK_ROLE_FINAL_NORM,
                      FT_PACK_ROLE_LM_HEAD);
    const ft_pack_block *b = block_of(p, -1);
    if (!b)
        return ft_err(FT_E_UNSUPPORTED, "%s: a partial pack (`ftune plan`'s probe) has no "
                      "embeddings, final norm or LM head", p->path);
    ft_pack_tensor dir[FT_PACK_MAX_SLOTS];
    const ft_pack_tensor *d = p->gdir;
    int64_t n = b->n_tensors;
    if (!p->gdir_ok) { /* read again, to say what is wrong */
        FT_TRY(pread_all(p->fd, dir, sizeof(ft_pack_tensor) * b->n_tensors, (int64_t)b->offset,
                         p->path));
        int rc = ft_pack_block_dir(p, -1, dir, &d, &n);
        if (rc < 0)
            return ft_err_prefix(rc, "global block at offset %llu", (unsigned long long)b->offset);
    }
    *found = 0;
    for (int64_t i = 0; i < n; i++)
        if ((int)d[i].role == role) {
            *out = d[i];
            *found = 1;
        }
    return 0;
}

int ft_pack_global_info(ft_pack_file *p, int role, int64_t *rows, int64_t *cols, int *present)
{
    ft_pack_tensor r;
    int found;
    FT_TRY(global_record(p, role, &r, &found));
    *present = found;
    if (found) {
        *rows = r.rows;
        *cols = r.cols;
    } else { /* the tied head has the embedding's shape */
        *rows = p->cfg.vocab_size;
        *cols = p->cfg.hidden_size;
    }
    return 0;
}

int ft_pack_read_global(ft_pack_file *p, int role, int64_t row0, int64_t n_rows, float *dst)
{
    ft_pack_tensor r;
    int found;
    FT_TRY(global_record(p, role, &r, &found));
    if (!found)
        return ft_err(FT_E_INVALID, "%s: no lm_head in the pack: tied: use EMBED "
                      "(tie_word_embeddings; the LM head is the embedding matrix)", p->path);
    if (row0 < 0 || n_rows < 0 || row0 > r.rows || n_rows > r.rows - row0)
        return ft_err(FT_E_RANGE, "%s: %s rows [%lld, %lld) outside its %lld rows", p->path,
                      global_role_name(role), (long long)row0, (long long)(row0 + n_rows),
                      (long long)r.rows);
    const ft_pack_block *b = block_of(p, -1);
    int64_t esz = r.dtype == FT_PACK_DT_BF16 ? 2 : 4;
    int64_t pos = (int64_t)b->offset + r.data_off + row0 * r.cols * esz, n = n_rows * r.cols;
    if (r.dtype == FT_PACK_DT_F32) return n ? pread_all(p->fd, dst, (size_t)n * 4, pos, p->path) : 0;
    if (r.dtype != FT_PACK_DT_BF16)
        return ft_err(FT_E_CORRUPT, "%s: %s has dtype %u (expected BF16)", p->path,
                      global_role_name(role), r.dtype);
    const int64_t chunk = (int64_t)4 << 20; /* values per read: 8 MiB of bf16 */
    uint16_t small[8192];                   /* a row or a few: no allocation */
    uint16_t *tmp = n <= 8192 ? small : malloc((size_t)(n < chunk ? n : chunk) * 2);
    if (!tmp) return ft_err(-ENOMEM, "%s: out of memory", p->path);
    int rc = 0;
    for (int64_t e = 0; e < n && !rc; e += chunk) {
        int64_t k = n - e < chunk ? n - e : chunk;
        rc = pread_all(p->fd, tmp, (size_t)k * 2, pos + e * 2, p->path);
        if (rc) break;
        ft_quant_bf16_to_f32_n(dst + e, tmp, k);
    }
    if (tmp != small) free(tmp);
    return rc;
}

int ft_pack_gather_global(ft_pack_file *p, int role, const int32_t *rows, int64_t n, float *dst)
{
    int64_t R, C;
    int present;
    FT_TRY(ft_pack_global_info(p, role, &R, &C, &present));
    if (!present) return ft_pack_read_global(p, role, 0, 1, dst); /* the tied-head error */
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= R)
            return ft_err(FT_E_RANGE, "%s: row %d (index %lld) outside the %lld rows of %s", p->path,
                          rows[i], (long long)i, (long long)R, global_role_name(role));
    int rc = 0;
    int64_t bad = n;
    char msg[600] = "";
#pragma omp parallel for schedule(dynamic, 16) if (n > 64)
    for (int64_t i = 0; i < n; i++) {
        int k = ft_pack_read_global(p, role, rows[i], 1, dst + i * C);
        if (k < 0) {
#pragma omp critical(ft_pack_gather_err)
            if (i < bad) {
                bad = i;
                rc = k;
                snprintf(msg, sizeof msg, "%s", ft_errmsg());
            }
        }
    }
    return rc ? ft_err(rc, "%s", msg) : 0;
}
