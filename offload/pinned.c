/* pinned.c - NUMA-local page-locked host memory (see pinned.h). Each allocation carries a
 * one-page header before the memory it returns: what was mapped, the node asked for, and
 * where a sample of its pages landed (checked once, after registration). */
#include "offload/pinned.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "src/core/err.h"

#ifdef FT_HAVE_NUMA
#include <numa.h>
#include <numaif.h>
#endif

#define PIN_PAGE 4096
#define PIN_HUGE ((size_t)2 << 20) /* the pool starts on a huge-page boundary */
#define PIN_MAGIC 0x4e49505446ull /* "FTPIN" */
#define PIN_SAMPLES 64

typedef struct pin_hdr {
    uint64_t magic;
    char *map_base;    /* the mapping (the pool starts at the first 2 MiB boundary past a page) */
    size_t map_bytes, bytes;
    int node;          /* asked for; -1: none */
    int bound;         /* 1: the preference was applied (mbind) */
    int sampled;       /* pages sampled that were resident */
    int on_node;       /* ... of which on `node` (or, with node -1, on first_node) */
    int first_node;    /* node of the first resident sample */
    char why[96];      /* why no preference was applied */
} pin_hdr;
_Static_assert(sizeof(pin_hdr) <= PIN_PAGE, "the header must fit its page");

static pin_hdr *hdr_of(const void *p)
{
    pin_hdr *h = (pin_hdr *)((char *)p - PIN_PAGE);
    return h->magic == PIN_MAGIC ? h : NULL;
}

int ft_pinned_node(ft_backend *be)
{
    char id[64], path[160];
    if (!be->ops->device_pci_id || be->ops->device_pci_id(be, id, sizeof id) < 0) {
        ft_err_clear();
        return -1;
    }
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", id);
    FILE *f = fopen(path, "r");
    int node = -1;
    if (!f) return -1;
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
    return node < 0 ? -1 : node;
}

/* Where the resident pages among PIN_SAMPLES evenly spaced ones are. */
static void sample_nodes(pin_hdr *h, char *mem)
{
#ifdef FT_HAVE_NUMA
    void *pages[PIN_SAMPLES];
    int status[PIN_SAMPLES];
    size_t n_pages = h->bytes / PIN_PAGE;
    int k = n_pages < PIN_SAMPLES ? (int)n_pages : PIN_SAMPLES;
    for (int i = 0; i < k; i++) pages[i] = mem + (size_t)i * (n_pages / (size_t)k) * PIN_PAGE;
    if (k < 1 || numa_available() < 0 || numa_move_pages(0, (unsigned long)k, pages, NULL, status, 0) < 0)
        return;
    for (int i = 0; i < k; i++) {
        if (status[i] < 0) continue; /* not resident */
        if (!h->sampled) h->first_node = status[i];
        h->sampled++;
        h->on_node += status[i] == (h->node >= 0 ? h->node : h->first_node);
    }
#else
    (void)h, (void)mem;
#endif
}

int ft_pinned_alloc(ft_backend *be, size_t bytes, int node, void **out)
{
    *out = NULL;
    size_t n = bytes ? (bytes + PIN_PAGE - 1) / PIN_PAGE * PIN_PAGE : PIN_PAGE;
    if (n < bytes || n > SIZE_MAX - PIN_PAGE)
        return ft_err(-ENOMEM, "pinned host memory: %zu bytes is too large", bytes);
    size_t map_n = n + PIN_PAGE + PIN_HUGE;
    char *base = mmap(NULL, map_n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return ft_err(-ENOMEM, "pinned host memory: cannot map %.2f GiB: %s", n / 1073741824.0,
                      strerror(errno));
    char *mem = (char *)(((uintptr_t)base + PIN_PAGE + PIN_HUGE - 1) & ~(uintptr_t)(PIN_HUGE - 1));
    /* Huge pages where the kernel gives them (THP "madvise" or "always"): an O_DIRECT read into
     * physically scattered 4 KiB pages is split into many more device requests
     * (bench/results/code-measurements.md); fewer pages to pin and translate for the GPU too. */
    (void)madvise(mem, n, MADV_HUGEPAGE);
    pin_hdr *h = (pin_hdr *)(mem - PIN_PAGE);
    memset(h, 0, sizeof *h);
    h->magic = PIN_MAGIC;
    h->map_base = base;
    h->map_bytes = map_n;
    h->bytes = n;
    h->node = node;
#ifdef FT_HAVE_NUMA
    if (node < 0) {
        snprintf(h->why, sizeof h->why, "the GPU's node is unknown");
    } else if (numa_available() < 0) {
        snprintf(h->why, sizeof h->why, "the kernel has no NUMA support");
        h->node = -1;
    } else if (node > numa_max_node()) {
        snprintf(h->why, sizeof h->why, "node %d does not exist", node);
        h->node = -1;
    } else {
        struct bitmask *bm = numa_allocate_nodemask();
        numa_bitmask_setbit(bm, (unsigned)node);
        if (mbind(mem, n, MPOL_PREFERRED, bm->maskp, bm->size + 1, 0) == 0) {
            h->bound = 1;
        } else {
            snprintf(h->why, sizeof h->why, "mbind: %s", strerror(errno));
            h->node = -1;
        }
        numa_bitmask_free(bm);
    }
#else
    snprintf(h->why, sizeof h->why, "built without libnuma");
    h->node = -1;
#endif
    int rc = be->ops->host_register ? be->ops->host_register(be, mem, n) : 0;
    if (rc < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
        munmap(base, map_n);
        return ft_err(rc, "pinned host memory: cannot page-lock %.2f GiB: %s", n / 1073741824.0, msg);
    }
    sample_nodes(h, mem);
    *out = mem;
    return 0;
}

void ft_pinned_free(ft_backend *be, void *p)
{
    if (!p) return;
    pin_hdr *h = hdr_of(p);
    if (!h) return; /* not ours: leak rather than corrupt */
    if (be->ops->host_unregister) be->ops->host_unregister(be, p);
    munmap(h->map_base, h->map_bytes);
}

size_t ft_pinned_bytes(const void *p)
{
    const pin_hdr *h = p ? hdr_of(p) : NULL;
    return h ? h->bytes : 0;
}

void ft_pinned_describe(const void *p, char *buf, size_t n)
{
    const pin_hdr *h = p ? hdr_of(p) : NULL;
    if (!n) return;
    if (!h) {
        snprintf(buf, n, "none");
        return;
    }
    double g = h->bytes / 1073741824.0;
    char size[32];
    if (g >= 1) snprintf(size, sizeof size, "%.1f GiB", g);
    else snprintf(size, sizeof size, "%.1f MiB", h->bytes / 1048576.0);
    if (h->node < 0)
        snprintf(buf, n, "%s (no NUMA preference: %s)", size, h->why);
    else if (!h->sampled)
        snprintf(buf, n, "%s preferring NUMA node %d (GPU's node; pages placed on first touch)", size,
                 h->node);
    else if (h->on_node == h->sampled)
        snprintf(buf, n, "%s on NUMA node %d (GPU's node)", size, h->node);
    else
        snprintf(buf, n, "%s: %d%% on NUMA node %d (GPU's node), the rest elsewhere (the node is full)",
                 size, (100 * h->on_node + h->sampled / 2) / h->sampled, h->node);
}
