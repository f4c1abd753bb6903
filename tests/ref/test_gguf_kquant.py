"""`ftune logits` on a tiny Llama GGUF whose weights are K-quants (and Q5/IQ4), against the
float64 numpy reference forward (tests/ref/llama_ref.py) on the weights gguf-py dequantizes.

The model (written here with gguf-py's GGUFWriter into tmp_path): arch llama, 2 layers,
hidden 256, ffn 512, 4 heads of 64, 2 KV heads, vocab 128, untied, the type mix of the
common llama.cpp presets and every type ftune's quant.c dequantizes beyond Q4_1:
  token_embd Q4_K, output Q6_K, norms F32;
  layer 0: attn_q Q4_K, attn_k Q6_K, attn_v Q5_0, attn_output Q3_K, ffn_gate Q4_K,
           ffn_up Q2_K, ffn_down Q6_K                                  (Q4_K_M / Q3_K_M-like)
  layer 1: attn_q Q5_K, attn_k IQ4_XS, attn_v Q5_1, attn_output IQ4_NL, ffn_gate Q4_K,
           ffn_up Q5_K, ffn_down Q6_K.
Each quantized tensor is random block bytes (numpy default_rng(SEED)) with its fp16 scale
fields chosen so the weights have a standard deviation of about WEIGHT_STD and a block mean
near zero (make_kquant_fixtures.py gives the field offsets). The bytes are stored as they
are (q/k rows in GGUF order): ftune un-permutes attn_q/attn_k for arch llama on load, and
the reference (llama_ref.load_gguf) dequantizes with gguf.quants.dequantize and un-permutes
in numpy, so both see the same HF-layout weights.

Controls (a dequantizer mistake must be visible at this bound): the reference with the Q3_K
hmask convention inverted, and with Q4_K's nibbles read high-first, each moves the logits by
more than MIN_EFFECT times the bound.
"""
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref as R  # noqa: E402
import test_logits_ref as L  # noqa: E402  (ftune_logits, check, assert_effect)
from make_gguf_fixtures import llama_kv  # noqa: E402
from make_kquant_fixtures import FP16_FIELDS  # noqa: E402

SEED = 4404
N_LAYER, C, FF, H, HKV, D, V = 2, 256, 512, 4, 2, 64, 128
WEIGHT_STD = 0.05
IDS = [(i * 37 + 5) % V for i in range(20)]

# ftune's fp32 forward vs the float64 reference, relative to max |logit|. The weights are
# the same fp32 values on both sides (the dequantization is bit-exact, test_gguf.c), so
# what is left is fp32 rounding in the 256/512-long dot products, attention and norms of
# a model whose logits are small (max ~2.9) next to its residual stream. Measured when
# written: ftune 1.26e-6, numpy's own float32 forward 1.77e-6 (so this is what single
# precision costs here, not a dequantization difference); the bound sits ~6-8x above both,
# and the controls below move the logits by ~1e5 times it.
TOL_LOGITS_REL_KQUANT = 1e-5

LAYER_TYPES = [
    dict(attn_q=Q.Q4_K, attn_k=Q.Q6_K, attn_v=Q.Q5_0, attn_output=Q.Q3_K, ffn_gate=Q.Q4_K,
         ffn_up=Q.Q2_K, ffn_down=Q.Q6_K),
    dict(attn_q=Q.Q5_K, attn_k=Q.IQ4_XS, attn_v=Q.Q5_1, attn_output=Q.IQ4_NL, ffn_gate=Q.Q4_K,
         ffn_up=Q.Q5_K, ffn_down=Q.Q6_K),
]
SHAPES = dict(attn_q=(H * D, C), attn_k=(HKV * D, C), attn_v=(HKV * D, C),
              attn_output=(C, H * D), ffn_gate=(FF, C), ffn_up=(FF, C), ffn_down=(C, FF))


def _set_f16(blocks, off, vals):
    blocks[:, off:off + 2] = np.asarray(vals, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_quant(rng, qtype, shape):
    """(rows, row_bytes) uint8 blocks of qtype for an HF-shape (rows, cols) weight: random
    bytes, d scaled per block to std ~ WEIGHT_STD, and dmin (K-quants) / m (Q5_1) chosen so
    that the block's mean is about zero."""
    rows, cols = shape
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block_size
    blocks = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
    d_off, m_off = FP16_FIELDS[qtype]
    # unit d, zero min: the shape of each block's values
    _set_f16(blocks, d_off, np.ones(nb))
    if m_off is not None:
        _set_f16(blocks, m_off, np.zeros(nb))
    x1 = gguf.quants.dequantize(blocks, qtype).astype(np.float64).reshape(nb, block_size)
    d = WEIGHT_STD / np.maximum(x1.std(axis=1), 1e-3) * rng.uniform(0.7, 1.3, size=nb)
    if m_off is None:
        d *= np.where(rng.integers(0, 2, size=nb) == 1, -1.0, 1.0)
        _set_f16(blocks, d_off, d)
    else:
        _set_f16(blocks, d_off, d)
        if qtype == Q.Q5_1:  # x = q * d + m
            m = -x1.mean(axis=1) * d
        else:  # x = d * sc * q - dmin * mn: the min part with unit dmin
            _set_f16(blocks, d_off, np.zeros(nb))
            _set_f16(blocks, m_off, np.ones(nb))
            x2 = gguf.quants.dequantize(blocks, qtype).astype(np.float64).reshape(nb, block_size)
            _set_f16(blocks, d_off, d)
            m = x1.mean(axis=1) * d / np.maximum(-x2.mean(axis=1), 1e-3)
        _set_f16(blocks, m_off, m)
    return blocks.reshape(rows, cols // block_size * type_size)


def write_model(path):
    """Writes the GGUF; returns {gguf tensor name: (qtype, raw blocks)}."""
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("kquant-tiny")
    llama_kv(w, N_LAYER, C, FF, H, HKV, D, V, 1e-5, 10000.0, 256)
    raw = {}

    def add_q(name, qtype, shape):
        b = random_quant(rng, qtype, shape)
        w.add_tensor(name, b, raw_dtype=qtype)
        raw[name] = (qtype, b)

    def add_norm(name):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(C)).astype(np.float32))

    add_q("token_embd.weight", Q.Q4_K, (V, C))
    add_norm("output_norm.weight")
    add_q("output.weight", Q.Q6_K, (V, C))
    for l in range(N_LAYER):
        add_norm(f"blk.{l}.attn_norm.weight")
        add_norm(f"blk.{l}.ffn_norm.weight")
        for g, qt in LAYER_TYPES[l].items():
            add_q(f"blk.{l}.{g}.weight", qt, SHAPES[g])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return raw


def test_kquant_model_logits(tmp_path):
    path = tmp_path / "kquant.gguf"
    raw = write_model(path)
    cfg, w = R.load_gguf(str(path))
    for name, (qt, _) in sorted(raw.items()):
        a = gguf.quants.dequantize(raw[name][1], qt)
        print(f"  {name:26s} {qt.name:6s} std {a.std():.4f} mean {a.mean():+.4f} "
              f"max|w| {np.abs(a).max():.3f}")
        assert np.all(np.isfinite(a)) and 0.01 < a.std() < 0.2, name
    j, got = L.ftune_logits(tmp_path, path, IDS)
    ref = L.check("kquant tiny llama", cfg, w, IDS, j, got, TOL_LOGITS_REL_KQUANT)
    assert np.all(np.isfinite(ref))

    # control 1: Q3_K hmask read with the opposite convention (subtract 4 where the bit is set)
    qt, b = raw["blk.0.attn_output.weight"]
    bad = b.reshape(-1, gguf.GGML_QUANT_SIZES[qt][1]).copy()
    bad[:, :32] ^= 0xFF
    w1 = dict(w)
    w1["model.layers.0.self_attn.o_proj.weight"] = (
        gguf.quants.dequantize(bad, qt).astype(np.float32).reshape(C, H * D))
    L.assert_effect("Q3_K hmask inverted", ref, R.forward(cfg, w1, IDS), TOL_LOGITS_REL_KQUANT)

    # control 2: Q4_K 4-bit values read high nibble first
    qt, b = raw["blk.1.ffn_gate.weight"]
    bad = b.reshape(-1, gguf.GGML_QUANT_SIZES[qt][1]).copy()
    bad[:, 16:] = (bad[:, 16:] << 4) | (bad[:, 16:] >> 4)
    w2 = dict(w)
    w2["model.layers.1.mlp.gate_proj.weight"] = (
        gguf.quants.dequantize(bad, qt).astype(np.float32).reshape(FF, C))
    L.assert_effect("Q4_K nibbles swapped", ref, R.forward(cfg, w2, IDS), TOL_LOGITS_REL_KQUANT)
