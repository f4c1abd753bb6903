"""`ftune logits` against the independent numpy reference forward (tests/ref/llama_ref.py).

The reference reads the weights itself (safetensors / gguf-py), runs in float64 and is taken
as the truth; ftune runs in float32. Each test prints the largest logit error next to the
error of the same reference evaluated in plain float32 numpy (what single precision costs
on its own), and asserts:

  max |logits_ftune - logits_ref| <= TOL_* * max |logits_ref|
  |loss_ftune - loss_ref| <= TOL_LOSS_REL * loss_ref

Tolerances, from the figures measured when these tests were written (ftune / numpy-fp32,
relative to the largest |logit|): 1-2 layer fixtures 1.6e-7..2.7e-7 / 1.6e-7..2.5e-7;
SmolLM2-135M (30 layers, Q4_1) 2.2e-6 / 2.3e-6. The bounds sit about 10x above what fp32
gives, so a float32 implementation passes and any real mistake (a wrong rope pair, KV head,
scale, permutation, missing bias) does not: every test also checks that a deliberate change
of that kind moves the reference logits by more than MIN_EFFECT times the bound.

Models: the tiny-llama fixture (HF BF16, tied), the GGUF fixtures (mixed quant types,
rope_freqs llama3 divisors, qwen2 with biases), tiny HF folders written here (F32/F16,
sharded, untied, rope_scaling llama3 / rope_parameters / linear), the example
SmolLM2-135M-Instruct Q4_1 GGUF (skipped if scripts/fetch_example.sh cannot fetch it), and
PEFT adapters trained by `ftune train` for two steps (B non-zero).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import llama_ref as R  # noqa: E402

TINY = os.path.join(REPO, "tests", "fixtures", "tiny-llama")
GG = os.path.join(REPO, "tests", "fixtures", "gguf")
DATA = os.path.join(REPO, "examples", "data", "alpaca-seed-tasks", "alpaca_seed_175.jsonl")

TOL_LOGITS_REL_SMALL = 3e-6  # 1-2 layer models, relative to max |logit|
TOL_LOGITS_REL_DEEP = 2e-5   # SmolLM2-135M, 30 layers
TOL_LOSS_REL = 1e-5
MIN_EFFECT = 10              # a deliberate model change must exceed MIN_EFFECT x the bound

# "The quick brown fox jumps over the lazy dog near the river." (Llama-2 tokenizer, with BOS)
TINY_IDS = [1, 415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898, 3914, 3065, 272, 7782, 28723]
# "The capital of France is Paris. It is known for the Eiffel Tower, its museums, its cafes
# and its river." (SmolLM2 tokenizer; `ftune tokenize --model GGUF --text ...`)
SMOL_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 657, 314, 1343, 327, 260, 414, 46682, 18669,
            28, 624, 14739, 28, 624, 20879, 266, 284, 624, 4626, 30]


def ftune_bin():
    b = os.environ.get("FTUNE_BIN", os.path.join(REPO, "build", "ftune"))
    b = b if os.path.isabs(b) else os.path.join(REPO, b)
    assert os.access(b, os.X_OK), f"ftune binary not found at {b} (make build/ftune or set FTUNE_BIN)"
    return b


def ftune_logits(tmp_path, model, ids, adapter=None):
    out = tmp_path / "logits.f32"
    cmd = [ftune_bin(), "logits", "--model", str(model), "--ids", ",".join(map(str, ids)),
           "--out", str(out)]
    if adapter:
        cmd += ["--adapter", str(adapter)]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stderr}"
    j = json.loads(p.stdout)
    z = np.fromfile(out, dtype="<f4")
    assert j["n_tokens"] == len(ids) and z.size == len(ids) * j["vocab"], (j, z.size)
    return j, z.reshape(len(ids), j["vocab"])


def ftune_train(out, model, *extra):
    cmd = [ftune_bin(), "train", "--model", str(model), "--data", DATA, "--out", str(out),
           "--max-steps", "2", "--lr", "1e-2", "--quiet", *extra]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stderr}"
    assert os.path.isfile(os.path.join(out, "adapter_model.safetensors"))
    return out


def check(label, cfg, w, ids, j, got, tol_rel):
    """Asserts ftune's logits and loss against the float64 reference; returns the reference."""
    ref = R.forward(cfg, w, ids)
    ref32 = R.forward(cfg, w, ids, dtype=np.float32)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert j["vocab"] == cfg["vocab_size"]
    scale = float(np.abs(ref).max())
    err = float(np.abs(got - ref).max())
    err32 = float(np.abs(ref32 - ref).max())
    loss = R.next_token_loss(ref, ids)
    lerr = abs(j["loss"] - loss) / loss
    print(f"\n[{label}] T={len(ids)} V={ref.shape[1]} max|logit|={scale:.4g} "
          f"max|ftune-ref|={err:.3e} ({err / scale:.2e} rel; numpy fp32 {err32:.3e}, "
          f"{err32 / scale:.2e} rel; bound {tol_rel:.0e}) loss ftune={j['loss']:.9g} "
          f"ref={loss:.9g} rel err {lerr:.2e}")
    assert np.all(np.isfinite(got)), label
    assert err <= tol_rel * scale, f"{label}: max |ftune - ref| = {err:.3e} > {tol_rel} * {scale:.4g}"
    assert lerr <= TOL_LOSS_REL, f"{label}: loss {j['loss']} vs reference {loss}"
    return ref


def assert_effect(label, ref, changed, tol_rel):
    """The deliberate change `changed` (another reference run) must be caught by the bound."""
    d = float(np.abs(changed - ref).max())
    bound = tol_rel * float(np.abs(ref).max())
    print(f"[{label}] control: max change {d:.3e} = {d / bound:.0f}x the bound")
    assert d > MIN_EFFECT * bound, f"{label}: the change moves logits by only {d:.3e}"


def gguf_order(w, n_head):
    """HF rows -> GGUF(llama) rows (the permutation a loader must undo, formats.md 2.4)."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------
# base models

def test_tiny_llama_hf(tmp_path):
    cfg, w = R.load_hf(TINY)
    j, got = ftune_logits(tmp_path, TINY, TINY_IDS)
    ref = check("tiny-llama HF bf16", cfg, w, TINY_IDS, j, got, TOL_LOGITS_REL_SMALL)
    # controls: q/k left in llama.cpp order (interleaved rope pairs); KV head h % Hkv
    w2 = dict(w)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}.self_attn."
        w2[p + "q_proj.weight"] = gguf_order(w[p + "q_proj.weight"], cfg["num_attention_heads"])
        w2[p + "k_proj.weight"] = gguf_order(w[p + "k_proj.weight"], cfg["num_key_value_heads"])
    assert_effect("tiny-llama q/k permuted", ref, R.forward(cfg, w2, TINY_IDS), TOL_LOGITS_REL_SMALL)
    w3, H, Hkv, D = dict(w), cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rep = H // Hkv
    order = [n // rep + Hkv * (n % rep) for n in range(H)]  # old head order[n] meets KV n // rep = order[n] % Hkv
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}.self_attn."
        q = w[p + "q_proj.weight"].reshape(H, D, -1)
        w3[p + "q_proj.weight"] = q[order].reshape(H * D, -1)
        o = w[p + "o_proj.weight"].reshape(-1, H, D)
        w3[p + "o_proj.weight"] = o[:, order].reshape(-1, H * D)
    assert_effect("tiny-llama KV head h % Hkv", ref, R.forward(cfg, w3, TINY_IDS), TOL_LOGITS_REL_SMALL)


GGUF_CASES = {
    # name: (file, ids)
    "tiny-llama.gguf": ("tiny-llama.gguf", TINY_IDS),
    "rope-llama3.gguf": ("rope-llama3.gguf", [(i * 7 + 3) % 32 for i in range(256)]),
    "qwen2-tiny.gguf": ("qwen2-tiny.gguf", [(i * 5 + 1) % 16 for i in range(24)]),
}


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_gguf_fixture(tmp_path, case):
    fn, ids = GGUF_CASES[case]
    path = os.path.join(GG, fn)
    cfg, w = R.load_gguf(path)
    j, got = ftune_logits(tmp_path, path, ids)
    ref = check(case, cfg, w, ids, j, got, TOL_LOGITS_REL_SMALL)
    if case == "rope-llama3.gguf":  # control: rope_freqs.weight divisors ignored
        assert cfg["rope_freq_divisors"] is not None
        c2 = dict(cfg, rope_freq_divisors=None)
        assert_effect(case + " without rope_freqs", ref, R.forward(c2, w, ids), TOL_LOGITS_REL_SMALL)
    elif case == "qwen2-tiny.gguf":  # control: q/k/v biases dropped
        w2 = {k: v for k, v in w.items() if not k.endswith(".bias")}
        assert len(w2) == len(w) - 3
        assert_effect(case + " without biases", ref, R.forward(cfg, w2, ids), TOL_LOGITS_REL_SMALL)
    else:
        # layer 0 is stored F32: after un-permuting it equals the HF fixture exactly
        _, w_hf = R.load_hf(TINY)
        for k in ("q_proj", "k_proj", "v_proj", "o_proj"):
            n = f"model.layers.0.self_attn.{k}.weight"
            assert np.array_equal(w[n], w_hf[n]), n
        # control: q/k rows left in llama.cpp order
        w2 = dict(w)
        for l in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{l}.self_attn."
            w2[p + "q_proj.weight"] = gguf_order(w[p + "q_proj.weight"], cfg["num_attention_heads"])
            w2[p + "k_proj.weight"] = gguf_order(w[p + "k_proj.weight"], cfg["num_key_value_heads"])
        assert_effect(case + " q/k not un-permuted", ref, R.forward(cfg, w2, ids), TOL_LOGITS_REL_SMALL)


LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
HF_CASES = {
    # name: (config changes, storage dtype)
    "llama3 rope_scaling, F32": ({"rope_scaling": dict(LLAMA3, rope_type="llama3")}, "F32"),
    "llama3 rope_parameters (v5), F32": (
        {"rope_scaling": None, "rope_theta": None,
         "rope_parameters": dict(LLAMA3, rope_type="llama3", rope_theta=10000.0)}, "F32"),
    "linear rope_scaling 'type', F16": ({"rope_scaling": {"type": "linear", "factor": 4.0}}, "F16"),
}


def write_hf_folder(out, changes, dtype):
    """Tiny untied model in 2 shards, q/k scaled x6 so attention is sharp and rope matters."""
    from safetensors.numpy import save_file
    from make_tiny_model import CONFIG, make_weights

    cfg = dict(CONFIG, tie_word_embeddings=False, torch_dtype="float32")
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    w = make_weights(cfg, 7, True)
    for k in w:
        if ".q_proj." in k or ".k_proj." in k:
            w[k] = w[k] * 6
    np_dt = {"F32": np.float32, "F16": np.float16}[dtype]
    w = {k: v.astype(np_dt) for k, v in w.items()}
    os.makedirs(out)
    names = sorted(w)
    wm = {}
    for s, part in enumerate((names[0::2], names[1::2])):
        fn = f"model-{s + 1:05d}-of-00002.safetensors"
        save_file({k: w[k] for k in part}, os.path.join(out, fn), metadata={"format": "pt"})
        wm.update({k: fn for k in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_hf_rope_scaling(tmp_path, case):
    changes, dtype = HF_CASES[case]
    model = tmp_path / "model"
    write_hf_folder(str(model), changes, dtype)
    cfg, w = R.load_hf(str(model))
    assert cfg["rope_type"] != "default" and not cfg["tie_word_embeddings"]
    assert "lm_head.weight" in w
    ids = [(i * 997 + 13) % 32000 for i in range(32)]
    j, got = ftune_logits(tmp_path, model, ids)
    ref = check(case, cfg, w, ids, j, got, TOL_LOGITS_REL_SMALL)
    c2 = dict(cfg, rope_type="default")
    assert_effect(case + " scaling ignored", ref, R.forward(c2, w, ids), TOL_LOGITS_REL_SMALL)


@pytest.fixture(scope="module")
def example():
    env = dict(os.environ)
    if "FTUNE_CACHE" not in env and os.path.isdir("/tmp/ftcache/examples"):
        env["FTUNE_CACHE"] = "/tmp/ftcache"
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", "fetch_example.sh")], cwd=REPO,
                       capture_output=True, text=True, env=env)
    path = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if p.returncode != 0 or not os.path.isfile(path):
        pytest.skip(f"example model unavailable: {p.stderr.strip()[-300:]}")
    cfg, w = R.load_gguf(path)
    return path, cfg, w


def test_example_gguf(tmp_path, example):
    path, cfg, w = example
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"]) == (30, 576, 3)
    j, got = ftune_logits(tmp_path, path, SMOL_IDS)
    ref = check("SmolLM2-135M Q4_1", cfg, w, SMOL_IDS, j, got, TOL_LOGITS_REL_DEEP)
    # a trained model predicts English: the loss is far below log(V) = 10.8
    assert R.next_token_loss(ref, SMOL_IDS) < 6.0


# ---------------------------------------------------------------------------------------
# with a trained PEFT adapter

def lora_nonzero(adapter):
    acfg, t, _ = R.read_peft_adapter(str(adapter))
    bmax = max(float(np.abs(v).max()) for k, v in t.items() if k.endswith("lora_B.weight"))
    assert bmax > 0, "all lora_B are zero: the adapter has no effect"
    return acfg


def test_adapter_tiny_llama(tmp_path):
    ad = ftune_train(tmp_path / "ad", TINY, "--seq-len", "128")
    acfg = lora_nonzero(ad)
    assert not acfg["use_rslora"]
    cfg, w = R.load_hf(TINY)
    wa = R.apply_peft_adapter(cfg, w, str(ad))
    j, got = ftune_logits(tmp_path, TINY, TINY_IDS, adapter=ad)
    ref = check("tiny-llama + LoRA r16", cfg, wa, TINY_IDS, j, got, TOL_LOGITS_REL_SMALL)
    assert_effect("tiny-llama adapter removed", ref, R.forward(cfg, w, TINY_IDS), TOL_LOGITS_REL_SMALL)


def test_adapter_rslora_subset(tmp_path):
    ad = ftune_train(tmp_path / "ad", TINY, "--seq-len", "128", "--use-rslora", "--lora-r", "8",
                     "--lora-alpha", "16", "--lora-target", "q_proj,v_proj,down_proj")
    acfg = lora_nonzero(ad)
    assert acfg["use_rslora"] is True and acfg["r"] == 8
    assert sorted(acfg["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    cfg, w = R.load_hf(TINY)
    wa = R.apply_peft_adapter(cfg, w, str(ad))
    j, got = ftune_logits(tmp_path, TINY, TINY_IDS, adapter=ad)
    ref = check("tiny-llama + rsLoRA r8 q,v,down", cfg, wa, TINY_IDS, j, got, TOL_LOGITS_REL_SMALL)
    # control: the same adapter scaled by alpha/r instead of alpha/sqrt(r)
    plain = tmp_path / "plain"
    os.makedirs(plain)
    with open(plain / "adapter_config.json", "w") as f:
        json.dump(dict(acfg, use_rslora=False), f)
    os.symlink(ad / "adapter_model.safetensors", plain / "adapter_model.safetensors")
    assert_effect("rsLoRA scaled as alpha/r", ref,
                  R.forward(cfg, R.apply_peft_adapter(cfg, w, str(plain)), TINY_IDS),
                  TOL_LOGITS_REL_SMALL)


def test_adapter_example_gguf(tmp_path, example):
    """Adapters are in HF layout; on a llama GGUF they must meet the un-permuted q/k rows."""
    path, cfg, w = example
    ad = ftune_train(tmp_path / "ad", path, "--seq-len", "64", "--eval-max", "2",
                     "--lora-target", "q_proj,k_proj,v_proj,o_proj")
    lora_nonzero(ad)
    wa = R.apply_peft_adapter(cfg, w, str(ad))
    j, got = ftune_logits(tmp_path, path, SMOL_IDS, adapter=ad)
    ref = check("SmolLM2-135M Q4_1 + LoRA q,k,v,o", cfg, wa, SMOL_IDS, j, got, TOL_LOGITS_REL_DEEP)
    assert_effect("SmolLM2 adapter removed", ref, R.forward(cfg, w, SMOL_IDS), TOL_LOGITS_REL_DEEP)


def write_llama_qkv_bias_gguf(path):
    """A 1-layer llama-arch GGUF with q/k/v biases and no attn_output.bias (llama.cpp loads the
    o bias as optional), q/k rows and biases permuted as convert_hf_to_gguf.py does, F32
    values of make_gguf_fixtures.pattern (names in HF order before the permutation)."""
    import gguf
    from make_gguf_fixtures import llama_kv, one_layer_qkv_bias_shapes, pattern, permute
    C, F, H, Hkv, D, V = 64, 128, 4, 2, 16, 32
    w = gguf.GGUFWriter(str(path), "llama")
    llama_kv(w, 1, C, F, H, Hkv, D, V, 1e-5, 10000.0, 256)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, shape in one_layer_qkv_bias_shapes(C, F, H, Hkv, D, V).items():
        a = pattern(name, shape) * (8 if ".bias" in name or "attn_q" in name or "attn_k" in name else 1)
        if name.startswith("blk.0.attn_q."):
            a = permute(a, H, H)
        elif name.startswith("blk.0.attn_k."):
            a = permute(a, H, Hkv)
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_llama_qkv_bias_without_o_bias(tmp_path):
    """Such a file loads (the o projection without bias, as llama.cpp runs it: against the
    reference), and its NF4 pack, whose layout gives every llama-type model with attention
    biases an o bias (as transformers' LlamaAttention), builds with that slot zero: --quant
    nf4 runs, within NF4's error of the fp32 logits. (The pack build had failed: the o bias
    was missing from the file.)"""
    path = tmp_path / "llama-qkv-bias.gguf"
    write_llama_qkv_bias_gguf(path)
    ids = [(i * 5 + 3) % 32 for i in range(20)]
    cfg, w = R.load_gguf(str(path))
    assert "model.layers.0.self_attn.q_proj.bias" in w and "model.layers.0.self_attn.o_proj.bias" not in w
    j, got = ftune_logits(tmp_path, path, ids)
    ref = check("llama q/k/v bias, no o bias", cfg, w, ids, j, got, TOL_LOGITS_REL_SMALL)
    w2 = {k: v for k, v in w.items() if not k.endswith(".bias")}
    assert_effect("llama q/k/v bias dropped", ref, R.forward(cfg, w2, ids), TOL_LOGITS_REL_SMALL)
    out = tmp_path / "nf4.f32"
    cmd = [ftune_bin(), "logits", "--model", str(path), "--ids", ",".join(map(str, ids)),
           "--out", str(out), "--quant", "nf4", "--cache-dir", str(tmp_path / "packs")]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    nf4 = np.fromfile(out, dtype="<f4").reshape(got.shape)
    scale = float(np.abs(got).max())
    err = float(np.abs(nf4 - got).max())
    print(f"[nf4 pack] max |nf4 - fp32| {err:.3e} of max |logit| {scale:.3e}")
    assert np.all(np.isfinite(nf4)) and 0 < err <= 0.1 * scale
