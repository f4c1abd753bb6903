/* lora.h - LoRA adapter parameters (Hu et al. 2021; PEFT layout, formats.md 3).
 *
 * For each targeted linear W (out, in) of each layer: A (r, in), B (out, r), and
 * y = x W^T + scale * dropout(x) A^T B^T with scale = alpha / r (alpha / sqrt(r) with
 * rsLoRA, Kalajdzievski 2023). All trainable tensors live in one flat fp32 array (params),
 * with the same layout for gradients and the AdamW moments, so the optimizer, the gradient
 * norm and checkpoints treat them as one vector.
 */
#ifndef FT_LORA_H
#define FT_LORA_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "src/model/model.h"

#define FT_LORA_ALL_TARGETS ((1u << FT_N_PROJ) - 1)

typedef struct ft_lora_cfg {
    int64_t r;            /* rank */
    float alpha;          /* lora_alpha */
    float dropout;        /* lora_dropout, on the adapter's input only */
    int use_rslora;       /* scale = alpha / sqrt(r) */
    unsigned targets;     /* bit (1 << ft_proj) set for each adapted projection */
    uint64_t seed;        /* A initialisation and dropout masks */
} ft_lora_cfg;

typedef struct ft_lora_linear {
    float *A, *B;         /* (r, in), (out, r): slices of ft_lora.params */
    const float *A0, *B0; /* (r, in), (out, r): the frozen correction of a quantized base
                           * (slices of ft_lora.fixed, adapters/qcorr.h), NULL without one:
                           * y += scale x A0^T B0^T, never dropped out, no gradient */
    float *dA, *dB;       /* same shapes: slices of ft_lora.grads */
    int64_t in_n, out_n;
} ft_lora_linear;

typedef struct ft_lora {
    ft_lora_cfg cfg;
    float scale;
    int64_t n_layers;
    ft_lora_linear (*lin)[FT_N_PROJ]; /* [n_layers][FT_N_PROJ]; A == NULL when not targeted */
    int64_t n_params;
    float *params, *grads, *m, *v;    /* n_params each, backend memory */
    float *host;                      /* n_params host staging (save/load) */
    float *fixed;                     /* n_params backend memory or NULL: A0/B0 (ft_lora_set_fixed) */
    ft_backend *be;
} ft_lora;

/* The adapter's output scale: alpha / r, or alpha / sqrt(r) with rsLoRA (PEFT
 * LoraLayer.update_layer, formats.md 3.4). */
float ft_lora_scale(const ft_lora_cfg *c);

/* Backend bytes ft_lora_init allocates for cfg on m: parameters, gradients and the AdamW
 * moments (4 n_params floats), and with fixed the frozen correction (ft_lora_set_fixed, one
 * more); the allocator's rounding (64 bytes per array on the CPU) aside. For sizing several
 * adapters at once (offload/plan.h ft_plan_in_adapters). */
size_t ft_lora_bytes(const ft_model *m, const ft_lora_cfg *cfg, int fixed);

/* Allocates the adapter for `m` on backend `be` and initialises it as PEFT does
 * (init_lora_weights=True): A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with a=sqrt(5)),
 * B = 0; grads and moments zero. Returns 0, -ENOMEM, FT_E_INVALID (r < 1, no targets). */
int ft_lora_init(ft_lora *l, const ft_model *m, const ft_lora_cfg *cfg, ft_backend *be);
void ft_lora_free(ft_lora *l);

/* Installs a frozen low-rank correction of the base (adapters/qcorr.h): host holds n_params
 * floats in the layout of l->params (A0 where A is, B0 where B is); they are copied to one
 * backend allocation and every adapted linear gets A0/B0. Replaces an earlier one. Returns 0
 * or -ENOMEM. */
int ft_lora_set_fixed(ft_lora *l, const float *host);

/* Copies params to/from l->host (for saving and loading). */
int ft_lora_pull(ft_lora *l);
int ft_lora_push(ft_lora *l);

/* The parameter groups an optimizer tells apart (LoRA+, Hayou, Ghosh, Yu 2024, arXiv
 * 2402.12354; PEFT's create_loraplus_optimizer): every lora_A, every lora_B. */
enum ft_lora_group { FT_LORA_GROUP_A = 0, FT_LORA_GROUP_B = 1 };

/* One tensor of the adapter as a range of its flat arrays: params[off, off + n), and the same
 * range of grads, m and v; group is enum ft_lora_group. */
typedef struct ft_lora_slice {
    int64_t off, n;
    int group;
} ft_lora_slice;

/* The adapter's tensors in the order they lie in params: for each layer, each adapted
 * projection in enum ft_proj order, its A (r * in_n floats), then its B (out_n * r); together
 * they tile [0, n_params). Writes the first cap of them into out (out may be NULL when cap is
 * 0) and returns how many there are (2 per adapted linear), so a caller sizes its array with
 * a first call. */
int64_t ft_lora_slices(const ft_lora *l, ft_lora_slice *out, int64_t cap);

/* "q_proj,k_proj" / "all" / "all-linear" -> bit mask. Returns 0 or FT_E_INVALID naming the
 * unknown module. */
int ft_lora_parse_targets(const char *s, unsigned *mask);

#endif
