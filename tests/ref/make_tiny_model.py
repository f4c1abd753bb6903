#!/usr/bin/env python3
"""Writes a tiny random Llama model as a Hugging Face folder (STYLE C13 fixture).

    python3 tests/ref/make_tiny_model.py OUT_DIR [--f32] [--untied] [--shards N]
                                         [--seed S] [--link-tokenizer] [--qwen3]

Shapes: 2 layers, hidden 64, intermediate 128, 4 heads, 2 KV heads (head_dim 16),
vocab 32000 (the Llama-2 tokenizer from tests/fixtures/tokenizers/llama2 fits), tied
embeddings, rms_norm_eps 1e-5, rope_theta 10000. Weights ~ N(0, 0.02), norms 1 + N(0, 0.1),
seed 1234, stored as BF16 (round to nearest even) unless --f32. Files: config.json,
model.safetensors (or model-0000k-of-0000N.safetensors + model.safetensors.index.json with
--shards N), tokenizer.json and tokenizer_config.json (copied, or relative symlinks with
--link-tokenizer; the committed tests/fixtures/tiny-llama uses symlinks to keep the
repository small). --untied adds lm_head.weight and sets tie_word_embeddings false.
--qwen3 writes a Qwen3ForCausalLM instead (model_type qwen3): head_dim 32, so the attention
width H*D = 128 differs from hidden 64, rope_theta 1e6, and per layer
self_attn.q_norm.weight / k_norm.weight (head_dim values, 1 + N(0, 0.1)), the RMSNorm that
Qwen3 applies to each head of q and k before RoPE.

The safetensors writer below follows the reference layout (formats.md 1.1): compact JSON
header with __metadata__ {"format": "pt"} first, padded with spaces to 8 bytes, tensors
back to back in name order. It is written by hand because numpy has no bfloat16.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOK_DIR = os.path.join(REPO, "tests", "fixtures", "tokenizers", "llama2")

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.0",
}


def f32_to_bf16_bits(a):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (torch's .to(bfloat16))."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32,
         "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "use_sliding_window": False,
         "sliding_window": None, "max_window_layers": 2}


def make_weights(cfg, seed, untied):
    """Returns {name: float32 array} in HF layout (formats.md 2.3)."""
    rng = np.random.default_rng(seed)
    C, F = cfg["hidden_size"], cfg["intermediate_size"]
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    V = cfg["vocab_size"]

    def lin(o, i):
        return rng.normal(0.0, 0.02, size=(o, i)).astype(np.float32)

    def norm(n):
        return (1.0 + rng.normal(0.0, 0.1, size=(n,))).astype(np.float32)

    w = {"model.embed_tokens.weight": lin(V, C)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(C)
        w[p + "self_attn.q_proj.weight"] = lin(H * D, C)
        w[p + "self_attn.k_proj.weight"] = lin(Hkv * D, C)
        w[p + "self_attn.v_proj.weight"] = lin(Hkv * D, C)
        w[p + "self_attn.o_proj.weight"] = lin(C, H * D)
        if cfg["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(D)
            w[p + "self_attn.k_norm.weight"] = norm(D)
        w[p + "post_attention_layernorm.weight"] = norm(C)
        w[p + "mlp.gate_proj.weight"] = lin(F, C)
        w[p + "mlp.up_proj.weight"] = lin(F, C)
        w[p + "mlp.down_proj.weight"] = lin(C, F)
    w["model.norm.weight"] = norm(C)
    if untied:
        w["lm_head.weight"] = lin(V, C)
    return w


def write_safetensors(path, tensors, dtype):
    """tensors: {name: float32 array}; dtype 'BF16' or 'F32'."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, off = [], 0
    for name in sorted(tensors):
        a = tensors[name]
        raw = f32_to_bf16_bits(a).tobytes() if dtype == "BF16" else a.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return off


def read_safetensors(path):
    """Minimal reader (F32/BF16/F16) -> {name: float32 array}; used by make_gguf_fixtures."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[8 + n + b:8 + n + e]
        if info["dtype"] == "BF16":
            a = bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2"))
        elif info["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif info["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4").copy()
        else:
            raise ValueError(f"{path}: {name}: dtype {info['dtype']}")
        out[name] = a.reshape(info["shape"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--f32", action="store_true", help="store F32 instead of BF16")
    ap.add_argument("--untied", action="store_true", help="separate lm_head.weight")
    ap.add_argument("--shards", type=int, default=1, help="split into N shards + index")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--link-tokenizer", action="store_true",
                    help="symlink tokenizer files instead of copying them")
    ap.add_argument("--qwen3", action="store_true", help="a Qwen3 model (q/k norms, head_dim 32)")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    cfg = dict(CONFIG)
    if a.qwen3:
        cfg.update(QWEN3)
    cfg["tie_word_embeddings"] = not a.untied
    if a.f32:
        cfg["torch_dtype"] = "float32"
    w = make_weights(cfg, a.seed, a.untied)
    dtype = "F32" if a.f32 else "BF16"
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")

    names = sorted(w)
    if a.shards <= 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), w, dtype)
    else:
        n = a.shards
        groups = [names[i::n] for i in range(n)]
        weight_map, total = {}, 0
        for k, g in enumerate(groups):
            fn = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
            total += write_safetensors(os.path.join(a.out, fn), {x: w[x] for x in g}, dtype)
            for x in g:
                weight_map[x] = fn
        idx = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump(idx, f, indent=2)
            f.write("\n")

    for fn in ("tokenizer.json", "tokenizer_config.json"):
        dst = os.path.join(a.out, fn)
        if os.path.lexists(dst):
            os.remove(dst)
        if a.link_tokenizer:
            os.symlink(os.path.relpath(os.path.join(TOK_DIR, fn), os.path.abspath(a.out)), dst)
        else:
            shutil.copyfile(os.path.join(TOK_DIR, fn), dst)
    print(f"wrote {a.out}: {len(w)} tensors, {sum(x.size for x in w.values())} parameters, {dtype}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
