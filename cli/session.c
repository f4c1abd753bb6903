/* session.c - the commands' side of the runtime session, paths, training signals (see
 * session.h). */
#include "cli/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/env.h"
#include "src/core/err.h"
#include "src/formats/hub_cache.h"
#include "src/train/dpo.h"

int ft_session_out_lock(ft_dirlock *lk, const char *flag, const char *dir)
{
    long stale = 0;
    int rc = ft_dirlock_take(lk, dir, &stale);
    if (rc < 0) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
        ft_err(rc, "%s %s", flag, msg); /* "--out DIR is in use ...", as train has always said */
        return -1;
    }
    if (stale)
        fprintf(stderr, "ftune: %s %s: took over the stale lock of pid %ld (that run ended without releasing it)\n",
                flag, dir, stale);
    return 0;
}

int ft_session_hub_path(const char **path, char *buf, size_t n, int quiet, const char *what)
{
    if (!*path) return 0;
    ft_hub_env env;
    ft_env_hub(&env);
    int rc = ft_hub_resolve(*path, &env, buf, n);
    if (rc < 0) {
        ft_err_prefix(rc, "--%s", what);
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    if (rc == 1 && !quiet) fprintf(stderr, "ftune: %s %s: %s (Hugging Face cache)\n", what, *path, buf);
    if (rc == 1) *path = buf;
    return 0;
}

const char *ft_session_device(const char *opt)
{
    const char *env = getenv("FTUNE_DEVICE");
    return opt ? opt : env && *env ? env : "auto";
}

void ft_session_note_stderr(void *user, int kind, const char *line)
{
    (void)user;
    fprintf(stderr, "ftune: %s%s\n", kind == FT_SESSION_WARN ? "warning: " : "", line);
}

void ft_session_pack_wait_note(const char *path, long pid, void *user)
{
    char line[4400];
    (void)user;
    ft_pack_wait_text(line, sizeof line, path, pid);
    fprintf(stderr, "ftune: pack: %s\n", line);
}

int ft_session_open_quant(ft_session *s, const char *model, const char *adapter,
                          const char *device, int threads, const char *quant,
                          const char *cache_dir, int64_t gpu_mem, int64_t host_mem, int *qcorr)
{
    ft_session_cfg c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.device = ft_session_device(device);
    c.threads = threads;
    c.quant = !quant ? FT_SESSION_QUANT_AUTO : !strcmp(quant, "nf4") ? FT_PACK_QUANT_NF4
                                                                     : FT_PACK_QUANT_BF16;
    /* the session keeps the path for later placements (ft_session_set_adapter): the default
     * is kept for the process, as the program opens its sessions one after another */
    static char cache_buf[4096];
    c.cache_dir = ft_env_pack_cache_dir(cache_dir, cache_buf, sizeof cache_buf);
    ft_env_tune(&c.tune);
    c.gpu_mem = gpu_mem;
    c.host_mem = host_mem;
    c.adapter = adapter;
    c.note = ft_session_note_stderr;
    int rc = ft_session_open(s, &c);
    if (qcorr) *qcorr = s->qcorr;
    return rc;
}

int ft_session_bad_quant(const char *quant)
{
    if (!quant || !strcmp(quant, "bf16") || !strcmp(quant, "nf4")) return 0;
    fprintf(stderr, "ftune: --quant: unknown base quantization '%s' (bf16, nf4)\n", quant);
    return 1;
}

/* ---- training signals ------------------------------------------------------------------ */

static volatile sig_atomic_t g_stop;
static struct sigaction g_old_int, g_old_term;
static int g_installed;

/* Async-signal-safe: only write(2), _exit(2) and the flag. */
static void on_stop_signal(int sig)
{
    static const char first[] =
        "\nftune: stop requested: finishing the current step, then saving a checkpoint "
        "(signal again to quit at once)\n";
    static const char second[] = "\nftune: second stop signal: exiting now; checkpoints "
        "already written are left as they are (--resume checks them)\n";
    if (g_stop) {
        ssize_t w = write(2, second, sizeof second - 1);
        (void)w;
        _exit(128 + sig);
    }
    g_stop = sig;
    ssize_t w = write(2, first, sizeof first - 1);
    (void)w;
}

volatile sig_atomic_t *ft_session_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    g_stop = 0;
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
    g_installed = 1;
    return &g_stop;
}

void ft_session_signals_restore(void)
{
    if (!g_installed) return;
    sigaction(SIGINT, &g_old_int, NULL);
    sigaction(SIGTERM, &g_old_term, NULL);
    g_installed = 0;
}

int ft_opt_dpo_loss(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_dpo_loss_parse(v);
    if (k < 0) {
        snprintf(err, n, "unknown DPO loss '%s' (sigmoid, hinge, ipo, robust, orpo, simpo)", v);
        return -1;
    }
    *(int *)dst = k;
    return 0;
}
