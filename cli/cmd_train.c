/* cmd_train.c - `ftune [train] --model M --data F [options]`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/lora.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "src/core/err.h"
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

static int opt_format(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_data_format_parse(v);
    if (k < 0) {
        snprintf(err, n, "unknown data format '%s' (auto, alpaca, messages, sharegpt, prompt-completion, text)", v);
        return -1;
    }
    *(int *)dst = k;
    return 0;
}

static int opt_template(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_chat_template_parse(v);
    if (k < 0) {
        snprintf(err, n, "unknown chat template '%s' (auto, llama3, chatml, llama2, alpaca)", v);
        return -1;
    }
    *(int *)dst = k;
    return 0;
}

static int opt_u64(const char *v, void *dst, char *err, size_t n)
{
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end) {
        snprintf(err, n, "expected a non-negative integer, got '%s'", v);
        return -1;
    }
    *(uint64_t *)dst = x;
    return 0;
}

int ft_cmd_train(int argc, char **argv)
{
    ft_train_cfg c;
    ft_train_defaults(&c);
    int quiet = 0;
    int64_t log_every = 0;
    int64_t threads = 0;
    const ft_opt opts[] = {
        {"model", FT_OPT_STR, &c.model, "model folder (config.json + safetensors) or .gguf file", 0, "PATH"},
        {"data", FT_OPT_STR, &c.data, "training data: JSON array or JSONL", 0, "FILE"},
        {"out", FT_OPT_STR, &c.out, "output folder for the PEFT adapter, metrics.jsonl, summary.json (default ftune-out)", 0, "DIR"},
        {"init-adapter", FT_OPT_STR, &c.init_adapter, "start from this PEFT LoRA adapter folder", 0, "DIR"},
        {"seq-len", FT_OPT_INT, &c.seq_len, "tokens per packed row (default min(2048, model max))"},
        {"batch-size", FT_OPT_INT, &c.batch_size, "rows per micro-batch (default 1)"},
        {"grad-accum", FT_OPT_INT, &c.grad_accum, "micro-batches per optimizer step (default 1)"},
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
        {"lora-r", FT_OPT_INT, &c.lora.r, "LoRA rank (default 16)"},
        {"lora-alpha", FT_OPT_FLOAT, &c.lora.alpha, "LoRA alpha (default 32)"},
        {"lora-dropout", FT_OPT_FLOAT, &c.lora.dropout, "dropout on the adapter input (default 0.05)"},
        {"use-rslora", FT_OPT_FLAG, &c.lora.use_rslora, "scale by alpha/sqrt(r) (rsLoRA)"},
        {"lora-target", FT_OPT_FN, &c.lora.targets, "modules: all-linear or a list like q_proj,v_proj (default all-linear)", opt_targets, "LIST"},
        {"data-format", FT_OPT_FN, &c.data_cfg.format, "auto | alpaca | messages | sharegpt | prompt-completion | text", opt_format, "NAME"},
        {"chat-template", FT_OPT_FN, &c.data_cfg.chat_template, "auto | llama3 | chatml | llama2 | alpaca", opt_template, "NAME"},
        {"train-on-prompt", FT_OPT_FLAG, &c.data_cfg.train_on_prompt, "take the loss on prompt tokens too"},
        {"skip-bad-records", FT_OPT_FLAG, &c.data_cfg.skip_bad_records, "skip and count bad records instead of failing"},
        {"eval-fraction", FT_OPT_DBL, &c.data_cfg.eval_fraction, "held-out fraction of examples (default 0.05)"},
        {"eval-max", FT_OPT_INT, &c.data_cfg.eval_max, "cap on held-out examples (default 200)"},
        {"eval-every", FT_OPT_INT, &c.eval_every, "evaluate every N steps (default: start and end)"},
        {"seed", FT_OPT_FN, &c.seed, "seed for shuffling, LoRA init and dropout (default 42)", opt_u64, "N"},
        {"threads", FT_OPT_INT, &threads, "CPU threads (default: all cores)"},
        {"log-every", FT_OPT_INT, &log_every, "plain-output log line every N steps"},
        {"quiet", FT_OPT_FLAG, &quiet, "print only errors"},
        {NULL},
    };
    char err[1024];
    int rc = ft_args_parse(opts, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) {
        fprintf(stderr, "ftune: %s\n", err);
        return 2;
    }
    if (!c.model || !c.data) {
        fprintf(stderr, "ftune: train needs --model and --data (see ftune train --help)\n");
        return 2;
    }
    c.threads = (int)threads;
    ft_progress prog;
    ft_progress_init(&prog, quiet);
    prog.log_every = log_every;
    ft_train_result res;
    rc = ft_train_run(&c, ft_progress_cb, &prog, &res);
    ft_progress_flush(&prog);
    if (rc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    if (!quiet)
        fprintf(stderr, "ftune: done: %lld steps, %lld tokens (%lld with a loss target) in %.1f s (%.0f tok/s); eval loss %.4f -> %.4f\n",
                (long long)res.steps, (long long)res.tokens, (long long)res.trained_tokens, res.time_s, res.tokens_per_s,
                res.initial_eval_loss, res.final_eval_loss);
    return 0;
}
