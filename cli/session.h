/* session.h - what eval, generate and logits share: a model, an optional adapter, a backend
 * and an executor sized for one micro-batch; and the signal handling of a training run
 * (library code installs no handlers). */
#ifndef FT_SESSION_H
#define FT_SESSION_H

#include <signal.h>

#include "src/model/lora.h"
#include "offload/exec.h"
#include "offload/pack.h"
#include "src/model/model.h"

typedef struct ft_session {
    ft_model *model;
    ft_backend *be;
    ft_lora lora;
    int has_lora;
    ft_exec ex;
    int has_ex;
    ft_pack_file *pack;         /* a pack-only model's pack (its weights are read from there) */
    int pack_in_memory;         /* host backends: ft_session_plan reads the whole pack into
                                 * memory once (generation visits every layer per token)
                                 * instead of one block per layer visit */
    int64_t gpu_mem, host_mem;  /* device backends, a pack: the offload planner's budgets in
                                 * bytes (--gpu-mem, --host-mem; 0: what is free / available
                                 * less 4 GiB), set after opening, before ft_session_plan */
    int bf16_deferred;          /* a bf16 base on a device, its weights not read yet:
                                 * ft_session_plan reads them, or streams the base from its
                                 * bf16 pack when the resident run does not fit gpu_mem */
    const char *cache_dir;      /* where that pack is kept (NULL: the default) */
    int64_t gpu_reserve;        /* device bytes the caller allocates after ft_session_plan
                                 * (generation's KV cache and buffers, ft_gen_source_bytes):
                                 * kept out of the budget the base is placed in */
} ft_session;

/* Loads the model, the backend and (if adapter_dir) the PEFT adapter with the base in NF4 as a
 * QLoRA run trains it, and plans an executor for T tokens (T 0: none yet, ft_session_plan
 * makes it): the model is loaded deferred (no fp32 copy), its NF4 pack found or built under
 * cache_dir (NULL: the default; offload/pack.h ft_pack_ensure_loaded, as `ftune train --quant
 * nf4`), and every base weight read from the pack (embeddings and LM head as its bf16 copies),
 * placed by ft_session_plan. An adapter trained with --quant-correction gets its frozen correction
 * back (src/train/correction.h: adapter_dir/quant_correction, or that of the run folder above
 * it, for OUT/best and OUT/checkpoint-N), as part of the base; *qcorr (may be NULL) is set to
 * 1 then. Returns 0 or an error naming the file. */
int ft_session_open_nf4(ft_session *s, const char *model, const char *adapter_dir, int64_t T,
                        const char *device, int threads, const char *cache_dir, int *qcorr);

/* The session of eval, generate and logits from their flags, no executor yet
 * (ft_session_plan): quant NULL (the model's weights as they are), "bf16" (FT_E_INVALID,
 * naming the folder, for a folder holding only an NF4 pack: it has no unquantized weights to
 * serve) or "nf4" (ft_session_open_nf4, the pack under cache_dir; *qcorr as there, may be
 * NULL); gpu_mem / host_mem become the planner's budgets. The unquantized base on a device
 * backend is loaded deferred (bf16_deferred): ft_session_plan decides, as training does, between
 * reading the weights (every layer resident) and streaming the base from its bf16 pack under
 * cache_dir, so that an adapter trained on a streamed bf16 base runs on the same GPU without
 * the fp32 model in host memory. Returns 0 or an error naming the file. */
int ft_session_open_quant(ft_session *s, const char *model, const char *adapter,
                          const char *device, int threads, const char *quant,
                          const char *cache_dir, int64_t gpu_mem, int64_t host_mem, int *qcorr);

/* 1 (after printing the usage error) when --quant is neither absent, bf16 nor nf4. */
int ft_session_bad_quant(const char *quant);

/* Replaces the session's adapter with the PEFT adapter in adapter_dir (NULL: none, the base
 * model) and re-plans the executor for T tokens; an adapter of the same rank and targets is
 * loaded in place instead, keeping the executor (and the base it placed). Returns 0 or an
 * error naming the folder. */
int ft_session_set_adapter(ft_session *s, const char *adapter_dir, int64_t T);

/* --dpo-loss NAME (train and eval): a loss of src/train/dpo.h into *(int *)dst; an ft_opt
 * FN parser (cli/args.h): 0, or -1 with the message in err. */
int ft_opt_dpo_loss(const char *v, void *dst, char *err, size_t n);

/* --gpu-mem / --host-mem of eval, generate and logits (a pack on a device: ft_session_plan). */
#define FT_GPU_MEM_HELP "on a GPU: the memory it may use, e.g. 24G (default: all that is free); " \
                        "layers beyond it are streamed as in training (a bf16 base from its bf16 pack)"
#define FT_HOST_MEM_HELP "with --gpu-mem: host memory for the pinned pool of streamed layers (default: " \
                         "available memory less 4 GiB); layers beyond it are read from the pack file"

#define FT_CACHE_DIR_HELP "where pack files are kept: --quant nf4, or on a GPU a bf16 base that " \
                          "does not fit --gpu-mem, streamed from its bf16 pack as in training " \
                          "(default $XDG_CACHE_HOME/ftune/packs or ~/.cache/ftune/packs)"

/* --device's help line, shared by the commands that take it. */
#define FT_DEVICE_HELP "cpu | cuda | cuda:N | auto (default: $FTUNE_DEVICE, else auto: cuda when a " \
                       "GPU is visible) | cpu-device (the CPU posing as a GPU, for tests: slow)"

/* --model (and --adapter, --init-adapter, --ref-adapter: `what` names the flag) for every
 * command: an existing path as given, else a Hugging Face id ("org/name", "org/name@REV",
 * "org/name/FILE.gguf") resolved to its snapshot in the local hub cache
 * (src/formats/hub_cache.h ft_hub_resolve); *path then points at buf (n bytes), and unless
 * quiet the snapshot is named on stderr. NULL *path: nothing to do. Returns 0, or 1 after
 * printing the error (the command exits 1). */
int ft_session_hub_path(const char **path, char *buf, size_t n, int quiet, const char *what);
#define ft_session_model_path(m, buf, n, quiet) ft_session_hub_path(m, buf, n, quiet, "model")

/* offload/pack.h ft_pack_wait_cb for the commands: prints "ftune: pack: waiting for process
 * PID, which is building PATH ..." on stderr (user unused). */
void ft_session_pack_wait_note(const char *path, long pid, void *user);

/* The device a command runs on: --device when given, else the FTUNE_DEVICE environment
 * variable, else "auto" (CUDA when a GPU is visible, else the CPU). */
const char *ft_session_device(const char *opt);
/* Re-plans the executor for up to T tokens per micro-batch. A deferred bf16 base
 * (bf16_deferred) is resolved first, once, as the trainer decides: its weights are read when
 * the executor for T tokens with every layer resident (ft_exec_bytes) plus 1 GiB fits what
 * s->gpu_mem (0: the device's total) leaves; otherwise one stderr line says so and the model
 * becomes its bf16 pack, found or built under s->cache_dir (offload/pack.h
 * ft_pack_ensure_loaded; the build prints "pack: built PATH"). A pack on a device backend is
 * placed by the offload planner (offload/place.h ft_place_packed) within s->gpu_mem and
 * s->host_mem, as training places it: layers that do not fit the GPU are streamed from
 * pinned host memory or the pack file; the plan's lines go to stderr when some are. Returns
 * 0 or an error: the model's read errors, the pack's build errors (the session stays
 * deferred then), FT_E_RANGE naming the smallest budgets when nothing fits. */
int ft_session_plan(ft_session *s, int64_t T);
void ft_session_close(ft_session *s);

/* Stop requests for a training run. Installs SIGINT and SIGTERM handlers (SA_RESTART):
 * the first signal stores its number in the returned flag and prints one line (the
 * trainer, given the flag as ft_train_cfg.stop, finishes its step, saves a checkpoint
 * and returns); a second one exits at once with status 128 + signo, which cannot damage
 * the last checkpoint (checkpoints are renamed into place whole). */
volatile sig_atomic_t *ft_session_signals_install(void);
/* Puts back the handlers found by ft_session_signals_install. */
void ft_session_signals_restore(void);

#endif
