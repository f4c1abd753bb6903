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

/* Uniform float in [0, 1) with 24 random bits. */
static inline float ft_rng_uniform(ft_rng *r)
{
    return (float)(ft_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

#endif
