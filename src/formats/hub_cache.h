/* hub_cache.h - a Hugging Face model id ("org/name") resolved to its snapshot in the local
 * Hugging Face cache, as transformers, vLLM and llama.cpp find models a user downloaded once.
 *
 * ftune reads local files only: nothing is downloaded. Layout (huggingface.co/docs/hub/
 * local-cache, "Hub Local Cache"): <cache>/models--<org>--<name>/refs/<revision> holds a
 * commit hash; <cache>/models--<org>--<name>/snapshots/<commit>/ holds the repository's files
 * (symbolic links into blobs/). The cache is $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE (the
 * older name), else $HF_HOME/hub, else ${XDG_CACHE_HOME:-~/.cache}/huggingface/hub, as
 * huggingface_hub's constants.py chooses it. The library reads no environment: the program
 * (cli/env.c ft_env_hub) gives those variables' values in an ft_hub_env.
 */
#ifndef FT_HUB_CACHE_H
#define FT_HUB_CACHE_H

#include <stddef.h>

/* The values of the environment variables that name the cache (NULL or "": unset). */
typedef struct ft_hub_env {
    const char *hf_hub_cache;          /* $HF_HUB_CACHE */
    const char *huggingface_hub_cache; /* $HUGGINGFACE_HUB_CACHE */
    const char *hf_home;               /* $HF_HOME */
    const char *xdg_cache_home;        /* $XDG_CACHE_HOME */
    const char *home;                  /* $HOME */
} ft_hub_env;

/* The hub cache folder (see above) of env (NULL: all unset) into out (n bytes). Returns 0,
 * or FT_E_RANGE when it does not fit, FT_E_NOTFOUND when neither a variable nor $HOME names
 * it. */
int ft_hub_cache_dir(const ft_hub_env *env, char *out, size_t n);

/* Resolves a --model argument. An existing path is used as given (a local folder named like
 * an id wins, as in transformers). Otherwise an id "org/name", "org/name@REV" (a branch or
 * tag under refs/, or a full commit hash) or "org/name[@REV]/FILE" (a file inside the
 * snapshot, e.g. one of a repository's GGUF files) is looked up in the cache; a snapshot
 * without config.json (a model) or adapter_config.json (a PEFT adapter) that holds exactly
 * one .gguf file resolves to that file.
 * Returns 1 with the snapshot path in out (n bytes), 0 with arg copied to out (not an id:
 * the loader reports the missing path), or < 0: FT_E_NOTFOUND naming the cache folder
 * looked in and how to download the model (not cached, an unknown revision, a snapshot
 * missing), FT_E_INVALID (a GGUF-only snapshot with several .gguf files: their names are
 * listed; a refs file that holds no snapshot folder name), -errno (a refs file there but
 * unreadable), FT_E_RANGE (a path longer than n). REV has no '/' (not "refs/pr/N"). The
 * cache folder is ft_hub_cache_dir's of env (read only for an id). */
int ft_hub_resolve(const char *arg, const ft_hub_env *env, char *out, size_t n);

/* The id "org/name" of a path inside a cache snapshot (".../models--org--name/snapshots/
 * <commit>[/FILE]") into out: what adapter_config.json's base_model_name_or_path should say,
 * so that PEFT and vLLM load the base by its id (the revision is not kept: the path names
 * a commit, not the ref it was reached by). Returns 1, or 0 when path is not in a snapshot
 * or out (n bytes) is too small (out unchanged). */
int ft_hub_repo_id(const char *path, char *out, size_t n);

/* The commit of a path inside a cache snapshot (as ft_hub_repo_id takes it) into out (n
 * bytes) when the repository's refs/main does not name that snapshot (it was reached by
 * another branch, a tag or a commit, or there is no refs/main): what PEFT's `revision` should
 * say so that the base loads at that commit. Returns 1, or 0 when the snapshot is main's, the
 * path is not in a snapshot, refs/main cannot be read apart from being absent, or out is too
 * small. Reads <cache>/models--<org>--<name>/refs/main. */
int ft_hub_pinned_commit(const char *path, char *out, size_t n);

/* Splits s = "org/name@REV" (an id with a revision and no FILE part, the shape
 * ft_hub_resolve takes) into id (n bytes) and rev (rn bytes). Returns 1, or 0 when s has
 * another shape, is an existing local path (a folder "models/tiny@v2" is no id, as in
 * ft_hub_resolve), or a part does not fit (id and rev then unspecified). */
int ft_hub_split_rev(const char *s, char *id, size_t n, char *rev, size_t rn);

#endif
