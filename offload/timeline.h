/* timeline.h - spans of one optimizer step on its lanes (compute, host->device copies,
 * device->host copies, disk reads), recorded by the executor and drawn by `ftune bench step`
 * as an SVG picture (a row per lane, a bar per layer visit, time on the x axis).
 * Times are seconds from the step's start. */
#ifndef FT_TIMELINE_H
#define FT_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

enum ft_tl_lane { FT_TL_COMPUTE = 0, FT_TL_H2D, FT_TL_D2H, FT_TL_DISK, FT_TL_N_LANES };
enum ft_tl_kind { FT_TL_FWD = 0, FT_TL_BWD, FT_TL_HEAD, FT_TL_WEIGHTS, FT_TL_CKPT, FT_TL_OTHER };

typedef struct ft_tl_span {
    double t0, t1;              /* seconds from the step's start, t1 >= t0 */
    int32_t layer;              /* -1: not a layer (head, embeddings) */
    int8_t lane;                /* enum ft_tl_lane */
    int8_t kind;                /* enum ft_tl_kind */
    int16_t micro;              /* micro-batch, -1 if none */
} ft_tl_span;

typedef struct ft_timeline {
    ft_tl_span *s;
    int64_t n, cap;
} ft_timeline;

/* Appends a span (grows the array). Returns 0 or -ENOMEM. */
int ft_timeline_add(ft_timeline *t, int lane, int kind, int64_t layer, int64_t micro,
                    double t0, double t1);
void ft_timeline_reset(ft_timeline *t);   /* n = 0, keeps the memory */
void ft_timeline_free(ft_timeline *t);    /* NULL-safe */

/* Busy seconds of a lane (the union of its spans) and the step's length (the latest t1). */
double ft_timeline_busy(const ft_timeline *t, int lane);
double ft_timeline_span(const ft_timeline *t);

/* Writes the picture to path (temp name, fsync, rename): one row per lane that has spans,
 * bars colored by kind and labeled with the layer where they are wide enough, an axis in ms,
 * a title line and each lane's busy fraction. Returns 0 or -errno (naming the path). */
int ft_timeline_write_svg(const ft_timeline *t, const char *path, const char *title);

#endif
