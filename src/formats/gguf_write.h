/* gguf_write.h - streaming GGUF v3 writer (the inverse of gguf.h).
 *
 * Layout written (formats.md 4.3; ggml docs/gguf.md, src/gguf.cpp; gguf-py gguf_writer.py):
 *   "GGUF", u32 3, u64 tensor_count, u64 kv_count,
 *   kv_count x (u64 len + key bytes, u32 value type, value),
 *   tensor_count x (u64 len + name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset),
 *   0x00 padding to the alignment, then each tensor's bytes padded with 0x00 to the alignment.
 * Offsets are the running sum of the padded tensor sizes in declaration order, as ggml's
 * reader demands. The alignment is general.alignment (u32, a power of two), default 32; a
 * non-default alignment is written as that key automatically.
 *
 * Usage: ft_gguf_w_open; metadata (ft_gguf_w_kv_*) and tensor declarations
 * (ft_gguf_w_tensor) in any order; ft_gguf_w_begin_data writes the header; then each
 * tensor's bytes in declaration order (ft_gguf_w_data raw, or ft_gguf_w_data_f32 which
 * converts fp32 rows to the declared type), in as many pieces as wanted; ft_gguf_w_close
 * checks that every byte was written, fsyncs "<path>.tmp.<pid>" and renames it over path.
 * Metadata is kept in memory (small); tensor data is streamed, never held.
 * On any error the writer is poisoned: later calls return the first error, and
 * ft_gguf_w_close / ft_gguf_w_abort remove the temporary file, so no partial file ever
 * appears under `path`.
 */
#ifndef FT_GGUF_WRITE_H
#define FT_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "src/formats/gguf.h"

typedef struct ft_gguf_w ft_gguf_w;

/* Creates "<path>.tmp.<pid>". alignment 0 means 32; otherwise a power of two <= 2^30.
 * Returns 0, -errno (message names the path), FT_E_INVALID (bad alignment). */
int ft_gguf_w_open(ft_gguf_w **out, const char *path, uint32_t alignment);

/* Metadata. Keys are 1..65535 bytes; a duplicate key gives FT_E_INVALID naming it.
 * "general.alignment" may not be set here (it follows the open() alignment). */
int ft_gguf_w_kv_u8(ft_gguf_w *w, const char *key, uint8_t v);
int ft_gguf_w_kv_i8(ft_gguf_w *w, const char *key, int8_t v);
int ft_gguf_w_kv_u16(ft_gguf_w *w, const char *key, uint16_t v);
int ft_gguf_w_kv_i16(ft_gguf_w *w, const char *key, int16_t v);
int ft_gguf_w_kv_u32(ft_gguf_w *w, const char *key, uint32_t v);
int ft_gguf_w_kv_i32(ft_gguf_w *w, const char *key, int32_t v);
int ft_gguf_w_kv_u64(ft_gguf_w *w, const char *key, uint64_t v);
int ft_gguf_w_kv_i64(ft_gguf_w *w, const char *key, int64_t v);
int ft_gguf_w_kv_f32(ft_gguf_w *w, const char *key, float v);
int ft_gguf_w_kv_f64(ft_gguf_w *w, const char *key, double v);
int ft_gguf_w_kv_bool(ft_gguf_w *w, const char *key, int v);
int ft_gguf_w_kv_str(ft_gguf_w *w, const char *key, const char *v);            /* NUL-terminated */
int ft_gguf_w_kv_strn(ft_gguf_w *w, const char *key, const char *v, size_t n); /* n bytes */
/* An array of n numeric/bool elements of elem_type (enum ft_gguf_vtype), little-endian
 * host values packed at their natural size (u8..f64; bool = 1 byte). */
int ft_gguf_w_kv_arr(ft_gguf_w *w, const char *key, int elem_type, const void *data, int64_t n);
/* An array of n strings (NUL-terminated). */
int ft_gguf_w_kv_arr_str(ft_gguf_w *w, const char *key, const char *const *v, int64_t n);
/* Copies one entry read by gguf.h (any type, arrays included) under its own key. */
int ft_gguf_w_kv_copy(ft_gguf_w *w, const ft_gguf_kv *kv);

/* Declares a tensor: name 1..63 bytes, unique; n_dims 1..4; ne innermost first (an HF
 * row-major (rows, cols) matrix is ne = {cols, rows}); type F32, F16, BF16 or Q8_0 (or any
 * type ft_quant_block knows, written raw); ne[0] a multiple of the type's block size.
 * Returns the tensor's index (>= 0) or an error (FT_E_INVALID naming the tensor). Must come
 * before ft_gguf_w_begin_data. */
int64_t ft_gguf_w_tensor(ft_gguf_w *w, const char *name, int type, int n_dims, const int64_t *ne);

/* Writes the header: magic, version, counts, metadata, tensor infos and the padding. */
int ft_gguf_w_begin_data(ft_gguf_w *w);

/* Appends n bytes of the current tensor (the first not yet complete, in declaration order).
 * A piece may not cross into the next tensor: FT_E_INVALID. Padding after a tensor is
 * written when its last byte arrives. */
int ft_gguf_w_data(ft_gguf_w *w, const void *data, size_t n);

/* Converts n fp32 values (a multiple of the block size, whole blocks along ne[0]) to the
 * current tensor's type (F32, F16, BF16, Q8_0) and appends them. */
int ft_gguf_w_data_f32(ft_gguf_w *w, const float *x, int64_t n);

/* Finishes: every declared tensor must be complete (FT_E_INVALID naming the first that is
 * not). Flushes, fsyncs, renames over path and fsyncs the directory. Frees w in all cases
 * (on error the temporary file is removed). Returns 0 or the first error. */
int ft_gguf_w_close(ft_gguf_w *w);

/* Abandons the file: removes the temporary, frees w. NULL-safe. */
void ft_gguf_w_abort(ft_gguf_w *w);

/* Bytes written so far (header included): the final file size after ft_gguf_w_close. */
int64_t ft_gguf_w_bytes(const ft_gguf_w *w);

/* fp32 -> type conversion of n values (n a multiple of the block size) into dst, which
 * holds ft_quant_bytes(type, n) bytes. F32 copies; F16 and BF16 round to nearest even
 * (quant.h); Q8_0 is ggml's quantize_row_q8_0_ref (gguf-py quants.py Q8_0, bit-exact):
 * per block of 32, d = max|x| / 127, q = roundf(x / d) (half away from zero, via x * (1/d)),
 * d stored as fp16. Returns 0 or FT_E_UNSUPPORTED (other types) / FT_E_INVALID (n). */
int ft_gguf_from_f32(int type, const float *src, void *dst, int64_t n);

#endif
