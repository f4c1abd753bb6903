/* gguf.h - GGUF v2/v3 reader: header, metadata key/values, tensor infos, mmap'ed data.
 *
 * Layout (formats.md 4.3; ggml docs/gguf.md, src/gguf.cpp): "GGUF", u32 version (2 or 3),
 * u64 tensor_count, u64 kv_count, kv_count x (string key, u32 type, value),
 * tensor_count x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset),
 * zero padding to general.alignment (default 32), then the data; strings are u64 length +
 * bytes. Every length, count and offset is checked against the file size before use; tensor
 * offsets must equal the running sum of the padded tensor sizes, as ggml's reader demands.
 * Dims are ggml `ne` order (ne[0] innermost): ne = [in, out] is an HF (out, in) row-major
 * matrix with the same bytes.
 */
#ifndef FT_GGUF_H
#define FT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "src/tokenizer/tokenizer.h"

enum ft_gguf_vtype {
    FT_GGUF_U8 = 0, FT_GGUF_I8 = 1, FT_GGUF_U16 = 2, FT_GGUF_I16 = 3, FT_GGUF_U32 = 4,
    FT_GGUF_I32 = 5, FT_GGUF_F32 = 6, FT_GGUF_BOOL = 7, FT_GGUF_STRING = 8,
    FT_GGUF_ARRAY = 9, FT_GGUF_U64 = 10, FT_GGUF_I64 = 11, FT_GGUF_F64 = 12,
};

#define FT_GGUF_DEFAULT_ALIGNMENT 32
#define FT_GGUF_MAX_DIMS 4
#define FT_GGUF_MAX_NAME 64 /* GGML_MAX_NAME: names are at most 63 bytes */

/* One metadata entry. Scalars are decoded into i/u/f (all three set for numeric types and
 * bool); strings are NUL-terminated copies (str, str_len; embedded NULs are kept in
 * str_len). Arrays: arr_type, arr_n, and either arr_data (numeric elements, little-endian,
 * pointing into the mapping, possibly unaligned: read them with ft_gguf_arr_*) or arr_str
 * (arr_n NUL-terminated copies). */
typedef struct ft_gguf_kv {
    char *key;
    int type;                 /* enum ft_gguf_vtype */
    int64_t i;                /* integer or bool value (u64 above INT64_MAX: see u) */
    uint64_t u;
    double f;                 /* numeric value as double (integers converted) */
    char *str;
    size_t str_len;
    int arr_type;
    int64_t arr_n;
    const uint8_t *arr_data;
    char **arr_str;
    int64_t file_offset;      /* offset of the key in the file (for messages) */
} ft_gguf_kv;

typedef struct ft_gguf_tensor {
    char *name;
    int type;                 /* ggml type, enum ft_ggml_type (src/numeric/quant.h) */
    int n_dims;
    int64_t ne[FT_GGUF_MAX_DIMS]; /* ne[0] innermost; unused dims are 1 */
    int64_t n_elems;
    uint64_t offset;          /* relative to the data section */
    int64_t file_offset;      /* absolute offset of the data */
    size_t nbytes;
    const void *data;         /* into the mapping */
} ft_gguf_tensor;

typedef struct ft_gguf ft_gguf;

/* Maps and validates a GGUF file. Errors name the path and the byte offset, key or
 * tensor: -errno, FT_E_CORRUPT (truncated, offsets/lengths past the end, bad alignment,
 * offsets not equal to the padded running sum, duplicate keys/names), FT_E_UNSUPPORTED
 * (version other than 2/3, unknown value or ggml type). */
int ft_gguf_open(ft_gguf **out, const char *path);
void ft_gguf_close(ft_gguf *g); /* NULL-safe */

const char *ft_gguf_path(const ft_gguf *g);
uint32_t ft_gguf_version(const ft_gguf *g);
uint32_t ft_gguf_alignment(const ft_gguf *g);
int64_t ft_gguf_data_offset(const ft_gguf *g); /* absolute offset of the data section */

int64_t ft_gguf_n_kv(const ft_gguf *g);
const ft_gguf_kv *ft_gguf_kv_at(const ft_gguf *g, int64_t i);
const ft_gguf_kv *ft_gguf_find_kv(const ft_gguf *g, const char *key); /* NULL if absent */

/* Typed getters. Return 0, FT_E_NOTFOUND (absent; message names the key and file) or
 * FT_E_INVALID (wrong type or out of range; message names key, file, expected and found). */
int ft_gguf_get_int(const ft_gguf *g, const char *key, int64_t *v);   /* any integer type */
int ft_gguf_get_float(const ft_gguf *g, const char *key, double *v);  /* any numeric type */
int ft_gguf_get_bool(const ft_gguf *g, const char *key, int *v);      /* bool or integer */
int ft_gguf_get_str(const ft_gguf *g, const char *key, const char **v);

/* Copies a numeric array into out (kv->arr_n elements), converting each element.
 * Return 0 or FT_E_INVALID (not an array of a numeric type, or an integer that does not
 * fit int32 for the _i32 form). */
int ft_gguf_arr_f32(const ft_gguf_kv *kv, float *out);
int ft_gguf_arr_i32(const ft_gguf_kv *kv, int32_t *out);

int64_t ft_gguf_n_tensors(const ft_gguf *g);
const ft_gguf_tensor *ft_gguf_tensor_at(const ft_gguf *g, int64_t i);
const ft_gguf_tensor *ft_gguf_find_tensor(const ft_gguf *g, const char *name); /* NULL if absent */

/* Dequantizes a whole tensor into out (t->n_elems floats). Returns 0 or
 * FT_E_UNSUPPORTED naming the tensor, file and ggml type. */
int ft_gguf_tensor_f32(const ft_gguf *g, const ft_gguf_tensor *t, float *out);

/* Name of a metadata value type ("u32", "string", "array", ...). */
const char *ft_gguf_vtype_name(int type);
/* Bytes of one value of a scalar metadata type (formats.md 4.1: u8/i8/bool 1, u16/i16 2,
 * u32/i32/f32 4, u64/i64/f64 8); 0 for string, array and unknown types. */
size_t ft_gguf_vtype_size(int type);

/* Builds the tokenizer stored in a GGUF file's metadata (tokenizer.ggml.model, .pre,
 * .tokens, .scores, .token_type, .merges, .bos/.eos/.unknown/.padding_token_id,
 * .add_bos_token, .add_space_prefix, tokenizer.chat_template; llama.cpp's keys) through
 * ft_tok_from_spec(). Only the metadata is read (the tensor data is never touched).
 * add_bos/add_space_prefix default to 1 for model "llama" (SentencePiece) and 0 otherwise
 * when the keys are absent. Returns 0, -errno, FT_E_CORRUPT, FT_E_INVALID (missing
 * tokenizer.ggml.tokens/model, wrong types; message names the key and file) or an error
 * of ft_tok_from_spec. Implemented in loader.c. */
int ft_gguf_load_tokenizer(const char *path, ft_tokenizer **out);

#endif
