/* cpu_backend.h - shared by the CPU backend's table (backend.c) and its device mode
 * (cpu_device.c, "cpu-device"). Not a public interface: kernels/kernels.h is. */
#ifndef FT_CPU_BACKEND_H
#define FT_CPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

struct ft_cpu_lanes;

typedef struct ft_cpu_ctx {
    int n_threads; /* OpenMP team size (OpenBLAS itself runs single-threaded) */
    /* device mode only (ft_backend_cpu_device_init; NULL / unused otherwise): */
    ft_backend_ops dev_ops; /* this backend's table: cpu_ops with the device entries */
    float *wtile;           /* DEV_TILE_FLOATS: bf16 weights widened to fp32, NF4 staging */
    double *ev_t;           /* FT_MAX_EVENTS host times of the last record, < 0: none */
    struct ft_cpu_lanes *lanes; /* asynchronous copy lanes (ft_backend_cpu_device_set_lag), or NULL */
    size_t dev_bytes;       /* "device memory" in use: the usable size of every live alloc */
} ft_cpu_ctx;

/* The CPU backend's table (host memory), which the device mode copies and amends. */
extern const ft_backend_ops ft_cpu_ops;

/* Entries of ft_cpu_ops the device mode's own entries fall back to (kernels.h for each op). */
void *ft_cpu_alloc(ft_backend *be, size_t bytes);
int ft_cpu_copy(ft_backend *be, void *dst, const void *src, size_t bytes);
int ft_cpu_zero(ft_backend *be, void *p, size_t bytes);
int ft_cpu_linear_fwd(ft_backend *be, float *y, const float *x, const void *W, int wtype, int64_t T,
                      int64_t out, int64_t in, float beta, float *scratch);
int ft_cpu_linear_bwd_x(ft_backend *be, float *dx, const float *dy, const void *W, int wtype,
                        int64_t T, int64_t out, int64_t in, float beta, float *scratch);

/* Frees what the device mode added to ctx (the copy lanes, the weight tile, the event
 * times); nothing for a plain CPU context. */
void ft_cpu_device_ctx_free(ft_cpu_ctx *ctx);

#endif
