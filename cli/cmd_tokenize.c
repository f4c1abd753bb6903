/* cmd_tokenize.c - `ftune tokenize`: debug/reference view of the tokenizer and of the data
 * pipeline.
 *
 *   ftune tokenize --model M (--text S | --texts FILE | --data FILE) [--no-special]
 *                  [--data-format NAME] [--chat-template NAME] [--train-on-prompt] [--decode]
 *                  [--threads N]
 *
 * M is a folder with tokenizer.json (+ tokenizer_config.json) or a .gguf file.
 *   --text S      one line {"ids":[...]} (plus "text" with --decode: the ids decoded back)
 *   --texts FILE  each line of FILE is a JSON string; one JSON array of ids per line, in order
 *                 (with --decode: one {"ids":[...],"text":...} per line instead)
 *   --data FILE   the data set through ft_dataset_load (file order, no eval split, no
 *                 truncation); one line {"ids":[...],"labels":[...]} per example; repeated,
 *                 the files in the order given (ft_dataset_load_files)
 * FILE may be "-" (standard input, for one of them), a pipe (<(cmd)) or gzip-compressed
 * (ft_read_input's FT_INPUT_DATA).
 * Special tokens are added (post-processor, e.g. BOS) unless --no-special.
 * Exit codes: 0 success, 1 error (message "ftune: ..." on stderr), 2 usage.
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/core/utf8.h"
#include "src/core/fsutil.h"
#include "src/core/paths.h"
#include "src/data/dataset.h"
#include "src/tokenizer/tokenizer.h"
#include "src/formats/gguf.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: ftune tokenize --model M (--text S | --texts FILE | --data FILE) [options]\n"
        "  --model M            folder with tokenizer.json (+ tokenizer_config.json), or a .gguf file\n"
        "  --text S             print {\"ids\":[...]} for S\n"
        "  --texts FILE         FILE holds one JSON string per line; print one JSON array of ids per line\n"
        "  --data FILE          tokenize a data set; print {\"ids\":[...],\"labels\":[...]} per example\n"
        "                       (repeat it for several files, printed in the order given)\n"
        "                       FILE may be - (standard input), a pipe (<(cmd)) or gzip-compressed\n"
        "  --no-special         do not add the post-processor's special tokens (BOS)\n"
        "  --data-format NAME   alpaca, messages, sharegpt, prompt-completion, text (default: auto)\n"
        "  --chat-template NAME llama3, llama3.1, chatml, qwen3, llama2, mistral, zephyr, alpaca, jinja (default: auto)\n"
        "  --train-on-prompt    labels on every token (with --data)\n"
        "  --preference         with --data: preference records (what --method dpo trains on); print\n"
        "                       {\"chosen\":{\"ids\",\"labels\"},\"rejected\":{...}} per pair\n"
        "  --decode             with --text/--texts: also print the ids decoded back to text\n"
        "  --threads N          threads that encode --data's records (default: all cores)\n");
}

/* ---- output ------------------------------------------------------------------------------ */

static void put_ids(FILE *f, const int32_t *ids, int64_t n)
{
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", ids[i]);
    fputc(']', f);
}

static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p == '\r') fputs("\\r", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* ---- --texts: one JSON string per line ------------------------------------------------------ */

static int hex4(const char *s, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v * 16 + (unsigned)d;
    }
    return 1;
}

/* Decodes the JSON string literal s[0..n) (surrounding blanks allowed) into out (capacity
 * >= n), keeping embedded NULs. Returns the length, or -1 if s is not one JSON string. */
static int64_t json_unquote(const char *s, size_t n, char *out)
{
    while (n && (*s == ' ' || *s == '\t')) { s++; n--; }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    if (n < 2 || s[0] != '"' || s[n - 1] != '"') return -1;
    size_t o = 0;
    for (size_t i = 1; i < n - 1; i++) {
        char c = s[i];
        if (c == '"') return -1;
        if (c != '\\') { out[o++] = c; continue; }
        if (++i >= n - 1) return -1;
        switch (s[i]) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (i + 4 >= n - 1 || !hex4(s + i + 1, &cp)) return -1;
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && i + 6 < n - 1 && s[i + 1] == '\\' &&
                s[i + 2] == 'u' && hex4(s + i + 3, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                cp = 0xFFFD; /* lone surrogate */
            }
            o += (size_t)ft_utf8_encode(cp, out + o); /* an escape is >= 6 bytes, the UTF-8 <= 4 */
            break;
        }
        default: return -1;
        }
    }
    return (int64_t)o;
}

static int run_texts(const ft_tokenizer *tok, const char *path, int add_special, int decode)
{
    char *data;
    size_t len;
    FT_TRY(ft_read_input(path, "a text file", &data, &len, FT_INPUT_DATA));
    path = ft_input_name(path); /* "<stdin>" for "-", in messages */
    char *buf = malloc(len + 1);
    if (!buf) { free(data); return -ENOMEM; }
    int rc = 0;
    int64_t line = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        const char *nl = memchr(data + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - data) : len;
        line++;
        int64_t n = json_unquote(data + i, e - i, buf);
        if (n < 0) {
            rc = ft_err(FT_E_INVALID, "%s: line %lld: expected one JSON string", path, (long long)line);
            break;
        }
        int32_t *ids;
        int64_t n_ids;
        rc = ft_tok_encode(tok, buf, (size_t)n, add_special, &ids, &n_ids);
        if (rc == 0 && decode) {
            char *back;
            rc = ft_tok_decode(tok, ids, n_ids, 0, &back);
            if (rc == 0) {
                fputs("{\"ids\":", stdout);
                put_ids(stdout, ids, n_ids);
                fputs(",\"text\":", stdout);
                put_json_string(stdout, back);
                fputs("}\n", stdout);
                free(back);
            }
        } else if (rc == 0) {
            put_ids(stdout, ids, n_ids);
            fputc('\n', stdout);
        }
        free(ids);
        i = e + 1;
    }
    free(buf);
    free(data);
    return rc;
}

static int run_text(const ft_tokenizer *tok, const char *text, int add_special, int decode)
{
    int32_t *ids;
    int64_t n;
    FT_TRY(ft_tok_encode(tok, text, strlen(text), add_special, &ids, &n));
    fputs("{\"ids\":", stdout);
    put_ids(stdout, ids, n);
    int rc = 0;
    if (decode) {
        char *back;
        rc = ft_tok_decode(tok, ids, n, 0, &back);
        if (rc == 0) {
            fputs(",\"text\":", stdout);
            put_json_string(stdout, back);
            free(back);
        }
    }
    fputs("}\n", stdout);
    free(ids);
    return rc;
}

static void put_example(FILE *f, const ft_example *e)
{
    fputs("{\"ids\":", f);
    put_ids(f, e->ids, e->n);
    fputs(",\"labels\":", f);
    put_ids(f, e->labels, e->n);
    fputc('}', f);
}

static int run_data(const ft_tokenizer *tok, const char *const *paths, int64_t n_paths, int format,
                    int tmpl, int train_on_prompt, int preference)
{
    ft_data_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.format = format;
    cfg.chat_template = tmpl;
    cfg.train_on_prompt = train_on_prompt;
    cfg.skip_bad_records = 0;
    cfg.seq_len = INT64_MAX;
    cfg.eval_fraction = 0.0;
    cfg.no_shuffle = 1;
    cfg.preference = preference;
    ft_dataset ds;
    memset(&ds, 0, sizeof ds);
    FT_TRY(ft_dataset_load_files(&ds, paths, n_paths, &cfg, tok));
    for (int pass = 0; pass < 2; pass++) {
        const ft_example *ex = pass ? ds.eval : ds.train;
        int64_t n = pass ? ds.n_eval : ds.n_train;
        for (int64_t i = 0; i < n; i += preference ? 2 : 1) {
            if (preference) { /* pair i / 2: its chosen and rejected examples */
                fputs("{\"chosen\":", stdout);
                put_example(stdout, &ex[i]);
                fputs(",\"rejected\":", stdout);
                put_example(stdout, &ex[i + 1]);
                fputs("}\n", stdout);
                continue;
            }
            put_example(stdout, &ex[i]);
            fputc('\n', stdout);
        }
    }
    ft_dataset_free(&ds);
    return 0;
}

/* ---- entry ------------------------------------------------------------------------------------ */

/* A directory is a tokenizer folder; a regular file or a name ending in .gguf is GGUF. */
static int is_gguf(const char *m)
{
    size_t n = strlen(m);
    struct stat st;
    if (stat(m, &st) == 0) return !S_ISDIR(st.st_mode);
    return n >= 5 && !strcmp(m + n - 5, ".gguf");
}

int ft_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *texts = NULL, *data = NULL, *fmt = NULL, *tmpl = NULL;
    const char *threads = NULL;
    int no_special = 0, train_on_prompt = 0, decode = 0, preference = 0, n_stdin = 0;
    /* the --data files in order (at most argc / 2 of them) */
    const char **files = malloc((size_t)(argc / 2 + 1) * sizeof *files);
    int64_t n_files = 0;
    if (!files) {
        fprintf(stderr, "ftune: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--model") ? &model : !strcmp(a, "--text") ? &text
                         : !strcmp(a, "--texts") ? &texts : !strcmp(a, "--data") ? &data
                         : !strcmp(a, "--data-format") ? &fmt : !strcmp(a, "--chat-template") ? &tmpl
                         : !strcmp(a, "--threads") ? &threads : NULL;
        if (dst) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ftune: tokenize: %s needs a value\n", a);
                free(files);
                return 2;
            }
            *dst = argv[++i];
            if (dst == &data) files[n_files++] = data;
            if ((dst == &data || dst == &texts) && ft_input_is_stdin(*dst)) {
                if (n_stdin++) { /* standard input can be read once */
                    fprintf(stderr, "ftune: tokenize: %s - is the second input named -: standard input can be read once\n", a);
                    free(files);
                    return 2;
                }
            }
        } else if (!strcmp(a, "--no-special")) {
            no_special = 1;
        } else if (!strcmp(a, "--train-on-prompt")) {
            train_on_prompt = 1;
        } else if (!strcmp(a, "--decode")) {
            decode = 1;
        } else if (!strcmp(a, "--preference")) {
            preference = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(files);
            return 0;
        } else {
            fprintf(stderr, "ftune: tokenize: unknown option '%s'\n", a);
            usage(stderr);
            free(files);
            return 2;
        }
    }
    if (threads) {
        char *end;
        long t = strtol(threads, &end, 10);
        if (end == threads || *end || t < 1 || t > 4096) {
            fprintf(stderr, "ftune: tokenize: --threads '%s': expected an integer 1..4096\n", threads);
            free(files);
            return 2;
        }
        omp_set_num_threads((int)t);
    }
    if (!model || (!!text + !!texts + !!data) != 1) {
        fprintf(stderr, "ftune: tokenize: needs --model and exactly one of --text, --texts, --data\n");
        usage(stderr);
        free(files);
        return 2;
    }
    char model_buf[4096];
    if (ft_session_model_path(&model, model_buf, sizeof model_buf, 1)) {
        free(files);
        return 1;
    }
    if (preference && !data) {
        fprintf(stderr, "ftune: tokenize: --preference reads preference records: it needs --data\n");
        free(files);
        return 2;
    }
    int format = FT_DATA_AUTO, chat = FT_CHAT_AUTO;
    if (fmt && (format = ft_data_format_parse(fmt)) < 0) {
        fprintf(stderr, "ftune: tokenize: unknown --data-format '%s'\n", fmt);
        free(files);
        return 2;
    }
    if (tmpl && (chat = ft_chat_template_parse(tmpl)) < 0) {
        fprintf(stderr, "ftune: tokenize: unknown --chat-template '%s'\n", tmpl);
        free(files);
        return 2;
    }

    { /* the output is standard output: never one of the inputs (as GNU cat refuses) */
        const char *in[4] = {texts, NULL, NULL, NULL};
        const char *flag[4] = {"--texts", "--model", "--model", "--model"};
        char tj[4200], tc[4200];
        if (is_gguf(model)) {
            in[1] = model;
        } else if (!ft_path_join(tj, sizeof tj, model, "tokenizer.json") &&
                   !ft_path_join(tc, sizeof tc, model, "tokenizer_config.json")) {
            in[2] = tj;
            in[3] = tc;
        }
        for (int64_t i = -4; i < n_files; i++) {
            const char *p = i < 0 ? in[i + 4] : files[i], *f = i < 0 ? flag[i + 4] : "--data";
            if (p && ft_fd_is_path(1, p)) {
                fprintf(stderr, "ftune: tokenize: standard output is the %s file %s: it would be "
                        "replaced\n", f, p);
                free(files);
                return 1;
            }
        }
    }
    ft_tokenizer *tok = NULL;
    int rc = is_gguf(model) ? ft_gguf_load_tokenizer(model, &tok) : ft_tok_load_dir(&tok, model);
    if (rc == 0) ft_tok_set_chat_kind(tok, ft_chat_template_resolve(tok));
    if (rc == 0) {
        if (text) rc = run_text(tok, text, !no_special, decode);
        else if (texts) rc = run_texts(tok, texts, !no_special, decode);
        else rc = run_data(tok, files, n_files, format, chat, train_on_prompt, preference);
    }
    ft_tok_free(tok);
    free(files);
    if (fflush(stdout) != 0 && rc == 0) rc = ft_err(-EIO, "tokenize: writing the output failed");
    if (rc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg()[0] ? ft_errmsg() : ft_errname(rc));
        return 1;
    }
    return 0;
}
