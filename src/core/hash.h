/* hash.h - the hashes ftune uses, one copy each.
 *
 * XXH64 (Yann Collet's xxHash, 64-bit variant; the pack file's block and header checksums and
 * the model-identity stamps): the xxhash library's own code (Debian libxxhash-dev, used
 * header-only with XXH_INLINE_ALL, so nothing is linked and the GPU machine needs no
 * libxxhash.so). FNV-1a 64 (Fowler, Noll, Vo; offset basis 14695981039346656037, prime
 * 1099511628211, http://www.isthe.com/chongo/tech/comp/fnv/): string maps and caches, and the
 * checkpoint checksum, which runs it over little-endian 8-byte words (a format of its own: the
 * values are stored in checkpoint manifests, so the word grouping must not change). */
#ifndef FT_HASH_H
#define FT_HASH_H

#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define FT_FNV64_OFFSET 0xcbf29ce484222325ull /* 14695981039346656037 */
#define FT_FNV64_PRIME  0x100000001b3ull      /* 1099511628211 */

/* Streaming XXH64: ft_xxh64_init, ft_xxh64_update any number of times, ft_xxh64_digest.
 * The state lives on the caller's stack or in its struct (no allocation). */
typedef XXH64_state_t ft_xxh64_state;

static inline void ft_xxh64_init(ft_xxh64_state *h, uint64_t seed) { XXH64_reset(h, seed); }
static inline void ft_xxh64_update(ft_xxh64_state *h, const void *data, size_t len)
{
    XXH64_update(h, data, len);
}
static inline uint64_t ft_xxh64_digest(const ft_xxh64_state *h) { return XXH64_digest(h); }

/* XXH64 of data[0, len) with seed, one shot. */
static inline uint64_t ft_xxh64(const void *data, size_t len, uint64_t seed)
{
    return XXH64(data, len, seed);
}

/* FNV-1a 64 of bytes s[0, n), continuing from h (FT_FNV64_OFFSET to start). */
static inline uint64_t ft_fnv1a64(uint64_t h, const void *s, size_t n)
{
    const unsigned char *p = s;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * FT_FNV64_PRIME;
    return h;
}

/* FNV-1a 64 over little-endian 8-byte words of data[0, n), then the n % 8 tail bytes one by
 * one, continuing from h: the checkpoint checksum (src/train/checkpoint.c). Calls on pieces
 * whose lengths are multiples of 8 chain to the hash of the whole. */
static inline uint64_t ft_fnv1a64_words(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = 0;
        for (int b = 0; b < 8; b++) w |= (uint64_t)p[i + b] << (8 * b);
        h = (h ^ w) * FT_FNV64_PRIME;
    }
    for (; i < n; i++) h = (h ^ p[i]) * FT_FNV64_PRIME;
    return h;
}

#endif
