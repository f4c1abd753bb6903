/* opt_parse.c - FT_OPT_FN value parsers shared by several commands. */
#include "cli/opt_parse.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "offload/pack.h"
#include "src/core/err.h"
#include "src/data/dataset.h"

int ft_opt_u64(const char *v, void *dst, char *err, size_t n)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    /* strtoull takes " -1" as 2^64 - 1 and saturates past 2^64 - 1: only digits, in range */
    if (end == v || *end || *v < '0' || *v > '9' || errno == ERANGE) {
        snprintf(err, n, "expected an integer 0..18446744073709551615, got '%s'", v);
        return -1;
    }
    *(uint64_t *)dst = x;
    return 0;
}

int ft_opt_chat_template(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_chat_template_parse(v);
    if (k < 0) {
        snprintf(err, n, "unknown chat template '%s' (auto, llama3, llama3.1, chatml, qwen3, llama2, "
                 "mistral, zephyr, alpaca, jinja)", v);
        return -1;
    }
    *(int *)dst = k;
    return 0;
}

int ft_opt_data_format(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_data_format_parse(v);
    if (k < 0) {
        snprintf(err, n, "unknown data format '%s' (auto, alpaca, messages, sharegpt, "
                 "prompt-completion, text)", v);
        return -1;
    }
    *(int *)dst = k;
    return 0;
}

int ft_opt_pack_quant(const char *v, void *dst, char *err, size_t n)
{
    if (ft_pack_quant_parse(v, dst) < 0) {
        snprintf(err, n, "%s", ft_errmsg());
        return -1;
    }
    return 0;
}
