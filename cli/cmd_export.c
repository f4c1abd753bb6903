/* cmd_export.c - `ftune export --adapter DIR --format gguf --out FILE [--model M]
 * [--dtype f32|f16]`: a PEFT adapter as a GGUF LoRA file for llama.cpp (llama-cli --lora
 * FILE), written the way convert_lora_to_gguf.py writes it (adapters/export/export_gguf.h). */
#include <stdio.h>
#include <string.h>

#include "adapters/export/export_gguf.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/env.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/core/paths.h"
#include "src/numeric/quant.h"

int ft_cmd_export(int argc, char **argv)
{
    const char *adapter = NULL, *format = "gguf", *out = NULL, *model = NULL, *dtype = "f32";
    int quiet = 0;
    const ft_opt opts[] = {
        {"adapter", FT_OPT_STR, &adapter, "PEFT adapter folder (adapter_config.json + adapter_model.safetensors)", 0, "DIR"},
        {"format", FT_OPT_STR, &format, "output format: gguf (llama.cpp LoRA)", 0, "NAME"},
        {"out", FT_OPT_STR, &out, "output file", 0, "FILE"},
        {"model", FT_OPT_STR, &model, "base model folder or .gguf (default: base_model_name_or_path when it is a local path)", 0, "PATH"},
        {"dtype", FT_OPT_STR, &dtype, "tensor type: f32 (default) or f16", 0, "TYPE"},
        {"quiet", FT_OPT_FLAG, &quiet, "print nothing on success"},
        {NULL},
    };
    int rc = ft_args_cmd(opts, argc, argv, NULL);
    if (rc >= 0) return rc;
    if (!adapter || !out) {
        fprintf(stderr, "ftune: export needs --adapter DIR and --out FILE\n");
        return 2;
    }
    if (strcmp(format, "gguf")) {
        fprintf(stderr, "ftune: export --format '%s' is not supported (gguf; a PEFT folder is what "
                "training writes, `ftune merge` writes full models)\n", format);
        return 2;
    }
    int type;
    if (!strcmp(dtype, "f32")) type = FT_GGML_F32;
    else if (!strcmp(dtype, "f16")) type = FT_GGML_F16;
    else {
        fprintf(stderr, "ftune: export --dtype '%s': expected f32 or f16\n", dtype);
        return 2;
    }
    char model_buf[4096], adapter_buf[4096];
    if (ft_session_model_path(&model, model_buf, sizeof model_buf, 0) ||
        ft_session_hub_path(&adapter, adapter_buf, sizeof adapter_buf, 0, "adapter"))
        return 1;
    const ft_path_arg outs[] = {{"--out", out, NULL}};
    const ft_path_arg ins[] = {{"--adapter", adapter, NULL}, {"--model", model, NULL}};
    if (ft_paths_check(outs, 1, ins, 2) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    ft_export_info info;
    ft_hub_env hub;
    ft_env_hub(&hub);
    rc = ft_export_gguf_lora(adapter, out, model, type, &hub, &info);
    if (rc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    if (!quiet)
        fprintf(stderr, "ftune: wrote %s: GGUF LoRA, arch %s, %lld layers, %lld tensors (%s), "
                "alpha %g%s, %.2f MiB (base config: %s)\n", out, info.arch,
                (long long)info.n_layers, (long long)info.n_tensors, type == FT_GGML_F16 ? "F16" : "F32",
                info.alpha_written, info.permuted ? ", q/k lora_b rows permuted for llama.cpp" : "",
                info.bytes / 1048576.0, info.base);
    return 0;
}
