/* pack.h - the packed base-weight file: one contiguous 4 KiB-aligned block per layer.
 *
 * File layout (all little-endian; DESIGN.md "Memory and I/O", STYLE C15):
 *   [0, header_bytes)   ft_pack_hdr, then the config.json text (config_off, config_bytes),
 *                       then n_blocks ft_pack_block entries (block_table_off); zero padding
 *                       to a multiple of 4096.
 *   block i < n_layers  layer i: the tensor directory (n_tensors ft_pack_tensor records),
 *                       then each tensor's data at 64-byte aligned block-relative offsets:
 *                       input/post-attention RMSNorm weights (F32), the seven projection
 *                       weights (NF4 with its quant state, or BF16), biases if any (F32).
 *   block n_layers      embed_tokens (BF16), the final norm (F32), lm_head (BF16, untied only).
 *   Each block starts at a multiple of 4096 and is zero-padded to one (O_DIRECT reads).
 * NF4 tensors are bnb's layout (src/numeric/nf4.h): codes (rows*cols+1)/2 bytes, high nibble
 * first; nested: qabsmax U8 [n_blocks], nested_absmax F32, the 256-entry dynamic map, the
 * fp32 offset (in the record); not nested: absmax F32 [n_blocks]; plus the 16-entry code.
 * Integrity: each block's xxh64 (seed 0) is in the table; the header carries the model
 * identity (hash of config.json and every tensor header of the source), a hash of the
 * quantization settings, the file size, a header checksum, and the complete flag, which is
 * written last (after the blocks are fsynced); files are written under a temporary name
 * and renamed. Readers reject anything that does not check out (FT_E_CORRUPT with the
 * offset and what was expected).
 */
#ifndef FT_PACK_H
#define FT_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/hash.h"
#include "src/formats/config.h"
#include "src/model/model.h"
#include "src/numeric/nf4.h"

#define FT_PACK_MAGIC "FTPACK\0\1"
#define FT_PACK_VERSION 1u
#define FT_PACK_ALIGN 4096
#define FT_PACK_COMPLETE 0x454c504du /* "MPLE" */
/* The complete flag of a partial pack (ft_pack_build_opts.layer_limit): only the first
 * n_blocks layer blocks, no global block; ft_pack_open refuses it, ft_pack_open_partial
 * reads it. `ftune plan` times layer 0 from one before the real pack is built. */
#define FT_PACK_PARTIAL 0x54524150u  /* "PART" */
#define FT_PACK_GLOBAL 0xFFFFFFFFu   /* ft_pack_block.layer of the embeddings/head block */

enum ft_pack_quant { FT_PACK_QUANT_BF16 = 1, FT_PACK_QUANT_NF4 = 2 };
/* Each slot's dtype is fixed by the format (and checked at open): vectors (norms, biases) F32,
 * projections BF16 (bf16 packs) or NF4, the embeddings and LM head BF16. */
enum ft_pack_dtype { FT_PACK_DT_BF16 = 1, FT_PACK_DT_F32 = 2, FT_PACK_DT_NF4 = 3 };
/* Tensor roles: per layer ATTN_NORM, FFN_NORM, Q_NORM and K_NORM (qk_norm models), W0 + p
 * and B0 + p (p = enum ft_proj);
 * global block EMBED, FINAL_NORM, LM_HEAD. */
enum ft_pack_role {
    FT_PACK_ROLE_ATTN_NORM = 1, FT_PACK_ROLE_FFN_NORM = 2, FT_PACK_ROLE_Q_NORM = 3,
    FT_PACK_ROLE_K_NORM = 4,
    FT_PACK_ROLE_W0 = 16, FT_PACK_ROLE_B0 = 32,
    FT_PACK_ROLE_EMBED = 48, FT_PACK_ROLE_FINAL_NORM = 49, FT_PACK_ROLE_LM_HEAD = 50,
};

typedef struct ft_pack_hdr {
    char magic[8];             /* FT_PACK_MAGIC */
    uint32_t version;          /* FT_PACK_VERSION */
    uint32_t header_bytes;     /* bytes before block 0, a multiple of FT_PACK_ALIGN */
    uint32_t quant;            /* enum ft_pack_quant */
    uint32_t blocksize;        /* NF4 elements per absmax (64); 0 for BF16 packs */
    uint32_t nested_blocksize; /* 256; 0 = no double quantization */
    uint32_t n_layers;
    uint32_t n_blocks;         /* n_layers + 1 */
    uint32_t config_bytes;     /* config.json text length */
    int64_t config_off;
    int64_t block_table_off;
    uint64_t identity;         /* model identity (ft_pack_model_identity) */
    uint64_t settings;         /* hash of the quantization settings (ft_pack_settings_hash) */
    uint64_t file_bytes;       /* total file size */
    int64_t reserved0, reserved1;
    uint32_t complete;         /* FT_PACK_COMPLETE, written last */
    uint32_t header_sum;       /* low 32 bits of xxh64([0, header_bytes) with complete and
                                * header_sum read as 0) */
} ft_pack_hdr;
_Static_assert(sizeof(ft_pack_hdr) == 104, "ft_pack_hdr must have no padding");

typedef struct ft_pack_block {
    uint64_t offset;           /* file offset, a multiple of FT_PACK_ALIGN */
    uint64_t bytes;            /* a multiple of FT_PACK_ALIGN (zero padding included) */
    uint64_t checksum;         /* xxh64 of the block's bytes, seed 0 */
    uint32_t layer;            /* 0..n_layers-1, or FT_PACK_GLOBAL */
    uint32_t n_tensors;
} ft_pack_block;
_Static_assert(sizeof(ft_pack_block) == 32, "ft_pack_block must have no padding");

typedef struct ft_pack_tensor {
    uint32_t role;             /* enum ft_pack_role */
    uint32_t dtype;            /* enum ft_pack_dtype */
    int64_t rows, cols;        /* (out, in) for linears and embeddings; (n, 1) for vectors */
    int64_t data_off;          /* block-relative: the values (BF16/F32) or NF4 codes */
    int64_t data_bytes;
    int64_t absmax_off;        /* NF4: qabsmax U8 (nested) or absmax F32 */
    int64_t nested_off;        /* NF4 nested: nested_absmax F32 */
    int64_t map_off;           /* NF4 nested: the 256-entry dynamic map F32 */
    int64_t code_off;          /* NF4: the 16-entry code F32 */
    uint32_t blocksize, nested_blocksize;
    float offset;              /* NF4 nested: mean of the absmax values */
    uint32_t pad;
} ft_pack_tensor;
_Static_assert(sizeof(ft_pack_tensor) == 88, "ft_pack_tensor must have no padding");

/* ---- settings ------------------------------------------------------------------------ */

typedef struct ft_pack_settings {
    int quant;                 /* enum ft_pack_quant */
    int64_t blocksize;         /* NF4: 64 */
    int64_t nested_blocksize;  /* NF4: 256 (0 = absmax kept as fp32) */
} ft_pack_settings;

/* Defaults for a quant type: NF4 blocksize 64 with double quantization in blocks of 256. */
void ft_pack_settings_default(ft_pack_settings *s, int quant);
/* Parses "nf4" / "bf16" into *quant; FT_E_INVALID (message lists the choices) otherwise. */
int ft_pack_quant_parse(const char *name, int *quant);
const char *ft_pack_quant_name(int quant);
/* The quantization a pack file's name says: FT_PACK_QUANT_BF16 when its base name has "bf16"
 * (FT_PACK_LOCAL_BF16 from init-model, <identity>-bf16.ftpack in the cache), else
 * FT_PACK_QUANT_NF4. */
int ft_pack_quant_of_path(const char *path);
/* Hash of everything that changes the bytes of a pack besides the model. */
uint64_t ft_pack_settings_hash(const ft_pack_settings *s);

/* ---- building -------------------------------------------------------------------------- */

/* Where the builder gets tensors from. Rows are the outer dimension (out for linears, V for
 * embeddings, n for vectors with cols = 1). */
typedef struct ft_pack_src {
    void *user;
    /* Writes rows [row0, row0 + n_rows) of tensor `role` of `layer` (-1 for the global
     * block) as fp32 into dst (n_rows * cols floats). Returns 0 or an error. */
    int (*read_f32)(void *user, int64_t layer, int role, int64_t row0, int64_t n_rows,
                    int64_t cols, float *dst);
    /* Optional (may be NULL): when the source holds this tensor already in NF4 (a
     * bitsandbytes checkpoint), fills *v and returns 1; returns 0 if it does not. */
    int (*read_nf4)(void *user, int64_t layer, int role, ft_nf4_view *v);
    /* Optional: the builder is done with the source bytes of (layer, role). */
    void (*release)(void *user, int64_t layer, int role);
} ft_pack_src;

typedef struct ft_pack_stats {
    double seconds;
    uint64_t file_bytes;
    int64_t peak_rss_bytes;    /* getrusage ru_maxrss after the build (whole process) */
    int64_t buffer_bytes;      /* the builder's own largest allocation set */
    int64_t max_layer_bytes;   /* largest layer block in the pack */
    int64_t max_layer_src_bf16_bytes; /* largest layer as bf16 in the source */
    double layer_seconds;      /* from the first layer block's start until the last one is
                                * handed to the writer (a partial pack: until it is written;
                                * before the global block and the fsyncs either way) */
} ft_pack_stats;

/* Builds a pack at `path` from src, tensor by tensor: layer blocks are assembled in one
 * buffer of the largest layer block (sources converted in row chunks of at most 16 Mi
 * floats), the global block is streamed in chunks. Written to "<path>.tmp.<pid>", fsynced,
 * the complete flag written last, fsynced, renamed. cfg: the model (layer count and
 * shapes); config_json: its text (stored in the pack); identity: the model identity.
 * Returns 0 or an error (-errno, FT_E_NUMERIC for a non-finite weight, source errors);
 * on error nothing is left under path. */
int ft_pack_build(const char *path, const ft_model_config *cfg, const char *config_json,
                  size_t config_len, uint64_t identity, const ft_pack_settings *s,
                  const ft_pack_src *src, ft_pack_stats *st);

/* Options of ft_pack_build_ex. */
typedef struct ft_pack_build_opts {
    /* 1: src->read_f32 may be called from several threads at once for disjoint row ranges
     * (a pure or internally locked source, e.g. init-model's generator): every OpenMP
     * thread then reads and converts/quantizes its own small row chunk (chunk_floats
     * values, cache-resident). 0: one caller at a time, large chunks, the conversion
     * parallel inside (ft_pack_build). */
    int concurrent_src;
    /* Values per thread chunk with concurrent_src (0: 65536). The bytes written do not
     * depend on it, nor on the thread count (tests check both). */
    int64_t chunk_floats;
    /* Bytes per write of the global block (0: 32 MiB; rounded up to a multiple of 4096).
     * Does not change the bytes written either. */
    int64_t stream_bytes;
    /* 1: write the blocks with O_DIRECT where the file system allows (no copy into the page
     * cache, no dirty pages; falls back to buffered writes by itself). 0 (default): buffered
     * writes with writeback started after each block (sync_file_range), which leaves the
     * pack in the page cache for the checksum pass of its first use. */
    int direct_io;
    /* 1..n_layers: a partial pack of layers [0, layer_limit) only, without the global block
     * (the header's n_blocks = layer_limit, complete flag FT_PACK_PARTIAL; those blocks are
     * byte-identical to the whole pack's, checksums included). 0 (default): the whole pack. */
    int64_t layer_limit;
} ft_pack_build_opts;

/* ft_pack_build with options (o may be NULL: the defaults, as ft_pack_build). In both modes
 * a writer thread hashes and writes block l (one pwrite of the whole block) while block
 * l + 1 is being made in a second buffer, and the global block is streamed through two
 * chunk buffers the same way (32 MiB writes at aligned offsets); the NF4 offset (the mean
 * of the absmax values) is an exact parallel sum (ft_pack_sum_nonneg). The file is
 * byte-identical to ft_pack_build's whatever the options and thread count. Errors as
 * ft_pack_build; a failed write in the writer thread is reported with its offset. */
int ft_pack_build_ex(const char *path, const ft_model_config *cfg, const char *config_json,
                     size_t config_len, uint64_t identity, const ft_pack_settings *s,
                     const ft_pack_src *src, const ft_pack_build_opts *o, ft_pack_stats *st);

/* The layout ft_pack_build gives a model, without building it: block_bytes[l] (n_layers + 1
 * entries: each layer's block, then the global block's, zero padding included) and
 * *file_bytes (the header, config_len bytes of config.json and the block table included), from
 * the config, the settings and the source (whose pre-quantized NF4 tensors keep their own
 * block sizes, as in the build): the builder's own planning (ft_pack_plan_block), so the
 * numbers are the built pack's, byte for byte. Returns 0, FT_E_INVALID (a config too large to
 * pack, bad settings) or the source's read_nf4 errors. */
int ft_pack_layout(const ft_model_config *cfg, size_t config_len, const ft_pack_settings *s,
                   const ft_pack_src *src, uint64_t *block_bytes, uint64_t *file_bytes);

/* The sum of n non-negative finite floats, correctly rounded to double (round half to
 * even): the value ft_nf4_fsum returns, computed in parallel from exact per-exponent
 * integer bins. A negative or non-finite value makes it fall back to ft_nf4_fsum. */
double ft_pack_sum_nonneg(const float *x, int64_t n);

/* ---- reading --------------------------------------------------------------------------- */

typedef struct ft_pack_file ft_pack_file;

/* Opens and validates a pack: magic, version, header checksum, complete flag, file size,
 * block table (aligned, in bounds, in order, one block per layer and the global block),
 * the stored config.json, and with verify != 0 every block's checksum (reads the file).
 * Errors name the path and the offset: FT_E_CORRUPT, FT_E_UNSUPPORTED (version), -errno. */
int ft_pack_open(ft_pack_file **out, const char *path, int verify);
void ft_pack_close(ft_pack_file *p); /* NULL-safe */
/* Opens a partial pack (FT_PACK_PARTIAL, ft_pack_build_opts.layer_limit) with ft_pack_open's
 * checks, its block checksums verified: the layer blocks it holds read as a whole pack's
 * (ft_pack_read_block, ft_pack_block_dir, ft_pack_block_bytes); the others and the global
 * block are absent (FT_E_RANGE; ft_pack_block_bytes 0; ft_pack_read_global FT_E_UNSUPPORTED).
 * A whole pack is refused here (FT_E_INVALID), as a partial one is by ft_pack_open. */
int ft_pack_open_partial(ft_pack_file **out, const char *path);

const ft_pack_hdr *ft_pack_header(const ft_pack_file *p);
const ft_model_config *ft_pack_config(const ft_pack_file *p);
const char *ft_pack_path(const ft_pack_file *p);
/* Bytes of layer l's block (l = -1: the global block); 0 if out of range. */
size_t ft_pack_block_bytes(const ft_pack_file *p, int64_t l);
/* The largest layer block (not counting the global block). */
size_t ft_pack_max_layer_bytes(const ft_pack_file *p);

/* Reads layer l's block (l = -1: the global block) into buf (buf_bytes >= its size) through
 * the pack's reader: io_uring with O_DIRECT when the buffer is 4096-aligned and the file system
 * allows it, else pread (offload/uring.h); with verify != 0 checks its xxh64. Returns 0,
 * -errno or FT_E_CORRUPT (short read, checksum). */
int ft_pack_read_block(ft_pack_file *p, int64_t l, void *buf, size_t buf_bytes, int verify);

/* How ft_pack_read_block reads ("io_uring + O_DIRECT (...)" or "pread (reason)", uring.h) and
 * the bytes it has read since open. */
const char *ft_pack_read_mode(const ft_pack_file *p);
uint64_t ft_pack_bytes_read(const ft_pack_file *p);

/* Reopens the pack's block reader with this queue depth and chunk size (ft_reader_open's
 * rules; the defaults at open are 8 and 1 MiB), e.g. the best pair of a probe on this file
 * (offload/probe.h ft_probe_pack_reader). Readers opened on the pack later (the disk
 * read-ahead, offload/prefetch.h) take the same setting (ft_pack_reader_params). Not while
 * another thread reads blocks. Returns 0 or the open's error (the old reader is kept). */
int ft_pack_set_reader(ft_pack_file *p, int queue_depth, size_t chunk_bytes);
/* The block reader's queue depth and chunk bytes. */
void ft_pack_reader_params(const ft_pack_file *p, int *queue_depth, size_t *chunk_bytes);

/* File offset and bytes of layer l's block (l = -1: the global block): both multiples of
 * FT_PACK_ALIGN. Returns 0 or FT_E_RANGE. */
int ft_pack_block_extent(const ft_pack_file *p, int64_t l, uint64_t *off, uint64_t *bytes);

/* Checks every block's checksum. Returns 0 or FT_E_CORRUPT naming the first bad block. */
int ft_pack_verify(ft_pack_file *p);

/* Floats a layer needs in fp32 (norms, the seven weights, biases; each 16-float aligned). */
int64_t ft_pack_layer_floats(const ft_model_config *cfg);

/* Turns layer l's block (read into buf) into fp32 weights: dequantizes NF4 (bitsandbytes
 * arithmetic, nf4.h), widens BF16, copies F32 into dst (ft_pack_layer_floats floats, 64-byte
 * aligned) and points w's arrays into dst. Checks every record against the pack's config
 * (roles, shapes, offsets within the block). Returns 0 or FT_E_CORRUPT. */
int ft_pack_layer_weights(const ft_pack_file *p, int64_t l, const void *buf, float *dst,
                          ft_layer_weights *w);

/* ft_pack_layer_weights, except that NF4 projections of a shape the fused kernels take
 * (kernels.h ft_nf4_fusable: out and in multiples of 64, the device kernels' tile rule, which
 * real Llama shapes meet; the CPU kernel would take in % 16 == 0) stay as they are stored: proj[k].wtype FT_WTYPE_NF4, proj[k].nf4 =
 * &nf4[k] (nf4: FT_N_PROJ entries) describing the codes and scales inside buf (valid while buf is), proj[k].w NULL.
 * Norms, biases and the other projections go to dst as above. For a host-memory backend whose
 * linear_fwd reads NF4 in place (the CPU's decode step). Returns 0 or FT_E_CORRUPT. */
int ft_pack_layer_weights_nf4(const ft_pack_file *p, int64_t l, const void *buf, float *dst,
                              ft_layer_weights *w, struct ft_nf4_tensor *nf4);

/* t = record r (dtype NF4) of the block at blk, as the kernels take it (kernels.h): pointers
 * into blk. No checks beyond ft_pack_block_dir's. */
void ft_pack_record_nf4(const ft_pack_tensor *r, const void *blk, struct ft_nf4_tensor *t);

/* The tensor directory of a block read into buf: *n entries; FT_E_CORRUPT if malformed. */
int ft_pack_block_dir(const ft_pack_file *p, int64_t l, const void *buf, const ft_pack_tensor **dir,
                      int64_t *n);

/* Shape of global tensor `role` (FT_PACK_ROLE_EMBED, _FINAL_NORM or _LM_HEAD) as the pack
 * stores it: *rows x *cols (V x C, or C x 1 for the norm) and *present (0 for LM_HEAD of a
 * tied model, which has no copy: read EMBED). The directory is read from the global block's
 * start (pread of its n_tensors records, once at ft_pack_open) and checked against the stored
 * config. Returns 0,
 * FT_E_INVALID (not a global role), FT_E_CORRUPT (directory), -errno. */
int ft_pack_global_info(ft_pack_file *p, int role, int64_t *rows, int64_t *cols, int *present);

/* Rows [row0, row0 + n_rows) of global tensor `role` as fp32 into dst (n_rows * cols floats):
 * EMBED and LM_HEAD are stored BF16 (widened exactly), FINAL_NORM F32 (rows of one value).
 * Reads only those bytes (pread in chunks of at most 8 MiB through a bounded buffer; up to
 * 8192 values without allocating), not the whole global block, so the block's checksum is not
 * checked here (ft_pack_verify or ft_pack_open(verify = 1) does); the directory is the one
 * ft_pack_open read and validated (re-read to report the error when it was bad).
 * Thread-safe (pread on a shared descriptor, no state changed).
 * Returns 0, FT_E_INVALID (a tied model's LM_HEAD: "tied: use EMBED"; not a global role),
 * FT_E_RANGE (rows outside [0, rows)), FT_E_CORRUPT, -errno, -ENOMEM. */
int ft_pack_read_global(ft_pack_file *p, int role, int64_t row0, int64_t n_rows, float *dst);

/* Rows rows[0..n) of global tensor `role` (e.g. the embeddings of a micro-batch's token
 * ids) as fp32 into dst (n * cols floats, row i at dst + i * cols): one pread per row, in
 * parallel (OpenMP) above 64 rows; the directory is the one read at open. Returns 0,
 * FT_E_RANGE (a row outside the tensor, naming its index), or ft_pack_read_global's errors. */
int ft_pack_gather_global(ft_pack_file *p, int role, const int32_t *rows, int64_t n, float *dst);

/* ---- the cache (pack_src.c) ------------------------------------------------------------ */

/* Identity of a model folder (config.json + every safetensors header, with file names and
 * sizes) or a GGUF file (its bytes before the tensor data, and its size). */
int ft_pack_model_identity(const char *model, uint64_t *identity);

/* The default cache directory into out (n bytes): XDG/ftune/packs, else HOME/.cache/ftune/packs,
 * for the values of $XDG_CACHE_HOME and $HOME (NULL or "": unset; the program reads them,
 * cli/env.c). Returns 0, FT_E_INVALID (neither set), FT_E_RANGE. The functions below that
 * take a cache_dir refuse NULL with FT_E_INVALID when they need the folder. */
int ft_pack_default_cache_dir(const char *xdg_cache_home, const char *home, char *out, size_t n);

/* The cache file name for (identity, settings) under dir. */
int ft_pack_cache_path(char *out, size_t n, const char *dir, uint64_t identity,
                       const ft_pack_settings *s);

enum ft_pack_action { FT_PACK_REUSED = 1, FT_PACK_BUILT, FT_PACK_REBUILT };

typedef struct ft_pack_ensure_info {
    int action;                /* enum ft_pack_action */
    char path[4200];
    char reason[512];          /* why an existing file was rebuilt ("" otherwise) */
    ft_pack_stats stats;       /* when built */
    uint64_t identity;
    int verified;              /* reused: 1 if every checksum was read and verified now, 0 if
                                * the pack's "<pack>.verified" stamp (same device, inode, size,
                                * mtime and ctime as when it last verified) was trusted */
    double waited_s;           /* seconds spent waiting for another process's build of the
                                * same pack (its "<pack>.lock"); 0 when none was under way */
} ft_pack_ensure_info;

/* Called by ft_pack_ensure_loaded before it waits for another process that holds the build
 * lock of the same pack (pid: the pid that process wrote into the lock file, 0 if unknown). */
typedef void (*ft_pack_wait_cb)(const char *pack_path, long pid, void *user);
/* The line the callers print for that wait: "waiting for process PID, which is building PATH
 * (a run sharing this cache folder); it is reused when done" (at most n - 1 bytes). */
void ft_pack_wait_text(char *buf, size_t n, const char *pack_path, long pid);

/* Finds or makes the pack of `model` (a HF folder, possibly a bitsandbytes 4-bit
 * checkpoint, or a GGUF file) for settings s under cache_dir (NULL: the default): a pack
 * written by `ftune init-model --pack` inside the folder is used when its settings match;
 * else the cached file is reused when it opens, its identity and settings match and every
 * checksum verifies (skipped when its verification stamp matches: info->verified);
 * otherwise it is (re)built, with the reason in info->reason ("block 3:
 * checksum ..."). force != 0 always rebuilds. Safetensors are streamed tensor by tensor, and
 * a GGUF file's tensors dequantized row range by row range as the builder asks
 * (ft_gguf_hf_rows), so memory stays bounded by a layer. Returns 0 or an error. */
int ft_pack_ensure(const char *model, const char *cache_dir, const ft_pack_settings *s,
                   int force, ft_pack_ensure_info *info);

/* ft_pack_ensure for a model the caller has loaded already (ft_model_load of the same
 * path): a GGUF model with its weights in memory is packed from `loaded`'s fp32 weights (the
 * same bytes as streaming it). loaded may be NULL or without weights (ft_model_load_deferred):
 * then as ft_pack_ensure; a folder is always streamed from its safetensors.
 * Concurrent runs sharing a cache folder (a sweep) build a pack once: the builder holds an
 * exclusive flock(2) on "<pack>.lock" (a small file with the builder's pid, removed when it is
 * done; one left by a killed run is harmless) while it builds; another process that finds no
 * usable pack waits for that lock (on_wait, if not NULL, is told first; info->waited_s says
 * how long), then looks again and reuses what was built (force != 0: rebuilds anyway). Where
 * the file system has no flock, builds proceed unlocked, as before. */
int ft_pack_ensure_loaded(const char *model, const ft_model *loaded, const char *cache_dir,
                          const ft_pack_settings *s, int force, ft_pack_ensure_info *info,
                          ft_pack_wait_cb on_wait, void *user);

/* ft_pack_ensure_loaded up to the build: what it would find (nothing is written, no pack is
 * built). info->action FT_PACK_REUSED: a usable pack is at info->path (checksums verified, or
 * its stamp trusted: info->verified); FT_PACK_BUILT: none there, one would be built at
 * info->path; FT_PACK_REBUILT: the file there is not usable (info->reason). info->identity is
 * the model's. Returns 0 or ft_pack_ensure's errors other than the build's. */
int ft_pack_locate(const char *model, const char *cache_dir, const ft_pack_settings *s,
                   ft_pack_ensure_info *info);

/* ---- a pack not built yet (`ftune plan`) ------------------------------------------------ */

/* What the planner needs of a pack before it exists: every block's size, a probe pack holding
 * layer 0's block, and a file to time the disk with. */
typedef struct ft_pack_preview {
    char path[4200];           /* where the pack will be written (ft_pack_locate's) */
    int quant;                 /* enum ft_pack_quant */
    int64_t n_layers;
    uint64_t *block_bytes;     /* n_layers + 1: ft_pack_layout's (layers, then the global block) */
    uint64_t max_layer_bytes;  /* the largest layer block */
    uint64_t file_bytes;       /* the whole file */
    ft_pack_file *probe;       /* partial pack of layer 0's block (ft_pack_open_partial), its
                                * file already unlinked (the descriptors keep it readable): NULL
                                * unless asked for */
    double probe_seconds;      /* making layer 0's block (ft_pack_stats.layer_seconds) */
    double build_estimate_s;   /* probe_seconds scaled by the pack's weights over layer 0's (0:
                                * no probe): a guess at the build, its final fsync not counted */
    char disk_file[4200];      /* the largest source file (a safetensors shard or the GGUF) */
    uint64_t disk_file_bytes;
    int disk_same_device;      /* 1: disk_file is on the file system the pack goes to (st_dev),
                                * 0: on another, -1: unknown */
} ft_pack_preview;

/* Fills *pv for the pack of `model` (a HF folder or GGUF file; loaded as for
 * ft_pack_ensure_loaded) with settings s, to be written at `path` (ft_pack_locate's): sizes
 * from ft_pack_layout; with probe != 0 also builds the probe pack (the builder with
 * layer_limit 1) as "<path>.probe.<pid>" in path's folder (created if missing), opens it and
 * unlinks it at once, so nothing stays in the cache folder, even if the process dies later.
 * Returns 0, or the source's, the layout's or the probe build's errors (*pv then holds
 * nothing to free). Free with ft_pack_preview_free. */
int ft_pack_preview_make(const char *model, const ft_model *loaded, const char *path,
                         const ft_pack_settings *s, int probe, ft_pack_preview *pv);
void ft_pack_preview_free(ft_pack_preview *pv); /* NULL-safe; zeroes *pv */

/* The file names init-model gives a pack it writes into a model folder, FT_PACK_LOCAL_NF4 and
 * FT_PACK_LOCAL_BF16, are model.h's: the loader finds a pack-only folder by them. */

#endif
