"""Independent numpy reference forward pass of a Llama-family decoder (tests only).

Written from the spec digest /work/shared/reference/formats.md and the public model
definitions it cites, without any ftune code:
  - HF config.json fields and defaults (formats.md 2.1), RoPE inverse frequencies incl.
    `rope_scaling` linear and llama3, legacy `rope_scaling` and v5 `rope_parameters` (2.2);
  - HF tensor names and block math (2.3): RMSNorm, rotate-half RoPE as transformers applies
    it, grouped-query causal attention (KV head of query head h = h // (H / Hkv), i.e.
    transformers' repeat_kv), SwiGLU MLP, tied or untied output matrix;
  - weights from a HF folder, read with the `safetensors` package (safetensors.deserialize
    validates the file; BF16/F16/F32 converted here since numpy has no bfloat16; sharded
    folders through model.safetensors.index.json, 1.2);
  - weights from a GGUF file (4.3), read with gguf-py's GGUFReader and dequantized with
    gguf.quants.dequantize, llama.cpp's q/k row permutation undone for arch "llama" (2.4),
    config from the {arch}.* metadata, rope_freqs.weight divisors (llama.cpp's Llama-3.1
    scaling: theta_i / rope_freqs[i]) and {arch}.rope.scaling.{type,factor} = linear;
    arch "qwen2" (q/k/v biases, NEOX rope, no permutation) as well, and arch "qwen3" (NEOX
    rope, no permutation, blk.N.attn_q_norm / attn_k_norm);
  - Qwen3 (transformers modeling_qwen3.py Qwen3Attention): q and k are RMS-normalized per
    head (head_dim values, weights self_attn.q_norm / k_norm, eps rms_norm_eps) after the
    projections and before RoPE; biases follow attention_bias as for llama;
  - an optional PEFT LoRA adapter (3.2-3.4): W' = W + s * B @ A with s = lora_alpha / r,
    or lora_alpha / sqrt(r) with use_rslora.

Everything is computed in the dtype passed to forward() (float64 by default, float32 to see
what plain single precision gives). Usage:

    cfg, w = load_model(path)                  # folder or .gguf; float32 weights
    w = apply_peft_adapter(cfg, w, adapter_dir)  # optional
    logits = forward(cfg, w, ids)              # (T, V) float64
    loss = next_token_loss(logits, ids)
"""
import json
import math
import os

import numpy as np

PROJ = {  # PEFT / HF module name -> parent module
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}


# ---------------------------------------------------------------------------------------
# safetensors (formats.md 1)

def bf16_bits_to_f32(u16):
    """uint16 bfloat16 bit patterns -> float32 (exact: bf16 is the top half of an fp32)."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


_ST_NUMPY = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}


def read_safetensors(path):
    """{name: float32 ndarray} of a .safetensors file (F32, F16, BF16, F64), plus metadata."""
    import safetensors

    with open(path, "rb") as f:
        raw = f.read()
    out = {}
    for name, t in safetensors.deserialize(raw):
        dt, shape, data = t["dtype"], tuple(t["shape"]), bytes(t["data"])
        if dt == "BF16":
            a = bf16_bits_to_f32(np.frombuffer(data, dtype="<u2"))
        elif dt in _ST_NUMPY:
            a = np.frombuffer(data, dtype=_ST_NUMPY[dt]).astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name} has dtype {dt}, not a float type")
        out[name] = a.reshape(shape)
    with safetensors.safe_open(path, framework="numpy") as f:
        meta = f.metadata() or {}
    return out, meta


def read_hf_weights(folder):
    """All tensors of a HF folder: model.safetensors or the shards of the index."""
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for fn in files:
        part, _ = read_safetensors(os.path.join(folder, fn))
        w.update(part)
    return w


# ---------------------------------------------------------------------------------------
# config (formats.md 2.1, 2.2)

def config_from_hf(d):
    """Normalized config dict from a parsed config.json (LlamaConfig defaults)."""
    H = d.get("num_attention_heads", 32)
    C = d.get("hidden_size", 4096)
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = d.get("rope_theta")
    if theta is None:
        theta = rope.get("rope_theta", 10000.0)
    rtype = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
    if d.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotImplementedError("partial_rotary_factor != 1")
    arch = (d.get("architectures") or ["LlamaForCausalLM"])[0]
    mt = d.get("model_type")
    if mt not in ("llama", "mistral", "qwen2", "qwen3"):
        mt = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}.get(arch, "llama")
    return {
        "arch": mt if mt in ("qwen2", "qwen3") else "llama",
        "qk_norm": mt == "qwen3",
        "vocab_size": d.get("vocab_size", 32000),
        "hidden_size": C,
        "intermediate_size": d.get("intermediate_size", 11008),
        "num_hidden_layers": d.get("num_hidden_layers", 32),
        "num_attention_heads": H,
        "num_key_value_heads": d.get("num_key_value_heads") or H,
        "head_dim": d.get("head_dim") or C // H,
        "rms_norm_eps": d.get("rms_norm_eps", 1e-6),
        "rope_theta": float(theta),
        "rope_type": rtype,
        "rope": dict(rope),
        "rope_freq_divisors": None,
        "max_position_embeddings": d.get("max_position_embeddings", 2048),
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", False)),
    }


def rope_inv_freq(cfg):
    """(head_dim/2,) float64 inverse frequencies (transformers modeling_rope_utils)."""
    D = cfg["head_dim"]
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D)
    rt, p = cfg["rope_type"], cfg["rope"]
    if rt == "default":
        pass
    elif rt == "linear":
        inv = inv / float(p["factor"])
    elif rt == "llama3":
        factor, lf, hf = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old = float(p["original_max_position_embeddings"])
        low_wl, high_wl = old / lf, old / hf
        wl = 2 * math.pi / inv
        out = np.empty_like(inv)
        for i in range(len(inv)):
            if wl[i] > low_wl:
                out[i] = inv[i] / factor
            elif wl[i] < high_wl:
                out[i] = inv[i]
            else:
                s = (old / wl[i] - lf) / (hf - lf)
                out[i] = (1 - s) * inv[i] / factor + s * inv[i]
        inv = out
    else:
        raise NotImplementedError(f"rope type {rt}")
    if cfg.get("rope_freq_divisors") is not None:  # GGUF rope_freqs.weight
        inv = inv / cfg["rope_freq_divisors"].astype(np.float64)
    return inv


def load_hf(folder):
    """(cfg, {HF name: float32 array}) of a Hugging Face model folder."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = config_from_hf(json.load(f))
    return cfg, read_hf_weights(folder)


# ---------------------------------------------------------------------------------------
# GGUF (formats.md 4.3, 2.4)

_GGUF_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}


def gguf_unpermute(w, n_head):
    """GGUF(llama) rows -> HF rows: hf[h*hd + j*hd/2 + i] = gguf[h*hd + 2*i + j] (2.4)."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def load_gguf(path):
    """(cfg, {HF name: float32 array}) of a llama/qwen2/qwen3 GGUF file, in HF layout."""
    import gguf

    r = gguf.GGUFReader(path)
    arch = _field(r, "general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise NotImplementedError(f"GGUF arch {arch}")
    raw = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # ggml ne is innermost first
        raw[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
    H = int(_field(r, f"{arch}.attention.head_count"))
    C = int(_field(r, f"{arch}.embedding_length"))
    Hkv = int(_field(r, f"{arch}.attention.head_count_kv", H))
    D = int(_field(r, f"{arch}.attention.key_length", C // H))
    rope, rtype = {}, "default"
    st = _field(r, f"{arch}.rope.scaling.type")
    if st in ("linear",):
        rtype, rope = "linear", {"factor": float(_field(r, f"{arch}.rope.scaling.factor"))}
    elif st not in (None, "none"):
        raise NotImplementedError(f"GGUF rope scaling {st}")
    cfg = {
        "arch": arch,
        "qk_norm": arch == "qwen3",
        "vocab_size": raw["token_embd.weight"].shape[0],
        "hidden_size": C,
        "intermediate_size": int(_field(r, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_field(r, f"{arch}.block_count")),
        "num_attention_heads": H,
        "num_key_value_heads": Hkv,
        "head_dim": D,
        "rms_norm_eps": float(_field(r, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(r, f"{arch}.rope.freq_base", 10000.0)),
        "rope_type": rtype,
        "rope": rope,
        "rope_freq_divisors": raw.get("rope_freqs.weight"),
        "max_position_embeddings": int(_field(r, f"{arch}.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in raw,
    }
    w = {"model.embed_tokens.weight": raw["token_embd.weight"],
         "model.norm.weight": raw["output_norm.weight"]}
    if "output.weight" in raw:
        w["lm_head.weight"] = raw["output.weight"]
    permute = arch == "llama"
    for name, a in raw.items():
        parts = name.split(".")
        if parts[0] != "blk":
            continue
        l, g, kind = int(parts[1]), parts[2], parts[3]
        if permute and g == "attn_q":
            a = gguf_unpermute(a, H)
        elif permute and g == "attn_k":
            a = gguf_unpermute(a, Hkv)
        w[f"model.layers.{l}.{_GGUF_LAYER[g]}.{kind}"] = a
    return cfg, w


def load_model(path):
    """A HF folder or a .gguf file -> (cfg, float32 weights with HF names)."""
    if os.path.isdir(path):
        return load_hf(path)
    return load_gguf(path)


# ---------------------------------------------------------------------------------------
# PEFT LoRA (formats.md 3)

def read_peft_adapter(adapter_dir):
    """(adapter_config dict, {tensor name: float32 array}, safetensors metadata)."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        acfg = json.load(f)
    t, meta = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    return acfg, t, meta


def apply_peft_adapter(cfg, weights, adapter_dir):
    """New weights dict with every adapted linear merged: W + s * B @ A (float64)."""
    acfg, t, _ = read_peft_adapter(adapter_dir)
    if acfg.get("peft_type") != "LORA":
        raise ValueError("peft_type must be LORA")
    if acfg.get("rank_pattern") or acfg.get("alpha_pattern") or acfg.get("use_dora"):
        raise NotImplementedError("rank_pattern / alpha_pattern / DoRA")
    r, alpha = int(acfg.get("r", 8)), float(acfg.get("lora_alpha", 8))
    s = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r
    pre = "base_model.model."
    out = dict(weights)
    for k in t:
        if not k.endswith(".lora_A.weight"):
            continue
        assert k.startswith(pre), k
        mod = k[len(pre):-len(".lora_A.weight")]
        A = t[k].astype(np.float64)
        B = t[pre + mod + ".lora_B.weight"].astype(np.float64)
        W = out[mod + ".weight"]
        assert A.shape == (r, W.shape[1]) and B.shape == (W.shape[0], r), (k, A.shape, B.shape)
        out[mod + ".weight"] = W.astype(np.float64) + s * (B @ A)
    n_b = sum(k.endswith(".lora_B.weight") for k in t)
    n_a = sum(k.endswith(".lora_A.weight") for k in t)
    assert n_a == n_b and n_a + n_b == len(t), "unpaired or unknown adapter tensors"
    return out


# ---------------------------------------------------------------------------------------
# forward (formats.md 2.3)

def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def apply_rope(x, cos, sin):
    """x (T, nh, D); HF rotate_half: pairs (i, i + D/2)."""
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(cfg, weights, ids, dtype=np.float64, positions=None):
    """Logits (T, V) of one causal sequence, computed entirely in `dtype`."""
    W = lambda n: np.asarray(weights[n], dtype=dtype)  # noqa: E731
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = dtype(cfg["rms_norm_eps"])
    pos = np.arange(T, dtype=np.float64) if positions is None else np.asarray(positions, np.float64)
    ang = pos[:, None] * rope_inv_freq(cfg)[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    scale = dtype(1.0 / math.sqrt(D))
    rep = H // Hkv

    def lin(x, name):
        y = x @ W(name + ".weight").T
        if name + ".bias" in weights:
            y = y + W(name + ".bias")
        return y

    def qk(x, name, nh, l):
        """(T, nh, D) projection; with qk_norm (Qwen3) each head RMS-normalized."""
        y = lin(x, f"model.layers.{l}.self_attn.{name}_proj").reshape(T, nh, D)
        if cfg.get("qk_norm"):
            y = rmsnorm(y, W(f"model.layers.{l}.self_attn.{name}_norm.weight"), eps)
        return y

    x = W("model.embed_tokens.weight")[ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        xn = rmsnorm(x, W(p + "input_layernorm.weight"), eps)
        q = apply_rope(qk(xn, "q", H, l), cos, sin)
        k = apply_rope(qk(xn, "k", Hkv, l), cos, sin)
        v = lin(xn, p + "self_attn.v_proj").reshape(T, Hkv, D)
        att = np.empty((T, H, D), dtype=dtype)
        for h in range(H):
            kh, vh = k[:, h // rep, :], v[:, h // rep, :]
            s = (q[:, h, :] @ kh.T) * scale
            s = np.where(mask, -np.inf, s)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            att[:, h, :] = (s / s.sum(axis=-1, keepdims=True)) @ vh
        x = x + lin(att.reshape(T, H * D), p + "self_attn.o_proj")
        xn = rmsnorm(x, W(p + "post_attention_layernorm.weight"), eps)
        g, u = lin(xn, p + "mlp.gate_proj"), lin(xn, p + "mlp.up_proj")
        x = x + lin(silu(g) * u, p + "mlp.down_proj")
    x = rmsnorm(x, W("model.norm.weight"), eps)
    head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
    return x @ W(head).T


def next_token_loss(logits, ids):
    """Mean cross-entropy of predicting ids[t+1] from logits[t], t = 0..T-2 (float64)."""
    z = np.asarray(logits, dtype=np.float64)[:-1]
    m = z.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))[:, 0]
    tgt = np.asarray(ids[1:], dtype=np.int64)
    return float(np.mean(lse - z[np.arange(len(tgt)), tgt]))
