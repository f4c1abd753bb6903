/* merge_internal.h - what merge.c (plan, row pipeline) and merge_out.c (sinks, files, the
 * driver) share. Not a public interface: see merge.h. */
#ifndef FT_MERGE_INTERNAL_H
#define FT_MERGE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "adapters/export/merge.h"
#include "adapters/peft.h"
#include "src/formats/config.h"
#include "src/formats/gguf.h"
#include "src/formats/gguf_write.h"
#include "src/formats/safetensors.h"

/* The base model: an HF folder's safetensors files or a GGUF file, mapped. */
typedef struct mg_src {
    char path[4200];
    int is_gguf;
    ft_model_config cfg;
    char arch[32];             /* GGUF architecture: llama, qwen2 or qwen3 */
    int has_rope_freqs;
    ft_gguf *g;
    ft_st_file **files;
    int n_files;
} mg_src;

/* One output tensor and where it comes from. rows x cols is the tensor as a row-major
 * matrix (rows = outermost dim; 1-D tensors are n x 1, or 1 x n for block types). */
typedef struct mg_tensor {
    char src_name[160], out_name[160];
    int64_t order, seq;        /* output order: (order, seq) */
    int64_t layer;             /* -1 outside the layers */
    int proj;                  /* enum ft_proj for a projection's .weight, else -1 */
    int is_qk;                 /* q or k weight/bias: llama.cpp permutes its rows (arch llama) */
    int n_dims;
    int64_t shape[8];          /* outer first (safetensors order) */
    int64_t rows, cols, numel;
    int src_type;              /* ggml type; -1: a non-float safetensors dtype copied raw */
    int raw_st_dtype;
    const void *data;
    size_t nbytes;
    int src_perm, out_perm;    /* rows in llama.cpp's q/k order in the source / the output */
    int out_type;              /* ggml type, -1 = raw */
    uint64_t out_bytes;
} mg_tensor;

typedef struct mg_sink {
    int (*write)(struct mg_sink *k, const void *data, size_t n);
    int (*write_f32)(struct mg_sink *k, const mg_tensor *t, const float *x, int64_t n);
    ft_gguf_w *gw;             /* GGUF output */
    int fd;                    /* safetensors shard */
    const char *path;
    int64_t pos;
    uint8_t *conv;
    size_t conv_cap;
} mg_sink;

int mg_src_open(mg_src *s, const char *path);
void mg_src_close(mg_src *s);
/* The output tensors in order, with types and sizes; *skipped counts source tensors left
 * out (no counterpart in the output format). */
int mg_plan(mg_src *s, const ft_merge_opts *o, mg_tensor **out, int64_t *n_out, int64_t *skipped);
/* Streams one tensor (merged with the adapter `a` if it targets it; a may be NULL). */
int mg_write_tensor(mg_sink *k, const mg_src *s, const mg_tensor *t, const ft_peft_file *a);

#endif
