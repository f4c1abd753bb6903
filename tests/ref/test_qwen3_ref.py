"""Qwen3 (model_type qwen3: Llama + a per-head RMSNorm of q and k before RoPE) against the
independent numpy reference of tests/ref/llama_ref.py (float64; transformers'
Qwen3Attention: q = q_norm(q_proj(x).view(T, H, D)), k likewise, then RoPE).

The model is the tiny random Qwen3 folder of tests/ref/make_tiny_model.py --qwen3 (2 layers,
hidden 64, 4 heads x head_dim 32 = 128 != hidden, 2 KV heads, q_norm/k_norm weights
1 + N(0, 0.1), BF16), written into a temporary folder per test module. Checks:
  (a) `ftune logits` of the HF folder equal the reference within the bound test_logits_ref.py
      uses for tiny-llama (3e-6 of max |logit|); controls: without the q/k norms, with the
      norm after RoPE instead of before, with q_norm and k_norm swapped;
  (b) a GGUF of the same weights written with gguf-py as llama.cpp's convert_hf_to_gguf.py
      writes Qwen3 (arch qwen3, {arch}.attention.key_length = head_dim, NEOX rope so no q/k
      permutation, blk.N.attn_q_norm / attn_k_norm) gives the same logits;
  (c) `ftune train` for 2 steps (lr 1e-2, every projection adapted): `ftune logits --adapter`
      equals the reference with W + s B A (the backward itself is checked against finite
      differences in tests/unit/test_kernels_grad.c test_block_qk_norm_bwd);
  (d) `ftune generate` greedy (KV cache) gives the reference's greedy tokens, on an untied
      variant with sharper attention (norm weights x3) so that the context matters;
  (e) a missing or misshaped q/k norm tensor (HF and GGUF) is one clear error line naming
      the file and the tensor;
  (f) `ftune init-model --config` of a qwen3 config writes q_norm/k_norm (ones) and the
      result loads and matches the reference; its bf16 pack (--pack, no safetensors) gives
      the same logits.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import llama_ref as R  # noqa: E402
from cli_helpers import assert_clean_error, run_ftune, st_read, st_write  # noqa: E402
from test_logits_ref import (TOL_LOGITS_REL_SMALL, assert_effect, check, ftune_logits,  # noqa: E402
                             ftune_train, lora_nonzero)

# "The quick brown fox jumps over the lazy dog near the river." (Llama-2 tokenizer, with BOS)
IDS = [1, 415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898, 3914, 3065, 272, 7782, 28723]
PROMPT = "Once upon a time, in a quiet village by the sea,"
N_NEW = 8


def make_qwen3(out, *flags):
    p = subprocess.run([sys.executable, os.path.join(HERE, "make_tiny_model.py"), str(out),
                        "--qwen3", *flags], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return str(out)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = make_qwen3(tmp_path_factory.mktemp("qwen3") / "tiny-qwen3")
    cfg, w = R.load_hf(path)
    assert cfg["arch"] == "qwen3" and cfg["qk_norm"] and cfg["head_dim"] == 32
    assert cfg["num_attention_heads"] * cfg["head_dim"] != cfg["hidden_size"]
    return path, cfg, w


def variants(cfg, w, ids):
    """Reference logits of deliberate mistakes: no q/k norms, norm after RoPE, q/k norm
    weights swapped."""
    out = {"without q/k norms": R.forward(dict(cfg, qk_norm=False), w, ids)}
    sw = dict(w)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}.self_attn."
        sw[p + "q_norm.weight"], sw[p + "k_norm.weight"] = w[p + "k_norm.weight"], w[p + "q_norm.weight"]
    out["q_norm and k_norm swapped"] = R.forward(cfg, sw, ids)
    out["norm after RoPE"] = forward_norm_after_rope(cfg, w, ids)
    return out


def forward_norm_after_rope(cfg, w, ids):
    """The reference with the per-head norm moved after RoPE (a plausible wrong order): the
    weighted norm does not commute with the rotation, so the logits differ."""
    orig = R.apply_rope
    state = {}

    def rope_then_norm(x, cos, sin):
        y = orig(x, cos, sin)
        return R.rmsnorm(y, state["w"].pop(0), cfg["rms_norm_eps"])

    ws = []
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}.self_attn."
        ws += [np.asarray(w[p + "q_norm.weight"], np.float64), np.asarray(w[p + "k_norm.weight"], np.float64)]
    state["w"] = ws
    R.apply_rope = rope_then_norm
    try:
        return R.forward(dict(cfg, qk_norm=False), w, ids)
    finally:
        R.apply_rope = orig


# ---------------------------------------------------------------------------------------
# (a) HF folder

def test_qwen3_hf_logits(tmp_path, qwen3):
    path, cfg, w = qwen3
    j, got = ftune_logits(tmp_path, path, IDS)
    ref = check("tiny-qwen3 HF bf16", cfg, w, IDS, j, got, TOL_LOGITS_REL_SMALL)
    for label, z in variants(cfg, w, IDS).items():
        assert_effect("tiny-qwen3 " + label, ref, z, TOL_LOGITS_REL_SMALL)


def test_qwen3_architectures_only(tmp_path, qwen3):
    """config.json without model_type: architectures ["Qwen3ForCausalLM"] selects qwen3."""
    path, cfg, w = qwen3
    m = tmp_path / "m"
    shutil.copytree(path, m)
    c = json.loads((m / "config.json").read_text())
    del c["model_type"]
    (m / "config.json").write_text(json.dumps(c))
    j, got = ftune_logits(tmp_path, m, IDS[:6])
    check("tiny-qwen3 architectures only", cfg, w, IDS[:6], j, got, TOL_LOGITS_REL_SMALL)


# ---------------------------------------------------------------------------------------
# (b) GGUF

def write_qwen3_gguf(out, cfg, w, drop=()):
    """The HF weights as llama.cpp's convert_hf_to_gguf.py writes a Qwen3 (Qwen3Model):
    arch qwen3, key/value_length = head_dim, no q/k permutation (NEOX rope), F32 tensors."""
    import gguf

    g = gguf.GGUFWriter(str(out), "qwen3")
    g.add_block_count(cfg["num_hidden_layers"])
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(cfg["num_attention_heads"])
    g.add_head_count_kv(cfg["num_key_value_heads"])
    g.add_rope_freq_base(cfg["rope_theta"])
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    g.add_key_length(cfg["head_dim"])
    g.add_value_length(cfg["head_dim"])
    g.add_bos_token_id(1)
    g.add_eos_token_id(2)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {v: k for k, v in R._GGUF_LAYER.items()}
    for hf, a in sorted(w.items()):
        if hf in names:
            name = names[hf]
        else:
            parts = hf.split(".")  # model.layers.N.<module path>.weight
            name = f"blk.{parts[2]}.{layer['.'.join(parts[3:-1])]}.{parts[-1]}"
        if name not in drop:
            g.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return str(out)


def test_qwen3_gguf_logits(tmp_path, qwen3):
    path, cfg, w = qwen3
    gg = write_qwen3_gguf(tmp_path / "tiny-qwen3.gguf", cfg, w)
    gcfg, gw = R.load_gguf(gg)
    assert gcfg["arch"] == "qwen3" and gcfg["qk_norm"] and gcfg["head_dim"] == cfg["head_dim"]
    assert "model.layers.1.self_attn.k_norm.weight" in gw
    for k, a in w.items():
        assert np.array_equal(gw[k], a), k
    j, got = ftune_logits(tmp_path, gg, IDS)
    ref = check("tiny-qwen3 GGUF f32", gcfg, gw, IDS, j, got, TOL_LOGITS_REL_SMALL)
    _, got_hf = ftune_logits(tmp_path, path, IDS)
    d = float(np.abs(got - got_hf).max())
    print(f"[tiny-qwen3] GGUF vs HF folder through ftune: max |diff| {d:.3e}")
    assert d <= 1e-6 * float(np.abs(ref).max())
    for label, z in variants(gcfg, gw, IDS).items():
        assert_effect("tiny-qwen3 GGUF " + label, ref, z, TOL_LOGITS_REL_SMALL)


# ---------------------------------------------------------------------------------------
# (c) a trained adapter

def test_qwen3_adapter(tmp_path, qwen3):
    path, cfg, w = qwen3
    ad = ftune_train(tmp_path / "ad", path, "--seq-len", "128")
    acfg = lora_nonzero(ad)
    assert {"q_proj", "k_proj"} <= set(acfg["target_modules"]), acfg["target_modules"]
    _, t, _ = R.read_peft_adapter(str(ad))
    for proj in ("q_proj", "k_proj"):  # the projections whose gradient passes the q/k norms
        b = t[f"base_model.model.model.layers.0.self_attn.{proj}.lora_B.weight"]
        assert float(np.abs(b).max()) > 0, proj
    wa = R.apply_peft_adapter(cfg, w, str(ad))
    j, got = ftune_logits(tmp_path, path, IDS, adapter=ad)
    ref = check("tiny-qwen3 + LoRA r16", cfg, wa, IDS, j, got, TOL_LOGITS_REL_SMALL)
    assert_effect("tiny-qwen3 adapter removed", ref, R.forward(cfg, w, IDS), TOL_LOGITS_REL_SMALL)
    assert_effect("tiny-qwen3 + LoRA without q/k norms", ref,
                  R.forward(dict(cfg, qk_norm=False), wa, IDS), TOL_LOGITS_REL_SMALL)


# ---------------------------------------------------------------------------------------
# (d) generate

def test_qwen3_generate_greedy(tmp_path):
    path = make_qwen3(tmp_path / "q3u", "--untied", "--f32")
    cfg, w = R.load_hf(path)
    # sharper attention (scores scale with the square of the norm weights): the context matters
    from safetensors.numpy import save_file
    for k in list(w):
        if k.endswith(("q_norm.weight", "k_norm.weight")):
            w[k] = (w[k] * 3).astype(np.float32)
    save_file(w, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    cfg, w = R.load_hf(path)
    p = run_ftune(["generate", "--model", path, "--raw", "--prompt", PROMPT, "--max-new-tokens",
                   N_NEW, "--json"])
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    prompt, ids = got["prompt_ids"], got["ids"]
    assert prompt[0] == 1 and len(prompt) > 8
    assert 0 < len(ids) <= N_NEW and 2 not in ids
    w64 = {k: np.asarray(v, np.float64) for k, v in w.items()}
    z = R.forward(cfg, w64, prompt + ids)
    stopped = got["stop"] == "stop_token"
    rows = z[len(prompt) - 1:len(prompt) - 1 + len(ids) + (1 if stopped else 0)]
    ref = [int(np.argmax(r)) for r in rows]
    top2 = np.sort(np.partition(rows, -2, axis=1)[:, -2:], axis=1)
    print(f"\n[tiny-qwen3 generate] ftune {ids}, stop {got['stop']}; smallest top-2 margin "
          f"{float((top2[:, 1] - top2[:, 0]).min()):.3e} (max |logit| {float(np.abs(z).max()):.3g})")
    assert ref[:len(ids)] == ids, f"reference greedy {ref[:len(ids)]}, ftune {ids}"
    if stopped:
        assert ref[-1] == 2
    else:
        assert len(ids) == N_NEW
    assert len(set(ids)) > 2, "degenerate generation: the check would be weak"
    # control: without the q/k norms the reference picks other tokens
    z2 = R.forward(dict(cfg, qk_norm=False), w64, prompt + ids)[len(prompt) - 1:-1]
    assert [int(np.argmax(r)) for r in z2] != ids[:len(z2)] or len(ids) == 1


# ---------------------------------------------------------------------------------------
# (e) bad inputs

def rewrite_st(folder, fn):
    """Rewrites folder/model.safetensors through fn(header dict, data bytes) -> (header, data)."""
    f = os.path.join(folder, "model.safetensors")
    _, h, data = st_read(f)
    h, data = fn(h, data)
    st_write(f, h, data)


def drop_tensor(name):
    def fn(h, data):
        off = 0
        out, parts = {"__metadata__": h.get("__metadata__", {})}, []
        for k, v in sorted(((k, v) for k, v in h.items() if k != "__metadata__"),
                           key=lambda kv: kv[1]["data_offsets"][0]):
            if k == name:
                continue
            b, e = v["data_offsets"]
            parts.append(data[b:e])
            out[k] = dict(v, data_offsets=[off, off + e - b])
            off += e - b
        assert name in h
        return out, b"".join(parts)
    return fn


def reshape_tensor(name, shape):
    def fn(h, data):
        assert name in h
        n = int(np.prod(h[name]["shape"]))
        assert int(np.prod(shape)) == n
        h[name]["shape"] = list(shape)
        return h, data
    return fn


def test_qwen3_missing_k_norm(tmp_path, qwen3):
    path, _, _ = qwen3
    m = str(tmp_path / "m")
    shutil.copytree(path, m)
    name = "model.layers.1.self_attn.k_norm.weight"
    rewrite_st(m, drop_tensor(name))
    r = run_ftune(["logits", "--model", m, "--ids", "1,2,3", "--out", tmp_path / "z.f32"])
    line = assert_clean_error(r, None, m, name, "qwen3")
    assert "not found" in line


def test_qwen3_misshaped_q_norm(tmp_path, qwen3):
    path, _, _ = qwen3
    m = str(tmp_path / "m")
    shutil.copytree(path, m)
    name = "model.layers.0.self_attn.q_norm.weight"
    rewrite_st(m, reshape_tensor(name, (2, 16)))  # same bytes, wrong shape
    r = run_ftune(["logits", "--model", m, "--ids", "1,2,3", "--out", tmp_path / "z.f32"])
    assert_clean_error(r, None, os.path.join(m, "model.safetensors"), name, "[2, 16]", "[32]")


def test_qwen3_gguf_missing_k_norm(tmp_path, qwen3):
    _, cfg, w = qwen3
    name = "blk.0.attn_k_norm.weight"
    gg = write_qwen3_gguf(tmp_path / "bad.gguf", cfg, w, drop=(name,))
    r = run_ftune(["logits", "--model", gg, "--ids", "1,2,3", "--out", tmp_path / "z.f32"])
    assert_clean_error(r, None, gg, name)


# ---------------------------------------------------------------------------------------
# (f) init-model

def test_qwen3_init_model(tmp_path, qwen3):
    path, _, _ = qwen3
    out = tmp_path / "init"
    r = run_ftune(["init-model", "--config", os.path.join(path, "config.json"), "--out", out,
                   "--seed", 5, "--tokenizer", path])
    assert r.returncode == 0, r.stderr
    cfg, w = R.load_hf(str(out))
    for l in range(cfg["num_hidden_layers"]):
        for n in ("q_norm", "k_norm"):
            a = w[f"model.layers.{l}.self_attn.{n}.weight"]
            assert a.shape == (cfg["head_dim"],) and np.all(a == 1.0), (l, n)
    j, got = ftune_logits(tmp_path, out, IDS[:8])
    ref = check("init-model qwen3", cfg, w, IDS[:8], j, got, TOL_LOGITS_REL_SMALL)
    # a bf16 pack written straight from the generator (no safetensors: a pack-only model,
    # its q/k norms read from the pack) holds the same values
    pk = tmp_path / "pack"
    r = run_ftune(["init-model", "--config", os.path.join(path, "config.json"), "--out", pk,
                   "--seed", 5, "--tokenizer", path, "--pack", "--quant", "bf16"])
    assert r.returncode == 0, r.stderr
    assert not any(f.endswith(".safetensors") for f in os.listdir(pk))
    _, got_pk = ftune_logits(tmp_path, pk, IDS[:8])
    d = float(np.abs(got_pk - got).max())
    print(f"[init-model qwen3] pack-only vs safetensors: max |diff| {d:.3e}")
    assert d <= 1e-6 * float(np.abs(ref).max())
