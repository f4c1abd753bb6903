#!/usr/bin/env python3
"""Writes the K-quant / Q5 / IQ4 dequantization fixtures of tests/unit/test_gguf.c into
tests/fixtures/gguf/ (or OUT_DIR).

    python3 tests/ref/make_kquant_fixtures.py [OUT_DIR]

One file per ggml type, kquant_<TYPE>.bin, for TYPE in Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K, IQ4_NL, IQ4_XS:

    N_BLOCKS raw blocks (N_BLOCKS * type_size bytes, ggml-common.h block layout)
    followed by N_BLOCKS * block_size little-endian float32 values: gguf-py's
    gguf.quants.dequantize of those bytes (the reference ftune must match bit for bit).

A reader gets N_BLOCKS from the file size: size / (type_size + 4 * block_size).

The blocks are random bytes (numpy default_rng(SEED), so the files are reproducible) whose
fp16 fields (d, and dmin / m where the type has one) are overwritten with finite fp16 values
of moderate size: +-2^e with e uniform in [-12, 4] times a uniform mantissa, random sign.
Block 0 has d = 0 and block 1 a negative d (and, for types with a min field, block 1 a
negative dmin too, block 2 a dmin of 0). Every other byte (scales, hmask, qh, qs) is
random, so every code of every field occurs across the blocks.
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

SEED = 44
N_BLOCKS = 6

# type -> (byte offset of d, byte offset of dmin/m or None), from ggml-common.h
FP16_FIELDS = {
    Q.Q5_0: (0, None),      # block_q5_0:  d, qh[4], qs[16]
    Q.Q5_1: (0, 2),         # block_q5_1:  d, m, qh[4], qs[16]
    Q.Q2_K: (80, 82),       # block_q2_K:  scales[16], qs[64], d, dmin
    Q.Q3_K: (108, None),    # block_q3_K:  hmask[32], qs[64], scales[12], d
    Q.Q4_K: (0, 2),         # block_q4_K:  d, dmin, scales[12], qs[128]
    Q.Q5_K: (0, 2),         # block_q5_K:  d, dmin, scales[12], qh[32], qs[128]
    Q.Q6_K: (208, None),    # block_q6_K:  ql[128], qh[64], scales[16] (int8), d
    Q.IQ4_NL: (0, None),    # block_iq4_nl: d, qs[16]
    Q.IQ4_XS: (0, None),    # block_iq4_xs: d, scales_h (u16), scales_l[4], qs[128]
}


def moderate_f16(rng, n):
    """n finite fp16 values: random sign, mantissa in [1, 2), exponent in [-12, 4]."""
    mag = rng.uniform(1.0, 2.0, size=n) * np.exp2(rng.integers(-12, 5, size=n))
    sign = np.where(rng.integers(0, 2, size=n) == 1, -1.0, 1.0)
    return (sign * mag).astype(np.float16)


def make_blocks(rng, qtype):
    """(N_BLOCKS, type_size) uint8 blocks of qtype with the fp16 fields set as documented."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(N_BLOCKS, type_size), dtype=np.uint8)
    d_off, m_off = FP16_FIELDS[qtype]
    d = moderate_f16(rng, N_BLOCKS)
    d[0] = 0.0
    d[1] = -abs(d[1])
    blocks[:, d_off:d_off + 2] = d.view(np.uint8).reshape(N_BLOCKS, 2)
    if m_off is not None:
        m = moderate_f16(rng, N_BLOCKS)
        m[1] = -abs(m[1])
        m[2] = 0.0
        blocks[:, m_off:m_off + 2] = m.view(np.uint8).reshape(N_BLOCKS, 2)
    return blocks


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "tests", "fixtures", "gguf")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for qtype in FP16_FIELDS:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = make_blocks(rng, qtype)
        ref = gguf.quants.dequantize(blocks, qtype)
        ref = np.ascontiguousarray(ref, dtype=np.float32).reshape(-1)
        assert ref.size == N_BLOCKS * block_size and np.all(np.isfinite(ref)), qtype.name
        path = os.path.join(out, f"kquant_{qtype.name}.bin")
        with open(path, "wb") as f:
            f.write(blocks.tobytes())
            f.write(ref.astype("<f4").tobytes())
        print(f"{os.path.basename(path)}: {os.path.getsize(path)} bytes, {N_BLOCKS} blocks, "
              f"max |x| {float(np.abs(ref).max()):.4g}", file=sys.stderr)


if __name__ == "__main__":
    main()
