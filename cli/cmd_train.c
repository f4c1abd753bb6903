/* cmd_train.c - `ftune [train] --model M --data F [--data F2 ...] [options]`: flags, the
 * signal handling of a run (cli/session.c), the test hooks from the environment, the resume
 * hint and exit statuses: 0 done, 1 error, 2 usage, 128 + signo when stopped by SIGINT (130)
 * or SIGTERM (143) after saving a checkpoint. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/lora.h"
#include "adapters/qcorr.h"
#include "cli/args.h"
#include "cli/opt_parse.h"
#include "cli/commands.h"
#include "cli/env.h"
#include "cli/progress.h"
#include "cli/dist_env.h"
#include "cli/session.h"
#include "offload/pack.h"
#include "src/core/dirlock.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/paths.h"
#include "src/formats/tfevents.h"
#include "src/train/checkpoint.h"
#include "src/train/dpo.h"
#include "src/train/schedule.h"
#include "src/train/trainer.h"

static int opt_targets(const char *v, void *dst, char *err, size_t n)
{
    if (ft_lora_parse_targets(v, dst) < 0) {
        snprintf(err, n, "%s", ft_errmsg());
        return -1;
    }
    return 0;
}

static int opt_schedule(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_schedule_parse(v);
    if (k < 0) {
        snprintf(err, n, "unknown schedule '%s' (cosine, linear, constant)", v);
        return -1;
    }
    *(int *)dst = k;
    return 0;
}

static int opt_qcorr(const char *v, void *dst, char *err, size_t n)
{
    if (ft_qcorr_parse(v, dst) < 0) {
        snprintf(err, n, "unknown quantization correction '%s' (none, calibrated, weight)", v);
        return -1;
    }
    return 0;
}

static int opt_quant(const char *v, void *dst, char *err, size_t n)
{
    if (!strcmp(v, "auto")) {
        *(int *)dst = FT_TRAIN_QUANT_AUTO;
        return 0;
    }
    if (ft_pack_quant_parse(v, dst) < 0) {
        snprintf(err, n, "unknown base quantization '%s' (nf4, bf16, auto)", v);
        return -1;
    }
    return 0;
}

/* v as a whole finite number into *x: 0, or -1 (not a number, trailing text, inf, nan, out of
 * range). */
static int finite_num(const char *v, double *x)
{
    char *end;
    errno = 0;
    *x = strtod(v, &end);
    return errno || end == v || *end || !isfinite(*x) ? -1 : 0;
}

/* --loraplus-lr-ratio X: a finite X > 0 (off, the default 0, is leaving the flag out) */
static int opt_pos_ratio(const char *v, void *dst, char *err, size_t n)
{
    double x;
    if (finite_num(v, &x) || !(x > 0)) {
        snprintf(err, n, "expected a number > 0, got '%s'", v);
        return -1;
    }
    *(double *)dst = x;
    return 0;
}

/* --neftune-noise-alpha X: a finite X >= 0 (0, the default, is off) */
static int opt_nonneg(const char *v, void *dst, char *err, size_t n)
{
    double x;
    if (finite_num(v, &x) || !(x >= 0)) {
        snprintf(err, n, "expected a number >= 0, got '%s'", v);
        return -1;
    }
    *(double *)dst = x;
    return 0;
}

static int opt_method(const char *v, void *dst, char *err, size_t n)
{
    if (!strcmp(v, "sft")) *(int *)dst = FT_TRAIN_METHOD_SFT;
    else if (!strcmp(v, "dpo")) *(int *)dst = FT_TRAIN_METHOD_DPO;
    else {
        snprintf(err, n, "unknown training method '%s' (sft, dpo)", v);
        return -1;
    }
    return 0;
}

/* --lora-dropout X: 0 <= X < 1, remembered as given (its default depends on --method) */
typedef struct dropout_arg { float p; int set; } dropout_arg;

static int opt_dropout(const char *v, void *dst, char *err, size_t n)
{
    double x;
    if (finite_num(v, &x) || !(x >= 0 && x < 1)) {
        snprintf(err, n, "expected a probability 0 <= p < 1, got '%s'", v);
        return -1;
    }
    dropout_arg *d = dst;
    d->p = (float)x;
    d->set = 1;
    return 0;
}

/* --resume [DIR]: a bare --resume (last argument, or followed by another flag) becomes
 * "--resume=" before parsing; the empty value means "the latest checkpoint in --out". */
static int opt_resume(const char *v, void *dst, char *err, size_t n)
{
    *(const char **)dst = v;
    return 0;
}

/* Writes `a` to f quoted for a POSIX shell where needed. */
static void put_shell_word(FILE *f, const char *a)
{
    int plain = *a != 0;
    for (const char *p = a; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./=:,+-@%", *p))
            plain = 0;
    if (plain) {
        fputs(a, f);
        return;
    }
    fputc('\'', f);
    for (const char *p = a; *p; p++) {
        if (*p == '\'') fputs("'\\''", f);
        else fputc(*p, f);
    }
    fputc('\'', f);
}

/* The command that continues this run: the same flags, --resume CKPT instead of any
 * earlier --resume. */
static void print_resume_hint(const char *lead, int argc, char **argv, const char *ckpt)
{
    extern char *program_invocation_name;
    fprintf(stderr, "%s", lead);
    put_shell_word(stderr, program_invocation_name);
    fputs(" train", stderr);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--resume")) {
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) i++;
            continue;
        }
        if (!strncmp(argv[i], "--resume=", 9)) continue;
        fputc(' ', stderr);
        put_shell_word(stderr, argv[i]);
    }
    fputs(" --resume ", stderr);
    put_shell_word(stderr, ckpt);
    fputc('\n', stderr);
}

static int opt_grad_accum(const char *v, void *dst, char *err, size_t n)
{
    if (!strcmp(v, "auto")) {
        *(int64_t *)dst = 0;
        return 0;
    }
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < 1) {
        snprintf(err, n, "expected a positive integer or auto, got '%s'", v);
        return -1;
    }
    *(int64_t *)dst = x;
    return 0;
}

int ft_cmd_train(int argc, char **argv)
{
    return ft_cmd_train_ex(argc, argv, 0);
}

/* The trainer's test hooks from the environment (trainer.h ft_train_test_hooks):
 * FTUNE_TEST_STOP_HOLD_MS=N (ms a stopped run waits before its stop checkpoint) and
 * FTUNE_TEST_INF_EMBEDDING=ID (a token id whose input embedding is made +Inf). Returns 0, or
 * -1 after printing the error for a value that is not a number. */
static int test_hooks(ft_train_test_hooks *t)
{
    const char *hold = getenv("FTUNE_TEST_STOP_HOLD_MS");
    t->stop_hold_ms = hold && *hold ? strtoll(hold, NULL, 10) : 0;
    const char *inf = getenv("FTUNE_TEST_INF_EMBEDDING");
    if (!inf || !*inf) return 0;
    char *end;
    long long id = strtoll(inf, &end, 10);
    if (*end || id < 0) {
        fprintf(stderr, "ftune: FTUNE_TEST_INF_EMBEDDING=%s: expected a token id\n", inf);
        return -1;
    }
    t->inf_embedding = id;
    return 0;
}

/* --cuda-fused LIST: the FT_CUDA_FUSED_* bits of a comma list of adamw, all, none (kernels.h
 * ft_backend_cuda_set_fused). Returns 0, or -1 after printing the error. */
static int fused_mask(const char *list, unsigned *mask)
{
    static const struct { const char *name; unsigned bits; } names[] = {
        {"adamw", FT_CUDA_FUSED_ADAMW}, {"all", FT_CUDA_FUSED_ALL}, {"none", 0}};
    *mask = 0;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        size_t k = 0;
        while (k < sizeof names / sizeof names[0] && (strlen(names[k].name) != n || strncmp(p, names[k].name, n))) k++;
        if (k == sizeof names / sizeof names[0]) {
            fprintf(stderr, "ftune: --cuda-fused %s: unknown kernel '%.*s' (expected a comma list of adamw, all, none)\n",
                    list, (int)n, p);
            return -1;
        }
        *mask |= names[k].bits;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* FTUNE_TEST_KILL_AT_STEP=S, FTUNE_TEST_KILL_RANK=R and FTUNE_TEST_KILL_SIGNAL=N (default 9,
 * SIGKILL; 19, SIGSTOP: a rank that hangs): rank R sends itself signal N as step S begins
 * (tests/ref/test_distributed.py). */
static void test_kill_hook(ft_train_test_hooks *t)
{
    const char *s = getenv("FTUNE_TEST_KILL_AT_STEP"), *r = getenv("FTUNE_TEST_KILL_RANK");
    const char *g = getenv("FTUNE_TEST_KILL_SIGNAL");
    t->kill_at_step = s && *s ? strtoll(s, NULL, 10) : 0;
    t->kill_rank = r && *r ? atoi(r) : 0;
    t->kill_signal = g && *g ? atoi(g) : 0;
}

/* `ftune plan` with a sweep's flags (--grid, --adapters-per-pass): the sweep's plan, with the
 * adapters per pass (ftune sweep --plan). */
int ft_cmd_plan(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--grid", 6) || !strncmp(argv[i], "--adapters-per-pass", 19)) {
            char **av = malloc((size_t)(argc + 2) * sizeof *av);
            if (!av) {
                fprintf(stderr, "ftune: out of memory\n");
                return 1;
            }
            memcpy(av, argv, (size_t)argc * sizeof *av);
            av[argc] = "--plan";
            av[argc + 1] = NULL;
            int rc = ft_cmd_sweep(argc + 1, av);
            free(av);
            return rc;
        }
    return ft_cmd_train_ex(argc, argv, 1);
}

/* A bare --resume takes the newest intact checkpoint: each newer one it passed over is
 * damaged, and the user is told which and why before the run falls back. */
static void resume_note_skipped(const char *out, int64_t step)
{
    DIR *d = opendir(out);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = ft_ckpt_parse_name(e->d_name);
        char p[4200];
        if (s <= step || snprintf(p, sizeof p, "%s/%s", out, e->d_name) >= (int)sizeof p) continue;
        if (ft_ckpt_verify(p, NULL) < 0)
            fprintf(stderr, "ftune: --resume: %s is damaged (%s); resuming from the earlier intact " FT_CKPT_PREFIX "%lld\n",
                    p, ft_errmsg(), (long long)step);
    }
    closedir(d);
}

/* One run per output folder (issue 31): rank 0 takes out's lock before any checkpoint there is
 * read (the other ranks of a data-parallel run share rank 0's folder); the others wait for its
 * answer, since every rank of a sweep writes its own trials' folders under --out: none of them
 * starts before rank 0 holds the lock. Returns 0, or -1 after ft_cli_comm_fail (every rank ends). */
static int lock_out_dir(ft_comm *comm, const char *out, ft_dirlock *lk)
{
    int locked = 1;
    char msg[1300] = "";
    if (ft_comm_rank(comm) == 0 && ft_session_out_lock(lk, "--out", out) < 0) {
        locked = 0;
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
    }
    if (ft_comm_size(comm) > 1 && ft_comm_bcast(comm, &locked, sizeof locked, 0) < 0) {
        locked = 0;
        snprintf(msg, sizeof msg, "--out %s: %s", out, ft_errmsg());
    }
    if (locked) return 0;
    if (!msg[0]) /* a rank > 0: rank 0 prints its error and its abort ends this one */
        snprintf(msg, sizeof msg, "--out %s: rank 0 could not take the folder's lock", out);
    ft_cli_comm_fail(comm, msg); /* several ranks: all of them end here */
    return -1;
}

int ft_cmd_train_ex(int argc, char **argv, int plan_only)
{
    return ft_cmd_train_with(argc, argv, plan_only, NULL);
}

int ft_cmd_train_with(int argc, char **argv, int plan_only, const ft_train_runner *run)
{
    ft_train_cfg c;
    ft_train_defaults(&c);
    c.plan_only = plan_only;
    dropout_arg dropout = {c.lora.dropout, 0}; /* the method's default unless given */
    int quiet = 0;
    int64_t log_every = 0;
    int64_t threads = 0;
    const char *device = NULL;
    const char *resume = NULL;
    const char *tensorboard = NULL;
    const char *cuda_fused = NULL;
    ft_str_list data = {0};
    const ft_opt opts[] = {
        {"model", FT_OPT_STR, &c.model, "model folder (config.json + safetensors) or .gguf file", 0, "PATH"},
        {"data", FT_OPT_LIST, &data, "training data: JSON array or JSONL, gzip-compressed or not; - reads standard input, a pipe such as <(cmd) is read to its end; repeat it to train on several files (each with its own schema, --data-format auto), their examples joined in the order given, then shuffled and split as one; in --config a file or a list of files", 0, "FILE"},
        {"out", FT_OPT_STR, &c.out, "output folder for the PEFT adapter, metrics.jsonl, summary.json (default ftune-out)", 0, "DIR"},
        {"base-model-id", FT_OPT_STR, &c.base_model_id, "the base model's Hugging Face id (org/name[@REVISION]) for the adapter's base_model_name_or_path and model card, so AutoPeftModelForCausalLM and vLLM load the base by it (default: the id of a model from the Hugging Face cache, or the repository a GGUF's metadata names, else the --model path)", 0, "ID"},
        {"init-adapter", FT_OPT_STR, &c.init_adapter, "start from this PEFT LoRA adapter folder", 0, "DIR"},
        {"seq-len", FT_OPT_INT, &c.seq_len, "tokens per packed row (default min(2048, model max))"},
        {"batch-size", FT_OPT_INT, &c.batch_size, "rows per micro-batch: a budget of N x seq-len tokens (default 1); with --method dpo N full-length pairs, 2 x N x seq-len tokens"},
        {"grad-accum", FT_OPT_FN, &c.grad_accum, "micro-batches per optimizer step (default 1); auto: the offload planner picks the fewest that keep the GPU busy (QLoRA on a GPU)", opt_grad_accum, "N|auto"},
        {"balance-steps", FT_OPT_FLAG, &c.balance_steps, "order each epoch's micro-batches so that every optimizer step's (grad-accum x ranks of them) cost about the same, and data-parallel ranks reach the all-reduce together (windows of 16 steps sorted by tokens plus loss-target tokens weighted by the LM head, the steps shuffled in the window); the order is the same at any rank count with the same global batch (default: the packer's shuffled order)"},
        {"max-steps", FT_OPT_INT, &c.max_steps, "optimizer steps (overrides --epochs)"},
        {"epochs", FT_OPT_DBL, &c.epochs, "passes over the training data (default 1)"},
        {"lr", FT_OPT_DBL, &c.lr, "peak learning rate (default 2e-4)"},
        {"schedule", FT_OPT_FN, &c.schedule, "cosine | linear | constant (default cosine)", opt_schedule, "NAME"},
        {"warmup-steps", FT_OPT_INT, &c.warmup_steps, "linear warmup steps (default: --warmup-ratio)"},
        {"warmup-ratio", FT_OPT_DBL, &c.warmup_ratio, "warmup as a fraction of the steps (default 0.03)"},
        {"min-lr-ratio", FT_OPT_DBL, &c.min_lr_ratio, "final LR as a fraction of --lr (default 0)"},
        {"weight-decay", FT_OPT_DBL, &c.weight_decay, "AdamW decoupled weight decay (default 0)"},
        {"adam-beta1", FT_OPT_DBL, &c.adam_beta1, "AdamW beta1 (default 0.9)"},
        {"adam-beta2", FT_OPT_DBL, &c.adam_beta2, "AdamW beta2 (default 0.999)"},
        {"adam-eps", FT_OPT_DBL, &c.adam_eps, "AdamW epsilon (default 1e-8)"},
        {"max-grad-norm", FT_OPT_DBL, &c.max_grad_norm, "clip the global gradient norm (default 1.0; 0 = off)"},
        {"method", FT_OPT_FN, &c.method, "sft: supervised fine-tuning on instruction data (default) | dpo: Direct Preference Optimization on preference pairs (TRL's DPOTrainer: records with prompt/chosen/rejected, or chosen/rejected with the prompt implicit, or LLaMA-Factory's pairwise alpaca/sharegpt); --batch-size N then packs up to N full-length pairs (2 x N x seq-len tokens), the reference is the starting model", opt_method, "NAME"},
        {"dpo-beta", FT_OPT_FN, &c.dpo.beta, "DPO: beta, the strength of the pull toward the reference model (default 0.1)", opt_pos_ratio, "X"},
        {"dpo-loss", FT_OPT_FN, &c.dpo.loss_type, "DPO loss: sigmoid (DPO, default) | hinge (SLiC) | ipo | robust (with --dpo-label-smoothing); reference-free on per-token mean log-probabilities, as LLaMA-Factory's pref_loss: orpo (the chosen NLL + beta x the odds-ratio loss) | simpo (with --simpo-gamma)", ft_opt_dpo_loss, "NAME"},
        {"simpo-gamma", FT_OPT_DBL, &c.dpo.simpo_gamma, "--dpo-loss simpo: the target reward margin gamma (default 0.5)"},
        {"dpo-label-smoothing", FT_OPT_FN, &c.dpo.label_smoothing, "DPO robust loss: the assumed fraction of pairs whose preference is flipped, 0 <= X < 0.5 (default 0)", opt_nonneg, "X"},
        {"lora-r", FT_OPT_INT, &c.lora.r, "LoRA rank (default 16)"},
        {"lora-alpha", FT_OPT_FLOAT, &c.lora.alpha, "LoRA alpha (default 32)"},
        {"lora-dropout", FT_OPT_FN, &dropout, "dropout on the adapter input (default 0.05; 0 with --method dpo, as TRL's disable_dropout)", opt_dropout, "P"},
        {"use-rslora", FT_OPT_FLAG, &c.lora.use_rslora, "scale by alpha/sqrt(r) (rsLoRA)"},
        {"loraplus-lr-ratio", FT_OPT_FN, &c.loraplus_lr_ratio, "LoRA+: train the B matrices at X times the learning rate of A (the paper suggests 16; default: off, one lr)", opt_pos_ratio, "X"},
        {"neftune-noise-alpha", FT_OPT_FN, &c.neftune_noise_alpha, "NEFTune: add uniform noise of magnitude X/sqrt(seq_len*hidden_size) to the embeddings while training (the paper uses 5; default: off)", opt_nonneg, "X"},
        {"lora-target", FT_OPT_FN, &c.lora.targets, "modules: all-linear or a list like q_proj,v_proj (default all-linear)", opt_targets, "LIST"},
        {"data-format", FT_OPT_FN, &c.data_cfg.format, "auto | alpaca | messages | sharegpt | prompt-completion | text", ft_opt_data_format, "NAME"},
        {"chat-template", FT_OPT_FN, &c.data_cfg.chat_template, "auto | llama3 | llama3.1 | chatml | qwen3 | llama2 | mistral | zephyr | alpaca | jinja (the model's own template, rendered as transformers does)", ft_opt_chat_template, "NAME"},
        {"train-on-prompt", FT_OPT_FLAG, &c.data_cfg.train_on_prompt, "take the loss on prompt tokens too"},
        {"skip-bad-records", FT_OPT_FLAG, &c.data_cfg.skip_bad_records, "skip and count bad records instead of failing"},
        {"eval-fraction", FT_OPT_DBL, &c.data_cfg.eval_fraction, "held-out fraction of examples (default 0.05; ignored with --eval-data)"},
        {"eval-data", FT_OPT_STR, &c.eval_data, "held-out examples from this JSON array or JSONL file instead (a validation set; read as --data is, - or .gz too); every --data example then trains", 0, "FILE"},
        {"eval-max", FT_OPT_INT, &c.data_cfg.eval_max, "cap on held-out examples (default 200); with --eval-data the first N of FILE in file order"},
        {"eval-every", FT_OPT_INT, &c.eval_every, "evaluate every N steps (default: start and end)"},
        {"eval-prompts", FT_OPT_STR, &c.eval_prompts, "at every evaluation (the start, each --eval-every, the end) answer each prompt of FILE greedily with the adapter being trained, into OUT/samples.jsonl ({\"step\", \"prompt\", \"reply\"}), the report and, with --tensorboard, TensorBoard's text tab; FILE: JSONL or a JSON array of prompts as generate --prompts reads them (at most 64); training is unchanged by it", 0, "FILE"},
        {"eval-max-new-tokens", FT_OPT_INT, &c.eval_max_new_tokens, "new tokens per --eval-prompts reply (default 128)"},
        {"save-best", FT_OPT_FLAG, &c.save_best, "keep the adapter of the lowest eval loss so far in OUT/best/ (a PEFT folder, rewritten at each new best of the --eval-every evaluations and the final one; the step-0 eval is no candidate, as in transformers); OUT itself keeps the last step's adapter; summary.json names best_eval_loss, best_eval_step and best_adapter"},
        {"early-stopping-patience", FT_OPT_INT, &c.early_stopping_patience, "stop after N evaluations in a row (--eval-every) whose eval loss is not below the best by more than --early-stopping-threshold (transformers' EarlyStoppingCallback); the run then ends as a complete one (checkpoint, adapter, summary.json \"early_stopped\": true) (default 0: off)"},
        {"early-stopping-threshold", FT_OPT_DBL, &c.early_stopping_threshold, "the improvement in eval loss that resets --early-stopping-patience (default 0)"},
        {"seed", FT_OPT_FN, &c.seed, "seed for shuffling, LoRA init and dropout (default 42)", ft_opt_u64, "N"},
        {"save-every", FT_OPT_INT, &c.save_every, "checkpoint OUT/checkpoint-<step>/ every N steps (default 200; 0: only at the end); also at the end and on SIGINT/SIGTERM"},
        {"keep", FT_OPT_INT, &c.keep, "keep the newest N checkpoints (default 2; 0: all)"},
        {"resume", FT_OPT_FN, &resume, "continue a run from checkpoint DIR (default: the latest in --out), bit-identical to an uninterrupted run; flags that shape the run (seq-len, batch, grad-accum, steps, schedule, optimizer, LoRA, seed, data) must not change; --threads, eval, log and checkpoint flags may", opt_resume, "[DIR]"},
        {"max-bad-steps", FT_OPT_INT, &c.max_bad_steps, "a step with a NaN/Inf loss or gradient norm is skipped (no update, counted as bad_steps); stop after N in a row (default 5)"},
        {"threads", FT_OPT_INT, &threads, "CPU threads (default: all cores)"},
        {"device", FT_OPT_STR, &device, FT_DEVICE_HELP, 0, "DEV"},
        {"quant", FT_OPT_FN, &c.quant, "base linear weights: nf4 (QLoRA: bitsandbytes NF4 with double quantization, kept in a pack file and dequantized per layer) | bf16 (unquantized; on a GPU whose budget cannot hold every layer, streamed from a bf16 pack file by the offload planner) | auto (default: bf16, nf4 when the bf16 base does not fit the GPU budget); the plan line says which was chosen", opt_quant, "TYPE"},
        {"quant-correction", FT_OPT_FN, &c.quant_correction, "with --quant nf4: a frozen rank-r (the LoRA rank) correction of the NF4 error added to the base before training, so the adapter learns the task rather than repairing the quantization; calibrated: least output error on --quant-correction-tokens training tokens (CLoQ), weight: least weight error (LoftQ with the NF4 base fixed), none (default). Needs the unquantized weights; written to OUT/quant_correction; the adapter in OUT stays one for the original weights", opt_qcorr, "NAME"},
        {"quant-correction-tokens", FT_OPT_INT, &c.quant_correction_tokens, "calibration tokens of --quant-correction calibrated (default 4096, whole micro-batches)"},
        {"cache-dir", FT_OPT_STR, &c.cache_dir, "where pack files are kept (--quant nf4, or a streamed bf16 base), reused while the model is unchanged (default $XDG_CACHE_HOME/ftune/packs or ~/.cache/ftune/packs)", 0, "DIR"},
        {"gpu-mem", FT_OPT_FN, &c.gpu_mem, "GPU memory the run may use, e.g. 24G (default: all that is free); the run is refused up front, naming the smallest budget that works, if it cannot fit", ft_opt_bytes, "SIZE"},
        {"host-mem", FT_OPT_FN, &c.host_mem, "host memory for the offload tiers (pinned pool of base layers and staging), e.g. 48G (default: available memory less 4 GiB); layers beyond it are read from the pack file (NVMe, io_uring) at each visit", ft_opt_bytes, "SIZE"},
        {"tensorboard", FT_OPT_STR, &tensorboard, "also write the metrics as TensorBoard event files into DIR (default OUT/tb), flushed at every log line: tensorboard --logdir DIR", 0, "[DIR]"},
        {"timeline", FT_OPT_STR, &c.timeline, "draw the second step's timeline (compute, H2D copies, disk reads per layer) into this SVG file", 0, "FILE"},
        {"profile", FT_OPT_FLAG, &c.profile, "time every GPU op after the first step and print the per-op table at the end"},
        {"cuda-fused", FT_OPT_STR, &cuda_fused, "CUDA: use these fused kernels, a comma list of adamw (the multi-tensor AdamW, one launch), all, none (default none: they are verified on the CPU emulation, not yet measured on a GPU; docs/gpu.md)", 0, "LIST"},
        {"log-every", FT_OPT_INT, &log_every, "plain-output log line every N steps"},
        {"bus-gbps", FT_OPT_DBL, &c.bus_gbps, "ftune plan under mpirun/srun: the all-reduce's bus bandwidth in GB/s (nccl-tests' busbw) to predict its time per step (docs/distributed.md)"},
        {"quiet", FT_OPT_FLAG, &quiet, "print only warnings and errors"},
        {NULL},
    };
    /* a bare --resume or --tensorboard takes no value: make it --resume= for the table parser */
    char **av = malloc((size_t)(argc + 1) * sizeof *av);
    if (!av) {
        fprintf(stderr, "ftune: out of memory\n");
        return 1;
    }
    for (int i = 0; i < argc; i++)
        av[i] = !strcmp(argv[i], "--resume") && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))
                    ? "--resume="
                : !strcmp(argv[i], "--tensorboard") && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))
                    ? "--tensorboard=" : argv[i];
    av[argc] = NULL;
    int rc = ft_args_cmd(opts, argc, av, NULL);
    free(av);
    if (rc >= 0) {
        ft_str_list_free(&data);
        return rc;
    }
    {
        ft_train_cfg def;
        ft_train_defaults(&def);
        if (c.method != FT_TRAIN_METHOD_DPO && (c.dpo.beta != def.dpo.beta || c.dpo.loss_type != def.dpo.loss_type ||
                                          c.dpo.label_smoothing != def.dpo.label_smoothing ||
                                          c.dpo.simpo_gamma != def.dpo.simpo_gamma)) {
            ft_str_list_free(&data);
            fprintf(stderr, "ftune: --dpo-beta, --dpo-loss, --dpo-label-smoothing and --simpo-gamma apply to --method dpo (this run: sft)\n");
            return 2;
        }
        if (c.dpo.loss_type != FT_DPO_SIMPO && c.dpo.simpo_gamma != def.dpo.simpo_gamma) {
            ft_str_list_free(&data);
            fprintf(stderr, "ftune: --simpo-gamma applies to --dpo-loss simpo (this run: %s)\n",
                    ft_dpo_loss_name(c.dpo.loss_type));
            return 2;
        }
    }
    /* the dropout default depends on the method: TRL's DPOConfig turns dropout off */
    c.lora.dropout = dropout.set ? dropout.p : c.method == FT_TRAIN_METHOD_DPO ? 0.0f : dropout.p;
    c.data = data.v;
    c.n_data = data.n;
    if (!c.model || !c.n_data) {
        ft_str_list_free(&data);
        const char *cmd = run ? run->cmd : plan_only ? "plan" : "train";
        fprintf(stderr, "ftune: %s needs --model and --data (see ftune %s --help)\n", cmd, cmd);
        return 2;
    }
    { /* standard input can be read once: at most one input may be "-" */
        const char *first = NULL;
        for (int64_t i = 0; i < c.n_data + 1; i++) {
            const char *flag = i < c.n_data ? "--data" : "--eval-data";
            if (!ft_input_is_stdin(i < c.n_data ? c.data[i] : c.eval_data)) continue;
            if (first) {
                if (!strcmp(first, flag))
                    fprintf(stderr, "ftune: %s - is given twice: standard input can be read once (give the other input as a file, or as <(cmd))\n", flag);
                else
                    fprintf(stderr, "ftune: %s - and %s - both name standard input, which can be read once (give one of them as a file, or as <(cmd))\n", first, flag);
                ft_str_list_free(&data);
                return 2;
            }
            first = flag;
        }
    }
    char model_buf[4096], init_buf[4096];
    if (ft_session_model_path(&c.model, model_buf, sizeof model_buf, quiet) ||
        ft_session_hub_path(&c.init_adapter, init_buf, sizeof init_buf, quiet, "init-adapter")) {
        ft_str_list_free(&data);
        return 1;
    }
    if (!plan_only) { /* no output over an input (src/core/paths.h) */
        const ft_path_arg outs[] = {{"--out", c.out, NULL}, {"--out", c.out, "adapter_model.safetensors"},
                                    {"--out", c.out, "adapter_config.json"}, {"--out", c.out, "metrics.jsonl"},
                                    {"--out", c.out, "summary.json"}, {"--timeline", c.timeline, NULL}};
        const ft_path_arg ins[] = {{"--model", c.model, NULL}, {"--init-adapter", c.init_adapter, NULL},
                                   {"--eval-data", c.eval_data, NULL}};
        int bad = ft_paths_check(outs, 6, ins, 3) < 0;
        for (int64_t i = 0; i < c.n_data && !bad; i++)
            bad = ft_paths_check(outs, 6, &(ft_path_arg){"--data", c.data[i], NULL}, 1) < 0;
        if (bad) {
            fprintf(stderr, "ftune: %s\n", ft_errmsg());
            ft_str_list_free(&data);
            return 1;
        }
    }
    c.threads = (int)threads;
    c.device = ft_session_device(device);
    /* data-parallel: the ranks of mpirun / srun (dist_env.h); rank 0 alone prints progress */
    ft_comm *comm = NULL;
    if (ft_cli_comm_open(&comm)) {
        ft_str_list_free(&data);
        return 1;
    }
    ft_dirlock out_lock = {.fd = -1};
    if (!plan_only && !(run && run->no_out_lock) && lock_out_dir(comm, c.out, &out_lock) < 0) {
        ft_str_list_free(&data);
        rc = 1;
        goto done;
    }
    char latest[4200];
    if (resume && !*resume) {
        int64_t step;
        int found = ft_ckpt_find_latest(c.out, latest, sizeof latest, &step);
        if (found <= 0) {
            fprintf(stderr, "ftune: --resume: no complete checkpoint in %s (looked for %s/" FT_CKPT_PREFIX "<step>/%s%s); run without --resume to start, or name one with --resume DIR\n",
                    c.out, c.out, found < 0 ? ": " : "", found < 0 ? ft_errmsg() : "");
            ft_str_list_free(&data);
            rc = 2;
            goto done;
        }
        resume = latest;
        resume_note_skipped(c.out, step);
    }
    c.resume = resume;
    char tb_dir[4200];
    if (tensorboard && !ft_tfevents_available()) {
        fprintf(stderr, "ftune: --tensorboard: this ftune was built without protobuf-c (Debian: libprotobuf-c-dev protobuf-c-compiler; install them and rebuild)\n");
        ft_str_list_free(&data);
        rc = 2;
        goto done;
    }
    if (tensorboard && !*tensorboard && ft_path_join(tb_dir, sizeof tb_dir, c.out, "tb") == 0)
        tensorboard = tb_dir;
    c.tensorboard = tensorboard;
    /* test hook (fault injection): checkpoint writes fail with ENOSPC after N bytes */
    const char *fail = getenv("FTUNE_FAIL_WRITE_AFTER");
    if (fail && *fail) ft_ckpt_fail_writes_after(strtoll(fail, NULL, 10));
    if (cuda_fused && fused_mask(cuda_fused, &c.cuda_fused) < 0) {
        ft_str_list_free(&data);
        rc = 2;
        goto done;
    }
    char cache_buf[4096];
    c.cache_dir = ft_env_pack_cache_dir(c.cache_dir, cache_buf, sizeof cache_buf);
    ft_env_tune(&c.tune);
    if (test_hooks(&c.test) < 0) {
        ft_str_list_free(&data);
        rc = 2;
        goto done;
    }
    test_kill_hook(&c.test);
    c.comm = comm;
    ft_progress prog;
    ft_progress_init(&prog, quiet || ft_comm_rank(comm) > 0);
    prog.log_every = log_every;
    if (run) { /* another command over the same training options (ftune sweep) */
        rc = run->fn(&c, &prog, run->user);
        ft_str_list_free(&data);
        ft_progress_flush(&prog);
        goto done;
    }
    ft_train_result res;
    c.stop = ft_session_signals_install();
    rc = ft_train_run(&c, ft_progress_cb, &prog, &res);
    ft_str_list_free(&data);
    int sig = *c.stop;
    ft_session_signals_restore();
    ft_progress_flush(&prog);
    if (rc < 0) {
        ft_cli_comm_fail(comm, ft_errmsg()); /* several ranks: all of them end here */
        if (res.checkpoint[0] && rc != FT_E_NUMERIC)
            print_resume_hint("ftune: to continue from the last checkpoint: ", argc, argv, res.checkpoint);
        rc = 1;
        goto done;
    }
    const int rank = ft_comm_rank(comm);
    ft_comm_free(comm);
    comm = NULL;
    if (rank > 0) { /* the stop and done lines are rank 0's */
        rc = res.stopped ? 128 + (sig ? sig : SIGINT) : 0;
        goto done;
    }
    if (res.stopped) {
        const char *name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
        if (res.checkpoint[0]) {
            char lead[4600];
            snprintf(lead, sizeof lead, "ftune: stopped by %s after step %lld/%lld, checkpoint %s; resume with: ",
                     name, (long long)res.steps, (long long)res.total_steps, res.checkpoint);
            print_resume_hint(lead, argc, argv, res.checkpoint);
        } else {
            fprintf(stderr, "ftune: stopped by %s before the first step; nothing to save: run the same command to start\n", name);
        }
        rc = 128 + (sig ? sig : SIGINT);
        goto done;
    }
    rc = 0;
    if (plan_only) goto done;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (!quiet) {
        char ev[96] = "no held-out set"; /* --eval-fraction 0 without --eval-data: no eval loss */
        if (!isnan(res.initial_eval_loss) || !isnan(res.final_eval_loss))
            snprintf(ev, sizeof ev, "eval loss %.4f -> %.4f", res.initial_eval_loss, res.final_eval_loss);
        fprintf(stderr, "ftune: done: %lld steps, %lld tokens (%lld with a loss target) in %.1f s (%.0f tok/s); %s; peak host RSS %.2f GiB\n",
                (long long)res.steps, (long long)res.tokens, (long long)res.trained_tokens, res.time_s, res.tokens_per_s,
                ev, ru.ru_maxrss / 1048576.0);
    }
done:
    ft_dirlock_release(&out_lock);
    ft_comm_free(comm);
    return rc;
}
