/* layout.c - the layer layout of a Llama-family model from its config (model.h): the HF
 * projection names, each projection's shape and bias, and the fp32 layout of one layer's
 * weights that the loader, the pack file (offload/pack.c) and the exporters share. */
#include "src/model/model.h"

#include <string.h>

#include "src/core/align.h"

const char *const ft_proj_name[FT_N_PROJ] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
const char *const ft_proj_parent[FT_N_PROJ] = {"self_attn", "self_attn", "self_attn", "self_attn",
                                               "mlp", "mlp", "mlp"};

/* model.h; formats.md 2.3 */
void ft_proj_dims(const ft_model_config *c, int p, int64_t *out, int64_t *in)
{
    const int64_t C = c->hidden_size, F = c->intermediate_size;
    const int64_t qd = c->num_attention_heads * c->head_dim, kd = c->num_key_value_heads * c->head_dim;
    switch (p) {
    case FT_Q: *out = qd; *in = C; break;
    case FT_K: case FT_V: *out = kd; *in = C; break;
    case FT_O: *out = C; *in = qd; break;
    case FT_GATE: case FT_UP: *out = F; *in = C; break;
    default: *out = C; *in = F; break;
    }
}

/* model.h. LlamaAttention gives o_proj bias=attention_bias; Qwen2Attention never does. */
int ft_proj_has_bias(const ft_model_config *c, int p, int o_bias)
{
    if (!c->attention_bias) return 0;
    return p == FT_Q || p == FT_K || p == FT_V || (p == FT_O && o_bias);
}

/* model.h */
int64_t ft_layer_floats(const ft_model_config *c, int o_bias)
{
    int64_t n = 2 * ft_pad16(c->hidden_size) + (c->qk_norm ? 2 * ft_pad16(c->head_dim) : 0);
    for (int p = 0; p < FT_N_PROJ; p++) {
        int64_t out, in;
        ft_proj_dims(c, p, &out, &in);
        n += ft_pad16(out * in) + (ft_proj_has_bias(c, p, o_bias) ? ft_pad16(out) : 0);
    }
    return n;
}

/* model.h */
double ft_layer_proj_params(const ft_model_config *c)
{
    double p = 0;
    for (int k = 0; k < FT_N_PROJ; k++) {
        int64_t out, in;
        ft_proj_dims(c, k, &out, &in);
        p += (double)out * (double)in;
    }
    return p;
}

/* model.h */
void ft_layer_carve(const ft_model_config *c, int o_bias, float *b, ft_layer_weights *w)
{
    memset(w, 0, sizeof *w);
    w->attn_norm = b;
    b += ft_pad16(c->hidden_size);
    w->ffn_norm = b;
    b += ft_pad16(c->hidden_size);
    if (c->qk_norm) { /* Qwen3: (head_dim) each */
        w->q_norm = b;
        b += ft_pad16(c->head_dim);
        w->k_norm = b;
        b += ft_pad16(c->head_dim);
    }
    for (int p = 0; p < FT_N_PROJ; p++) {
        ft_linear *li = &w->proj[p];
        ft_proj_dims(c, p, &li->out_n, &li->in_n);
        li->w = b;
        b += ft_pad16(li->out_n * li->in_n);
        if (ft_proj_has_bias(c, p, o_bias)) {
            li->b = b;
            b += ft_pad16(li->out_n);
        }
    }
}
