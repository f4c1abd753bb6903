/* paths.h - where a path really is: an output that would replace one of the command's inputs
 * is refused before anything is read or written (formats.md's "outputs never over inputs"). */
#ifndef FT_PATHS_H
#define FT_PATHS_H

#include <stddef.h>

/* The absolute, canonical form of path into out (out_n bytes): symlinks resolved in the part
 * of path that exists (realpath), the rest, which does not exist yet, taken as written with
 * "." and ".." applied to the components before them (as mkdir -p then open would walk
 * them) and repeated '/' dropped. Returns 0, FT_E_RANGE (too long, naming path) or -errno
 * (getcwd failed). */
int ft_path_resolve(const char *path, char *out, size_t out_n);

/* 1 when child is parent or lies inside the folder parent, both taken through
 * ft_path_resolve (so a symlink to, or into, parent counts), or when both exist and are the
 * same file (a hard link: same device and inode); 0 otherwise. Returns 0 when either is NULL,
 * empty or "-" (standard input/output: no file to replace), or when parent does not exist
 * (nothing there to replace), FT_E_RANGE when a path is too long (message names it). */
int ft_path_within(const char *child, const char *parent);

/* The check every command makes for each of its outputs against each of its inputs: the
 * written path is out (name NULL) or out/name (a file the command writes inside its output
 * folder out), out_flag and in_flag name the options ("--out", "--model") in the message.
 * Returns 0 when the written path neither is in nor lies inside in (ft_path_within), else
 * FT_E_INVALID with one line such as
 *   "--out m is the --model folder m: writing there would replace its files"
 *   "--out m/x would replace m/x, inside the --model folder m" (m/x exists)
 *   "--out m/x is inside the --model folder m: writing there would mix the output with its files"
 *   "--out o: o/config.json would replace the --config file o/config.json"
 * (or FT_E_RANGE for a path too long). in NULL, empty or "-": 0. */
int ft_path_check_output(const char *out_flag, const char *out, const char *name,
                         const char *in_flag, const char *in);

/* A path a command writes or reads, for ft_paths_check: the option that names it ("--out"),
 * the path, and for an output the file it writes inside that folder (NULL: the path itself). */
typedef struct ft_path_arg {
    const char *flag, *path, *name;
} ft_path_arg;

/* ft_path_check_output of every output against every input (entries whose path is NULL are
 * skipped): 0, or the first refusal's error. */
int ft_paths_check(const ft_path_arg *outs, int n_out, const ft_path_arg *ins, int n_in);

/* 1 when the open file descriptor fd (standard output, 1) is the regular file path (same
 * device and inode), as GNU cat's "input file is output file"; 0 otherwise (path "-",
 * missing, or fd not a regular file). */
int ft_fd_is_path(int fd, const char *path);

#endif
