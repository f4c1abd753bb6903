/* session.c - shared set-up for eval and logits (see session.h). */
#include "cli/session.h"

#include <string.h>

#include "adapters/peft.h"
#include "src/core/err.h"

int ft_session_open(ft_session *s, const char *model, const char *adapter_dir, int64_t T,
                    int threads)
{
    memset(s, 0, sizeof *s);
    FT_TRY(ft_model_load(&s->model, model));
    FT_TRY(ft_backend_cpu_init(&s->be, threads));
    if (adapter_dir) {
        ft_lora_cfg lc;
        FT_TRY(ft_peft_read_config(adapter_dir, &lc));
        lc.dropout = 0;
        lc.seed = 0;
        FT_TRY(ft_lora_init(&s->lora, s->model, &lc, s->be));
        s->has_lora = 1;
        FT_TRY(ft_peft_load_weights(adapter_dir, &s->lora));
    }
    return ft_session_plan(s, T);
}

int ft_session_plan(ft_session *s, int64_t T)
{
    if (s->has_ex) ft_exec_free(&s->ex);
    s->has_ex = 0;
    FT_TRY(ft_exec_init(&s->ex, s->be, s->model, s->has_lora ? &s->lora : NULL, T, 1, T));
    s->has_ex = 1;
    return 0;
}

void ft_session_close(ft_session *s)
{
    if (s->has_ex) ft_exec_free(&s->ex);
    if (s->has_lora) ft_lora_free(&s->lora);
    ft_backend_free(s->be);
    ft_model_free(s->model);
    memset(s, 0, sizeof *s);
}
