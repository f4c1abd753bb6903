"""Independent (Python-side) checks of the model fixtures used by tests/unit/test_gguf.c and
test_safetensors.c:

- the committed fixtures are exactly what tests/ref/make_tiny_model.py and
  make_gguf_fixtures.py produce (so a reviewer can trust the scripts' descriptions);
- the tiny-llama safetensors file passes the reference `safetensors` reader's validation;
- tiny-llama.gguf, read with gguf-py's GGUFReader, dequantized with gguf.quants and
  un-permuted in numpy (formats.md 2.4), equals the HF weights within each ggml type's error
  bound: the same check the C loader passes, done without any of our C code.

The example model's weights are checked against gguf-py in test_gguf.c (hard-coded
reference statistics), so no C dump tool is needed here.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
TINY = os.path.join(REPO, "tests", "fixtures", "tiny-llama")
GG = os.path.join(REPO, "tests", "fixtures", "gguf")
sys.path.insert(0, HERE)
from make_tiny_model import read_safetensors  # noqa: E402

# Per-32-block error bounds against the unquantized values (as in test_gguf.c).
TOL_Q8_0_AMAX = 1.0 / 127
TOL_Q4_0_AMAX = 0.126
TOL_Q4_1_RANGE = 0.07
TOL_F16_REL = 1.0 / 2048
TOL_F16_ABS = 3e-8


def run(*args):
    subprocess.run([sys.executable, *args], check=True, cwd=REPO, capture_output=True)


def test_fixtures_reproducible(tmp_path):
    run(os.path.join(HERE, "make_tiny_model.py"), str(tmp_path / "tl"), "--link-tokenizer")
    for fn in ("config.json", "model.safetensors"):
        with open(tmp_path / "tl" / fn, "rb") as a, open(os.path.join(TINY, fn), "rb") as b:
            assert a.read() == b.read(), fn
    run(os.path.join(HERE, "make_gguf_fixtures.py"), str(tmp_path / "gg"))
    for fn in sorted(os.listdir(GG)):
        if not fn.endswith((".gguf", ".safetensors")):
            continue
        if fn.endswith(".safetensors"):
            ra, rb = read_safetensors(str(tmp_path / "gg" / fn)), read_safetensors(os.path.join(GG, fn))
            assert ra.keys() == rb.keys()
            for k in ra:
                assert np.array_equal(ra[k], rb[k]), (fn, k)
            continue
        a, b = gguf.GGUFReader(str(tmp_path / "gg" / fn)), gguf.GGUFReader(os.path.join(GG, fn))
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors], fn
        for ta, tb in zip(a.tensors, b.tensors):
            assert ta.tensor_type == tb.tensor_type and list(ta.shape) == list(tb.shape)
            assert np.array_equal(np.asarray(ta.data), np.asarray(tb.data)), (fn, ta.name)
        assert sorted(a.fields) == sorted(b.fields), fn


def test_tiny_llama_safetensors_valid():
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(os.path.join(TINY, "model.safetensors"), framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        keys = set(f.keys())
    assert "lm_head.weight" not in keys and len(keys) == 2 + 2 * 9
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        assert os.path.isfile(os.path.join(TINY, fn)), fn


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf.py LlamaModel.permute: GGUF(llama) rows -> HF rows."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def within(qtype, got, ref):
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.BF16):
        return np.array_equal(got, ref)
    if qtype == gguf.GGMLQuantizationType.F16:
        return bool(np.all(np.abs(got - ref) <= np.abs(ref) * TOL_F16_REL + TOL_F16_ABS))
    b = ref.reshape(-1, 32).astype(np.float64)
    e = np.abs(got.reshape(-1, 32) - b).max(axis=1)
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        tol = np.abs(b).max(axis=1) * TOL_Q8_0_AMAX
    elif qtype == gguf.GGMLQuantizationType.Q4_0:
        tol = np.abs(b).max(axis=1) * TOL_Q4_0_AMAX
    else:
        tol = (b.max(axis=1) - b.min(axis=1)) * TOL_Q4_1_RANGE + np.abs(b.min(axis=1)) * 1e-3
    return bool(np.all(e <= tol))


def test_tiny_gguf_equals_hf_in_python():
    import json
    with open(os.path.join(TINY, "config.json")) as f:
        cfg = json.load(f)
    hf = read_safetensors(os.path.join(TINY, "model.safetensors"))
    r = gguf.GGUFReader(os.path.join(GG, "tiny-llama.gguf"))
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    m = dict(attn_norm="input_layernorm", ffn_norm="post_attention_layernorm",
             attn_q="self_attn.q_proj", attn_k="self_attn.k_proj", attn_v="self_attn.v_proj",
             attn_output="self_attn.o_proj", ffn_gate="mlp.gate_proj", ffn_up="mlp.up_proj",
             ffn_down="mlp.down_proj")
    for l in range(cfg["num_hidden_layers"]):
        for g, h in m.items():
            names[f"blk.{l}.{g}.weight"] = f"model.layers.{l}.{h}.weight"
    assert sorted(t.name for t in r.tensors) == sorted(names)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # ggml ne is innermost first
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if ".attn_q." in t.name:
            w = unpermute(w, cfg["num_attention_heads"])
        elif ".attn_k." in t.name:
            w = unpermute(w, cfg["num_key_value_heads"])
        ref = hf[names[t.name]]
        assert w.shape == ref.shape, t.name
        assert within(t.tensor_type, w, ref), (t.name, t.tensor_type.name)
