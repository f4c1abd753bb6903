/* progress.c - progress bar / plain log lines (see progress.h). */
#include "cli/progress.h"

#include <math.h>
#include <stdio.h>
#include <unistd.h>

void ft_progress_init(ft_progress *p, int quiet)
{
    p->tty = isatty(2);
    p->quiet = quiet;
    p->log_every = 0;
    p->bar_open = 0;
}

void ft_progress_flush(ft_progress *p)
{
    if (p->bar_open) fputc('\n', stderr);
    p->bar_open = 0;
}

static void fmt_time(char *b, size_t n, double s)
{
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(b, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(b, n, "%ldm%02lds", t / 60, t % 60);
}

void ft_progress_cb(const ft_train_event *ev, void *user)
{
    ft_progress *p = user;
    if (p->quiet && ev->kind != FT_EV_WARN) return; /* --quiet keeps warnings and errors */
    if (ev->kind == FT_EV_INFO || ev->kind == FT_EV_PLAN || ev->kind == FT_EV_DONE) {
        ft_progress_flush(p);
        fprintf(stderr, "ftune: %s\n", ev->text);
        return;
    }
    if (ev->kind == FT_EV_WARN) {
        ft_progress_flush(p);
        fprintf(stderr, "ftune: warning: %s\n", ev->text);
        return;
    }
    if (ev->kind == FT_EV_CKPT) {
        ft_progress_flush(p);
        fprintf(stderr, "ftune: checkpoint at step %lld/%lld: %s\n", (long long)ev->step,
                (long long)ev->total_steps, ev->text);
        return;
    }
    if (ev->kind == FT_EV_EVAL) {
        ft_progress_flush(p);
        if (ev->pref) /* DPO: a pair loss has no perplexity */
            fprintf(stderr, "ftune: eval at step %lld/%lld: DPO loss %.4f, reward accuracy %.3f, margin %.4f\n",
                    (long long)ev->step, (long long)ev->total_steps, ev->eval_loss,
                    ev->reward_accuracy, ev->reward_margin);
        else
            fprintf(stderr, "ftune: eval at step %lld/%lld: loss %.4f (ppl %.2f)\n", (long long)ev->step,
                    (long long)ev->total_steps, ev->eval_loss, exp(ev->eval_loss));
        return;
    }
    char eta[32], el[32];
    fmt_time(eta, sizeof eta, ev->eta_s);
    fmt_time(el, sizeof el, ev->elapsed_s);
    if (p->tty) {
        int width = 24, fill = (int)(width * (double)ev->step / (double)ev->total_steps);
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(stderr, "\r[%s] step %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  %s elapsed, ETA %s  ",
                bar, (long long)ev->step, (long long)ev->total_steps, ev->loss, ev->lr,
                ev->tokens_per_s, el, eta);
        p->bar_open = 1;
        if (ev->step == ev->total_steps) ft_progress_flush(p);
        fflush(stderr);
        return;
    }
    char acc[48] = "";
    if (ev->pref) snprintf(acc, sizeof acc, " reward_accuracy %.3f", ev->reward_accuracy);
    int64_t every = p->log_every > 0 ? p->log_every : (ev->total_steps + 49) / 50;
    if (every < 1) every = 1;
    if (ev->step % every == 0 || ev->step == 1 || ev->step == ev->total_steps)
        fprintf(stderr, "ftune: step %lld/%lld loss %.4f%s lr %.3e grad_norm %.3f %.0f tok/s elapsed %s ETA %s\n",
                (long long)ev->step, (long long)ev->total_steps, ev->loss, acc, ev->lr, ev->grad_norm,
                ev->tokens_per_s, el, eta);
}
