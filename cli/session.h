/* session.h - the commands' side of the runtime session (offload/session.h): the session of
 * eval, generate and logits from their flags, the flag help texts they share, the model and
 * adapter paths of every command (Hugging Face ids), the --device default, and the signal
 * handling of a training run (library code installs no handlers). */
#ifndef FT_CLI_SESSION_H
#define FT_CLI_SESSION_H

#include <signal.h>

#include "offload/session.h"
#include "src/core/dirlock.h"

/* The session of eval, generate and logits from their flags (offload/session.h ft_session_open,
 * cfg.train 0; its notes printed on stderr as "ftune: LINE"), no executor yet
 * (ft_session_plan): quant NULL (the model's weights as they are), "bf16" (FT_E_INVALID,
 * naming the folder, for a folder holding only an NF4 pack: it has no unquantized weights to
 * serve) or "nf4" (the NF4 pack under cache_dir, built or reused, as `ftune train --quant
 * nf4`; an adapter trained with --quant-correction gets its frozen correction back, and
 * *qcorr, which may be NULL, is set to 1); device NULL: ft_session_device's default; gpu_mem /
 * host_mem become the planner's budgets. The unquantized base on a device backend stays
 * deferred: ft_session_plan decides, as training does, between reading the weights (every
 * layer resident) and streaming the base from its bf16 pack under cache_dir. Returns 0 or an
 * error naming the file; ft_session_close frees s either way. */
int ft_session_open_quant(ft_session *s, const char *model, const char *adapter,
                          const char *device, int threads, const char *quant,
                          const char *cache_dir, int64_t gpu_mem, int64_t host_mem, int *qcorr);

/* offload/session.h ft_session_note_fn for the commands: "ftune: LINE" on stderr
 * ("ftune: warning: LINE" for a warning). */
void ft_session_note_stderr(void *user, int kind, const char *line);

/* 1 (after printing the usage error) when --quant is neither absent, bf16 nor nf4. */
int ft_session_bad_quant(const char *quant);

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

/* One run per output folder (issue 31 class 7), for every command that writes a folder (train
 * and sweep --out, merge --out DIR, init-model --out): takes the lock on dir
 * (src/core/dirlock.h ft_dirlock_take: created if missing, held until ft_dirlock_release, which
 * removes DIR/.ftune.lock, so no lock file stays in a finished folder) without waiting. flag
 * names the option in the messages ("--out"). Returns 0 (a stale lock left by a run that
 * ended without releasing it is taken over, and one line says so on stderr: "ftune: FLAG DIR:
 * took over the stale lock of pid N (...)"), or -1 with the error recorded (ft_errmsg():
 * "FLAG DIR is in use by another ftune run (pid N holds DIR/.ftune.lock); ..."), which the
 * caller prints as "ftune: MSG" (or hands to ft_cli_comm_fail under MPI) and exits 1; lk->fd
 * is -1 then. Under MPI only the rank that writes the folder calls it, after the communicator
 * opens. */
int ft_session_out_lock(ft_dirlock *lk, const char *flag, const char *dir);

/* Stop requests for a training run. Installs SIGINT and SIGTERM handlers (SA_RESTART):
 * the first signal stores its number in the returned flag and prints one line (the
 * trainer, given the flag as ft_train_cfg.stop, finishes its step, saves a checkpoint
 * and returns); a second one exits at once with status 128 + signo, which cannot damage
 * the last checkpoint (checkpoints are renamed into place whole). */
volatile sig_atomic_t *ft_session_signals_install(void);
/* Puts back the handlers found by ft_session_signals_install. */
void ft_session_signals_restore(void);

#endif
