"""`ftune export --format gguf`: a PEFT adapter as a llama.cpp GGUF LoRA file (formats.md 4.2,
4.3, 9.3), parsed with the `gguf` package (gguf-py, llama.cpp's own reader/writer).

The adapter is trained by `ftune train` for 2 steps with --lr 1e-2 on tests/fixtures/tiny-llama
(B != 0). Checked: the KV pairs llama.cpp's llama_adapter_lora_init requires (general.type
"adapter", general.architecture "llama", adapter.type "lora", adapter.lora.alpha as FLOAT32),
the tensor names blk.N.<base>.weight.lora_{a,b}, ne [in, r] / [r, out], the dtype, and the
values: lora_a is PEFT's A byte for byte; lora_b is PEFT's B with, for attn_q and attn_k, the
rows permuted by numpy exactly as convert_hf_to_gguf.py LlamaModel.permute does (n_head for q,
n_head_kv for k). Controls: the permutation must actually move rows of this B (a test that
compared unpermuted B would fail), and bad inputs (adapter of another base, a base that is
not local) give one clean error and no file.

If llama-cpp-python is importable, the adapter is also loaded into llama.cpp on a GGUF of the
same base and llama.cpp's logit change caused by the adapter is compared with ftune's
(`ftune logits --adapter` minus without), within TOL_LLAMACPP_DELTA of the largest change.
"""
import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cli_helpers import ROOT, SEED_DATA, TINY, TINY_GGUF, assert_clean_error, run_ftune  # noqa: E402
import llama_ref as R  # noqa: E402

gguf = pytest.importorskip("gguf")

PROJ = [("q_proj", "self_attn", "attn_q"), ("k_proj", "self_attn", "attn_k"),
        ("v_proj", "self_attn", "attn_v"), ("o_proj", "self_attn", "attn_output"),
        ("gate_proj", "mlp", "ffn_gate"), ("up_proj", "mlp", "ffn_up"),
        ("down_proj", "mlp", "ffn_down")]
TOL_F16_REL = 2.0 ** -11      # F16 export: half an ulp of an 11-bit significand ...
TOL_F16_ABS = 2.0 ** -25      # ... or half the subnormal spacing 2^-24
# llama.cpp vs ftune (both fp32 weights, F32 KV cache), relative to the largest value: the
# logit change the adapter causes, and the logits with the adapter. Measured: see the test log.
TOL_LLAMACPP_DELTA = 2e-5  # measured 1.4e-6
TOL_LLAMACPP_LOGITS = 3e-6  # measured 2.7e-7
TINY_IDS = [1, 415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898, 3914, 3065, 272, 7782]


def permute_np(w, n_head):
    """HF -> GGUF(llama) rows, convert_hf_to_gguf.py LlamaModel.permute (formats.md 2.4)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "ad"
    r = run_ftune(["train", "--model", TINY, "--data", SEED_DATA, "--out", out, "--max-steps", 2,
                   "--lr", "1e-2", "--seq-len", 64, "--batch-size", 1, "--threads", 2, "--quiet"],
                  cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return out


def field(rd, key):
    f = rd.fields[key]
    return f.contents(), f.types


def peft(adapter_dir):
    acfg, t, _ = R.read_peft_adapter(str(adapter_dir))
    return acfg, t


def test_gguf_lora_layout_and_values(adapter, tmp_path):
    out = tmp_path / "ad.gguf"
    r = run_ftune(["export", "--adapter", adapter, "--format", "gguf", "--out", out, "--model", TINY])
    assert r.returncode == 0, r.stderr
    print(r.stderr.strip())
    cfg = json.loads((TINY / "config.json").read_text())
    acfg, t = peft(adapter)
    rank = acfg["r"]
    rd = gguf.GGUFReader(str(out))
    assert field(rd, "general.architecture") == ("llama", [gguf.GGUFValueType.STRING])
    assert field(rd, "general.type") == ("adapter", [gguf.GGUFValueType.STRING])
    assert field(rd, "adapter.type") == ("lora", [gguf.GGUFValueType.STRING])
    alpha, types = field(rd, "adapter.lora.alpha")
    assert types == [gguf.GGUFValueType.FLOAT32], types   # llama.cpp: gguf_get_val_f32 asserts it
    assert alpha == float(acfg["lora_alpha"])
    assert rd.alignment == 32
    names = {ti.name: ti for ti in rd.tensors}
    L = cfg["num_hidden_layers"]
    want = {f"blk.{l}.{g}.weight.lora_{ab}" for l in range(L) for _, _, g in PROJ for ab in "ab"}
    assert set(names) == want, sorted(set(names) ^ want)
    moved = 0
    for l in range(L):
        for hf, parent, g in PROJ:
            A = t[f"base_model.model.model.layers.{l}.{parent}.{hf}.lora_A.weight"]
            B = t[f"base_model.model.model.layers.{l}.{parent}.{hf}.lora_B.weight"]
            ta, tb = names[f"blk.{l}.{g}.weight.lora_a"], names[f"blk.{l}.{g}.weight.lora_b"]
            assert ta.tensor_type == gguf.GGMLQuantizationType.F32
            assert tb.tensor_type == gguf.GGMLQuantizationType.F32
            # ggml ne order: lora_a [in, r], lora_b [r, out] (llama-adapter.cpp shape checks)
            assert list(ta.shape) == [A.shape[1], rank] and list(tb.shape) == [rank, B.shape[0]]
            assert np.array_equal(np.asarray(ta.data).reshape(A.shape), A)
            if hf in ("q_proj", "k_proj"):
                heads = cfg["num_attention_heads"] if hf == "q_proj" else cfg["num_key_value_heads"]
                Bp = permute_np(B, heads)
                moved += not np.array_equal(Bp, B)
            else:
                Bp = B
            assert np.abs(B).max() > 0, "B is zero: the adapter was not trained"
            assert np.array_equal(np.asarray(tb.data).reshape(B.shape), Bp), (l, hf)
    assert moved == 2 * L, "the permutation left a q/k B unchanged: the check would be vacuous"


def test_gguf_lora_f16_and_default_base(adapter, tmp_path):
    """--dtype f16, and the base taken from base_model_name_or_path (the local path the
    adapter was trained with)."""
    out = tmp_path / "ad16.gguf"
    acfg, t = peft(adapter)
    assert acfg["base_model_name_or_path"]
    r = run_ftune(["export", "--adapter", adapter, "--format", "gguf", "--out", out, "--dtype",
                   "f16"], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    rd = gguf.GGUFReader(str(out))
    assert field(rd, "general.file_type")[0] == 1
    worst = 0.0
    for ti in rd.tensors:
        assert ti.tensor_type == gguf.GGMLQuantizationType.F16
        l, g, ab = int(ti.name.split(".")[1]), ti.name.split(".")[2], ti.name[-1]
        hf, parent = [(h, p) for h, p, gg in PROJ if gg == g][0]
        src = t[f"base_model.model.model.layers.{l}.{parent}.{hf}.lora_{ab.upper()}.weight"]
        if ab == "b" and hf in ("q_proj", "k_proj"):
            src = permute_np(src, 4 if hf == "q_proj" else 2)
        got = np.asarray(ti.data).astype(np.float32).reshape(src.shape)
        assert np.array_equal(got, src.astype(np.float16).astype(np.float32)), ti.name
        bound = TOL_F16_REL * np.abs(src) + TOL_F16_ABS
        worst = max(worst, float(np.max(np.abs(got - src) / bound)))
    print("f16 export: max rounding error / bound", worst)
    assert worst <= 1.0


def test_export_bad_inputs(adapter, tmp_path):
    out = tmp_path / "bad.gguf"
    # another base: the qwen2 fixture has 1 layer and hidden 32
    r = run_ftune(["export", "--adapter", adapter, "--format", "gguf", "--out", out, "--model",
                   ROOT / "tests" / "fixtures" / "gguf" / "qwen2-tiny.gguf"])
    line = assert_clean_error(r, None, "adapter_model.safetensors", "another base model")
    assert not out.exists()
    # base_model_name_or_path a hub id, not a local path, and no --model
    hub = tmp_path / "hub"
    hub.mkdir()
    acfg = json.loads((adapter / "adapter_config.json").read_text())
    acfg["base_model_name_or_path"] = "HuggingFaceTB/not-a-local-folder"
    (hub / "adapter_config.json").write_text(json.dumps(acfg))
    (hub / "adapter_model.safetensors").write_bytes((adapter / "adapter_model.safetensors").read_bytes())
    r = run_ftune(["export", "--adapter", hub, "--format", "gguf", "--out", out], cwd=tmp_path)
    assert_clean_error(r, None, "adapter_config.json", "HuggingFaceTB/not-a-local-folder", "--model")
    assert not out.exists()
    r = run_ftune(["export", "--adapter", tmp_path / "nope", "--format", "gguf", "--out", out,
                   "--model", TINY])
    assert_clean_error(r, None, "nope")
    assert not out.exists() and not list(tmp_path.glob("bad.gguf.tmp*"))
    print(line)


def test_llamacpp_applies_adapter_like_ftune(adapter, tmp_path):
    """llama.cpp (llama-cpp-python) loads a GGUF base (our merge of a zero adapter: the base
    weights in F32 with the tokenizer) plus the exported adapter; the logit change the adapter
    causes must match ftune's."""
    llama_cpp = pytest.importorskip("llama_cpp")
    zero = tmp_path / "zero"
    zero.mkdir()
    acfg, t = peft(adapter)
    (zero / "adapter_config.json").write_text(json.dumps(acfg))
    from safetensors.numpy import save_file
    save_file({k: (np.zeros_like(v) if ".lora_B." in k else v) for k, v in t.items()},
              str(zero / "adapter_model.safetensors"), metadata={"format": "pt"})
    base = tmp_path / "base.gguf"
    r = run_ftune(["merge", "--model", TINY, "--adapter", zero, "--out", base, "--format", "gguf",
                   "--dtype", "f32"])
    assert r.returncode == 0, r.stderr
    lora = tmp_path / "ad.gguf"
    r = run_ftune(["export", "--adapter", adapter, "--format", "gguf", "--out", lora, "--model", TINY])
    assert r.returncode == 0, r.stderr

    def cpp(lora_path):
        kw = {"lora_path": str(lora_path)} if lora_path else {}
        # F32 KV cache (type_k/type_v = GGML_TYPE_F32): the default F16 cache alone costs ~1e-3
        m = llama_cpp.Llama(model_path=str(base), n_ctx=64, logits_all=True, verbose=False,
                            n_threads=2, type_k=0, type_v=0, **kw)
        m.eval(TINY_IDS)
        out = np.array(m.scores[:len(TINY_IDS)], dtype=np.float64)
        m.close()
        return out

    def ft(extra):
        f = tmp_path / "l.bin"
        r = run_ftune(["logits", "--model", TINY, "--ids", ",".join(map(str, TINY_IDS)), "--out", f] + extra)
        assert r.returncode == 0, r.stderr
        return np.fromfile(f, dtype=np.float32).reshape(len(TINY_IDS), -1).astype(np.float64)

    with_cpp, with_ft = cpp(lora), ft(["--adapter", str(adapter)])
    d_cpp = with_cpp - cpp(None)
    d_ft = with_ft - ft([])
    scale = np.abs(d_ft).max()
    err = np.abs(d_cpp - d_ft).max() / scale
    err_abs = np.abs(with_cpp - with_ft).max() / np.abs(with_ft).max()
    print(f"llama.cpp vs ftune: adapter logit change max {scale:.4g}, max error {err:.3g} "
          f"(relative to it); logits with the adapter: max error {err_abs:.3g} (relative)")
    assert scale > 1e-4, "the adapter changes nothing: the comparison would be vacuous"
    assert err <= TOL_LLAMACPP_DELTA
    assert err_abs <= TOL_LLAMACPP_LOGITS
