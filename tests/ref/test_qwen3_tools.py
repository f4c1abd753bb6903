"""Qwen3 (q/k RMSNorm per head) beyond the model core: the NF4 pack and the executor that
streams it, merge to safetensors and GGUF, and the GGUF LoRA export.

The model is tests/ref/make_tiny_model.py --qwen3 (head_dim 32, so H*D = 128 != hidden 64;
q_norm/k_norm weights 1 + N(0, 0.1)), written into a temporary folder. References:
- the pack's q_norm/k_norm records hold the source weights exactly (F32), every linear
  weight's NF4 codes are nf4_ref.quantize_nf4's;
- QLoRA on the CPU streams each layer's block from the pack (io_uring) and binds its norms:
  its untrained eval loss equals the eval loss of an unquantized (fp32) run on a folder whose
  weights are the pack's dequantized values (same ops, same order: equal to TOL_SAME), and
  differs from the loss with the q/k norm weights reset to 1 (so the norms are used);
- `ftune merge --dtype f32` of an adapter gives the logits of `ftune logits --adapter` on the
  base (TOL_LOGITS_F32), and the GGUF merge carries arch qwen3 and blk.N.attn_q_norm.weight.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cli_helpers import ROOT, SEED_DATA, run_ftune  # noqa: E402
import nf4_ref as N  # noqa: E402
import make_tiny_model as M  # noqa: E402

gguf = pytest.importorskip("gguf")

F32 = np.float32
ROLE_Q_NORM, ROLE_K_NORM, ROLE_W0 = 3, 4, 16
PROJ = [("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"),
        ("self_attn", "o_proj"), ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj")]
# Eval losses of two runs that execute the same fp32 ops on the same weights.
TOL_SAME = 1e-6
# Logits of an f32 merge vs the adapter applied at run time (only the fp32 op order differs).
TOL_LOGITS_F32 = 1e-5
IDS = [1, 415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898, 3914]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3") / "tiny-qwen3"
    r = subprocess.run([sys.executable, os.path.join(HERE, "make_tiny_model.py"), str(d),
                        "--qwen3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return d


def train(model, out, quant, cache, extra=()):
    r = run_ftune(["train", "--model", model, "--data", SEED_DATA, "--out", out, "--quant", quant,
                   "--cache-dir", cache, "--save-every", "0", "--seq-len", "64", "--batch-size", "2",
                   "--eval-fraction", "0.1", "--lora-r", "4", "--threads", "2", *extra], timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads((Path(out) / "summary.json").read_text()), r.stderr


def write_folder(src, dst, weights):
    """An HF folder like src (config, tokenizer) with these fp32 weights."""
    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg["torch_dtype"] = "float32"
    (dst / "config.json").write_text(json.dumps(cfg))
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        (dst / fn).write_bytes((src / fn).read_bytes())
    M.write_safetensors(str(dst / "model.safetensors"), weights, "F32")


def test_pack_and_streamed_qlora(qwen3, tmp_path):
    w = M.read_safetensors(str(qwen3 / "model.safetensors"))
    r = run_ftune(["pack", "--model", qwen3, "--quant", "nf4", "--cache-dir", tmp_path / "cache",
                   "--quiet"])
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    h, blocks = N.read_pack(info["path"])
    deq = dict(w)
    code8 = N.dynamic_map()
    for b in blocks:
        l = b["layer"]
        if l < 0:
            continue
        t = b["tensors"]
        for role, name in ((ROLE_Q_NORM, "q_norm"), (ROLE_K_NORM, "k_norm")):
            src = w[f"model.layers.{l}.self_attn.{name}.weight"]
            assert role in t, f"layer {l}: no {name} in the pack"
            assert t[role]["data"].reshape(-1).tobytes() == src.astype(F32).tobytes(), (l, name)
        for p, (parent, proj) in enumerate(PROJ):
            key = f"model.layers.{l}.{parent}.{proj}.weight"
            rec = t[ROLE_W0 + p]
            q = N.quantize_nf4(w[key].reshape(-1), rec["blocksize"], rec["nested_blocksize"], code8)
            assert np.array_equal(rec["codes"], q["codes"]), key
            am = N.absmax_from_nested(rec["qabsmax"], rec["nested_absmax"], rec["nested_map"],
                                      rec["offset"], rec["nested_blocksize"])
            deq[key] = N.dequantize_nf4(rec["codes"], am, rec["n"], rec["blocksize"]).reshape(w[key].shape)

    # QLoRA (CPU: every layer streamed from the pack) vs fp32 on the dequantized weights
    s_nf4, err = train(qwen3, tmp_path / "nf4", "nf4", tmp_path / "cache", ["--max-steps", "1"])
    assert "base nf4" in err and "dequantized per layer from the pack" in err
    write_folder(qwen3, tmp_path / "deq", deq)
    s_deq, _ = train(tmp_path / "deq", tmp_path / "deq-out", "bf16", tmp_path / "cache2",
                     ["--max-steps", "1"])
    a, b = s_nf4["initial_eval_loss"], s_deq["initial_eval_loss"]
    print(f"untrained eval loss: QLoRA (pack streamed) {a:.7f}, fp32 on its dequantized weights {b:.7f}")
    assert abs(a - b) <= TOL_SAME * abs(b)

    # the norms matter: with q_norm/k_norm reset to 1 the loss moves by far more than TOL_SAME
    ones = dict(deq)
    for k in ones:
        if k.endswith(("q_norm.weight", "k_norm.weight")):
            ones[k] = np.ones_like(ones[k])
    write_folder(qwen3, tmp_path / "ones", ones)
    s_one, _ = train(tmp_path / "ones", tmp_path / "ones-out", "bf16", tmp_path / "cache3",
                     ["--max-steps", "1"])
    c = s_one["initial_eval_loss"]
    print(f"with q/k norm weights = 1: {c:.7f}")
    assert abs(c - b) > 100 * TOL_SAME * abs(b)


def logits(model, tmp, extra=()):
    """(T, V) float64 logits of `ftune logits` (raw float32 rows)."""
    f = Path(tmp) / "logits.bin"
    r = run_ftune(["logits", "--model", model, "--ids", ",".join(map(str, IDS)), "--out", f,
                   "--threads", 2, *extra])
    assert r.returncode == 0, r.stderr
    return np.fromfile(f, dtype=np.float32).reshape(len(IDS), -1).astype(np.float64)


def test_merge_and_export(qwen3, tmp_path):
    s, _ = train(qwen3, tmp_path / "ad", "bf16", tmp_path / "cache",
                 ["--max-steps", "2", "--lr", "1e-2"])
    ad = tmp_path / "ad"
    # safetensors f32 merge: the merged folder's logits are the adapter's
    r = run_ftune(["merge", "--model", qwen3, "--adapter", ad, "--out", tmp_path / "m32",
                   "--dtype", "f32"])
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "m32" / "config.json").read_text())
    assert cfg["model_type"] == "qwen3"
    ref = logits(qwen3, tmp_path, ["--adapter", ad])
    got = logits(tmp_path / "m32", tmp_path)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    print(f"f32 merge vs --adapter: {err:.3g}")
    assert err <= TOL_LOGITS_F32
    # GGUF merge: llama.cpp's qwen3 names and arch; ftune reads it back to the same logits
    out = tmp_path / "m.gguf"
    r = run_ftune(["merge", "--model", qwen3, "--adapter", ad, "--out", out, "--format", "gguf",
                   "--dtype", "f32"])
    assert r.returncode == 0, r.stderr
    rd = gguf.GGUFReader(str(out))
    arch = bytes(rd.fields["general.architecture"].parts[-1]).decode()
    names = {t.name for t in rd.tensors}
    assert arch == "qwen3"
    assert "blk.0.attn_q_norm.weight" in names and "blk.1.attn_k_norm.weight" in names
    assert "qwen3.attention.key_length" in rd.fields
    got = logits(out, tmp_path)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    print(f"GGUF f32 merge vs --adapter: {err:.3g}")
    assert err <= TOL_LOGITS_F32
    # the LoRA adapter as GGUF for llama.cpp: arch qwen3
    r = run_ftune(["export", "--adapter", ad, "--format", "gguf", "--out", tmp_path / "a.gguf",
                   "--model", qwen3])
    assert r.returncode == 0, r.stderr
    rd = gguf.GGUFReader(str(tmp_path / "a.gguf"))
    assert bytes(rd.fields["general.architecture"].parts[-1]).decode() == "qwen3"
