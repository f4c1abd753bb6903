/* exec_open.c - the executor's one public constructor and its accessors (exec.h); the
 * in-place constructors it calls are exec.c's (exec_impl.h). */
#include "offload/exec_impl.h"

#include <errno.h>
#include <stdlib.h>

#include "src/core/err.h"

int ft_exec_open(ft_exec **out, ft_backend *be, const ft_model *m, const ft_exec_cfg *c)
{
    *out = NULL;
    if (!c || !be || !m) return ft_err(FT_E_INVALID, "executor: no backend, model or configuration");
    ft_exec *e = calloc(1, sizeof *e);
    if (!e) return ft_err(-ENOMEM, "out of memory");
    int64_t nm = c->n_micro > 0 ? c->n_micro : 1;
    int64_t rope = c->rope_seq_len > 0 ? c->rope_seq_len : c->T_max;
    int place = !c->defer_layers, rc;
    if (c->n_adapters > 0)
        rc = ft_exec_init_multi(e, be, m, c->n_adapters, c->r_max, c->T_max, nm, rope, place,
                                c->ckpt_dev_layers, c->ckpt_sets);
    else if (c->ckpt_sets > 0)
        rc = ft_exec_init_ckpt_host(e, be, m, c->lora, c->T_max, nm, rope, place, c->ckpt_dev_layers,
                                    c->ckpt_sets);
    else
        rc = ft_exec_init_ex(e, be, m, c->lora, c->T_max, nm, rope, place);
    if (rc < 0) {
        free(e); /* the constructors free what they allocated on an error */
        return rc;
    }
    *out = e;
    return 0;
}

void ft_exec_close(ft_exec *e)
{
    if (!e) return;
    ft_exec_free(e);
    free(e);
}

void ft_exec_get_info(const ft_exec *e, ft_exec_info *o)
{
    *o = (ft_exec_info){
        .T_max = e->T_max,
        .n_micro_max = e->n_micro_max,
        .arena_bytes = e->arena_bytes,
        .weights_bytes = e->weights_bytes,
        .kept_bytes = e->kept_bytes,
        .kept = e->kept != NULL,
        .nf4_fused = e->nf4_fused,
        .on_device = e->on_device,
        .layer_fetches = e->layer_fetches,
        .pack_reads = e->pack_reads,
        .h2d_bytes = e->h2d_bytes,
        .disk_bytes = e->disk_bytes,
        .disk_seconds = e->disk_seconds,
    };
}

ft_lora *ft_exec_adapter(const ft_exec *e) { return e->lora; }

ft_lora *ft_exec_set_adapter(ft_exec *e, ft_lora *l)
{
    ft_lora *was = e->lora;
    e->lora = l;
    return was;
}

void ft_exec_set_neftune(ft_exec *e, double alpha, uint64_t seed)
{
    e->neftune_alpha = alpha;
    e->neftune_seed = seed;
}

void ft_exec_set_concat_gemms(ft_exec *e, int on) { e->concat_gemms = on != 0; }
void ft_exec_set_mb_base(ft_exec *e, int64_t mb_base) { e->mb_base = mb_base; }
