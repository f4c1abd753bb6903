#!/usr/bin/env python3
"""FLOPs per token of a LoRA training step of a Llama-family model (HF config.json), counted
term by term, and the MFU they give. Used by bench/run for its table; run alone it prints the
breakdown.

A multiply-add is 2 FLOPs. Per token of a sequence of S tokens (every token is trained), with
L layers, hidden C, intermediate F, H query heads and Hkv key/value heads of size D, vocabulary
V, LoRA rank r on the projections P (default all seven), and the frozen linear parameters
    N = L (C·H·D + 2·C·Hkv·D + H·D·C + 3·C·F)          (q, k, v, o, gate, up, down)
the terms are:
  linear forward           2N          y = x Wᵀ for every frozen projection
  linear backward (dx)     2N          dx = dy W; W is frozen, so no weight gradient (not 6N)
  LoRA forward             L Σ_P 2r(in+out)        u = x Aᵀ, y += s·u Bᵀ
  LoRA backward            2 × LoRA forward        dB = s·dyᵀu, du = s·dy B (2r·out each),
                                                   dA = duᵀx, dx += du A (2r·in each)
  attention forward        L · H · 4·D·c           QKᵀ (2·D per key) and PV (2·D per key), causal:
                                                   a query at position i sees i+1 keys, mean
                                                   c = (S+1)/2
  attention backward       2 × attention forward   dV = PᵀdO, dP = dO Vᵀ, dQ = dS K, dK = dSᵀQ
  LM head forward          2·C·V       logits (fused with the cross-entropy in chunks or not)
  LM head backward (dx)    2·C·V       the head is frozen (or tied): input gradient only
  recompute (checkpointing) linear forward + LoRA forward + attention forward, once more in the
                           backward when activations are not kept (not the LM head)
Not counted: elementwise work (RMSNorm, RoPE, SwiGLU, softmax, cross-entropy; about 30·(C+F)
FLOPs per layer per token, < 0.1%), the embedding gather, the optimizer (r·(in+out) values per
projection, per step, not per token), and a FlashAttention backward's own recompute of QKᵀ
(an implementation choice).
MFU counts the model's FLOPs (all terms but the recompute) over the peak; HFU adds the
recompute. MFU = tokens/s × FLOPs/token / peak, with the peak the measured bf16 GEMM rate
(bench/run measures it) or the nominal 989 TFLOP/s of the H100 SXM's dense bf16 tensor cores.

Usage: bench/flops.py [--config examples/configs/llama-3-8b.json] [--seq 2048] [--rank 16]
       [--recompute] [--tokens-per-s X] [--peak-tflops P]
"""
import argparse
import json
import os

H100_SXM_BF16_DENSE_TFLOPS = 989.4  # NVIDIA H100 SXM datasheet, bf16 tensor core, dense
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def shape(cfg):
    """(L, C, F, H, Hkv, D, V) from a config.json dict (LlamaConfig defaults)."""
    C = cfg.get("hidden_size", 4096)
    H = cfg.get("num_attention_heads", 32)
    return (cfg.get("num_hidden_layers", 32), C, cfg.get("intermediate_size", 11008), H,
            cfg.get("num_key_value_heads") or H, cfg.get("head_dim") or C // H,
            cfg.get("vocab_size", 32000))


def proj_dims(cfg):
    """{projection: (in, out)}."""
    L, C, F, H, Hkv, D, V = shape(cfg)
    return {"q_proj": (C, H * D), "k_proj": (C, Hkv * D), "v_proj": (C, Hkv * D),
            "o_proj": (H * D, C), "gate_proj": (C, F), "up_proj": (C, F), "down_proj": (F, C)}


def flops_per_token(cfg, seq, rank=16, recompute=False, targets=ALL_TARGETS):
    """{term: FLOPs per token} (see the module doc), plus 'model' (all terms but the
    recompute), 'hardware' (all terms) and 'N' (frozen linear parameters)."""
    L, C, F, H, Hkv, D, V = shape(cfg)
    dims = proj_dims(cfg)
    N = L * sum(i * o for i, o in dims.values())
    lora_fwd = L * sum(2 * rank * (dims[p][0] + dims[p][1]) for p in targets)
    ctx = (seq + 1) / 2.0
    attn_fwd = L * H * 4 * D * ctx
    t = {
        "linear forward": 2.0 * N,
        "linear backward (dx)": 2.0 * N,
        "LoRA forward": float(lora_fwd),
        "LoRA backward": 2.0 * lora_fwd,
        "attention forward": attn_fwd,
        "attention backward": 2.0 * attn_fwd,
        "LM head forward": 2.0 * C * V,
        "LM head backward (dx)": 2.0 * C * V,
        "recompute": (2.0 * N + lora_fwd + attn_fwd) if recompute else 0.0,
    }
    t["model"] = sum(v for k, v in t.items() if k != "recompute")
    t["hardware"] = t["model"] + t["recompute"]
    t["N"] = float(N)
    return t


FORMULAS = {
    "linear forward": "2N",
    "linear backward (dx)": "2N",
    "LoRA forward": "L sum 2r(in+out)",
    "LoRA backward": "2 x LoRA fwd",
    "attention forward": "L H 4 D (S+1)/2",
    "attention backward": "2 x attn fwd",
    "LM head forward": "2 C V",
    "LM head backward (dx)": "2 C V",
    "recompute": "2N + LoRA fwd + attn fwd",
}


def mfu(tokens_per_s, flops, peak_tflops):
    """Achieved FLOP/s over the peak (fractions; None when unknown)."""
    if not tokens_per_s or not peak_tflops:
        return None
    return tokens_per_s * flops / (peak_tflops * 1e12)


def breakdown(cfg, seq, rank=16, recompute=False):
    """The table printed by this script (markdown), as a string."""
    t = flops_per_token(cfg, seq, rank, recompute)
    L, C, F, H, Hkv, D, V = shape(cfg)
    lines = [f"FLOPs per token, LoRA r={rank} on all 7 projections, seq {seq}: L={L} C={C} F={F} "
             f"H={H} Hkv={Hkv} D={D} V={V}, N = {t['N'] / 1e9:.3f}B frozen linear parameters"
             + (", activations recomputed" if recompute else ""), "",
             "| term | formula | GFLOP/token | share of model FLOPs |", "|---|---|---|---|"]
    for k, f in FORMULAS.items():
        if k == "recompute" and not recompute:
            continue
        lines.append(f"| {k} | {f} | {t[k] / 1e9:.3f} | {t[k] / t['model']:.1%} |")
    lines.append(f"| **model FLOPs (MFU)** | | **{t['model'] / 1e9:.3f}** | 100% |")
    if recompute:
        lines.append(f"| hardware FLOPs (HFU) | model + recompute | {t['hardware'] / 1e9:.3f} | "
                     f"{t['hardware'] / t['model']:.1%} |")
    return "\n".join(lines)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="FLOPs per token of LoRA training (see the doc)")
    ap.add_argument("--config", default=os.path.join(here, "..", "examples", "configs", "llama-3-8b.json"))
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--recompute", action="store_true", help="activation checkpointing")
    ap.add_argument("--tokens-per-s", type=float, help="print the MFU of this rate")
    ap.add_argument("--peak-tflops", type=float, default=H100_SXM_BF16_DENSE_TFLOPS)
    ap.add_argument("--json", action="store_true", help="print the terms as JSON")
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = json.load(f)
    if a.json:
        print(json.dumps(flops_per_token(cfg, a.seq, a.rank, a.recompute)))
        return
    print(breakdown(cfg, a.seq, a.rank, a.recompute))
    if a.tokens_per_s:
        t = flops_per_token(cfg, a.seq, a.rank, a.recompute)
        print(f"\n{a.tokens_per_s:.0f} tokens/s = {a.tokens_per_s * t['model'] / 1e12:.1f} TFLOP/s of "
              f"model FLOPs: MFU {mfu(a.tokens_per_s, t['model'], a.peak_tflops):.1%} of {a.peak_tflops:g} "
              f"TFLOP/s; HFU {mfu(a.tokens_per_s, t['hardware'], a.peak_tflops):.1%}")


if __name__ == "__main__":
    main()
