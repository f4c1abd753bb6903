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

Also: the fuzz seed tests/fuzz/corpus/gguf/kquant_tiny.gguf (the same builder, smallest dims)
loads and gives numpy's logits; and `ftune merge` of a random PEFT adapter into the K-quant
model (q/k/v/o/up targets: every one of the nine types merged, gate/down/embeddings/output
converted) writes, bit for bit, what numpy computes from gguf.quants.dequantize (default
safetensors BF16, and --format gguf --dtype f16), within a named tolerance of the float64
formula W + scale * B A, and the merged GGUF's logits match `--adapter` on the source.
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

import gguf
from gguf import GGMLQuantizationType as Q

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref as R  # noqa: E402
import test_logits_ref as L  # noqa: E402  (ftune_logits, check, assert_effect)
import test_merge as M  # noqa: E402  (merged_ref, bf16_bits, gguf_fields, check_gguf_weights)
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


# The fuzz seed tests/fuzz/corpus/gguf/kquant_tiny.gguf (tests/fuzz/make_corpus.py writes it
# with write_fuzz_seed): a small Llama that reaches all nine dequantizers through
# ft_model_load. A K-quant row holds 256 values, so C = 256; the other dimensions are tiny
# (head_dim 2, FF 2, vocab 4), which leaves attn_output (256 x 2) and ffn_down (256 x 2) with
# rows too short for any block type: F16. 13 KB; the other gguf seeds are 22-51 KB.
FUZZ_SEED_DIMS = (2, 256, 2, 1, 1, 2, 4)  # n_layer, C, FF, H, HKV, D, V
FUZZ_SEED_TYPES = [
    dict(attn_q=Q.Q4_K, attn_k=Q.Q6_K, attn_v=Q.Q5_0, attn_output=Q.F16, ffn_gate=Q.Q3_K,
         ffn_up=Q.Q2_K, ffn_down=Q.F16),
    dict(attn_q=Q.Q5_K, attn_k=Q.IQ4_XS, attn_v=Q.Q5_1, attn_output=Q.F16, ffn_gate=Q.IQ4_NL,
         ffn_up=Q.Q5_K, ffn_down=Q.F16),
]
FUZZ_SEED = os.path.join(HERE, "..", "fuzz", "corpus", "gguf", "kquant_tiny.gguf")


def write_fuzz_seed(path):
    """The fuzz seed (13,056 bytes with gguf-py 0.19): embeddings Q4_K, output Q6_K, norms F16, layers as
    FUZZ_SEED_TYPES; no tokenizer metadata (the other gguf seeds carry tokenizers)."""
    return write_model(path, FUZZ_SEED_DIMS, FUZZ_SEED_TYPES, norm_type=Q.F16,
                       name="kquant-fuzz-seed")


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


def shapes(c, ff, h, hkv, d):
    """HF (rows, cols) of each layer projection, by GGUF base name."""
    return dict(attn_q=(h * d, c), attn_k=(hkv * d, c), attn_v=(hkv * d, c),
                attn_output=(c, h * d), ffn_gate=(ff, c), ffn_up=(ff, c), ffn_down=(c, ff))


def write_model(path, dims=None, layer_types=None, embd_type=Q.Q4_K, output_type=Q.Q6_K,
                norm_type=Q.F32, name="kquant-tiny"):
    """Writes the GGUF; returns {gguf tensor name: (qtype, raw blocks or float array)}.

    dims = (n_layer, C, FF, H, HKV, D, V), default the module's; layer_types = one dict per
    layer {GGUF base name: type}, default LAYER_TYPES. A quantized type's row length must be
    a multiple of its block size; F32/F16 weights are normal(0, WEIGHT_STD). norm_type F32
    or F16. attention.key_length is written when D != C / H. With the defaults the bytes
    are those this file wrote before these parameters existed (same rng sequence)."""
    n_layer, c, ff, h, hkv, d, v = dims or (N_LAYER, C, FF, H, HKV, D, V)
    layer_types = layer_types or LAYER_TYPES
    shp = shapes(c, ff, h, hkv, d)
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    llama_kv(w, n_layer, c, ff, h, hkv, d, v, 1e-5, 10000.0, 256)
    if d * h != c:
        w.add_key_length(d)
    raw = {}
    fdt = {Q.F32: np.float32, Q.F16: np.float16}

    def add_q(tname, qtype, shape):
        if qtype in fdt:
            b = (WEIGHT_STD * rng.standard_normal(shape)).astype(fdt[qtype])
            w.add_tensor(tname, b)
        else:
            b = random_quant(rng, qtype, shape)
            w.add_tensor(tname, b, raw_dtype=qtype)
        raw[tname] = (qtype, b)

    def add_norm(tname):
        w.add_tensor(tname, (1.0 + 0.1 * rng.standard_normal(c)).astype(fdt[norm_type]))

    add_q("token_embd.weight", embd_type, (v, c))
    add_norm("output_norm.weight")
    add_q("output.weight", output_type, (v, c))
    for l in range(n_layer):
        add_norm(f"blk.{l}.attn_norm.weight")
        add_norm(f"blk.{l}.ffn_norm.weight")
        for g, qt in layer_types[l].items():
            add_q(f"blk.{l}.{g}.weight", qt, shp[g])
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


# ---- the fuzz seed -------------------------------------------------------------------------

def test_fuzz_seed_loads(tmp_path):
    """The committed seed is what write_fuzz_seed makes (its types), and ftune loads it with
    numpy's logits: so the fuzzer starts from a model that reaches every dequantizer."""
    import gguf as G
    rd = G.GGUFReader(FUZZ_SEED)
    types = {t.name: t.tensor_type for t in rd.tensors}
    for l, lt in enumerate(FUZZ_SEED_TYPES):
        for g, qt in lt.items():
            assert types[f"blk.{l}.{g}.weight"] == qt, (l, g)
    assert {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q5_0, Q.Q5_1, Q.IQ4_NL,
            Q.IQ4_XS} <= set(types.values())
    assert os.path.getsize(FUZZ_SEED) < 16384
    cfg, w = R.load_gguf(FUZZ_SEED)
    ids = [0, 3, 1, 2, 2, 0, 3]
    j, got = L.ftune_logits(tmp_path, FUZZ_SEED, ids)
    L.check("kquant fuzz seed", cfg, w, ids, j, got, TOL_LOGITS_REL_KQUANT)


# ---- ftune merge on the K-quant model ------------------------------------------------------

# Merged weights against the float64 formula dequantize(W) + scale * (B @ A), elementwise:
# |got - exact| <= TOL_MERGE_BF16_REL * |exact| + TOL_MERGE_ABS. BF16 keeps 8 significant
# bits, so a correct rounding is within u = 2^-8 relative (measured when written: 0.996 u);
# the bound is 2u, room for the fp32 steps before the rounding. TOL_MERGE_ABS covers fp32
# cancellation where W + scale * BA is near zero (fp32 epsilon 1.2e-7 times |W| + |BA| < 1).
# The bit-exact comparison below (numpy doing ftune's fp64-dot, fp32-add formula, then
# bf16/f16 rounding) is the stricter check; this one ties it to the plain formula.
TOL_MERGE_BF16_REL = 2.0 ** -7
TOL_MERGE_ABS = 1e-6
MERGE_TARGETS = {"q_proj": ("self_attn", "attn_q"), "k_proj": ("self_attn", "attn_k"),
                 "v_proj": ("self_attn", "attn_v"), "o_proj": ("self_attn", "attn_output"),
                 "up_proj": ("mlp", "ffn_up")}
MERGE_R, MERGE_ALPHA = 4, 8


def write_adapter(d, seed=45):
    """A PEFT LoRA adapter (r MERGE_R, alpha MERGE_ALPHA) for the default K-quant model:
    random lora_A (uniform, 1/sqrt(in)) and lora_B (normal, std WEIGHT_STD) for
    MERGE_TARGETS in every layer. Returns {(layer, proj): (A, B)} as float32."""
    rng = np.random.default_rng(seed)
    shp = shapes(C, FF, H, HKV, D)
    t, ab = {}, {}
    for l in range(N_LAYER):
        for p, (parent, g) in MERGE_TARGETS.items():
            rows, cols = shp[g]
            A = (rng.uniform(-1, 1, (MERGE_R, cols)) / np.sqrt(cols)).astype(np.float32)
            B = rng.normal(0, WEIGHT_STD, (rows, MERGE_R)).astype(np.float32)
            key = f"base_model.model.model.layers.{l}.{parent}.{p}"
            t[key + ".lora_A.weight"], t[key + ".lora_B.weight"] = A, B
            ab[(l, p)] = (A, B)
    os.makedirs(d, exist_ok=True)
    save_file(t, os.path.join(d, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": MERGE_R, "lora_alpha": MERGE_ALPHA,
                   "target_modules": list(MERGE_TARGETS), "bias": "none",
                   "task_type": "CAUSAL_LM", "base_model_name_or_path": "kquant-tiny"}, f)
    return ab


def test_kquant_merge(tmp_path):
    path = tmp_path / "kquant.gguf"
    raw = write_model(path)
    ad = tmp_path / "ad"
    ab = write_adapter(str(ad))
    scale = MERGE_ALPHA / MERGE_R
    cfg, base = R.load_gguf(str(path))  # every tensor dequantized by gguf-py, q/k un-permuted
    shp = shapes(C, FF, H, HKV, D)
    want, exact = dict(base), {}
    for l in range(N_LAYER):
        for p, (parent, g) in MERGE_TARGETS.items():
            qt, blocks = raw[f"blk.{l}.{g}.weight"]
            w = gguf.quants.dequantize(blocks, qt).astype(np.float32).reshape(shp[g])
            if g in ("attn_q", "attn_k"):  # GGUF (llama.cpp) row order -> HF
                w = R.gguf_unpermute(w, H if g == "attn_q" else HKV)
            name = f"model.layers.{l}.{parent}.{p}.weight"
            assert np.array_equal(w, base[name]), name
            A, B = ab[(l, p)]
            want[name] = M.merged_ref(w, A, B, scale)
            exact[name] = w.astype(np.float64) + scale * (B.astype(np.float64) @ A.astype(np.float64))
    print(f"\n{len(exact)} merged projections over types "
          f"{sorted({raw[f'blk.{l}.{g}.weight'][0].name for l in range(N_LAYER) for _, g in MERGE_TARGETS.values()})}")

    # default output: safetensors, BF16
    out = tmp_path / "merged"
    M.merge(["--model", path, "--adapter", ad, "--out", out])
    got = M.st_raw(str(out))
    assert set(got) == set(want), set(got) ^ set(want)
    worst, least_moved = 0.0, np.inf
    for name, w in want.items():
        dt, shape, data = got[name]
        assert (dt, shape) == ("BF16", w.shape), (name, dt, shape)
        have = np.frombuffer(data, "<u2").reshape(shape)
        bad = int(np.count_nonzero(have != M.bf16_bits(w)))
        assert bad == 0, f"{name}: {bad} of {w.size} bf16 values differ from numpy"
        if name in exact:
            x = exact[name]
            g32 = R.bf16_bits_to_f32(have).reshape(shape).astype(np.float64)
            err = np.abs(g32 - x)
            assert np.all(err <= TOL_MERGE_BF16_REL * np.abs(x) + TOL_MERGE_ABS), name
            worst = max(worst, float((err / (np.abs(x) + TOL_MERGE_ABS)).max()))
            moved = np.abs(x - base[name]).max() / np.abs(base[name]).max()
            assert moved > 10 * TOL_MERGE_BF16_REL, f"{name}: the adapter barely moves it ({moved:.3g})"
            least_moved = min(least_moved, moved)
    print(f"bf16 safetensors: {len(want)} tensors bit-identical to numpy; merged vs float64 "
          f"formula max rel err {worst:.3g} = {worst * 256:.3f} u (bound {TOL_MERGE_BF16_REL:.3g} "
          f"+ {TOL_MERGE_ABS:g} abs); adapter moves each merged tensor by >= {least_moved:.3g} "
          f"of its max |w|")
    c = json.loads((out / "config.json").read_text())
    assert c["tie_word_embeddings"] is False and c["num_key_value_heads"] == HKV

    # --format gguf --dtype f16: q/k back in GGUF order, 2-D weights F16, norms F32
    out = tmp_path / "m.gguf"
    M.merge(["--model", path, "--adapter", ad, "--out", out, "--format", "gguf", "--dtype", "f16"])
    rd, kv = M.gguf_fields(str(out))
    assert kv["general.architecture"] == "llama" and kv["llama.block_count"] == N_LAYER
    assert M.check_gguf_weights(rd, want, "f16", cfg) == len(want)
    print(f"f16 GGUF: {len(want)} tensors bit-identical to numpy")
    ids = IDS[:12]
    _, ref = L.ftune_logits(tmp_path, path, ids, adapter=ad)
    _, mrg = L.ftune_logits(tmp_path, out, ids)
    err = float(np.abs(mrg - ref).max() / np.abs(ref).max())
    print(f"merged f16 GGUF vs --adapter on the K-quant GGUF: {err:.3g} (bound {M.TOL_LOGITS_F16:g})")
    assert err <= M.TOL_LOGITS_F16
