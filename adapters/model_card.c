/* model_card.c - the adapter folder's README.md (see model_card.h). */
#include "adapters/model_card.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"

static const cJSON *get(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* A JSON scalar as Markdown text: numbers %.6g (a float32 setting such as 0.05f reads 0.05),
 * strings in backticks when code is set, arrays of scalars joined with ", ". */
static void md_value(FILE *f, const cJSON *v, int code)
{
    if (cJSON_IsNumber(v)) {
        fprintf(f, "%.6g", v->valuedouble);
    } else if (cJSON_IsString(v)) {
        fprintf(f, code ? "`%s`" : "%s", v->valuestring);
    } else if (cJSON_IsBool(v)) {
        fputs(cJSON_IsTrue(v) ? "true" : "false", f);
    } else if (cJSON_IsArray(v)) {
        const cJSON *it;
        int first = 1;
        cJSON_ArrayForEach(it, v) {
            if (!first) fputs(", ", f);
            md_value(f, it, code);
            first = 0;
        }
    } else {
        fputs("-", f);
    }
}

static void result_row(FILE *f, const cJSON *summary, const char *key, const char *label)
{
    const cJSON *v = get(summary, key);
    if (!cJSON_IsNumber(v)) return;
    fprintf(f, "| %s | %.4f |\n", label, v->valuedouble);
}

static void usage(FILE *f, const char *base, int is_id, const char *rev, const char *dir, long long r)
{
    const char *bm = is_id ? base : "PATH/TO/BASE";
    fputs("## How to use\n\n### PEFT (transformers)\n\n```python\n", f);
    if (is_id) {
        fputs("from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n\n", f);
        fprintf(f, "model = AutoPeftModelForCausalLM.from_pretrained(\"%s\")  # loads the base %s%s%s\n",
                dir, base, rev ? " at revision " : "", rev ? rev : "");
        fprintf(f, "tokenizer = AutoTokenizer.from_pretrained(\"%s\")\n", base);
    } else {
        fputs("from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n", f);
        fputs("# the base was a local file; load its Hugging Face model (ftune train --base-model-id\n"
              "# ID records it here, and AutoPeftModelForCausalLM then loads it alone)\n", f);
        fprintf(f, "base = AutoModelForCausalLM.from_pretrained(\"%s\")\n", bm);
        fprintf(f, "model = PeftModel.from_pretrained(base, \"%s\")\n", dir);
        fprintf(f, "tokenizer = AutoTokenizer.from_pretrained(\"%s\")\n", bm);
    }
    fputs("```\n\n### vLLM\n\n```sh\n", f);
    fprintf(f, "vllm serve %s --enable-lora --lora-modules adapter=%s", bm, dir);
    static const int ranks[] = {16, 32, 64, 128, 256, 320, 512};
    for (int i = 0; i < 7; i++)
        if (r > 16 && r <= ranks[i] && (i == 0 || r > ranks[i - 1])) fprintf(f, " --max-lora-rank %d", ranks[i]);
    fputs("\n```\n\nThen ask for the model `adapter` in requests to the OpenAI-compatible server.", f);
    if (r > 512) fputs(" vLLM serves ranks up to 512: merge this adapter instead (`ftune merge`).", f);
    fputs("\n\n### llama.cpp\n\n```sh\n", f);
    fprintf(f, "ftune export --adapter %s --format gguf --out adapter.gguf%s\n", dir,
            is_id ? "   # add --model BASE when the base is not in the Hugging Face cache"
                  : " --model PATH/TO/BASE");
    fputs("llama-cli -m base.gguf --lora adapter.gguf   # base.gguf: the base model as GGUF\n```\n\n", f);
}

static int card_text(FILE *f, const char *dir, const cJSON *ac, const cJSON *summary,
                     const cJSON *settings)
{
    const cJSON *bn = get(ac, "base_model_name_or_path"), *rv = get(ac, "revision");
    const char *base = cJSON_IsString(bn) ? bn->valuestring : "";
    const char *rev = cJSON_IsString(rv) && rv->valuestring[0] ? rv->valuestring : NULL;
    int is_id = ft_peft_is_repo_id(base) && !ft_path_exists(base);
    const cJSON *r = get(ac, "r");
    long long rank = cJSON_IsNumber(r) && r->valuedouble >= 0 && r->valuedouble < 1e9 ? (long long)r->valuedouble : 0;
    /* front matter: what the Hub reads (model-card metadata; PEFT sets library_name and
     * base_model, and the base_model:adapter tag) */
    fputs("---\n", f);
    if (is_id) fprintf(f, "base_model: %s\n", base);
    fputs("library_name: peft\npipeline_tag: text-generation\ntags:\n", f);
    if (is_id) fprintf(f, "- base_model:adapter:%s\n", base);
    fputs("- lora\n- ftune\n---\n\n", f);
    const char *name = strrchr(dir, '/');
    name = name && name[1] ? name + 1 : dir;
    fprintf(f, "# %s\n\nA LoRA adapter (PEFT format: `adapter_config.json`, `adapter_model.safetensors`) "
               "trained with ftune.\n\n", name);
    fputs("## Base model\n\n", f);
    if (is_id)
        fprintf(f, "[%s](https://huggingface.co/%s)%s%s%s\n\n", base, base, rev ? " at revision `" : "",
                rev ? rev : "", rev ? "`" : "");
    else
        fprintf(f, "`%s` (a local path: pass the base model when loading, or train with "
                   "`--base-model-id ORG/NAME` to record its Hugging Face id)\n\n", base[0] ? base : "(not recorded)");
    const cJSON *data = get(summary, "data");
    if (data) {
        fputs("## Training data\n\n", f);
        if (cJSON_IsArray(data)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, data) {
                fputs("- ", f);
                md_value(f, it, 1);
                fputs("\n", f);
            }
        } else {
            fputs("- ", f);
            md_value(f, data, 1);
            fputs("\n", f);
        }
        const cJSON *nt = get(summary, "n_train"), *ne = get(summary, "n_eval"), *ed = get(summary, "eval_data");
        if (cJSON_IsNumber(nt))
            fprintf(f, "\n%.0f training examples, %.0f held-out examples%s%s%s.\n", nt->valuedouble,
                    cJSON_IsNumber(ne) ? ne->valuedouble : 0.0, cJSON_IsString(ed) ? " (from `" : "",
                    cJSON_IsString(ed) ? ed->valuestring : "", cJSON_IsString(ed) ? "`)" : "");
        fputs("\n", f);
    }
    fputs("## LoRA settings\n\n| setting | value |\n|---|---|\n", f);
    static const char *const lk[5] = {"r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora"};
    for (int i = 0; i < 5; i++) {
        fprintf(f, "| %s | ", lk[i]);
        md_value(f, get(ac, lk[i]), 1);
        fputs(" |\n", f);
    }
    if (settings) {
        fputs("\n## Training settings\n\n| setting | value |\n|---|---|\n", f);
        const cJSON *it;
        cJSON_ArrayForEach(it, settings) {
            if (cJSON_IsObject(it) || !it->string || !strncmp(it->string, "lora_", 5) ||
                !strcmp(it->string, "use_rslora"))
                continue; /* the LoRA settings are above */
            fprintf(f, "| %s | ", it->string);
            md_value(f, it, 0);
            fputs(" |\n", f);
        }
    }
    if (summary) {
        fputs("\n## Results\n\n| metric | value |\n|---|---|\n", f);
        const cJSON *st = get(summary, "steps"), *tk = get(summary, "tokens");
        if (cJSON_IsNumber(st)) fprintf(f, "| optimizer steps | %.0f |\n", st->valuedouble);
        if (cJSON_IsNumber(tk)) fprintf(f, "| tokens | %.0f |\n", tk->valuedouble);
        result_row(f, summary, "final_train_loss", "final train loss");
        result_row(f, summary, "initial_eval_loss", "eval loss before training");
        result_row(f, summary, "final_eval_loss", "final eval loss");
        const cJSON *fe = get(summary, "final_eval_loss");
        if (cJSON_IsNumber(fe)) fprintf(f, "| final eval perplexity | %.4g |\n", exp(fe->valuedouble));
        const cJSON *bs = get(summary, "best_eval_step");
        if (cJSON_IsNumber(bs)) {
            result_row(f, summary, "best_eval_loss", "best eval loss");
            fprintf(f, "| best eval step | %.0f |\n", bs->valuedouble);
        }
        fputs("\nLosses are mean token cross-entropy in nats. The run's curves are in `report.html`, "
              "its numbers in `metrics.jsonl` and `summary.json`.\n", f);
    }
    fputs("\n", f);
    usage(f, base, is_id, rev, dir, rank);
    fputs("### Framework versions\n\n- ftune (PEFT LoRA format, `peft_type` LORA, `task_type` CAUSAL_LM)\n", f);
    return 0;
}

int ft_model_card_write(const char *dir, const cJSON *summary, const cJSON *settings)
{
    char path[4200];
    FT_TRY(ft_path_join(path, sizeof path, dir, "adapter_config.json"));
    char *txt;
    size_t len;
    FT_TRY(ft_read_file(path, &txt, &len));
    cJSON *ac = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(ac)) {
        cJSON_Delete(ac);
        return ft_err(FT_E_INVALID, "%s: not a JSON object", path);
    }
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) {
        cJSON_Delete(ac);
        return ft_err(-ENOMEM, "out of memory");
    }
    card_text(f, dir, ac, summary, settings);
    cJSON_Delete(ac);
    if (fclose(f) != 0) {
        free(buf);
        return ft_err(-ENOMEM, "out of memory");
    }
    int rc = ft_path_join(path, sizeof path, dir, "README.md");
    if (!rc) rc = ft_write_file_atomic(path, buf, n);
    free(buf);
    return rc;
}
