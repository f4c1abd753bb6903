/* opt_parse.h - FT_OPT_FN value parsers shared by several commands (args.h's ft_opt_fn:
 * parse v into dst, or write a message into err[n] and return -1). */
#ifndef FT_CLI_OPT_PARSE_H
#define FT_CLI_OPT_PARSE_H

#include <stddef.h>

/* A decimal integer 0..2^64-1 (digits only) into a uint64_t (a seed). */
int ft_opt_u64(const char *v, void *dst, char *err, size_t n);

/* A chat template name (dataset.h ft_chat_template_parse: auto, llama3, ..., jinja) into an int. */
int ft_opt_chat_template(const char *v, void *dst, char *err, size_t n);

/* A data-set format name (dataset.h ft_data_format_parse: auto, alpaca, ...) into an int. */
int ft_opt_data_format(const char *v, void *dst, char *err, size_t n);

/* A pack quantization, "nf4" or "bf16" (pack.h ft_pack_quant_parse), into an int. */
int ft_opt_pack_quant(const char *v, void *dst, char *err, size_t n);

#endif
