/* session.h - what eval, logits (and later generate) share: a model, an optional adapter,
 * a backend and an executor sized for one micro-batch. */
#ifndef FT_SESSION_H
#define FT_SESSION_H

#include "adapters/lora.h"
#include "offload/exec.h"
#include "src/model/model.h"

typedef struct ft_session {
    ft_model *model;
    ft_backend *be;
    ft_lora lora;
    int has_lora;
    ft_exec ex;
    int has_ex;
} ft_session;

/* Loads the model and (if adapter_dir) the PEFT adapter; plans an executor for T tokens.
 * Returns 0 or an error (ft_errmsg() names the file). */
int ft_session_open(ft_session *s, const char *model, const char *adapter_dir, int64_t T,
                    int threads);
/* Re-plans the executor for up to T tokens per micro-batch. */
int ft_session_plan(ft_session *s, int64_t T);
void ft_session_close(ft_session *s);

#endif
