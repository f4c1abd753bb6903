/* main.c - ftune entry point: dispatches subcommands. `ftune --model DIR --data FILE` is
 * `ftune train ...`. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/omp_env.h"
#include "src/core/json.h"

#define FTUNE_VERSION "0.1.0"

static void usage(FILE *f)
{
    fprintf(f,
        "ftune %s - LoRA fine-tuning for Llama-family models\n\n"
        "usage: ftune [train] --model DIR|FILE.gguf --data FILE [options]   train a LoRA adapter\n"
        "       ftune eval --model M --data FILE [--adapter DIR]           loss and perplexity\n"
        "       ftune tokenize --model M (--text S | --texts FILE | --data FILE)\n"
        "       ftune generate --model M [--adapter DIR] --prompt S        reply (chat template)\n"
        "       ftune generate --model M --prompts F.jsonl [--out R.jsonl]  many prompts, decoded together\n"
        "       ftune generate --model M [--adapter DIR] --chat            a conversation on stdin\n"
        "       ftune export --adapter DIR --format gguf --out FILE        GGUF LoRA for llama.cpp\n"
        "       ftune merge --model M --adapter DIR --out DIR [--format gguf]  merged model\n"
        "       ftune logits --model M --ids 1,2,3 [--out FILE]            debug: raw logits\n"
        "       ftune pack --model DIR [--quant nf4|bf16]                  build the layer pack (QLoRA base)\n"
        "       ftune init-model --config config.json --out DIR [--pack]   random weights (benchmarks)\n"
        "       ftune plan --model M --data FILE [train options]           where weights and checkpoints go\n"
        "       ftune sweep --model M --data FILE --out DIR --grid K=V1,V2  many adapters per pass, pruned\n"
        "       ftune bench io --path FILE | bench step --model M ...     disk/PCIe rates, step timeline\n"
        "       ftune report DIR [DIR ...] [--out FILE]                    HTML report of runs (charts)\n"
        "       ftune --version | --help\n\n"
        "`ftune train --help` lists the training options; `ftune COMMAND --help` each command's.\n", FTUNE_VERSION);
}

int main(int argc, char **argv)
{
    ft_omp_env_reexec(argv); /* returns only when OpenMP's spin count is set already */
    ft_json_init();          /* cJSON allocation failures reported as out of memory */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--help") || !strcmp(c, "-h") || !strcmp(c, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(c, "--version") || !strcmp(c, "version")) {
        printf("ftune %s\n", FTUNE_VERSION);
        return 0;
    }
    int rc = 0, known = 1;
    if (!strcmp(c, "train")) rc = ft_cmd_train(argc - 1, argv + 1);
    else if (!strcmp(c, "eval")) rc = ft_cmd_eval(argc - 1, argv + 1);
    else if (!strcmp(c, "tokenize")) rc = ft_cmd_tokenize(argc - 1, argv + 1);
    else if (!strcmp(c, "logits")) rc = ft_cmd_logits(argc - 1, argv + 1);
    else if (!strcmp(c, "generate")) rc = ft_cmd_generate(argc - 1, argv + 1);
    else if (!strcmp(c, "export")) rc = ft_cmd_export(argc - 1, argv + 1);
    else if (!strcmp(c, "merge")) rc = ft_cmd_merge(argc - 1, argv + 1);
    else if (!strcmp(c, "pack")) rc = ft_cmd_pack(argc - 1, argv + 1);
    else if (!strcmp(c, "init-model")) rc = ft_cmd_init_model(argc - 1, argv + 1);
    else if (!strcmp(c, "plan")) rc = ft_cmd_plan(argc - 1, argv + 1);
    else if (!strcmp(c, "sweep")) rc = ft_cmd_sweep(argc - 1, argv + 1);
    else if (!strcmp(c, "bench")) rc = ft_cmd_bench(argc - 1, argv + 1);
    else if (!strcmp(c, "report")) rc = ft_cmd_report(argc - 1, argv + 1);
    else if (c[0] == '-') rc = ft_cmd_train(argc, argv); /* flags only: train */
    else known = 0;
    if (!known) {
        fprintf(stderr, "ftune: unknown command '%s' (try ftune --help)\n", c);
        return 2;
    }
    if (rc != 0) {
        /* a failed command ends here, its outputs already safe (written to a temporary name
         * and renamed, or not at all): flush, then _exit, so that nothing run by exit() (a
         * library's destructor joining a thread stuck in an allocation) can hang the end */
        fflush(NULL);
        _exit(rc);
    }
    return 0;
}
