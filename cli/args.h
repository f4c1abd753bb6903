/* args.h - table-driven flag parsing shared by the subcommands, with --config FILE (a JSON
 * object whose keys mirror the flags: "lora_r" or "lora-r" for --lora-r; flags given on
 * the command line override it). */
#ifndef FT_ARGS_H
#define FT_ARGS_H

#include <stdint.h>
#include <stdio.h>

enum ft_opt_type { FT_OPT_STR, FT_OPT_INT, FT_OPT_DBL, FT_OPT_FLOAT, FT_OPT_FLAG, FT_OPT_FN, FT_OPT_LIST };

/* Destination of an FT_OPT_LIST option: its values in order. The flag may be repeated; the
 * --config key may be one string or a JSON array of strings; flags given on the command line
 * replace the config's values rather than add to them. The strings point into argv or the
 * parsed config (kept for the process); free v with ft_str_list_free. */
typedef struct ft_str_list {
    const char **v;
    int64_t n, cap;
    int from_cli;          /* set once a command-line flag has been added */
} ft_str_list;

void ft_str_list_free(ft_str_list *l);

typedef struct ft_opt {
    const char *name;      /* without the leading "--" */
    int type;
    void *dst;             /* const char **, int64_t *, double *, float *, int *, ft_str_list * */
    const char *help;
    int (*fn)(const char *val, void *dst, char *err, size_t err_n); /* FT_OPT_FN */
    const char *metavar;
} ft_opt;

/* Parses argv[1..] against opts (terminated by a {NULL} entry). --config FILE is handled
 * first (its values are set before the flags'). On error writes one line to err and returns -1; returns 1 if --help was given
 * (usage printed to stdout), 0 otherwise. */
int ft_args_parse(const ft_opt *opts, int argc, char **argv, char *err, size_t err_n);

/* ft_args_parse for a command's main: prints a parse error as "ftune: [cmd: ]MESSAGE" on
 * stderr. Returns -1 when the command goes on, else the exit status to return at once: 0
 * after --help (usage printed), 2 after a usage error. cmd may be NULL (no prefix). */
int ft_args_cmd(const ft_opt *opts, int argc, char **argv, const char *cmd);

/* FT_OPT_FN parser for memory sizes into an int64_t of bytes: "24G", "24GiB", "512M",
 * "1.5T" (K/M/G/T and KiB..TiB are binary, as nvidia-smi and the --gpu-mem of other tools),
 * "24GB" (decimal), or plain bytes. */
int ft_opt_bytes(const char *v, void *dst, char *err, size_t n);

/* Prints the option table and the --config FILE line (an options file). */
void ft_args_usage(FILE *f, const ft_opt *opts);
/* The option table alone (a command whose --config means something else). */
void ft_args_usage_table(FILE *f, const ft_opt *opts);

#endif
