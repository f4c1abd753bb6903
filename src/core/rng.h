/* rng.h - a small deterministic PRNG (splitmix64 seeding + xoshiro256**, Blackman & Vigna
 * 2018) for initialisation and shuffling: the same seed gives the same stream everywhere. */
#ifndef FT_RNG_H
#define FT_RNG_H

#include <stdint.h>

typedef struct ft_rng { uint64_t s[4]; } ft_rng;

/* splitmix64's output function (Steele, Lea & Flood, OOPSLA 2014; Vigna's splitmix64.c): the
 * two xor-shift-multiply rounds and the final xor-shift, a bijection on 64 bits. */
static inline uint64_t ft_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t ft_splitmix64(uint64_t *x)
{
    return ft_mix64(*x += 0x9e3779b97f4a7c15ull);
}

/* The random streams a training run derives per step from its seed (ft_seed_derive). */
enum ft_seed_stream {
    FT_SEED_DROPOUT = 0, /* LoRA dropout masks (src/model/llama.c ft_seed_derive_proj per layer) */
    FT_SEED_NEFTUNE = 1, /* NEFTune embedding noise (offload/exec_step.c) */
};

/* The seed of stream s at optimizer step `step` (0-based) of a run seeded `seed`: seed times
 * the stream's odd multiplier (splitmix64's gamma for dropout, its first mixing constant for
 * NEFTune), xor (step + 1). A pure function of (seed, stream, step), so a resumed run draws the
 * same masks and noise; the values are those of every earlier ftune version. */
static inline uint64_t ft_seed_derive(uint64_t seed, enum ft_seed_stream s, int64_t step)
{
    const uint64_t mul = s == FT_SEED_NEFTUNE ? 0xbf58476d1ce4e5b9ull : 0x9e3779b97f4a7c15ull;
    return (seed * mul) ^ (uint64_t)(step + 1);
}

/* The dropout seed of projection p (0-based) of layer `layer` from a micro-batch's dropout
 * seed `base` (0: no dropout, returned as 0): base xor the layer times splitmix64's gamma xor
 * (p + 1) in the top byte, then two of splitmix64's xor-shift-multiply rounds; odd, so never 0. */
static inline uint64_t ft_seed_derive_proj(uint64_t base, int64_t layer, int p)
{
    if (!base) return 0;
    uint64_t x = base ^ ((uint64_t)layer * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)(p + 1) << 56);
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
    return (x ^ (x >> 29)) | 1;
}

static inline void ft_rng_seed(ft_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = ft_splitmix64(&seed);
}

static inline uint64_t ft_rng_next(ft_rng *r)
{
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5, res = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return res;
}

/* Fisher-Yates shuffle of a[0..n) with r: for i = n-1 down to 1, a[i] swapped with a[k],
 * k = next % (i + 1) (one draw per i, in that order). */
static inline void ft_rng_shuffle_i64(ft_rng *r, int64_t *a, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t k = (int64_t)(ft_rng_next(r) % (uint64_t)(i + 1)), t = a[i];
        a[i] = a[k];
        a[k] = t;
    }
}

/* Uniform float in [0, 1) with 24 random bits. */
static inline float ft_rng_uniform(ft_rng *r)
{
    return (float)(ft_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

#endif
