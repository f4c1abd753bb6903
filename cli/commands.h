/* commands.h - ftune subcommands. Each returns the process exit code (0 success, 1 error,
 * 2 usage). Only cli/ prints to the terminal and decides exit codes (STYLE C2). */
#ifndef FT_COMMANDS_H
#define FT_COMMANDS_H

int ft_cmd_train(int argc, char **argv);    /* ftune [train] --model DIR --data FILE ... */
int ft_cmd_eval(int argc, char **argv);     /* ftune eval --model DIR --adapter DIR --data FILE */
int ft_cmd_tokenize(int argc, char **argv); /* ftune tokenize --model DIR (--text S | --texts F | --data F) */
int ft_cmd_logits(int argc, char **argv);   /* ftune logits --model DIR --ids 1,2,3 --out F */
int ft_cmd_generate(int argc, char **argv); /* ftune generate --model DIR --prompt S ... */
int ft_cmd_export(int argc, char **argv);   /* ftune export --adapter DIR --format gguf --out FILE */
int ft_cmd_merge(int argc, char **argv);    /* ftune merge --model M --adapter DIR --out DIR */
int ft_cmd_pack(int argc, char **argv);     /* ftune pack --model M [--quant nf4|bf16] [--cache-dir D] */
int ft_cmd_init_model(int argc, char **argv); /* ftune init-model --config FILE --out DIR [--pack] */
int ft_cmd_plan(int argc, char **argv);     /* ftune plan --model M [train options]: the offload plan */
int ft_cmd_train_ex(int argc, char **argv, int plan_only); /* train, or with plan_only = 1 plan */
int ft_cmd_sweep(int argc, char **argv);    /* ftune sweep --model M --data D --out DIR --grid k=v,... */

struct ft_train_cfg;
struct ft_progress;
/* A command that takes `ftune train`'s options (parsed, checked and completed as train does:
 * model path, devices, test hooks) and runs something else with them: fn gets the settings
 * and the progress display and returns the exit code. cmd names the command in messages. */
typedef struct ft_train_runner {
    const char *cmd;
    int (*fn)(struct ft_train_cfg *c, struct ft_progress *prog, void *user);
    void *user;
    int no_out_lock; /* 1: the run writes nothing (sweep --plan): --out is not locked */
} ft_train_runner;
/* ft_cmd_train_ex, handing the parsed settings to run (NULL: train) */
int ft_cmd_train_with(int argc, char **argv, int plan_only, const ft_train_runner *run);
int ft_cmd_bench(int argc, char **argv);    /* ftune bench io|step ...: I/O rates, one-step timeline */
int ft_cmd_report(int argc, char **argv);   /* ftune report DIR [DIR ...] [--out FILE]: HTML report */

#endif
