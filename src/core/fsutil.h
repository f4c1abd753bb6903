/* fsutil.h - small file helpers shared by every writer and reader. */
#ifndef FT_FSUTIL_H
#define FT_FSUTIL_H

#include <stddef.h>

/* Reads a whole regular file into a malloc'ed NUL-terminated buffer (*len may be NULL).
 * Opens with O_NONBLOCK, so a FIFO at path is refused at once rather than waited on.
 * Returns 0, -errno (-EISDIR for a directory), FT_E_INVALID (not a regular file) or -ENOMEM
 * (also a file over FT_INPUT_MAX_BYTES), with a message naming the path.
 * = ft_read_input(path, "a file", data, len, 0). */
int ft_read_file(const char *path, char **data, size_t *len);

/* ft_read_input flags. */
#define FT_INPUT_STREAM 1u /* also "-" (standard input, once per process), pipes (/dev/fd/N,
                            * <(cmd)), FIFOs and devices: read to EOF */
#define FT_INPUT_GZIP   2u /* content starting with the gzip magic 1f 8b, whatever the name,
                            * is decompressed (zlib; every member of a concatenation) */
#define FT_INPUT_DATA   (FT_INPUT_STREAM | FT_INPUT_GZIP) /* what a user's data file may be */

/* The most bytes ft_read_input returns (after decompression): 64 GiB, and never more than
 * ft_input_mem_bound: a stream (pipe, device such as /dev/zero) or a gzip file's content
 * stops at a quarter of the memory, a regular file is refused above half of it, with
 * -ENOMEM and a message naming the input and the limit, before the kernel's OOM killer. */
#define FT_INPUT_MAX_BYTES ((size_t)64 << 30)

/* The memory bound on one input: a quarter (stream != 0) or half of the smaller of the
 * physical memory (sysconf _SC_PHYS_PAGES) and the address-space limit (RLIMIT_AS,
 * `ulimit -v`), at most FT_INPUT_MAX_BYTES. Bytes. */
size_t ft_input_mem_bound(int stream);

/* Reads a user's input into a malloc'ed NUL-terminated buffer *data of *len bytes (len may
 * be NULL). A regular file is read as ft_read_file reads it; `flags` (FT_INPUT_*) widen what
 * path may be. Nothing blocks in open(): a named FIFO with no writer is refused at once
 * (FT_E_INVALID); one with a writer, or a pipe, is read to its EOF. `what` names the
 * expected kind in messages ("a data file"); messages name the path, "<stdin>" for "-".
 * Returns 0, -errno (-EISDIR for a directory), FT_E_INVALID (not a kind flags allow; "-" a
 * second time; stdin a terminal), FT_E_CORRUPT (gzip data corrupt or truncated: "NAME: gzip
 * data corrupt at byte N (zlib's reason)", "NAME: gzip data truncated at byte N", N the
 * compressed offset) or -ENOMEM (out of memory, or more than FT_INPUT_MAX_BYTES). */
int ft_read_input(const char *path, const char *what, char **data, size_t *len, unsigned flags);

/* ft_read_input with another limit than FT_INPUT_MAX_BYTES on the bytes returned (and read). */
int ft_read_input_max(const char *path, const char *what, char **data, size_t *len,
                      unsigned flags, size_t max_bytes);

/* 1 if path is "-", standard input for ft_read_input with FT_INPUT_STREAM. */
int ft_input_is_stdin(const char *path);

/* The name messages give an input: "<stdin>" for "-", else path itself. */
const char *ft_input_name(const char *path);

/* Maps a whole regular file read-only (MAP_PRIVATE). *map is NULL for an empty file.
 * `what` names the expected kind in messages ("a .safetensors file"). Returns 0, -errno
 * (cannot open / stat / mmap; -EISDIR for a directory) or FT_E_INVALID (not a regular
 * file), each with a message naming the path. Release with ft_unmap_file. */
int ft_map_file(const char *path, const char *what, const void **map, size_t *size);
void ft_unmap_file(const void *map, size_t size); /* NULL-safe */

/* Writes len bytes to "<path>.tmp.<pid>", fsyncs, renames to path, fsyncs the directory.
 * On any failure the temporary is removed and `path` is untouched. Returns 0 or -errno. */
int ft_write_file_atomic(const char *path, const void *data, size_t len);

/* mkdir -p. Returns 0 or -errno. */
int ft_mkdir_p(const char *path);

/* 1 if path names something stat() reaches (a file, a folder, a link's target), else 0. */
int ft_path_exists(const char *path);

/* 1 if path is a directory, 0 if it is something else, -errno if it cannot be stat'ed. */
int ft_is_dir(const char *path);

/* Joins a and b with '/' into out (size out_n). Returns 0 or FT_E_RANGE if too long. */
int ft_path_join(char *out, size_t out_n, const char *a, const char *b);

/* Fsyncs the directory that holds path (best effort). */
void ft_fsync_parent(const char *path);

/* Every output is written under a temporary name, fsynced and renamed (DEVELOPERS.md), so
 * the final name holds either its old content or the whole new file:
 *
 * ft_tmp_open creates (or truncates, mode 0644) "<path>.tmp.<pid>" for writing and puts that
 * name in tmp (tmp_n bytes). Returns the fd, or FT_E_RANGE (path too long) or -errno (cannot
 * create, naming tmp). */
int ft_tmp_open(const char *path, char *tmp, size_t tmp_n);

/* ft_tmp_commit ends the write through fd (fd < 0: already closed): with rc == 0 it fsyncs
 * and closes fd, renames tmp to path and fsyncs path's folder; with rc != 0, or when a step
 * fails, it closes fd and removes tmp. Returns rc if nonzero, else 0 or -errno (the failing
 * step and the path in ft_errmsg). */
int ft_tmp_commit(int fd, const char *tmp, const char *path, int rc);

#endif
