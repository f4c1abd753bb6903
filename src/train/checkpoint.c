/* checkpoint.c - training checkpoints (see checkpoint.h). */
#include "src/train/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/json.h"
#include "src/formats/safetensors.h"

#define PATH_N 4200

static const char *const k_files[] = {"adapter_model.safetensors", "adapter_config.json",
                                      FT_CKPT_OPTIM_FILE};
enum { N_FILES = 3 };

/* ---- hashing ------------------------------------------------------------------------ */

uint64_t ft_ckpt_hash(uint64_t h, const void *data, size_t n)
{
    return ft_fnv1a64_words(h, data, n);
}

/* Size and hash of a whole file, read in 1 MiB pieces (an 8-byte-aligned chunk size, so
 * the word grouping equals that of one ft_ckpt_hash call over the whole file). */
static int hash_file(const char *path, int64_t *size, uint64_t *hash)
{
    enum { CHUNK = 1 << 20 };
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ft_err(-errno, "%s: cannot open: %s", path, strerror(errno));
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return ft_err(-ENOMEM, "%s: out of memory", path);
    }
    uint64_t h = FT_CKPT_HASH_INIT;
    int64_t total = 0;
    int rc = 0;
    for (;;) {
        size_t got = 0;
        while (got < CHUNK) {
            ssize_t r = read(fd, buf + got, CHUNK - got);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                rc = ft_err(-errno, "%s: read failed at offset %lld: %s", path,
                            (long long)(total + (int64_t)got), strerror(errno));
                break;
            }
            if (r == 0) break;
            got += (size_t)r;
        }
        if (rc) break;
        h = ft_ckpt_hash(h, buf, got);
        total += (int64_t)got;
        if (got < CHUNK) break;
    }
    free(buf);
    close(fd);
    *size = total;
    *hash = h;
    return rc;
}

/* ---- the state file's own hash ------------------------------------------------------- */

#define STATE_HASH_KEY "state_fnv1a64"

/* Offset of the 16 hex digits of the last "state_fnv1a64": "<16 hex>" in txt, or -1. The
 * writer puts that key last, so the last occurrence is the key itself, never a string value
 * (whose quotes would be escaped). */
static long state_hash_span(const char *txt, size_t len)
{
    static const char key[] = "\"" STATE_HASH_KEY "\"";
    const size_t kn = sizeof key - 1;
    for (size_t i = len >= kn ? len - kn + 1 : 0; i-- > 0;) {
        if (memcmp(txt + i, key, kn)) continue;
        size_t j = i + kn;
        while (j < len && (txt[j] == ' ' || txt[j] == '\t' || txt[j] == '\n' || txt[j] == '\r')) j++;
        if (j >= len || txt[j++] != ':') return -1;
        while (j < len && (txt[j] == ' ' || txt[j] == '\t' || txt[j] == '\n' || txt[j] == '\r')) j++;
        if (j + 18 > len || txt[j] != '"' || txt[j + 17] != '"') return -1;
        for (size_t d = j + 1; d < j + 17; d++)
            if (!((txt[d] >= '0' && txt[d] <= '9') || (txt[d] >= 'a' && txt[d] <= 'f'))) return -1;
        return (long)(j + 1);
    }
    return -1;
}

/* FNV-1a (ft_ckpt_hash, one call: its 8-byte words counted from the start of the text) of
 * txt with the 16 digits at span read as '0'; 0 when out of memory (no hash ever matches:
 * ft_ckpt_hash never returns 0 for a state text in practice, and a mismatch only refuses). */
static uint64_t state_hash(const char *txt, size_t len, long span)
{
    char *z = malloc(len ? len : 1);
    if (!z) return 0;
    memcpy(z, txt, len);
    memset(z + span, '0', 16);
    uint64_t h = ft_ckpt_hash(FT_CKPT_HASH_INIT, z, len);
    free(z);
    return h;
}

int ft_ckpt_state_seal(char *txt, size_t len)
{
    long span = state_hash_span(txt, len);
    if (span < 0) return FT_E_INVALID;
    char hex[20];
    snprintf(hex, sizeof hex, "%016" PRIx64, state_hash(txt, len, span));
    memcpy(txt + span, hex, 16);
    return 0;
}

/* Checks the state file's own hash: required from version 2 on, checked in a version-1 file
 * only if present (those were written without it). */
static int state_hash_check(const char *txt, size_t len, int version, const char *path)
{
    long span = state_hash_span(txt, len);
    if (span < 0) {
        if (version < 2) return 0;
        return ft_err(FT_E_CORRUPT, "%s: no \"" STATE_HASH_KEY "\" (its own hash) at the end of the state (damaged checkpoint)",
                      path);
    }
    char hex[20];
    snprintf(hex, sizeof hex, "%016" PRIx64, state_hash(txt, len, span));
    if (memcmp(hex, txt + span, 16))
        return ft_err(FT_E_CORRUPT, "%s: content hash %s, the state recorded %.16s at offset %ld (the file was modified or damaged)",
                      path, hex, txt + span, span);
    return 0;
}

/* ---- the writer (with the fault-injection hook) ------------------------------------- */

static int64_t g_fail_after = -1; /* test hook: bytes left before writes fail; < 0 off */

void ft_ckpt_fail_writes_after(int64_t bytes)
{
    g_fail_after = bytes;
}

typedef struct wfile {
    int fd;
    const char *path;
    int64_t off;
} wfile;

static int w_open(wfile *w, const char *path)
{
    w->path = path;
    w->off = 0;
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) return ft_err(-errno, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

static int w_write(wfile *w, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        size_t want = n;
        if (g_fail_after >= 0 && (int64_t)want > g_fail_after) want = (size_t)g_fail_after;
        ssize_t k = want ? write(w->fd, p, want) : -1;
        if (!want) errno = ENOSPC; /* injected: the disk is "full" */
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            return ft_err(-e, "%s: write failed at offset %lld: %s", w->path, (long long)w->off,
                          strerror(e));
        }
        if (g_fail_after >= 0) g_fail_after -= k;
        p += k;
        n -= (size_t)k;
        w->off += k;
    }
    return 0;
}

/* fsync + close; on any earlier error just closes. */
static int w_close(wfile *w, int rc)
{
    if (!rc && fsync(w->fd) < 0) rc = ft_err(-errno, "%s: fsync failed: %s", w->path, strerror(errno));
    if (close(w->fd) < 0 && !rc) rc = ft_err(-errno, "%s: close failed: %s", w->path, strerror(errno));
    w->fd = -1;
    return rc;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ft_err(-errno, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = 0;
    if (fsync(fd) < 0 && errno != EINVAL) /* some filesystems cannot fsync a directory */
        rc = ft_err(-errno, "%s: fsync of the directory failed: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

/* Removes the regular files of dir, then dir. Missing dir: 0. A sub-folder (never written
 * by ftune) makes the rmdir fail: -errno, the folder is left. */
static int rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -errno;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
    return rmdir(dir) < 0 ? -errno : 0;
}

/* ---- save --------------------------------------------------------------------------- */

static int write_optimizer(const char *path, ft_lora *l, int64_t adam_step)
{
    const ft_backend_ops *o = l->be->ops;
    size_t bytes = (size_t)l->n_params * sizeof(float);
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr,
                     "{\"__metadata__\":{\"format\":\"ftune-adamw\",\"adam_step\":\"%lld\"},"
                     "\"exp_avg\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[0,%zu]},"
                     "\"exp_avg_sq\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}}",
                     (long long)adam_step, (long long)l->n_params, bytes, (long long)l->n_params,
                     bytes, 2 * bytes);
    while (n % 8) hdr[n++] = ' '; /* the buffer starts 8-byte aligned (formats.md 1.1) */
    unsigned char len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)n >> (8 * b));
    wfile w;
    FT_TRY(w_open(&w, path));
    int rc = w_write(&w, len8, 8);
    if (!rc) rc = w_write(&w, hdr, (size_t)n);
    const float *mom[2] = {l->m, l->v};
    for (int k = 0; k < 2 && !rc; k++) {
        rc = o->copy(l->be, l->host, mom[k], bytes);
        if (!rc) rc = w_write(&w, l->host, bytes);
    }
    return w_close(&w, rc);
}

/* The shortest of %.15g, %.16g, %.17g that reads back as exactly v (cJSON's own printer
 * keeps 15 digits when the value is within an epsilon, which loses the last bits). */
static void fmt_exact(char *buf, size_t n, double v)
{
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) return;
    }
}

char *ft_ckpt_json_print(cJSON *o, int formatted)
{
    cJSON *it = o ? o->child : NULL;
    while (it) {
        cJSON *next = it->next;
        if (cJSON_IsNumber(it) && isfinite(it->valuedouble)) {
            char buf[40];
            fmt_exact(buf, sizeof buf, it->valuedouble);
            cJSON *raw = cJSON_CreateRaw(buf);
            if (raw) { /* the object key moves to the new item */
                raw->string = it->string;
                raw->type |= it->type & cJSON_StringIsConst;
                it->string = NULL;
            }
            if (!raw || !cJSON_ReplaceItemViaPointer(o, it, raw)) {
                cJSON_Delete(raw);
                return NULL;
            }
        } else if (cJSON_IsObject(it) || cJSON_IsArray(it)) {
            char *sub = ft_ckpt_json_print(it, 0); /* converts the subtree in place */
            if (!sub) return NULL;
            free(sub);
        }
        it = next;
    }
    return formatted ? cJSON_Print(o) : cJSON_PrintUnformatted(o);
}

static void add_num(cJSON *o, const char *key, double v)
{
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

static int write_state(const char *dir, const ft_ckpt_state *st, const char *config_json)
{
    char path[PATH_N];
    FT_TRY(ft_path_join(path, sizeof path, dir, FT_CKPT_STATE_FILE));
    cJSON *cfg = cJSON_Parse(config_json ? config_json : "{}");
    if (!cfg || !cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return ft_err(FT_E_INVALID, "%s: the run config is not a JSON object", path);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", FT_CKPT_FORMAT);
    cJSON_AddNumberToObject(o, "version", FT_CKPT_VERSION);
    cJSON_AddStringToObject(o, "run_id", st->run_id);
    cJSON_AddNumberToObject(o, "step", (double)st->step);
    cJSON_AddNumberToObject(o, "adam_step", (double)st->adam_step);
    cJSON_AddNumberToObject(o, "total_steps", (double)st->total_steps);
    cJSON_AddNumberToObject(o, "warmup_steps", (double)st->warmup_steps);
    cJSON_AddNumberToObject(o, "epoch", (double)st->epoch);
    cJSON_AddNumberToObject(o, "cursor", (double)st->cursor);
    cJSON_AddNumberToObject(o, "tokens", (double)st->tokens);
    cJSON_AddNumberToObject(o, "positions", (double)st->positions);
    cJSON_AddNumberToObject(o, "bad_steps", (double)st->bad_steps);
    cJSON_AddNumberToObject(o, "bad_run", (double)st->bad_run);
    add_num(o, "initial_eval_loss", st->initial_eval_loss);
    add_num(o, "last_eval_loss", st->last_eval_loss);
    add_num(o, "last_loss", st->last_loss);
    add_num(o, "elapsed_s", st->elapsed_s);
    add_num(o, "best_eval_loss", st->best_eval_loss);
    cJSON_AddNumberToObject(o, "best_eval_step", (double)st->best_eval_step);
    cJSON_AddNumberToObject(o, "best_saved_step", (double)st->best_saved_step);
    cJSON_AddNumberToObject(o, "n_evals", (double)st->n_evals);
    cJSON_AddNumberToObject(o, "evals_no_improve", (double)st->evals_no_improve);
    if (st->eval_set[0]) cJSON_AddStringToObject(o, "eval_set", st->eval_set);
    cJSON_AddItemToObject(o, "config", cfg);
    cJSON *files = cJSON_AddObjectToObject(o, "files");
    int rc = 0;
    for (int i = 0; i < N_FILES && !rc; i++) {
        char fp[PATH_N];
        int64_t size;
        uint64_t h;
        rc = ft_path_join(fp, sizeof fp, dir, k_files[i]);
        if (!rc) rc = hash_file(fp, &size, &h);
        if (rc) break;
        char hex[20];
        snprintf(hex, sizeof hex, "%016" PRIx64, h);
        cJSON *e = cJSON_AddObjectToObject(files, k_files[i]);
        cJSON_AddNumberToObject(e, "bytes", (double)size);
        cJSON_AddStringToObject(e, "fnv1a64", hex);
    }
    if (!rc) cJSON_AddStringToObject(o, STATE_HASH_KEY, "0000000000000000"); /* last key */
    char *txt = rc ? NULL : ft_ckpt_json_print(o, 1);
    cJSON_Delete(o);
    if (rc) return rc;
    if (!txt) return ft_err(-ENOMEM, "%s: out of memory", path);
    size_t n = strlen(txt);
    char *nl = realloc(txt, n + 2); /* the file ends with a newline, covered by the hash */
    if (!nl) {
        free(txt);
        return ft_err(-ENOMEM, "%s: out of memory", path);
    }
    txt = nl;
    memcpy(txt + n++, "\n", 2);
    if (ft_ckpt_state_seal(txt, n) < 0) {
        free(txt);
        return ft_err(FT_E_INVALID, "%s: cannot place the state's own hash", path);
    }
    wfile w;
    rc = w_open(&w, path);
    if (!rc) {
        rc = w_write(&w, txt, n);
        rc = w_close(&w, rc);
    }
    free(txt);
    return rc;
}

int ft_ckpt_save(const char *out_dir, const ft_ckpt_state *st, const char *config_json,
                 ft_lora *l, const ft_model *m, const char *base_name, char *path_out,
                 size_t path_n)
{
    char name[64], fin[PATH_N], tmp[PATH_N], old[PATH_N], opt[PATH_N];
    snprintf(name, sizeof name, FT_CKPT_PREFIX "%lld", (long long)st->step);
    FT_TRY(ft_path_join(fin, sizeof fin, out_dir, name));
    if (snprintf(tmp, sizeof tmp, "%s/.%s.tmp", out_dir, name) >= (int)sizeof tmp ||
        snprintf(old, sizeof old, "%s/.%s.old", out_dir, name) >= (int)sizeof old)
        return ft_err(FT_E_RANGE, "%s: path too long", out_dir);
    FT_TRY(ft_mkdir_p(out_dir));
    rm_tree(tmp); /* a leftover of a crash during an earlier save */
    if (mkdir(tmp, 0755) < 0)
        return ft_err(-errno, "%s: cannot create directory: %s", tmp, strerror(errno));
    int rc = ft_peft_save(tmp, l, m, base_name);
    if (!rc) rc = ft_path_join(opt, sizeof opt, tmp, FT_CKPT_OPTIM_FILE);
    if (!rc) rc = write_optimizer(opt, l, st->adam_step);
    if (!rc) rc = write_state(tmp, st, config_json);
    if (!rc) rc = fsync_dir(tmp);
    if (!rc && rename(tmp, fin) < 0) {
        if (errno == ENOTEMPTY || errno == EEXIST) {
            rm_tree(old);
            if (rename(fin, old) < 0 || rename(tmp, fin) < 0)
                rc = ft_err(-errno, "%s: cannot replace the existing checkpoint: %s", fin, strerror(errno));
            else
                rm_tree(old);
        } else {
            rc = ft_err(-errno, "%s: rename to %s failed: %s", tmp, fin, strerror(errno));
        }
    }
    if (rc) {
        int keep = rc;
        rm_tree(tmp);
        return ft_err_prefix(keep, "saving checkpoint %s", fin);
    }
    FT_TRY(fsync_dir(out_dir));
    if (path_out && snprintf(path_out, path_n, "%s", fin) >= (int)path_n)
        return ft_err(FT_E_RANGE, "%s: path too long", fin);
    return 0;
}

/* ---- a separate adapter folder (OUT/best) ------------------------------------------ */

/* OUT/<name>, and the OUT/.<name>.tmp and OUT/.<name>.old of its swap (PATH_N each). */
static int adapter_paths(const char *out_dir, const char *name, char *fin, char *tmp, char *old)
{
    FT_TRY(ft_path_join(fin, PATH_N, out_dir, name));
    if (snprintf(tmp, PATH_N, "%s/.%s.tmp", out_dir, name) >= PATH_N ||
        snprintf(old, PATH_N, "%s/.%s.old", out_dir, name) >= PATH_N)
        return ft_err(FT_E_RANGE, "%s: path too long", out_dir);
    return 0;
}

int ft_ckpt_save_adapter(const char *out_dir, const char *name, ft_lora *l, const float *values,
                         const char *base_name, int64_t step, double eval_loss)
{
    char fin[PATH_N], tmp[PATH_N], old[PATH_N];
    FT_TRY(adapter_paths(out_dir, name, fin, tmp, old));
    FT_TRY(ft_mkdir_p(out_dir));
    rm_tree(tmp);
    if (mkdir(tmp, 0755) < 0)
        return ft_err(-errno, "%s: cannot create directory: %s", tmp, strerror(errno));
    int rc = 0;
    if (!values) {
        rc = ft_lora_pull(l);
        values = l->host;
    }
    if (!rc) rc = ft_peft_save_values(tmp, l, values, base_name);
    if (!rc && step > 0) {
        char p[PATH_N + 32], js[128];
        int k = snprintf(js, sizeof js, "{\"step\": %lld, \"eval_loss\": %.17g}\n", (long long)step,
                         isfinite(eval_loss) ? eval_loss : 0.0);
        rc = ft_path_join(p, sizeof p, tmp, "ftune_step.json");
        if (!rc) rc = ft_write_file_atomic(p, js, (size_t)k);
    }
    if (!rc) rc = fsync_dir(tmp);
    if (!rc) {
        /* swap in one step: fin (if any) ends up under tmp's name, then removed */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, fin, RENAME_EXCHANGE) == 0) {
            rm_tree(tmp);
        } else if (errno == ENOENT) { /* no fin yet */
            if (rename(tmp, fin) < 0)
                rc = ft_err(-errno, "%s: rename to %s failed: %s", tmp, fin, strerror(errno));
        } else { /* EINVAL: no RENAME_EXCHANGE on this filesystem */
            rm_tree(old);
            if (rename(fin, old) < 0 || rename(tmp, fin) < 0)
                rc = ft_err(-errno, "%s: cannot replace the existing folder: %s", fin, strerror(errno));
            else
                rm_tree(old);
        }
    }
    if (rc) {
        int keep = rc;
        rm_tree(tmp);
        return ft_err_prefix(keep, "saving the adapter %s", fin);
    }
    return fsync_dir(out_dir);
}

int64_t ft_ckpt_adapter_step(const char *out_dir, const char *name)
{
    char dir[PATH_N], p[PATH_N + 32], *txt = NULL;
    size_t len = 0;
    if (ft_path_join(dir, sizeof dir, out_dir, name) < 0 ||
        ft_path_join(p, sizeof p, dir, "ftune_step.json") < 0 || ft_read_file(p, &txt, &len) < 0)
        return -1;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    int64_t step = cJSON_IsNumber(s) && s->valuedouble >= 1 ? (int64_t)s->valuedouble : -1;
    cJSON_Delete(j);
    return step;
}

void ft_ckpt_adapter_cleanup(const char *out_dir, const char *name, int remove)
{
    char fin[PATH_N], tmp[PATH_N], old[PATH_N];
    if (adapter_paths(out_dir, name, fin, tmp, old) < 0) return;
    rm_tree(tmp);
    if (remove) rm_tree(fin);
    if (!remove && ft_is_dir(fin) < 0 && ft_is_dir(old) == 1) rename(old, fin); /* crash between the renames */
    rm_tree(old);
}

/* ---- load --------------------------------------------------------------------------- */

static int get_i64(const cJSON *o, const char *key, int64_t *v, const char *path)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble) ||
        x->valuedouble > 9007199254740992.0)
        return ft_err(FT_E_INVALID, "%s: \"%s\" must be a non-negative integer", path, key);
    *v = (int64_t)x->valuedouble;
    return 0;
}

/* A finite number or null (NAN). The writer stores every non-finite value as null (add_num),
 * so an infinity (cJSON reads 1e999 as one) is damage, not a value. */
static int get_dbl(const cJSON *o, const char *key, double *v, const char *path)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNull(x)) *v = NAN;
    else if (cJSON_IsNumber(x) && isfinite(x->valuedouble)) *v = x->valuedouble;
    else return ft_err(FT_E_INVALID, "%s: \"%s\" must be a finite number or null", path, key);
    return 0;
}

/* get_i64 / get_dbl of a key that checkpoints of an older ftune lack: absent -> def. */
static int get_i64_opt(const cJSON *o, const char *key, int64_t *v, int64_t def, const char *path)
{
    if (!cJSON_GetObjectItemCaseSensitive(o, key)) {
        *v = def;
        return 0;
    }
    return get_i64(o, key, v, path);
}

static int get_dbl_opt(const cJSON *o, const char *key, double *v, double def, const char *path)
{
    if (!cJSON_GetObjectItemCaseSensitive(o, key)) {
        *v = def;
        return 0;
    }
    return get_dbl(o, key, v, path);
}

static int parse_state(const cJSON *o, const char *path, ft_ckpt_state *st)
{
    int oom = 0;
    const char *dup = ft_json_dup_key(o, 1, &oom);
    if (oom) return ft_err(-ENOMEM, "%s: out of memory", path);
    if (dup)
        return ft_err(FT_E_INVALID, "%s: key \"%.64s\" appears twice in one object (damaged checkpoint)",
                      path, dup);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(o, "run_id");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, FT_CKPT_FORMAT))
        return ft_err(FT_E_UNSUPPORTED, "%s: \"format\" is not \"" FT_CKPT_FORMAT "\"", path);
    if (!cJSON_IsNumber(ver) || (ver->valuedouble != 1 && ver->valuedouble != FT_CKPT_VERSION))
        return ft_err(FT_E_UNSUPPORTED, "%s: \"version\" %g, this ftune reads versions 1 to %d", path,
                      cJSON_IsNumber(ver) ? ver->valuedouble : -1.0, FT_CKPT_VERSION);
    if (!cJSON_IsString(rid) || strlen(rid->valuestring) >= sizeof st->run_id)
        return ft_err(FT_E_INVALID, "%s: \"run_id\" must be a short string", path);
    memset(st, 0, sizeof *st);
    snprintf(st->run_id, sizeof st->run_id, "%s", rid->valuestring);
    FT_TRY(get_i64(o, "step", &st->step, path));
    FT_TRY(get_i64(o, "adam_step", &st->adam_step, path));
    FT_TRY(get_i64(o, "total_steps", &st->total_steps, path));
    FT_TRY(get_i64(o, "warmup_steps", &st->warmup_steps, path));
    FT_TRY(get_i64(o, "epoch", &st->epoch, path));
    FT_TRY(get_i64(o, "cursor", &st->cursor, path));
    FT_TRY(get_i64(o, "tokens", &st->tokens, path));
    FT_TRY(get_i64(o, "positions", &st->positions, path));
    FT_TRY(get_i64(o, "bad_steps", &st->bad_steps, path));
    FT_TRY(get_i64(o, "bad_run", &st->bad_run, path));
    FT_TRY(get_dbl(o, "initial_eval_loss", &st->initial_eval_loss, path));
    FT_TRY(get_dbl(o, "last_eval_loss", &st->last_eval_loss, path));
    FT_TRY(get_dbl(o, "last_loss", &st->last_loss, path));
    FT_TRY(get_dbl(o, "elapsed_s", &st->elapsed_s, path));
    FT_TRY(get_dbl_opt(o, "best_eval_loss", &st->best_eval_loss, NAN, path));
    FT_TRY(get_i64_opt(o, "best_eval_step", &st->best_eval_step, 0, path));
    FT_TRY(get_i64_opt(o, "best_saved_step", &st->best_saved_step, 0, path));
    FT_TRY(get_i64_opt(o, "n_evals", &st->n_evals, 0, path));
    FT_TRY(get_i64_opt(o, "evals_no_improve", &st->evals_no_improve, 0, path));
    const cJSON *es = cJSON_GetObjectItemCaseSensitive(o, "eval_set");
    if (es && (!cJSON_IsString(es) || strlen(es->valuestring) >= sizeof st->eval_set))
        return ft_err(FT_E_INVALID, "%s: \"eval_set\" must be a string of at most %d characters",
                      path, (int)sizeof st->eval_set - 1);
    if (es) snprintf(st->eval_set, sizeof st->eval_set, "%s", es->valuestring);
    if (st->adam_step > st->step || st->step > st->total_steps || st->bad_run > st->bad_steps)
        return ft_err(FT_E_INVALID, "%s: inconsistent counters (step %lld, adam_step %lld, total_steps %lld, bad_run %lld, bad_steps %lld)",
                      path, (long long)st->step, (long long)st->adam_step, (long long)st->total_steps,
                      (long long)st->bad_run, (long long)st->bad_steps);
    if (st->best_eval_step > st->step || st->best_saved_step > st->step ||
        st->evals_no_improve > st->n_evals || (st->best_eval_step > 0 && !isfinite(st->best_eval_loss)))
        return ft_err(FT_E_INVALID, "%s: inconsistent eval tracking (step %lld, best_eval_step %lld, best_eval_loss %g, best_saved_step %lld, n_evals %lld, evals_no_improve %lld)",
                      path, (long long)st->step, (long long)st->best_eval_step, st->best_eval_loss,
                      (long long)st->best_saved_step, (long long)st->n_evals,
                      (long long)st->evals_no_improve);
    if (st->elapsed_s < 0)
        return ft_err(FT_E_INVALID, "%s: \"elapsed_s\" %g is negative", path, st->elapsed_s);
    if (st->best_eval_step == 0) st->best_eval_loss = NAN;
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(o, "config")))
        return ft_err(FT_E_INVALID, "%s: \"config\" must be an object", path);
    return 0;
}

static int check_files(const char *dir, const cJSON *files, const char *spath)
{
    if (!cJSON_IsObject(files)) return ft_err(FT_E_INVALID, "%s: \"files\" must be an object", spath);
    for (int i = 0; i < N_FILES; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(files, k_files[i]);
        const cJSON *hx = cJSON_GetObjectItemCaseSensitive(e, "fnv1a64");
        int64_t want;
        if (!cJSON_IsObject(e) || !cJSON_IsString(hx) || get_i64(e, "bytes", &want, spath) < 0)
            return ft_err(FT_E_INVALID, "%s: \"files\".\"%s\" needs \"bytes\" and \"fnv1a64\"", spath, k_files[i]);
        char fp[PATH_N];
        int64_t size;
        uint64_t h;
        FT_TRY(ft_path_join(fp, sizeof fp, dir, k_files[i]));
        FT_TRY(hash_file(fp, &size, &h));
        char hex[20];
        snprintf(hex, sizeof hex, "%016" PRIx64, h);
        if (size != want)
            return ft_err(FT_E_CORRUPT, "%s: %lld bytes, the checkpoint recorded %lld (truncated or replaced)",
                          fp, (long long)size, (long long)want);
        if (strcmp(hex, hx->valuestring))
            return ft_err(FT_E_CORRUPT, "%s: content hash %s, the checkpoint recorded %s (the file was modified or damaged)",
                          fp, hex, hx->valuestring);
    }
    return 0;
}

static int load_moments(const char *dir, ft_lora *l)
{
    char path[PATH_N];
    FT_TRY(ft_path_join(path, sizeof path, dir, FT_CKPT_OPTIM_FILE));
    ft_st_file *f;
    FT_TRY(ft_st_open(&f, path));
    static const char *const names[2] = {"exp_avg", "exp_avg_sq"};
    float *dst[2] = {l->m, l->v};
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        const ft_st_tensor *t = ft_st_find(f, names[k]);
        if (!t)
            rc = ft_err(FT_E_NOTFOUND, "%s: missing tensor %s", path, names[k]);
        else if (t->dtype != FT_ST_F32 || t->n_dims != 1 || t->shape[0] != l->n_params)
            rc = ft_err(FT_E_INVALID, "%s: tensor %s must be F32 [%lld] (the adapter's parameter count)",
                        path, names[k], (long long)l->n_params);
        else
            rc = ft_st_to_f32(t, l->host, l->n_params);
        if (rc < 0) ft_err_prefix(rc, "%s", path);
        /* AdamW's moments are finite and the second one >= 0 (the adamw op); anything else
         * would turn the first update's parameters into NaN */
        for (int64_t i = 0; i < l->n_params && !rc; i++)
            if (!isfinite(l->host[i]) || (k == 1 && l->host[i] < 0))
                rc = ft_err(FT_E_CORRUPT, "%s: offset %lld: %s[%lld] is %g, not a %s number", path,
                            (long long)(t->file_offset + 4 * i), names[k], (long long)i,
                            (double)l->host[i], k ? "finite non-negative" : "finite");
        if (!rc) rc = l->be->ops->copy(l->be, dst[k], l->host, (size_t)l->n_params * sizeof(float));
    }
    ft_st_close(f);
    return rc;
}

static int load_adapter(const char *dir, ft_lora *l)
{
    ft_lora_cfg c;
    FT_TRY(ft_peft_read_config(dir, &c));
    if (c.r != l->cfg.r || c.targets != l->cfg.targets || c.use_rslora != l->cfg.use_rslora ||
        c.alpha != l->cfg.alpha)
        return ft_err(FT_E_INVALID, "%s/adapter_config.json: r=%lld alpha=%g rslora=%d targets=0x%x, the run uses r=%lld alpha=%g rslora=%d targets=0x%x",
                      dir, (long long)c.r, c.alpha, c.use_rslora, c.targets, (long long)l->cfg.r,
                      l->cfg.alpha, l->cfg.use_rslora, l->cfg.targets);
    return ft_peft_load_weights(dir, l);
}

/* Reads and checks DIR/trainer_state.json (JSON, nothing after it, its own hash, the
 * fields) into *out (the parsed object, caller frees) and st. */
static int read_state(const char *dir, ft_ckpt_state *st, cJSON **out, char *path, size_t path_n)
{
    *out = NULL;
    FT_TRY(ft_path_join(path, path_n, dir, FT_CKPT_STATE_FILE));
    char *txt;
    size_t len;
    FT_TRY(ft_read_file(path, &txt, &len));
    const char *ep = NULL;
    unsigned long mark = ft_json_oom_mark();
    cJSON *o = cJSON_ParseWithLengthOpts(txt, len, &ep, 0);
    int rc = 0;
    if (!o && ft_json_oom_since(mark))
        rc = ft_err(-ENOMEM, "%s: out of memory while parsing", path);
    else if (!o || !cJSON_IsObject(o))
        rc = ft_err(FT_E_INVALID, "%s: offset %ld: not a JSON object (damaged checkpoint)", path,
                    ep ? (long)(ep - txt) : 0L);
    /* the writer ends the object with a newline: anything else after it is damage (two
     * states run together, a partial overwrite), not to be ignored */
    while (!rc && ep && ep < txt + len && (*ep == ' ' || *ep == '\n' || *ep == '\r' || *ep == '\t')) ep++;
    if (!rc && ep && ep < txt + len)
        rc = ft_err(FT_E_INVALID, "%s: offset %ld: text after the JSON object (damaged checkpoint)",
                    path, (long)(ep - txt));
    if (!rc) {
        const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
        int v = cJSON_IsNumber(ver) && ver->valuedouble == 1 ? 1 : FT_CKPT_VERSION;
        rc = state_hash_check(txt, len, v, path);
    }
    free(txt);
    if (!rc) rc = parse_state(o, path, st);
    if (rc) cJSON_Delete(o);
    else *out = o;
    return rc;
}

int ft_ckpt_load(const char *dir, ft_ckpt_state *st, char **config_json, ft_lora *l)
{
    char path[PATH_N];
    if (config_json) *config_json = NULL;
    cJSON *o;
    FT_TRY(read_state(dir, st, &o, path, sizeof path));
    int rc = 0;
    if (l) rc = check_files(dir, cJSON_GetObjectItemCaseSensitive(o, "files"), path);
    if (!rc && l) rc = load_adapter(dir, l);
    if (!rc && l) rc = load_moments(dir, l);
    if (!rc && config_json) {
        *config_json = ft_ckpt_json_print(cJSON_GetObjectItemCaseSensitive(o, "config"), 0);
        if (!*config_json) rc = ft_err(-ENOMEM, "%s: out of memory", path);
    }
    cJSON_Delete(o);
    return rc;
}

int ft_ckpt_verify(const char *dir, ft_ckpt_state *st)
{
    char path[PATH_N];
    ft_ckpt_state tmp;
    cJSON *o;
    FT_TRY(read_state(dir, st ? st : &tmp, &o, path, sizeof path));
    int rc = check_files(dir, cJSON_GetObjectItemCaseSensitive(o, "files"), path);
    cJSON_Delete(o);
    return rc;
}

/* ---- config comparison -------------------------------------------------------------- */

static int same_value(const cJSON *a, const cJSON *b)
{
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b)) return a->valuedouble == b->valuedouble;
    return cJSON_Compare(a, b, 1);
}

static void show(char *buf, size_t n, const cJSON *v)
{
    if (cJSON_IsNumber(v)) {
        fmt_exact(buf, n, v->valuedouble);
        return;
    }
    char *t = v ? cJSON_PrintUnformatted(v) : NULL;
    snprintf(buf, n, "%s", t ? t : "(absent)");
    free(t);
}

int ft_ckpt_config_diff(const char *saved_json, const char *now_json)
{
    cJSON *a = cJSON_Parse(saved_json), *b = cJSON_Parse(now_json);
    int rc = 0;
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) {
        rc = ft_err(FT_E_INVALID, "run config is not a JSON object");
        goto out;
    }
    char msg[1600] = "";
    size_t len = 0;
    int n_diff = 0;
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *it, *self = pass ? b : a, *peer = pass ? a : b;
        cJSON_ArrayForEach(it, self) {
            if (!strcmp(it->string, "info")) continue;
            const cJSON *other = cJSON_GetObjectItemCaseSensitive(peer, it->string);
            if (pass && other) continue; /* keys of both were compared in pass 0 */
            if (other && same_value(it, other)) continue;
            if (++n_diff > 8) continue;
            char x[160], y[160];
            show(x, sizeof x, pass ? other : it);
            show(y, sizeof y, pass ? it : other);
            int k = snprintf(msg + len, sizeof msg - len, "%s%s: %s -> %s", len ? ", " : "",
                             it->string, x, y);
            if (k > 0) len = len + (size_t)k < sizeof msg ? len + (size_t)k : sizeof msg - 1;
        }
    }
    if (n_diff)
        rc = ft_err(FT_E_INVALID, "the run config differs from the checkpoint's (checkpoint -> now): %s%s",
                    msg, n_diff > 8 ? ", ..." : "");
out:
    cJSON_Delete(a);
    cJSON_Delete(b);
    return rc;
}

/* ---- listing, latest, rotation ------------------------------------------------------ */

int64_t ft_ckpt_parse_name(const char *name)
{
    size_t k = strlen(FT_CKPT_PREFIX);
    if (strncmp(name, FT_CKPT_PREFIX, k) || !name[k]) return -1;
    int64_t v = 0;
    for (const char *p = name + k; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Steps of the checkpoint-N folders of out_dir, ascending; *steps malloc'ed. */
static int list_ckpts(const char *out_dir, int64_t **steps, int64_t *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(out_dir);
    if (!d) return errno == ENOENT ? 0 : ft_err(-errno, "%s: cannot list: %s", out_dir, strerror(errno));
    int64_t cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        int64_t s = ft_ckpt_parse_name(e->d_name);
        if (s < 0) continue;
        char p[PATH_N];
        if (ft_path_join(p, sizeof p, out_dir, e->d_name) < 0 || ft_is_dir(p) != 1) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *t = realloc(*steps, (size_t)cap * sizeof *t);
            if (!t) {
                rc = ft_err(-ENOMEM, "out of memory listing %s", out_dir);
                break;
            }
            *steps = t;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (rc) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return rc;
    }
    if (*n) qsort(*steps, (size_t)*n, sizeof **steps, cmp_i64);
    return 0;
}

static void ckpt_path(char *p, size_t n, const char *out_dir, int64_t step)
{
    snprintf(p, n, "%s/" FT_CKPT_PREFIX "%lld", out_dir, (long long)step);
}

int ft_ckpt_find_latest(const char *out_dir, char *path, size_t path_n, int64_t *step)
{
    int64_t *steps, n;
    FT_TRY(list_ckpts(out_dir, &steps, &n));
    int found = 0;
    for (int64_t i = n - 1; i >= 0 && !found; i--) {
        char p[PATH_N];
        ft_ckpt_state st;
        ckpt_path(p, sizeof p, out_dir, steps[i]);
        if (ft_ckpt_verify(p, &st) == 0 && st.step == steps[i]) {
            snprintf(path, path_n, "%s", p);
            *step = steps[i];
            found = 1;
        }
    }
    free(steps);
    return found;
}

int ft_ckpt_count(const char *out_dir, int64_t *latest)
{
    int64_t *steps, n;
    FT_TRY(list_ckpts(out_dir, &steps, &n));
    *latest = n ? steps[n - 1] : -1;
    free(steps);
    return (int)n;
}

/* Renames checkpoint-N aside, then removes it. 1 if removed. */
static int remove_ckpt(const char *out_dir, int64_t step)
{
    char p[PATH_N], del[PATH_N];
    ckpt_path(p, sizeof p, out_dir, step);
    snprintf(del, sizeof del, "%s/." FT_CKPT_PREFIX "%lld.del", out_dir, (long long)step);
    rm_tree(del);
    if (rename(p, del) < 0) return 0;
    rm_tree(del);
    return 1;
}

/* Removes hidden leftovers of a crashed save or prune: .checkpoint-N.{tmp,old,del}. */
static void remove_leftovers(const char *out_dir)
{
    DIR *d = opendir(out_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name, *dot = strrchr(nm, '.');
        if (nm[0] != '.' || strncmp(nm + 1, FT_CKPT_PREFIX, strlen(FT_CKPT_PREFIX)) || !dot ||
            (strcmp(dot, ".tmp") && strcmp(dot, ".old") && strcmp(dot, ".del")))
            continue;
        char p[PATH_N];
        if (ft_path_join(p, sizeof p, out_dir, nm) == 0) rm_tree(p);
    }
    closedir(d);
}

int ft_ckpt_prune(const char *out_dir, int64_t step, const char *run_id, int64_t keep)
{
    int64_t *steps, n;
    FT_TRY(list_ckpts(out_dir, &steps, &n));
    remove_leftovers(out_dir);
    int removed = 0;
    int64_t kept = 0;
    for (int64_t i = n - 1; i >= 0; i--) {
        int drop = steps[i] > step;
        if (!drop) {
            char p[PATH_N];
            ft_ckpt_state st;
            ckpt_path(p, sizeof p, out_dir, steps[i]);
            drop = ft_ckpt_load(p, &st, NULL, NULL) < 0 || strcmp(st.run_id, run_id) ||
                   st.step != steps[i];
        }
        if (!drop && keep > 0 && kept >= keep) drop = 1;
        if (drop) removed += remove_ckpt(out_dir, steps[i]);
        else kept++;
    }
    free(steps);
    if (removed) fsync_dir(out_dir);
    return removed;
}
