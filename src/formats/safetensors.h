/* safetensors.h - read (mmap, bounds-checked) and write (atomic) safetensors files.
 * Format: formats.md 1.1 (huggingface/safetensors README "Format", tensor.rs checks):
 * u64 LE header length N, N bytes of JSON, then the byte buffer; data_offsets relative to
 * the buffer, contiguous, covering it exactly. Sharded folders: formats.md 1.2. */
#ifndef FT_SAFETENSORS_H
#define FT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum ft_st_dtype { FT_ST_F32 = 0, FT_ST_F16, FT_ST_BF16, FT_ST_U8, FT_ST_I8, FT_ST_I32,
                   FT_ST_I64, FT_ST_F64, FT_ST_I16, FT_ST_U16, FT_ST_BOOL, FT_ST_OTHER };

#define FT_ST_MAX_DIMS 8

typedef struct ft_st_tensor {
    char *name;
    int dtype;                    /* enum ft_st_dtype */
    int n_dims;
    int64_t shape[FT_ST_MAX_DIMS];
    const void *data;             /* into the mapping */
    size_t nbytes;
    int64_t file_offset;          /* absolute offset of the data in the file */
} ft_st_tensor;

typedef struct ft_st_file ft_st_file;

/* Maps and validates one file: header length <= 100,000,000 and <= file size - 8, JSON
 * object, dtype known, nbytes == prod(shape) * size, offsets contiguous from 0 and ending
 * at the file end. Errors name the path and the byte offset or tensor: FT_E_CORRUPT,
 * FT_E_INVALID, -errno. */
int ft_st_open(ft_st_file **out, const char *path);
void ft_st_close(ft_st_file *f); /* NULL-safe */
int64_t ft_st_count(const ft_st_file *f);
const ft_st_tensor *ft_st_at(const ft_st_file *f, int64_t i);
const ft_st_tensor *ft_st_find(const ft_st_file *f, const char *name); /* NULL if absent */
/* Value of a __metadata__ key, or NULL. */
const char *ft_st_meta(const ft_st_file *f, const char *key);
const char *ft_st_path(const ft_st_file *f);

/* A model's weights across one file or a sharded set (model.safetensors.index.json). */
typedef struct ft_st_set ft_st_set;
/* Opens DIR/model.safetensors, or the shards named by DIR/model.safetensors.index.json,
 * or a single other *.safetensors file in DIR. */
int ft_st_set_open(ft_st_set **out, const char *dir);
void ft_st_set_close(ft_st_set *s);
/* Finds a tensor by name across shards; NULL if absent. */
const ft_st_tensor *ft_st_set_find(const ft_st_set *s, const char *name, const ft_st_file **file);

/* Converts the first n elements of a tensor (F32/F16/BF16) to fp32. Returns 0,
 * FT_E_UNSUPPORTED (another dtype), FT_E_RANGE (n beyond the tensor) or FT_E_CORRUPT when a
 * converted value is NaN or infinite (the message names its file offset, the tensor and the
 * element; callers prefix the file's path). */
int ft_st_to_f32(const ft_st_tensor *t, float *out, int64_t n);

/* Writing. Tensors are written in the order given, back to back, after a compact JSON
 * header with "__metadata__" first, padded with spaces to a multiple of 8 bytes. The file
 * is written to "<path>.tmp.<pid>", fsynced, then renamed over path (and the directory
 * fsynced), so a failure never leaves a partial file under `path`. */
typedef struct ft_st_out {
    const char *name;
    int dtype;                    /* F32, F16 or BF16 */
    int n_dims;
    int64_t shape[FT_ST_MAX_DIMS];
    const void *data;             /* nbytes = prod(shape) * dtype size */
} ft_st_out;

/* meta: n_meta key/value pairs (keys[i], vals[i]); {"format":"pt"} should be among them.
 * Returns 0, -errno (message names the path), FT_E_INVALID (bad shape/dtype). */
int ft_st_write(const char *path, const ft_st_out *tensors, int64_t n,
                const char *const *meta_keys, const char *const *meta_vals, int n_meta);

/* Byte size of one element of a dtype (0 for unknown). */
size_t ft_st_dtype_size(int dtype);
const char *ft_st_dtype_name(int dtype);

#endif
