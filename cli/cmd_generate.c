/* cmd_generate.c - `ftune generate --model M [--adapter DIR] --prompt S ...`: a reply of the
 * model (and adapter) to one prompt, streamed to stdout as it is decoded.
 *
 * The prompt goes through the model's chat template with the generation prompt (unless
 * --raw), is prefilled in one batched forward (chunks of FT_GEN_CHUNK_DEFAULT tokens when
 * longer), then tokens are chosen one by one (greedy by default; --temperature > 0 samples,
 * with --top-k / --top-p / --min-p; --repetition-penalty for either; src/infer/sample.h) and
 * each runs one forward against the KV cache, until an EOS or end-of-turn token, a --stop
 * string or --max-new-tokens. Text is printed as whole UTF-8 characters become available;
 * speeds go to stderr. --json prints one JSON object instead (prompt and generated ids, text,
 * stop reason, timings) for scripts and tests.
 *
 * --stop STR (repeatable, up to FT_GEN_MAX_STOP_STR; in --config a string or a list) as vLLM's
 * SamplingParams.stop: the reply ends as soon as its decoded text (special tokens skipped,
 * whole UTF-8 characters) contains one of them, and its text stops before that string (the
 * string is not included); "stop": "stop_string" and "stop_reason": the string that matched
 * (vLLM's CompletionOutput.stop_reason). Its ids and new_tokens still count every token
 * generated, the one(s) that completed the string included (vLLM keeps them in token_ids).
 * When one token completes two of them, the one that ends first wins, then the one listed
 * first (vLLM's check_stop_strings takes the first listed that the new text completes).
 * Streaming holds back the longest end of the text that begins a stop string until the next
 * tokens settle it, so that nothing printed is later cut (as vLLM and llama.cpp's server do).
 *
 * --prompts FILE answers many prompts in one process: the model, adapter and KV cache are
 * loaded once (the cache sized for the longest prompt), every record of FILE (JSONL or a JSON
 * array; ft_gen_req_parse in src/infer/gen_prompt.h lists the schemas) is read and encoded
 * before anything is generated, so that a bad record stops the run with its line (gen_prompts.c);
 * up to --batch records are decoded together (src/infer/gen_env.h ft_gen_batch), each in its own
 * KV cache row (a sequence), reset when a record takes it. One JSON line per record goes to stdout, in input order:
 *   {"index", "prompt", "reply", "reference"?, "prompt_tokens", "new_tokens",
 *    "stop" ("stop_token" | "stop_string" | "length", as --json), "stop_reason"? (the --stop
 *    string, with "stop_string"; the token id, with "stop_token" when the token is one of the
 *    record's "stop_token_ids" or --stop-token-ids, not the EOS), "seconds", "seed"? (when
 *    sampling)}
 * ("seconds": from the start of the record's prefill to its last token, the records decoded
 * alongside it included)
 * or to --out FILE, written as FILE.tmp.PID and renamed at the end (an interrupted run leaves
 * no partial FILE). Record i samples with ft_gen_record_seed(seed, i) (record 0 with the
 * seed itself), so its reply is that of --prompt with that --seed.
 * A record (an object) may set its own "max_new_tokens" (or "max_tokens"), "temperature",
 * "top_p", "top_k", "min_p", "repetition_penalty", "stop" (a string or a list), "seed" and
 * "stop_token_ids" (a list of ids: --stop-token-ids) (ft_gen_req_parse), as
 * vLLM's LLM.generate takes one SamplingParams per prompt: each
 * replaces the flag for that record only, so its line is that of --prompt with the flags so
 * changed ("seed": its own when it sets one; "seed" is written when the record samples). Each
 * KV cache holds the largest prompt + new tokens of any record; each sequence samples with its
 * record's settings and draws (one ft_sampler, its cfg and PRNG swapped per sequence), and keeps
 * the ids it holds when any record has a repetition penalty.
 *
 * --chat holds a conversation (gen_chat.c): each line of standard input is a user turn (a
 * line ending in a backslash goes on with the next one, the backslash becoming a newline),
 * each reply streams to stdout as --prompt's does (a newline after it; an empty reply is an
 * empty line), and one line of statistics per turn goes to stderr ("turn N: P prompt tokens
 * (C from the cache, ...); R reply tokens ... tok/s; stop: ...", none with --quiet); "> " is
 * printed on stderr when standard input is a terminal. Commands: /exit (or end of input)
 * quits with 0, /reset starts a new conversation (the --system message kept), /help lists
 * them, another /word is refused with a message, and "//text" sends "/text". Each turn renders
 * the whole conversation as a --prompts record {"messages": [...]} with the same turns (so
 * its ids, and its greedy reply, are that record's), then prefills only the tokens after the
 * longest common prefix with what the KV cache holds (ft_gen_truncate_seq), as llama.cpp's
 * conversation mode does. The cache is sized once for --ctx-size tokens (default the model's
 * max_position_embeddings, at most 4096); when a turn's prompt + --max-new-tokens would not
 * fit, the oldest user/assistant exchanges are dropped (said on stderr; the system message
 * kept), and a message too long alone is refused while the chat goes on. One sampler serves
 * the whole chat (--seed, else the clock's, printed once); --repetition-penalty sees every
 * id of the conversation. SIGINT during a reply ends it (what was generated stays in the
 * conversation) and returns to the prompt; SIGINT at the prompt quits (exit 130). --chat
 * does not go with --prompt, --prompts, --raw, --json, --out or --batch (exit 2).
 *
 * --quant nf4 generates on the base a QLoRA adapter was trained on: the model's NF4 pack
 * (built or reused under --cache-dir, as `ftune train --quant nf4` and `ftune eval --quant
 * nf4`), with the run's --quant-correction when the adapter's run had one, and no fp32 copy of
 * the model in memory; each token dequantizes every layer's block (on the CPU into fp32; on a
 * GPU into bf16, or the fused NF4 GEMM), the pack held in memory (on a GPU placed within
 * --gpu-mem / --host-mem by the offload planner, as training places it: the layers beyond the
 * budget are streamed at every token). A folder that holds only a pack (init-model --pack)
 * is served the same way without the flag. On a GPU the bf16 base also goes through the
 * executor: its bf16 weight copies, as training reads them (no fp32 copy on the device).
 *
 * Defaults: greedy decoding (temperature 0), so that a run is reproducible and two adapters
 * can be compared on the same prompt. llama.cpp's CLI samples by default (temperature 0.8,
 * top-k 40, top-p 0.95, plus min-p 0.05); `--temperature 0.8 --top-k 40 --top-p 0.95` is
 * that setting without min-p. Without --seed a sampling run picks a seed from the clock
 * and prints it on stderr.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/model/lora.h"
#include "adapters/peft.h"
#include "cli/args.h"
#include "cli/opt_parse.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/paths.h"
#include "src/template/chat.h"
#include "src/data/dataset.h"
#include "src/data/records.h"
#include "src/infer/generate.h"
#include "src/infer/sample.h"
#include "src/infer/stop_text.h"
#include "cli/gen_cli.h"

static int print_json(const ft_gen_env *e, const gen_opts *o, int tmpl, const ft_gen_result *r)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "template", o->raw ? "raw" : ft_chat_template_name(tmpl));
    cJSON_AddItemToObject(j, "prompt_ids", gen_ids_json(r->prompt_ids, r->n_prompt));
    cJSON_AddItemToObject(j, "ids", gen_ids_json(r->out_ids, r->n_out));
    cJSON_AddStringToObject(j, "text", r->text ? r->text : "");
    cJSON_AddStringToObject(j, "stop", gen_stop_name(r));
    if (r->stop == FT_GEN_STOP_STRING) cJSON_AddStringToObject(j, "stop_reason", o->stop.v[r->stop_str]);
    /* a --stop-token-ids token: its id, as the --prompts lines (not for the EOS) */
    if (r->stop == FT_GEN_STOP_TOKEN && r->stop_tok != ft_tok_eos(e->tok) &&
        ft_gen_id_listed(o->stop_ids.v, o->stop_ids.n, r->stop_tok))
        cJSON_AddNumberToObject(j, "stop_reason", r->stop_tok);
    gen_add_seed(j, (uint64_t)o->seed);
    cJSON_AddNumberToObject(j, "prefill_s", r->prefill_s);
    cJSON_AddNumberToObject(j, "decode_s", r->decode_s);
    cJSON_AddNumberToObject(j, "decode_forwards", (double)r->n_decode);
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
    return s ? 0 : ft_err(-ENOMEM, "out of memory");
}

/* One prompt (--prompt): streamed, or one JSON object with --json. */
static int run_one(const gen_opts *o)
{
    ft_gen_env e;
    ft_gen_result r;
    int32_t *ids = NULL;
    int64_t n = 0;
    int tmpl = 0, last_nl = 1;
    memset(&r, 0, sizeof r);
    int rc = gen_open(&e, o);
    if (!rc) rc = ft_gen_prompt_ids(e.tok, o->tmpl, o->system, o->prompt, gen_flags(o), &ids, &n, &tmpl);
    if (!rc) gen_warn_no_think(o, e.tok, tmpl);
    if (!rc && n == 0) rc = ft_err(FT_E_INVALID, "the prompt encodes to no tokens");
    if (!rc) gen_warn_context(&e, n, o->max_new, "");
    const ft_gen_need nd = {n, n + o->max_new, o->max_new, o->rep_penalty != 1};
    const ft_gen_reply_cfg c = gen_reply_cfg(o);
    if (!rc) rc = gen_plan(&e, o, &nd, tmpl, 1);
    if (!rc) rc = ft_gen_reply(&e, &c, ids, n, 0, o->json ? NULL : gen_put_text, &last_nl, NULL, &r);
    if (!rc && !o->json) {
        if (!last_nl) putchar('\n');
        fflush(stdout);
    }
    if (!rc && o->json) rc = print_json(&e, o, tmpl, &r);
    if (!rc) {
        fprintf(stderr, "ftune: prefill %lld tokens in %.3f s (%.1f tok/s); decode %lld tokens in "
                "%.3f s (%.2f tok/s); stop: %s",
                (long long)r.n_prompt, r.prefill_s, r.prefill_s > 0 ? r.n_prompt / r.prefill_s : 0.0,
                (long long)r.n_out, r.decode_s,
                r.decode_s > 0 && r.n_decode > 0 ? r.n_decode / r.decode_s : 0.0, gen_stop_said(&r));
        if (o->temperature > 0) fprintf(stderr, "; seed %lld", (long long)o->seed);
        fputc('\n', stderr);
    }
    free(r.text);
    free(ids);
    ft_gen_env_close(&e);
    return rc;
}

/* --stop-token-ids ID,ID,...: up to FT_GEN_MAX_STOP_IDS token ids (integers 0..2^31 - 1; the
 * vocabulary bound is checked once the model is loaded) into a gen_id_list, replacing what an
 * earlier --stop-token-ids (or --config) gave; "" is none. */
static int opt_stop_ids(const char *v, void *dst, char *err, size_t n)
{
    gen_id_list *l = dst;
    l->n = 0;
    for (const char *p = v; *p;) {
        char *end;
        errno = 0;
        long long id = strtoll(p, &end, 10);
        if (end == p || errno || id < 0 || id > INT32_MAX || (*end && *end != ',')) {
            snprintf(err, n, "expected token ids separated by commas (integers 0..%d), got '%s'",
                     INT32_MAX, v);
            return -1;
        }
        if (l->n == FT_GEN_MAX_STOP_IDS) {
            snprintf(err, n, "at most %d token ids", FT_GEN_MAX_STOP_IDS);
            return -1;
        }
        l->v[l->n++] = (int32_t)id;
        p = *end ? end + 1 : end;
        if (*end && !*p) { /* a trailing comma */
            snprintf(err, n, "expected a token id after the last comma in '%s'", v);
            return -1;
        }
    }
    return 0;
}

/* Flags of the OpenAI Batch-API emulation that generate no longer has. */
static const char *const REMOVED_FLAGS[] = {"presence-penalty", "frequency-penalty", "logprobs",
                                            "prompt-logprobs", "logit-bias", "n", "best-of", NULL};

/* 1 (after one usage line on stderr) when argv holds a removed flag (--NAME or --NAME=V). */
static int removed_flag(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--", 2)) continue;
        if (!strcmp(argv[i], "--")) break;
        const char *f = argv[i] + 2;
        const size_t n = strcspn(f, "=");
        for (int k = 0; REMOVED_FLAGS[k]; k++)
            if (strlen(REMOVED_FLAGS[k]) == n && !strncmp(f, REMOVED_FLAGS[k], n)) {
                fprintf(stderr, "ftune: generate: --%s was removed (generate keeps what evaluating "
                        "an adapter needs; for an OpenAI-style serving API load the exported adapter "
                        "or the merged model into vLLM or llama.cpp: docs/generate.md)\n",
                        REMOVED_FLAGS[k]);
                return 1;
            }
    }
    return 0;
}

/* The value and combination checks of generate's options: 0, or 2 after one usage line. */
static int check_values(gen_opts *o)
{
    if (o->prompts && o->json) {
        fprintf(stderr, "ftune: generate: --json is for --prompt; --prompts always writes JSON lines\n");
        return 2;
    }
    if (o->no_think && o->raw) {
        fprintf(stderr, "ftune: generate: --no-think changes the chat template's prompt; --raw has none\n");
        return 2;
    }
    if (o->out && !o->prompts) {
        fprintf(stderr, "ftune: generate: --out goes with --prompts\n");
        return 2;
    }
    if (o->batch && !o->prompts) {
        fprintf(stderr, "ftune: generate: --batch goes with --prompts\n");
        return 2;
    }
    if (o->batch < 0 || o->batch > FT_GEN_MAX_SEQS) {
        fprintf(stderr, "ftune: generate: --batch %lld: expected 1..%d\n", (long long)o->batch,
                FT_GEN_MAX_SEQS);
        return 2;
    }
    o->batch_set = o->batch > 0;
    if (!o->batch) o->batch = FT_GEN_BATCH_DEFAULT;
    if (o->max_new < 1 || o->max_new > FT_GEN_MAX_NEW_TOKENS || o->top_k < 0 ||
        !(o->temperature >= 0) || !isfinite(o->temperature) || !(o->top_p > 0 && o->top_p <= 1)) {
        fprintf(stderr, "ftune: generate: --max-new-tokens must be 1..1000000, --top-k >= 0, "
                "--temperature finite and >= 0, 0 < --top-p <= 1\n");
        return 2;
    }
    if (!(o->rep_penalty > 0) || !isfinite(o->rep_penalty)) {
        fprintf(stderr, "ftune: generate: --repetition-penalty %g: expected a finite value > 0 (1: off)\n",
                (double)o->rep_penalty);
        return 2;
    }
    if (!(o->min_p >= 0 && o->min_p <= 1)) {
        fprintf(stderr, "ftune: generate: --min-p %g: expected 0 <= --min-p <= 1 (0: off)\n", (double)o->min_p);
        return 2;
    }
    if (o->stop.n > FT_GEN_MAX_STOP_STR) {
        fprintf(stderr, "ftune: generate: %lld --stop strings: at most %d\n", (long long)o->stop.n,
                FT_GEN_MAX_STOP_STR);
        return 2;
    }
    for (int64_t i = 0; i < o->stop.n; i++)
        if (!o->stop.v[i][0]) { /* args.c refuses them already; an empty one would match at once */
            fprintf(stderr, "ftune: generate: --stop: expected a non-empty string\n");
            return 2;
        }
    if (!o->prompts && o->temperature == 0 && (o->top_k > 0 || o->top_p < 1 || o->min_p > 0))
        fprintf(stderr, "ftune: warning: --top-k, --top-p and --min-p apply only when sampling "
                "(--temperature > 0); this run is greedy\n");
    return 0;
}

/* `ftune generate` with the options in *o (zeroed; its --stop list is the caller's to free). */
static int generate_cmd(gen_opts *o, int argc, char **argv)
{
    o->tmpl = FT_CHAT_AUTO;
    o->max_new = 256;
    o->seed = -1;
    o->top_p = 1.0f;
    o->rep_penalty = 1.0f;
    const ft_opt opts[] = {
        {"model", FT_OPT_STR, &o->model, "model folder or .gguf", 0, "PATH"},
        {"adapter", FT_OPT_STR, &o->adapter, "PEFT adapter folder to apply", 0, "DIR"},
        {"prompt", FT_OPT_STR, &o->prompt, "the user message (the whole text with --raw)", 0, "S"},
        {"prompts", FT_OPT_STR, &o->prompts, "instead of --prompt: a JSONL file or JSON array of strings, "
         "{prompt, system?}, or any conversational record --data reads (messages, sharegpt, alpaca, "
         "prompt/completion lists; a final assistant turn or \"output\": the \"reference\"); an object record "
         "may set its own max_new_tokens (or max_tokens), temperature, top_p, top_k, min_p, "
         "repetition_penalty, stop (a string or a list), seed and stop_token_ids (a list), each "
         "replacing the flag for that record; one JSON line each: {index, prompt, reply, reference?, "
         "prompt_tokens, new_tokens, stop, stop_reason?, seconds, seed?}", 0, "FILE"},
        {"chat", FT_OPT_FLAG, &o->chat, "instead of --prompt: a conversation: each line of standard input "
         "is a user turn (a line ending in '\\' goes on with the next), each reply streamed to stdout, "
         "the KV cache kept across turns (only what follows the part of the conversation it already "
         "holds is prefilled); /reset starts over (--system kept), /exit or end of input quits, /help "
         "lists the commands; Ctrl-C stops a reply; per-turn statistics on stderr"},
        {"ctx-size", FT_OPT_INT, &o->ctx_size, "with --chat: the conversation's KV cache in tokens (default: "
         "the model's max_position_embeddings, at most 4096); when a turn's prompt + --max-new-tokens "
         "would not fit, the oldest exchanges are dropped (the --system message kept)", 0, "N"},
        {"quiet", FT_OPT_FLAG, &o->quiet, "with --chat: no per-turn statistics on stderr"},
        {"out", FT_OPT_STR, &o->out, "with --prompts: write the JSON lines to FILE (renamed into place "
         "when complete) instead of stdout", 0, "FILE"},
        {"system", FT_OPT_STR, &o->system, "a system message before it (with --prompts: for records without one; with --chat: the "
         "conversation's, kept by /reset)", 0, "S"},
        {"raw", FT_OPT_FLAG, &o->raw, "no chat template: encode --prompt (or a --prompts record: a string or {prompt}) as is (with BOS)"},
        {"chat-template", FT_OPT_FN, &o->tmpl, "llama3|llama3.1|chatml|qwen3|llama2|mistral|zephyr|alpaca|jinja (default: from the tokenizer; jinja: its own template, rendered as transformers does)", ft_opt_chat_template, "NAME"},
        {"no-think", FT_OPT_FLAG, &o->no_think, "qwen3: answer without thinking (the template's enable_thinking=False: "
         "the prompt ends with an empty <think></think> block)"},
        {"max-new-tokens", FT_OPT_INT, &o->max_new, "most tokens to generate (default 256)"},
        {"temperature", FT_OPT_FLOAT, &o->temperature, "0: greedy (default); > 0: sample"},
        {"top-k", FT_OPT_INT, &o->top_k, "sample among the k most likely tokens (0: off)"},
        {"top-p", FT_OPT_FLOAT, &o->top_p, "nucleus sampling mass (1: off)"},
        {"min-p", FT_OPT_FLOAT, &o->min_p, "with --temperature > 0: keep the tokens whose probability is at least X "
         "times the most likely one's, after top-k and top-p (transformers' min_p; 0: off, the default)", 0, "X"},
        {"repetition-penalty", FT_OPT_FLOAT, &o->rep_penalty, "divide the logit of every token already in the "
         "prompt or the reply by X (a negative logit: multiply), before sampling or the greedy choice "
         "(transformers' repetition_penalty, CTRL; 1: off, the default; > 1 discourages repeats)", 0, "X"},
        {"stop", FT_OPT_LIST, &o->stop, "end the reply where its text contains STR, the text cut before it "
         "(\"stop\": \"stop_string\", \"stop_reason\": STR); repeat it for up to 16; in --config a string "
         "or a list", 0, "STR"},
        {"stop-token-ids", FT_OPT_FN, &o->stop_ids, "end a reply when it samples one of these token ids "
         "(vLLM's stop_token_ids: \"stop\": \"stop_token\", the token's text left out, "
         "\"stop_reason\": its id with --json and --prompts); with --prompts the default for records "
         "that do not set \"stop_token_ids\"",
         opt_stop_ids, "ID,ID,..."},
        {"batch", FT_OPT_INT, &o->batch, "with --prompts: generate up to N records together, one forward per "
         "token step for all of them (each layer's weights read once per step; 1: one record after "
         "the other; default 8, on a GPU fewer when their KV caches would take more than a quarter "
         "of the budget); the prompts that start together are prefilled in one forward too (up to "
         "1024 tokens). A record's logits may differ from --batch 1's in the last bits where "
         "fp32 or bf16 GEMMs sum N rows (not the CPU's in-place NF4 products)", 0, "N"},
        {"seed", FT_OPT_INT, &o->seed, "sampling seed (default: from the clock, printed); --prompts record i "
         "uses seed XOR (splitmix64 output i mod 2^53), record 0 the seed itself"},
        {"json", FT_OPT_FLAG, &o->json, "print one JSON object (ids, text, timings), no streaming"},
        {"threads", FT_OPT_INT, &o->threads, "CPU threads"},
        {"device", FT_OPT_STR, &o->device, FT_DEVICE_HELP, 0, "DEV"},
        {"quant", FT_OPT_STR, &o->quant, "base linear weights: bf16 (default: the model's weights unquantized; on a GPU streamed from its bf16 pack, as in training, when its layers do not all fit --gpu-mem) | nf4 (the base a QLoRA adapter was trained on, as `ftune train --quant nf4`: the NF4 pack, built or reused under --cache-dir, with the run's --quant-correction; no fp32 copy of the model in memory; on a GPU placed within --gpu-mem as training places it)", 0, "TYPE"},
        {"gpu-mem", FT_OPT_FN, &o->gpu_mem, FT_GPU_MEM_HELP, ft_opt_bytes, "SIZE"},
        {"host-mem", FT_OPT_FN, &o->host_mem, FT_HOST_MEM_HELP, ft_opt_bytes, "SIZE"},
        {"cache-dir", FT_OPT_STR, &o->cache_dir, FT_CACHE_DIR_HELP, 0, "DIR"},
        {NULL},
    };
    if (removed_flag(argc, argv)) return 2;
    int rc = ft_args_cmd(opts, argc, argv, NULL);
    if (rc >= 0) return rc;
    if (ft_session_bad_quant(o->quant)) return 2;
    if (o->chat && (o->prompt || o->prompts || o->raw || o->json || o->out || o->batch)) {
        fprintf(stderr, "ftune: generate: --chat reads the conversation from standard input; it does "
                "not go with %s\n", o->prompt ? "--prompt" : o->prompts ? "--prompts" : o->raw ? "--raw"
                : o->json ? "--json" : o->out ? "--out" : "--batch");
        return 2;
    }
    if (!o->model || (!o->chat && !o->prompt == !o->prompts)) {
        fprintf(stderr, "ftune: generate needs --model and one of --prompt, --prompts or --chat (see "
                "ftune generate --help)\n");
        return 2;
    }
    if (!o->chat && (o->ctx_size || o->quiet)) {
        fprintf(stderr, "ftune: generate: %s goes with --chat\n", o->ctx_size ? "--ctx-size" : "--quiet");
        return 2;
    }
    if (o->ctx_size < 0 || (o->ctx_size && o->ctx_size <= o->max_new)) {
        fprintf(stderr, "ftune: generate: --ctx-size %lld: expected more than --max-new-tokens (%lld), "
                "to leave room for a prompt\n", (long long)o->ctx_size, (long long)o->max_new);
        return 2;
    }
    char model_buf[4096], adapter_buf[4096];
    o->model_given = o->model;
    if (ft_session_model_path(&o->model, model_buf, sizeof model_buf, 0) ||
        ft_session_hub_path(&o->adapter, adapter_buf, sizeof adapter_buf, 0, "adapter"))
        return 1;
    { /* no output over an input (src/core/paths.h); stdout too when --prompts writes there */
        const ft_path_arg outs[] = {{"--out", o->out, NULL}};
        const ft_path_arg ins[] = {{"--model", o->model, NULL}, {"--adapter", o->adapter, NULL},
                                   {"--prompts", o->prompts, NULL}};
        int bad = ft_paths_check(outs, 1, ins, 3) < 0;
        if (bad) fprintf(stderr, "ftune: %s\n", ft_errmsg());
        if (!bad && o->prompts && !o->out && ft_fd_is_path(1, o->prompts)) {
            fprintf(stderr, "ftune: generate: standard output is the --prompts file %s: it would "
                    "be replaced (write with --out FILE)\n", o->prompts);
            bad = 1;
        }
        if (bad) return 1;
    }
    if ((rc = check_values(o))) return rc;
    if (o->seed < 0) /* 53 bits: exact in the JSON number */
        o->seed = (int64_t)((((uint64_t)time(NULL) * 1000003u) ^ (uint64_t)getpid()) & ((1ull << 53) - 1));

    rc = o->chat ? gen_run_chat(o) : o->prompts ? gen_run_prompts(o) : run_one(o);
    if (rc) fprintf(stderr, "ftune: %s\n", ft_errmsg());
    return rc ? 1 : 0;
}

int ft_cmd_generate(int argc, char **argv)
{
    gen_opts o = {0};
    int rc = generate_cmd(&o, argc, argv);
    ft_str_list_free(&o.stop);
    return rc;
}
