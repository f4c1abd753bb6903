/* backend.c - choosing a backend by name, and freeing any backend (kernels.h). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "src/core/err.h"

#ifndef FT_HAVE_CUDA
/* Built without nvcc: the CUDA entry points exist and say so. */
int ft_backend_cuda_init(ft_backend **out, int device)
{
    (void)device;
    if (out) *out = NULL;
    return ft_err(FT_E_UNSUPPORTED, "cuda: this ftune was built without the CUDA backend (nvcc "
                  "was not found at build time; install the CUDA toolkit and rebuild)");
}

int ft_backend_cuda_set_precise(ft_backend *be, int precise)
{
    (void)be;
    (void)precise;
    return ft_err(FT_E_UNSUPPORTED, "cuda: built without the CUDA backend");
}

int ft_backend_cuda_set_fused(ft_backend *be, unsigned mask)
{
    (void)be;
    (void)mask;
    return ft_err(FT_E_UNSUPPORTED, "cuda: built without the CUDA backend");
}
#endif

int ft_backend_profile(ft_backend *be, int on)
{
    if (be && be->ops->profile) return be->ops->profile(be, on);
    return ft_err(FT_E_UNSUPPORTED, "per-op profiling needs the CUDA backend (device %s)",
                  be ? be->ops->name : "none");
}

int ft_backend_profile_report(ft_backend *be, char *buf, size_t n, int reset)
{
    if (be && be->ops->profile_report) return be->ops->profile_report(be, buf, n, reset);
    return ft_err(FT_E_UNSUPPORTED, "per-op profiling needs the CUDA backend");
}

int ft_backend_mem_free(ft_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    if (be && be->ops->mem_info) return be->ops->mem_info(be, free_bytes, total_bytes);
    long pg = sysconf(_SC_PAGESIZE), av = sysconf(_SC_AVPHYS_PAGES), ph = sysconf(_SC_PHYS_PAGES);
    if (pg <= 0 || av < 0 || ph < 0) return ft_err(-EIO, "sysconf: cannot read the memory size");
    *free_bytes = (size_t)av * (size_t)pg;
    if (total_bytes) *total_bytes = (size_t)ph * (size_t)pg;
    return 0;
}

int ft_backend_mem_budget(ft_backend *be, int64_t gpu_mem, size_t reserve, ft_mem_budget *b)
{
    size_t free_b = 0, total_b = 0;
    FT_TRY(ft_backend_mem_free(be, &free_b, &total_b));
    size_t cap = gpu_mem > 0 ? (size_t)gpu_mem : total_b;
    size_t room = free_b > reserve ? free_b - reserve : 0;
    b->total = total_b;
    b->used = total_b - free_b;
    b->budget = cap > reserve ? cap - reserve : 0;
    b->avail = b->budget > b->used ? b->budget - b->used : 0;
    if (b->avail > room) b->avail = room;
    return 0;
}

int ft_backend_sync(ft_backend *be)
{
    return be && be->ops->sync ? be->ops->sync(be) : 0;
}

int ft_backend_init(ft_backend **out, const char *device, int n_threads)
{
    if (!device || !strcmp(device, "auto")) {
        int rc = ft_backend_cuda_init(out, 0);
        if (rc != FT_E_UNSUPPORTED) return rc;
        ft_err_clear();
        return ft_backend_cpu_init(out, n_threads);
    }
    if (!strcmp(device, "cpu")) return ft_backend_cpu_init(out, n_threads);
    /* the CPU backend in device mode: the GPU paths (device memory budget, offload planner,
     * tiers, bf16 products) run end to end without a GPU, for tests; slow */
    if (!strcmp(device, "cpu-device")) return ft_backend_cpu_device_init(out, n_threads);
    if (!strcmp(device, "cuda")) return ft_backend_cuda_init(out, 0);
    if (!strncmp(device, "cuda:", 5)) {
        char *end;
        long d = strtol(device + 5, &end, 10);
        if (end != device + 5 && !*end && d >= 0 && d < 1024) return ft_backend_cuda_init(out, (int)d);
    }
    return ft_err(FT_E_INVALID, "unknown device '%s' (expected cpu, cuda, cuda:N or auto)", device);
}

void ft_backend_free(ft_backend *be)
{
    if (!be) return;
    if (be->ops && be->ops->destroy) be->ops->destroy(be);
    free(be);
}
