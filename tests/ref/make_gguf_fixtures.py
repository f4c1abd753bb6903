#!/usr/bin/env python3
"""Writes the GGUF fixtures of tests/unit/test_gguf.c into tests/fixtures/gguf/ (or OUT_DIR).

    python3 tests/ref/make_gguf_fixtures.py [OUT_DIR]

Files (all made with gguf-py's GGUFWriter and gguf.quants, the reference llama.cpp uses):
  quant_types.gguf       one (16, 128) tensor per type F32, F16, BF16, Q8_0, Q4_0, Q4_1
                         ("t_f32", "t_q4_0", ...; values ~ N(0,1) with an all-zero block, a
                         constant block, a +-100 block and a block of 1e-3 values), a 3-D F32
                         tensor "t_3d" (2, 3, 32), and metadata of every value type
                         ("test.u8" ... "test.f64", arrays "test.arr_i32", "test.arr_f32",
                         "test.arr_str", "test.arr_u8").
  quant_types.expected.safetensors
                         F32 tensors "<name>.orig" (the input) and "<name>.dequant"
                         (gguf.quants.dequantize of the stored bytes) for each tensor above.
  tiny-llama.gguf        the weights of tests/fixtures/tiny-llama (read from its BF16
                         model.safetensors) as a llama-arch GGUF, q/k rows permuted as
                         llama.cpp's convert_hf_to_gguf.py LlamaModel.permute does. Types:
                         token_embd Q4_0; layer 0 all F32 (exact); layer 1 attn_q Q8_0,
                         attn_k Q4_1, attn_v Q4_0, attn_output F16, ffn_gate BF16, ffn_up F32,
                         ffn_down Q8_0; norms F32. Tied (no output.weight). No tokenizer
                         metadata except bos/eos ids.
  rope-llama3.gguf       a 1-layer llama (hidden 64, 1 head, head_dim 64, vocab 32, F16
                         weights) with rope.freq_base 500000 and rope_freqs.weight holding the
                         Llama-3.1 divisors (factor 8, low 1, high 4, original 8192) computed
                         exactly as convert_hf_to_gguf.py does.
  qwen2-tiny.gguf        a 1-layer qwen2-arch model (hidden 32, 2 heads, 1 KV head,
                         head_dim 16, ffn 64, vocab 16, untied, F32) whose every tensor
                         holds value(name, k) = ((k * 7 + len(name)) % 101 - 50) / 1000 for
                         flat index k in HF row-major order, with q/k/v biases: a test can
                         recompute every element; qwen2 is NEOX rope, so nothing is permuted.
"""
import math
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from make_tiny_model import read_safetensors  # noqa: E402

TYPES = [("f32", Q.F32), ("f16", Q.F16), ("bf16", Q.BF16), ("q8_0", Q.Q8_0),
         ("q4_0", Q.Q4_0), ("q4_1", Q.Q4_1)]


def add_tensor(w, name, a, qtype):
    """Quantizes a float32 array (HF row-major shape) and adds it; returns the stored bytes."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if qtype == Q.F32:
        w.add_tensor(name, a)
        return a
    if qtype == Q.F16:
        h = a.astype(np.float16)
        w.add_tensor(name, h)
        return h
    q = gguf.quants.quantize(a, qtype)
    w.add_tensor(name, q, raw_dtype=qtype)
    return q


def quant_types(out):
    rng = np.random.default_rng(42)
    a = rng.normal(0.0, 1.0, size=(16, 128)).astype(np.float32)
    a[0, 0:32] = 0.0            # d == 0 block
    a[1, 32:64] = 0.75          # constant block (Q4_1 d == 0)
    a[2, 64:96] = rng.uniform(-100, 100, size=32)
    a[3, 96:128] = rng.normal(0, 1e-3, size=32)
    w = gguf.GGUFWriter(os.path.join(out, "quant_types.gguf"), "test")
    w.add_key_value("test.u8", 200, gguf.GGUFValueType.UINT8)
    w.add_key_value("test.i8", -100, gguf.GGUFValueType.INT8)
    w.add_key_value("test.u16", 60000, gguf.GGUFValueType.UINT16)
    w.add_key_value("test.i16", -30000, gguf.GGUFValueType.INT16)
    w.add_key_value("test.u32", 4000000000, gguf.GGUFValueType.UINT32)
    w.add_key_value("test.i32", -2000000000, gguf.GGUFValueType.INT32)
    w.add_key_value("test.f32", 0.25, gguf.GGUFValueType.FLOAT32)
    w.add_key_value("test.bool", True, gguf.GGUFValueType.BOOL)
    w.add_key_value("test.str", "h\u00e9llo", gguf.GGUFValueType.STRING)
    w.add_key_value("test.u64", 2**63 + 5, gguf.GGUFValueType.UINT64)
    w.add_key_value("test.i64", -(2**40), gguf.GGUFValueType.INT64)
    w.add_key_value("test.f64", 1e-300, gguf.GGUFValueType.FLOAT64)
    w.add_key_value("test.arr_i32", [1, -2, 3], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
    w.add_key_value("test.arr_f32", [0.5, -1.5], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)
    w.add_key_value("test.arr_str", ["a", "", "\u4e2d\u6587"], gguf.GGUFValueType.ARRAY,
                    gguf.GGUFValueType.STRING)
    w.add_key_value("test.arr_u8", [7, 8, 9, 10], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT8)
    exp = {}
    for nm, qt in TYPES:
        stored = add_tensor(w, "t_" + nm, a, qt)
        deq = a if qt == Q.F32 else gguf.quants.dequantize(stored, qt).reshape(a.shape)
        exp[f"t_{nm}.orig"] = a.copy()
        exp[f"t_{nm}.dequant"] = np.ascontiguousarray(deq, dtype=np.float32)
    t3 = np.arange(2 * 3 * 32, dtype=np.float32).reshape(2, 3, 32) * 0.5 - 7
    add_tensor(w, "t_3d", t3, Q.F32)
    exp["t_3d.orig"] = t3
    exp["t_3d.dequant"] = t3
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(exp, os.path.join(out, "quant_types.expected.safetensors"), metadata={"format": "pt"})


def permute(weights, n_head, n_head_kv):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF -> GGUF llama), formats.md 2.4."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def llama_kv(w, n_layer, C, F, H, Hkv, D, V, eps, theta, ctx):
    w.add_block_count(n_layer)
    w.add_context_length(ctx)
    w.add_embedding_length(C)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)


def tiny_llama(out):
    import json
    src = os.path.join(REPO, "tests", "fixtures", "tiny-llama")
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    t = read_safetensors(os.path.join(src, "model.safetensors"))
    C, F = cfg["hidden_size"], cfg["intermediate_size"]
    H, Hkv, D, V = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                    cfg["vocab_size"])
    w = gguf.GGUFWriter(os.path.join(out, "tiny-llama.gguf"), "llama")
    w.add_name("tiny-llama")
    llama_kv(w, cfg["num_hidden_layers"], C, F, H, Hkv, D, V, cfg["rms_norm_eps"],
             cfg["rope_theta"], cfg["max_position_embeddings"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    add_tensor(w, "token_embd.weight", t["model.embed_tokens.weight"], Q.Q4_0)
    add_tensor(w, "output_norm.weight", t["model.norm.weight"], Q.F32)
    layer_types = [
        dict(attn_q=Q.F32, attn_k=Q.F32, attn_v=Q.F32, attn_output=Q.F32, ffn_gate=Q.F32,
             ffn_up=Q.F32, ffn_down=Q.F32),
        dict(attn_q=Q.Q8_0, attn_k=Q.Q4_1, attn_v=Q.Q4_0, attn_output=Q.F16, ffn_gate=Q.BF16,
             ffn_up=Q.F32, ffn_down=Q.Q8_0),
    ]
    hf = dict(attn_q="self_attn.q_proj", attn_k="self_attn.k_proj", attn_v="self_attn.v_proj",
              attn_output="self_attn.o_proj", ffn_gate="mlp.gate_proj", ffn_up="mlp.up_proj",
              ffn_down="mlp.down_proj")
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        add_tensor(w, f"blk.{l}.attn_norm.weight", t[p + "input_layernorm.weight"], Q.F32)
        add_tensor(w, f"blk.{l}.ffn_norm.weight", t[p + "post_attention_layernorm.weight"], Q.F32)
        for g, h in hf.items():
            x = t[p + h + ".weight"]
            if g == "attn_q":
                x = permute(x, H, H)
            elif g == "attn_k":
                x = permute(x, H, Hkv)
            add_tensor(w, f"blk.{l}.{g}.weight", x, layer_types[l][g])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def rope_llama3(out):
    C, F, H, Hkv, D, V = 64, 32, 1, 1, 64, 32
    base, factor, lf, hf, old = 500000.0, 8.0, 1.0, 4.0, 8192
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(os.path.join(out, "rope-llama3.gguf"), "llama")
    llama_kv(w, 1, C, F, H, Hkv, D, V, 1e-5, base, 131072)
    # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (rope_type llama3), in float32
    freqs = 1.0 / (np.float32(base) ** (np.arange(0, D, 2, dtype=np.float32) / np.float32(D)))
    low_wl, high_wl = old / lf, old / hf
    fac = []
    for fr in freqs.astype(np.float64):
        wl = 2 * math.pi / fr
        if wl < high_wl:
            fac.append(1.0)
        elif wl > low_wl:
            fac.append(factor)
        else:
            s = (old / wl - lf) / (hf - lf)
            fac.append(1 / ((1 - s) / factor + s))
    add_tensor(w, "rope_freqs.weight", np.array(fac, dtype=np.float32), Q.F32)

    def lin(o, i):
        return rng.normal(0, 0.02, size=(o, i)).astype(np.float32)

    add_tensor(w, "token_embd.weight", lin(V, C), Q.F16)
    add_tensor(w, "output_norm.weight", np.ones(C, np.float32), Q.F32)
    add_tensor(w, "blk.0.attn_norm.weight", np.ones(C, np.float32), Q.F32)
    add_tensor(w, "blk.0.ffn_norm.weight", np.ones(C, np.float32), Q.F32)
    for g, (o, i) in dict(attn_q=(H * D, C), attn_k=(Hkv * D, C), attn_v=(Hkv * D, C),
                          attn_output=(C, H * D), ffn_gate=(F, C), ffn_up=(F, C),
                          ffn_down=(C, F)).items():
        add_tensor(w, f"blk.0.{g}.weight", lin(o, i), Q.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def pattern(name, shape):
    k = np.arange(int(np.prod(shape)), dtype=np.int64)
    return (((k * 7 + len(name)) % 101 - 50) / 1000).astype(np.float32).reshape(shape)


def one_layer_qkv_bias_shapes(C, F, H, Hkv, D, V):
    """GGUF name -> HF-order shape of a 1-layer untied model with q/k/v biases, no o bias."""
    return {"token_embd.weight": (V, C), "output_norm.weight": (C,), "output.weight": (V, C),
            "blk.0.attn_norm.weight": (C,), "blk.0.ffn_norm.weight": (C,),
            "blk.0.attn_q.weight": (H * D, C), "blk.0.attn_q.bias": (H * D,),
            "blk.0.attn_k.weight": (Hkv * D, C), "blk.0.attn_k.bias": (Hkv * D,),
            "blk.0.attn_v.weight": (Hkv * D, C), "blk.0.attn_v.bias": (Hkv * D,),
            "blk.0.attn_output.weight": (C, H * D), "blk.0.ffn_gate.weight": (F, C),
            "blk.0.ffn_up.weight": (F, C), "blk.0.ffn_down.weight": (C, F)}


def qwen2_tiny(out):
    C, F, H, Hkv, D, V = 32, 64, 2, 1, 16, 16
    w = gguf.GGUFWriter(os.path.join(out, "qwen2-tiny.gguf"), "qwen2")
    w.add_block_count(1)
    w.add_context_length(4096)
    w.add_embedding_length(C)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_bos_token_id(15)
    w.add_eos_token_id(14)
    for name, shape in one_layer_qkv_bias_shapes(C, F, H, Hkv, D, V).items():
        add_tensor(w, name, pattern(name, shape), Q.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "tests", "fixtures", "gguf")
    os.makedirs(out, exist_ok=True)
    quant_types(out)
    tiny_llama(out)
    rope_llama3(out)
    qwen2_tiny(out)
    for fn in sorted(os.listdir(out)):
        print(f"{fn}: {os.path.getsize(os.path.join(out, fn))} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
