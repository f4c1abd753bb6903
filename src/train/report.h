/* report.h - the run report: one self-contained HTML file (inline SVG charts, inline CSS, a
 * few lines of inline script to sort the table of runs; nothing from the network, readable
 * offline) drawn from a run folder's own files:
 *   metrics.jsonl   (metrics.h) train loss, learning rate and tokens/s of every step, the eval
 *                   loss of every evaluation, against the optimizer step;
 *   summary.json    the run's summary (absent while a run is in progress);
 *   checkpoint-N/trainer_state.json  the run config of the latest checkpoint ("config":
 *                   every setting that shapes the run, checkpoint.h);
 *   samples.jsonl   when present: {"step", "prompt", "reply"} lines, shown grouped by step.
 * Charts: train loss raw and smoothed as TensorBoard smooths scalars (the debiased
 * exponential moving average of its line chart, weight FT_REPORT_SMOOTHING; a constant
 * series and non-finite points are left as they are), eval loss, learning rate, tokens/s.
 * Each curve is an SVG <polyline class="curve" data-series=S data-run=R data-points=N> of
 * the series' finite points, one per metrics.jsonl line that has the value, in step order:
 * S is train_loss, train_loss_smoothed, eval_loss, lr or tokens_per_s.
 */
#ifndef FT_REPORT_H
#define FT_REPORT_H

#include <stddef.h>
#include <stdint.h>

#define FT_REPORT_SMOOTHING 0.6 /* TensorBoard's default scalar smoothing */
#define FT_REPORT_FILE "report.html"

/* One run of a report. */
typedef struct ft_report_run {
    const char *dir;    /* the run folder (metrics.jsonl needed; the others when present) */
    const char *name;   /* its label in legends and the table; NULL: dir's last component */
    const char *status; /* a sweep trial's "completed", "pruned" or "failed", or NULL; a pruned
                         * trial's curves are dashed */
    const char *params; /* a JSON object of the trial's settings, shown as table columns (one
                         * per key of any run), or NULL */
} ft_report_run;

/* The report of one run: dir/report.html, written atomically (ft_write_file_atomic), with
 * the charts, the summary, the run's settings and the samples. The path written goes to
 * path (n bytes) when path is non-NULL. Returns 0, FT_E_NOTFOUND (no dir/metrics.jsonl),
 * FT_E_INVALID (a line of a JSONL file or summary.json that is not a JSON object: the
 * message names the file and the line), -errno. */
int ft_report_write(const char *dir, char *path, size_t n);

/* The report of several runs (a sweep, or runs to compare) into the file out_path: each
 * chart has one curve per run (train loss: the smoothed curve of each run over its faint
 * raw curve), in the colors of a legend, and a table of the runs (name, status, params,
 * steps, final train loss, final and best eval loss, tokens/s) that sorts by a column when
 * its header is clicked. With n_runs == 1 and no status or params, the same page as
 * ft_report_write. title heads the page (NULL: "ftune report"). Errors as
 * ft_report_write, naming the run folder; FT_E_INVALID for params that are not a JSON
 * object, or n_runs < 1. */
int ft_report_write_runs(const char *out_path, const char *title, const ft_report_run *runs,
                         int64_t n_runs);

/* The adapter folder's model card, dir/README.md (adapters/model_card.h), from the run's
 * adapter_config.json, summary.json and the latest checkpoint's run config: what a finished
 * run writes next to its adapter. Returns 0 or the error of a file (named). */
int ft_report_model_card(const char *dir);

/* TensorBoard's smoothing of y (n values) with weight w into out (may be y): last = 0, then
 * for each finite y[i]: last = last * w + (1 - w) * y[i], out[i] = last / (1 - w^k) after k
 * finite values; non-finite values, and every value of a constant series, are copied. */
void ft_report_smooth(const double *y, int64_t n, double w, double *out);

#endif
