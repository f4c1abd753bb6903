/* pinned.h - host memory for the streamed tiers (offload/tiers.c: the pinned pool of
 * host-tier layer blocks, the disk tier's staging buffers): page-locked, so the device copies
 * it at full bus speed, and placed on the NUMA node the GPU hangs off, so those copies do not
 * cross the inter-socket link. The memory is mmap'd at a 2 MiB boundary and advised to use
 * huge pages (MADV_HUGEPAGE: O_DIRECT reads into scattered 4 KiB pages split into many more
 * device requests), given the node as its preferred policy
 * (mbind MPOL_PREFERRED, libnuma: pages go elsewhere only when the node is full, never an
 * out-of-memory kill), then locked with the backend's host_register (CUDA: cudaHostRegister,
 * which faults every page in under that policy). Anonymous memory can also be registered
 * with io_uring (fixed-buffer reads, offload/uring.h), which cudaHostAlloc's cannot always.
 * Built without libnuma (FT_HAVE_NUMA undefined) the node is ignored, and said so.
 */
#ifndef FT_PINNED_H
#define FT_PINNED_H

#include <stddef.h>

#include "kernels/kernels.h"

/* The NUMA node of the backend's device (/sys/bus/pci/devices/<device_pci_id>/numa_node), or
 * -1: unknown, no NUMA information (the kernel's -1), or a host-memory backend. */
int ft_pinned_node(ft_backend *be);

/* *out = bytes (rounded up to 4096) of 4096-aligned host memory preferring NUMA node `node`
 * (-1: no preference), page-locked by be->ops->host_register. Setup only, like host_alloc.
 * Returns 0, -ENOMEM (the mapping; the message gives the bytes) or the registration's error
 * (nothing is left allocated on error). */
int ft_pinned_alloc(ft_backend *be, size_t bytes, int node, void **out);
/* Unregisters and unmaps memory from ft_pinned_alloc. NULL-safe. */
void ft_pinned_free(ft_backend *be, void *p);

/* Where the pages of p (from ft_pinned_alloc) are, from a sample of up to 64 of them:
 * "48.0 GiB on NUMA node 0 (GPU's node)", "48.0 GiB: 75% on NUMA node 0 (GPU's node), the
 * rest elsewhere", "48.0 GiB (no NUMA preference: the GPU's node is unknown)", or "(pages
 * placed on first touch)" when none was resident yet. */
void ft_pinned_describe(const void *p, char *buf, size_t n);

/* Bytes ft_pinned_alloc gave for p (0 for NULL). */
size_t ft_pinned_bytes(const void *p);

#endif
