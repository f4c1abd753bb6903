/* hub_cache.c - Hugging Face model ids resolved in the local hub cache (hub_cache.h). */
#include "src/formats/hub_cache.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"

#define ID_MAX 96 /* the hub's limit on an org or repository name */

static int set(const char *v) { return v && *v; }

int ft_hub_cache_dir(const ft_hub_env *env, char *out, size_t n)
{
    static const ft_hub_env none;
    const ft_hub_env *e = env ? env : &none;
    int w;
    if (set(e->hf_hub_cache)) w = snprintf(out, n, "%s", e->hf_hub_cache);
    else if (set(e->huggingface_hub_cache)) w = snprintf(out, n, "%s", e->huggingface_hub_cache);
    else if (set(e->hf_home)) w = snprintf(out, n, "%s/hub", e->hf_home);
    else if (set(e->xdg_cache_home)) w = snprintf(out, n, "%s/huggingface/hub", e->xdg_cache_home);
    else if (set(e->home)) w = snprintf(out, n, "%s/.cache/huggingface/hub", e->home);
    else return ft_err(FT_E_NOTFOUND, "the Hugging Face cache: none of HF_HUB_CACHE, HF_HOME, "
                       "XDG_CACHE_HOME or HOME is set");
    if (w < 0 || (size_t)w >= n) return ft_err(FT_E_RANGE, "the Hugging Face cache path is too long");
    return 0;
}

/* An org, repository or revision name: 1..ID_MAX of [A-Za-z0-9._-], not starting with '.'
 * or '-', without "..". */
static int name_ok(const char *s, size_t len)
{
    if (len < 1 || len > ID_MAX || s[0] == '.' || s[0] == '-') return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != '-') return 0;
        if (c == '.' && i + 1 < len && s[i + 1] == '.') return 0;
    }
    return 1;
}

static int is_commit(const char *s)
{
    size_t i = 0;
    for (; s[i]; i++)
        if (!isxdigit((unsigned char)s[i])) return 0;
    return i == 40;
}

typedef struct {
    char org[ID_MAX + 1], name[ID_MAX + 1], rev[ID_MAX + 1];
    const char *file; /* inside arg, or NULL */
} hub_id;

/* Splits "org/name[@rev][/file]"; 0 when arg is not shaped like an id. */
static int parse_id(const char *arg, hub_id *id)
{
    memset(id, 0, sizeof *id);
    const char *s1 = strchr(arg, '/');
    if (!s1 || !name_ok(arg, (size_t)(s1 - arg))) return 0;
    const char *nm = s1 + 1, *s2 = strchr(nm, '/');
    size_t nl = s2 ? (size_t)(s2 - nm) : strlen(nm);
    const char *at = memchr(nm, '@', nl);
    size_t rl = at ? nl - (size_t)(at + 1 - nm) : 0;
    if (at) nl = (size_t)(at - nm);
    if (!name_ok(nm, nl) || (at && !name_ok(at + 1, rl))) return 0;
    memcpy(id->org, arg, (size_t)(s1 - arg));
    memcpy(id->name, nm, nl);
    if (at) memcpy(id->rev, at + 1, rl);
    else strcpy(id->rev, "main");
    if (s2) {
        id->file = s2 + 1;
        if (!*id->file) return 0;
        /* no way out of the snapshot */
        for (const char *p = id->file; *p;) {
            const char *e = strchr(p, '/');
            size_t k = e ? (size_t)(e - p) : strlen(p);
            if (k == 0 || (k == 2 && !strncmp(p, "..", 2))) return 0;
            p += k + (e ? 1 : 0);
        }
    }
    return 1;
}

/* The names under dir, comma-separated, into buf (at most 8; "..." after). */
static void list_names(const char *dir, const char *suffix, char *buf, size_t n, int *count)
{
    buf[0] = 0;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    size_t o = 0;
    const struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name), sl = suffix ? strlen(suffix) : 0;
        if (e->d_name[0] == '.' || (suffix && (l <= sl || strcmp(e->d_name + l - sl, suffix))))
            continue;
        if (++*count <= 8 && o < n)
            o += (size_t)snprintf(buf + o, n - o, "%s%s", o ? ", " : "", e->d_name);
        else if (*count == 9 && o < n)
            o += (size_t)snprintf(buf + o, n - o, ", ...");
    }
    closedir(d);
}

/* The one .gguf file of a snapshot into name (n bytes); *count: how many there are. */
static void only_gguf(const char *dir, char *name, size_t n, int *count)
{
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    const struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] != '.' && l > 5 && !strcmp(e->d_name + l - 5, ".gguf") && ++*count == 1)
            snprintf(name, n, "%s", e->d_name);
    }
    closedir(d);
}

#define PUT_PATH(buf, ...)                                                                         \
    do {                                                                                           \
        int w_ = snprintf(buf, sizeof buf, __VA_ARGS__);                                           \
        if (w_ < 0 || (size_t)w_ >= sizeof buf)                                                    \
            return ft_err(FT_E_RANGE, "%s: the Hugging Face cache path is too long", arg);    \
    } while (0)

int ft_hub_resolve(const char *arg, const ft_hub_env *env, char *out, size_t n)
{
    hub_id id;
    if (!arg || ft_path_exists(arg) || !parse_id(arg, &id)) {
        if (snprintf(out, n, "%s", arg ? arg : "") >= (int)n)
            return ft_err(FT_E_RANGE, "model path too long: %s", arg);
        return 0;
    }
    char cache[4096], repo[4400], ref[4600], snap[4600], got[4800];
    FT_TRY(ft_hub_cache_dir(env, cache, sizeof cache));
    PUT_PATH(repo, "%s/models--%s--%s", cache, id.org, id.name);
    if (ft_is_dir(repo) != 1)
        return ft_err(FT_E_NOTFOUND, "%s: no such file or folder, and %s/%s is not in the "
                      "Hugging Face cache (%s does not exist). ftune reads local files only: "
                      "download it first (hf download %s/%s, or huggingface-cli download), or "
                      "pass its folder", arg, id.org, id.name, repo, id.org, id.name);
    char commit[128] = "";
    PUT_PATH(snap, "%s/snapshots/%s", repo, id.rev);
    if (is_commit(id.rev) && ft_is_dir(snap) == 1) {
        snprintf(commit, sizeof commit, "%s", id.rev);
    } else {
        PUT_PATH(ref, "%s/refs/%s", repo, id.rev);
        char *txt = NULL;
        size_t len = 0;
        int r = ft_read_file(ref, &txt, &len);
        if (r < 0 && r != -ENOENT && r != -ENOTDIR && r != -EISDIR) /* there, but unreadable */
            return ft_err_prefix(r, "%s: revision '%s'", arg, id.rev);
        if (r < 0) {
            char refs[512], dir[4500];
            int k;
            PUT_PATH(dir, "%s/refs", repo);
            list_names(dir, NULL, refs, sizeof refs, &k);
            return ft_err(FT_E_NOTFOUND, "%s: the Hugging Face cache has no revision '%s' of "
                          "%s/%s (no %s; revisions there: %s)%s", arg, id.rev, id.org, id.name, ref,
                          k ? refs : "none", k ? ": name one as ORG/NAME@REV" : "");
        }
        size_t a = 0, b = len;
        while (a < b && isspace((unsigned char)txt[a])) a++;
        while (b > a && isspace((unsigned char)txt[b - 1])) b--;
        /* a folder name under snapshots/ (a 40-digit hash as huggingface_hub writes it):
         * never "..", which would name the repository folder itself */
        int ok = name_ok(txt + a, b - a);
        if (ok) snprintf(commit, sizeof commit, "%.*s", (int)(b - a), txt + a);
        free(txt);
        if (!ok)
            return ft_err(FT_E_INVALID, "%s: %s does not hold a commit hash", arg, ref);
    }
    PUT_PATH(snap, "%s/snapshots/%s", repo, commit);
    if (ft_is_dir(snap) != 1)
        return ft_err(FT_E_NOTFOUND, "%s: revision '%s' is commit %s, but its snapshot %s is "
                      "missing (an interrupted download?): download %s/%s again", arg, id.rev,
                      commit, snap, id.org, id.name);
    if (id.file) {
        PUT_PATH(got, "%s/%s", snap, id.file);
    } else {
        char cfg[4700], acfg[4700];
        PUT_PATH(cfg, "%s/config.json", snap);
        PUT_PATH(acfg, "%s/adapter_config.json", snap);
        snprintf(got, sizeof got, "%s", snap);
        if (!ft_path_exists(cfg) && !ft_path_exists(acfg)) { /* a GGUF repository: its file, when there is one */
            char name[256] = "";
            int k;
            only_gguf(snap, name, sizeof name, &k);
            if (k == 1) {
                PUT_PATH(got, "%s/%s", snap, name);
            } else if (k > 1) {
                char names[1024];
                list_names(snap, ".gguf", names, sizeof names, &k);
                return ft_err(FT_E_INVALID, "%s: the snapshot %s holds %d GGUF files (%s) and "
                              "no config.json: name one as %s/%s/FILE.gguf", arg, snap, k, names,
                              id.org, id.name);
            }
        }
    }
    if (snprintf(out, n, "%s", got) >= (int)n)
        return ft_err(FT_E_RANGE, "%s: the snapshot path is too long", arg);
    return 1;
}

/* The first "/snapshots/" of path right after a models--ORG--NAME component (or models--NAME
 * for an id without an org), NULL if none: the cache folder's own path may hold another.
 * *repo (when repo is not NULL) gets the start of that component. */
static const char *snapshots_of(const char *path, const char **repo)
{
    const char *s = path, *c = NULL;
    while ((s = strstr(s, "/snapshots/"))) {
        c = s;
        while (c > path && c[-1] != '/') c--;
        if (!strncmp(c, "models--", 8)) break;
        s++;
    }
    if (repo) *repo = c;
    return s;
}

int ft_hub_repo_id(const char *path, char *out, size_t n)
{
    if (!path) return 0;
    const char *c, *s = snapshots_of(path, &c);
    if (!s) return 0;
    const char *on = c + 8, *sep = NULL;
    for (const char *p = on; p + 1 < s; p++)
        if (p[0] == '-' && p[1] == '-') {
            sep = p;
            break;
        }
    size_t ol = sep ? (size_t)(sep - on) : 0;
    const char *nm = sep ? sep + 2 : on;
    size_t nl = (size_t)(s - nm);
    if ((sep && !name_ok(on, ol)) || !name_ok(nm, nl)) return 0;
    /* then a commit folder */
    const char *cm = s + 11, *e = strchr(cm, '/');
    if (!name_ok(cm, e ? (size_t)(e - cm) : strlen(cm))) return 0;
    if ((sep ? ol + 1 : 0) + nl + 1 > n) return 0;
    if (sep) snprintf(out, n, "%.*s/%.*s", (int)ol, on, (int)nl, nm);
    else snprintf(out, n, "%.*s", (int)nl, nm);
    return 1;
}

int ft_hub_pinned_commit(const char *path, char *out, size_t n)
{
    char id[2 * ID_MAX + 2];
    if (!ft_hub_repo_id(path, id, sizeof id)) return 0;
    /* the repository folder ends where its snapshots/ begins; then the commit */
    const char *s = snapshots_of(path, NULL);
    if (!s) return 0;
    const char *cm = s + 11, *e = strchr(cm, '/');
    size_t cl = e ? (size_t)(e - cm) : strlen(cm);
    char ref[4800];
    int w = snprintf(ref, sizeof ref, "%.*s/refs/main", (int)(s - path), path);
    if (w < 0 || (size_t)w >= sizeof ref || cl + 1 > n) return 0;
    char *txt = NULL;
    size_t len = 0;
    int r = ft_read_file(ref, &txt, &len);
    int pinned;
    if (r < 0) {
        ft_err_clear();
        pinned = r == -ENOENT; /* no main branch: the commit is the only name */
    } else {
        size_t a = 0, b = len;
        while (a < b && isspace((unsigned char)txt[a])) a++;
        while (b > a && isspace((unsigned char)txt[b - 1])) b--;
        pinned = !(b - a == cl && !memcmp(txt + a, cm, cl));
        free(txt);
    }
    if (!pinned) return 0;
    snprintf(out, n, "%.*s", (int)cl, cm);
    return 1;
}

int ft_hub_split_rev(const char *s, char *id, size_t n, char *rev, size_t rn)
{
    hub_id h;
    /* an existing path wins over an id, as in ft_hub_resolve: "models/tiny@v2" (a folder)
     * or "models/tiny@q4.gguf" is a local model, never an id and a revision */
    if (!s || !strchr(s, '@') || !parse_id(s, &h) || h.file || ft_path_exists(s)) return 0;
    int w = snprintf(id, n, "%s/%s", h.org, h.name);
    if (w < 0 || (size_t)w >= n) return 0;
    w = snprintf(rev, rn, "%s", h.rev);
    return w >= 0 && (size_t)w < rn;
}
