/* fsutil.h - small file helpers shared by every writer and reader. */
#ifndef FT_FSUTIL_H
#define FT_FSUTIL_H

#include <stddef.h>

/* Reads a whole file into a malloc'ed NUL-terminated buffer. Returns 0 or -errno with a
 * message naming the path. */
int ft_read_file(const char *path, char **data, size_t *len);

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

#endif
