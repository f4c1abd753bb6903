"""`ftune merge`: W + scale * B A written as safetensors or GGUF, checked against numpy.

The numpy reference is the formula of adapters/export/merge.h, exactly:
    delta = (B.astype(f64) @ A.astype(f64)).astype(f32)        (fp64 accumulation, one rounding)
    W'    = W32 + f32(alpha / r) * delta                        (fp32 multiply, fp32 add)
then one rounding to the output type: bf16 round-to-nearest-even bits, numpy's float16, or
gguf-py's Q8_0 quantizer. Every merged tensor must be bit-identical to it, every other tensor
bit-identical to the source (or to its one conversion). Models: tests/fixtures/tiny-llama (HF,
BF16), tests/fixtures/gguf/tiny-llama.gguf (same weights, mixed F32/F16/BF16/Q8_0/Q4_0/Q4_1,
q/k rows in llama.cpp order) and the example SmolLM2-135M Q4_1 GGUF (skipped if
scripts/fetch_example.sh fails). The adapter is trained by `ftune train` for 2 steps with
--lr 1e-2 (B != 0), or made with numpy for the example model.

Also: `ftune logits` of a merged model against `ftune logits --adapter` on the base (named
tolerances below, measured figures printed), the merged GGUF's metadata and tokenizer (ftune
tokenizes the same ids from it as from tokenizer.json), sharding, the peak RSS of the
example merge against the model's size, `--init-adapter` compatibility errors, and, when
llama-cpp-python is importable, llama.cpp's logits of the merged GGUF.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cli_helpers import (ROOT, SEED_DATA, TINY, TINY_GGUF, assert_clean_error,  # noqa: E402
                         model_copy, run_ftune)
import llama_ref as R  # noqa: E402

gguf = pytest.importorskip("gguf")
from safetensors.numpy import save_file  # noqa: E402

PROJ = [("q_proj", "self_attn", "attn_q"), ("k_proj", "self_attn", "attn_k"),
        ("v_proj", "self_attn", "attn_v"), ("o_proj", "self_attn", "attn_output"),
        ("gate_proj", "mlp", "ffn_gate"), ("up_proj", "mlp", "ffn_up"),
        ("down_proj", "mlp", "ffn_down")]
TINY_IDS = [1, 415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898, 3914, 3065, 272, 7782]

# Logits of a merged model vs the base with the adapter applied at run time, relative to the
# largest |logit| (measured figures are printed by the tests):
TOL_LOGITS_F32 = 1e-5    # f32 merge: only the order of fp32 operations differs (~1e-7)
TOL_LOGITS_BF16 = 2e-2   # bf16 merge: each merged weight rounded to 8 significant bits
TOL_LOGITS_F16 = 5e-3    # f16 merge (GGUF): 11 significant bits
TOL_LOGITS_Q8_0 = 2e-2   # Q8_0 merge: 8-bit blocks
TOL_LLAMACPP = 3e-6      # llama.cpp (F32 KV cache) vs ftune, same F32 merged GGUF (measured 2.7e-7)
# Peak RSS of a merge must stay below one layer plus the embeddings in fp32 plus this much
# for the process, the mapped metadata and the row-block buffers (a bounded constant):
RSS_OVERHEAD_MIB = 64


# ---- helpers ------------------------------------------------------------------------------

def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (what torch .to(bfloat16) does)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def merged_ref(w32, A, B, scale):
    d = (B.astype(np.float64) @ A.astype(np.float64)).astype(np.float32)
    return (w32.astype(np.float32) + np.float32(scale) * d).astype(np.float32)


def permute_np(w, n_head):
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def st_raw(folder):
    """{name: (dtype, shape, bytes)} of a folder's safetensors (single or sharded)."""
    import safetensors
    idx = os.path.join(folder, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx)
             else ["model.safetensors"])
    out = {}
    for fn in files:
        for name, t in safetensors.deserialize(open(os.path.join(folder, fn), "rb").read()):
            out[name] = (t["dtype"], tuple(t["shape"]), bytes(t["data"]))
    return out


def st_one(path, name):
    """(shape, uint16/float32 array) of one tensor, read by offset from a safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        h = json.loads(f.read(n))[name]
        a, b = h["data_offsets"]
        f.seek(8 + n + a)
        data = f.read(b - a)
    dt = {"BF16": "<u2", "F16": "<f2", "F32": "<f4"}[h["dtype"]]
    return tuple(h["shape"]), np.frombuffer(data, dtype=dt).reshape(h["shape"])


def gguf_kv_fast(path, tensors=False):
    """{key: value} of a GGUF file's metadata, parsed with struct (formats.md 4.3); with
    tensors=True also the tensors (name, shape = ne, tensor_type, raw typed data). gguf-py's
    GGUFReader takes seconds on a tokenizer's hundreds of thousands of strings."""
    import struct
    b = open(path, "rb").read()
    assert b[:4] == b"GGUF" and struct.unpack_from("<I", b, 4)[0] == 3
    n_kv = struct.unpack_from("<Q", b, 16)[0]
    pos = 24
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}

    def string(p):
        n = struct.unpack_from("<Q", b, p)[0]
        return b[p + 8:p + 8 + n].decode(), p + 8 + n

    def value(t, p):
        if t == 8:
            return string(p)
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            if et == 8:
                out = []
                for _ in range(n):
                    v, p = string(p)
                    out.append(v)
                return out, p
            sz = struct.calcsize(fmt[et])
            return list(np.frombuffer(b, fmt[et], n, p)), p + n * sz
        return struct.unpack_from(fmt[t], b, p)[0], p + struct.calcsize(fmt[t])

    kv = {}
    for _ in range(n_kv):
        k, pos = string(pos)
        t = struct.unpack_from("<I", b, pos)[0]
        kv[k], pos = value(t, pos + 4)
    if not tensors:
        return kv
    infos = []
    for _ in range(struct.unpack_from("<Q", b, 8)[0]):
        name, pos = string(pos)
        nd = struct.unpack_from("<I", b, pos)[0]
        ne = list(struct.unpack_from(f"<{nd}Q", b, pos + 4))
        ty, off = struct.unpack_from("<IQ", b, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        infos.append((name, ne, ty, off))
    align = kv.get("general.alignment", 32)
    start = (pos + align - 1) // align * align
    out = []
    for name, ne, ty, off in infos:
        qt = gguf.GGMLQuantizationType(ty)
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        nbytes = int(np.prod(ne)) // bs * ts
        dt = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16,
              gguf.GGMLQuantizationType.BF16: np.uint16}.get(qt, np.uint8)
        data = np.frombuffer(b, dtype=dt, count=nbytes // np.dtype(dt).itemsize, offset=start + off)
        out.append(types.SimpleNamespace(name=name, shape=ne, tensor_type=qt, data=data))
    return kv, out


def adapter_tensors(adapter_dir):
    acfg, t, _ = R.read_peft_adapter(str(adapter_dir))
    scale = acfg["lora_alpha"] / acfg["r"]
    ab = {}
    for k, v in t.items():
        m = re.match(r"base_model\.model\.model\.layers\.(\d+)\.\w+\.(\w+)\.lora_([AB])\.weight", k)
        ab.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = v
    return acfg, scale, ab


def hf_key(name):
    m = re.match(r"model\.layers\.(\d+)\.\w+\.(\w+_proj)\.weight$", name)
    return (int(m.group(1)), m.group(2)) if m else None


def merged_want(base, adapter):
    """base (HF name -> array) with every LoRA-adapted weight replaced by merged_ref of it."""
    _, scale, ab = adapter_tensors(adapter)
    want = dict(base)
    for name in base:
        key = hf_key(name)
        if key:
            want[name] = merged_ref(base[name], ab[key]["A"], ab[key]["B"], scale)
    return want


def logits(model, extra=(), ids=TINY_IDS, tmp=None):
    f = os.path.join(str(tmp), "logits.bin")
    r = run_ftune(["logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", f,
                   "--threads", 2] + list(extra))
    assert r.returncode == 0, r.stderr
    return np.fromfile(f, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)


def merge(args):
    r = run_ftune(["merge"] + [str(a) for a in args])
    assert r.returncode == 0, r.stderr
    print(r.stderr.strip())
    return r


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    out = tmp_path_factory.mktemp("merge") / "ad"
    r = run_ftune(["train", "--model", TINY, "--data", SEED_DATA, "--out", out, "--max-steps", 2,
                   "--lr", "1e-2", "--seq-len", 64, "--batch-size", 1, "--threads", 2, "--quiet"])
    assert r.returncode == 0, r.stderr
    return out


# ---- safetensors from an HF folder ---------------------------------------------------------

def test_merge_safetensors_exact(adapter, tmp_path):
    out = tmp_path / "merged"
    merge(["--model", TINY, "--adapter", adapter, "--out", out])
    base, got = st_raw(str(TINY)), st_raw(str(out))
    acfg, scale, ab = adapter_tensors(adapter)
    assert set(got) == set(base)
    n_merged = changed = 0
    for name, (dt, shape, data) in base.items():
        gdt, gshape, gdata = got[name]
        assert (gdt, gshape) == ("BF16", shape), name
        key = hf_key(name)
        if key is None or key[1] not in acfg["target_modules"]:
            assert gdata == data, f"{name} changed but is not adapted"
            continue
        w32 = R.bf16_bits_to_f32(np.frombuffer(data, dtype="<u2")).reshape(shape)
        want = bf16_bits(merged_ref(w32, ab[key]["A"], ab[key]["B"], scale))
        have = np.frombuffer(gdata, dtype="<u2").reshape(shape)
        bad = int(np.count_nonzero(want != have))
        assert bad == 0, f"{name}: {bad} of {want.size} bf16 values differ from numpy"
        changed += int(np.count_nonzero(have != np.frombuffer(data, dtype="<u2").reshape(shape)))
        n_merged += 1
    print(f"{n_merged} merged tensors bit-identical to numpy; {changed} bf16 values changed")
    assert n_merged == 14 and changed > 1000, "the adapter changed nothing: vacuous check"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    src = json.loads((TINY / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "torch_dtype"} == \
        {k: v for k, v in src.items() if k != "torch_dtype"}
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / f).read_bytes() == (TINY / f).read_bytes(), f
    assert not list(out.glob("*.tmp.*"))


def test_merge_sharded_and_restale(adapter, tmp_path):
    one, sh = tmp_path / "one", tmp_path / "sh"
    merge(["--model", TINY, "--adapter", adapter, "--out", one])
    merge(["--model", TINY, "--adapter", adapter, "--out", sh, "--shard-size", "100KB"])
    idx = json.loads((sh / "model.safetensors.index.json").read_text())
    files = sorted(set(idx["weight_map"].values()))
    n = len(files)
    print("shards:", files)
    assert n >= 3 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    for fn in files:  # each shard within the limit, unless one tensor alone exceeds it
        sub = R.read_safetensors(str(sh / fn))[0]
        assert os.path.getsize(sh / fn) <= 100_000 or len(sub) == 1, fn
    a, b = st_raw(str(one)), st_raw(str(sh))
    assert a == b
    assert idx["metadata"]["total_size"] == sum(len(v[2]) for v in b.values())
    assert not (sh / "model.safetensors").exists()
    # merging again unsharded into the same folder removes the old shards and index
    merge(["--model", TINY, "--adapter", adapter, "--out", sh])
    assert sorted(p.name for p in sh.glob("model*")) == ["model.safetensors"]


def test_merged_logits_match_adapter(adapter, tmp_path):
    ref = logits(TINY, ["--adapter", adapter], tmp=tmp_path)
    base = logits(TINY, tmp=tmp_path)
    m = np.abs(ref).max()
    effect = np.abs(ref - base).max() / m
    for dtype, tol in (("f32", TOL_LOGITS_F32), ("bf16", TOL_LOGITS_BF16)):
        out = tmp_path / dtype
        merge(["--model", TINY, "--adapter", adapter, "--out", out, "--dtype", dtype])
        err = np.abs(logits(out, tmp=tmp_path) - ref).max() / m
        print(f"merged {dtype} vs --adapter: max |dlogit| / max|logit| = {err:.3g} "
              f"(adapter effect {effect:.3g}, bound {tol:g})")
        assert err <= tol
    assert effect > 10 * TOL_LOGITS_F32, "the adapter's effect is below the f32 bound: vacuous"


# ---- GGUF output ---------------------------------------------------------------------------

def gguf_fields(path):
    kv, ts = gguf_kv_fast(path, tensors=True)
    return types.SimpleNamespace(tensors=ts), kv


def check_gguf_weights(rd, want_hf, dtype, cfg):
    """want_hf: {HF name: float32 merged/original values in HF layout} -> exact comparison."""
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    seen = 0
    for t in rd.tensors:
        if t.name == "rope_freqs.weight":
            continue
        name = t.name
        if name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "model.norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        else:
            _, l, g, kind = name.split(".")
            sub = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
            hf = (f"model.layers.{l}.{sub[g]}.{kind}" if g in sub
                  else f"model.layers.{l}.{R._GGUF_LAYER[g]}.{kind}")
        w = want_hf[hf]
        if ".attn_q." in name:
            w = permute_np(w, H)
        elif ".attn_k." in name:
            w = permute_np(w, Hkv)
        raw = np.asarray(t.data)
        if w.ndim == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
            assert np.array_equal(raw.reshape(w.shape), w), name
        elif dtype == "f16":
            assert t.tensor_type == gguf.GGMLQuantizationType.F16, name
            assert np.array_equal(raw.reshape(w.shape).view(np.uint16),
                                  w.astype(np.float16).view(np.uint16)), name
        elif dtype == "bf16":
            assert t.tensor_type == gguf.GGMLQuantizationType.BF16, name
            assert np.array_equal(raw.reshape(-1).view(np.uint16), bf16_bits(w).reshape(-1)), name
        elif dtype == "q8_0":
            assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, name
            q = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
            assert np.array_equal(raw.reshape(-1).view(np.uint8), q.reshape(-1).view(np.uint8)), name
        seen += 1
    return seen


@pytest.mark.parametrize("dtype", ["f16", "q8_0", "bf16"])
def test_merge_gguf_from_hf(adapter, tmp_path, dtype):
    out = tmp_path / "m.gguf"
    merge(["--model", TINY, "--adapter", adapter, "--out", out, "--format", "gguf", "--dtype", dtype])
    rd, kv = gguf_fields(out)
    cfg = json.loads((TINY / "config.json").read_text())
    assert kv["general.architecture"] == "llama" and kv["general.type"] == "model"
    assert kv["general.file_type"] == {"f16": 1, "q8_0": 7, "bf16": 32}[dtype]
    for k, v in (("llama.block_count", 2), ("llama.embedding_length", 64),
                 ("llama.feed_forward_length", 128), ("llama.attention.head_count", 4),
                 ("llama.attention.head_count_kv", 2), ("llama.rope.dimension_count", 16),
                 ("llama.context_length", 2048), ("llama.vocab_size", 32000)):
        assert kv[k] == v, k
    assert kv["tokenizer.ggml.model"] == "llama" and len(kv["tokenizer.ggml.tokens"]) == 32000
    assert kv["tokenizer.ggml.bos_token_id"] == 1 and kv["tokenizer.ggml.eos_token_id"] == 2
    assert kv["tokenizer.ggml.add_bos_token"] is True
    base = {k: v.astype(np.float32) for k, v in R.read_hf_weights(str(TINY)).items()}
    want = merged_want(base, adapter)
    n = check_gguf_weights(rd, want, dtype, cfg)
    assert n == len(base), (n, len(base))
    print(f"{dtype}: {n} tensors equal to numpy (q/k permuted, Q8_0 via gguf.quants)")
    # ftune reads it back: same tokens as tokenizer.json, logits close to --adapter
    text = "The quick brown fox, 3.14 and   spaces\n\u4e2d\u6587"
    toks = []
    for m in (TINY, out):
        r = run_ftune(["tokenize", "--model", m, "--text", text])
        assert r.returncode == 0, r.stderr
        toks.append(r.stdout.strip())
    assert toks[0] == toks[1], toks
    ref = logits(TINY, ["--adapter", adapter], tmp=tmp_path)
    err = np.abs(logits(out, tmp=tmp_path) - ref).max() / np.abs(ref).max()
    tol = {"f16": TOL_LOGITS_F16, "q8_0": TOL_LOGITS_Q8_0, "bf16": TOL_LOGITS_BF16}[dtype]
    print(f"merged GGUF {dtype} vs --adapter: {err:.3g} (bound {tol:g})")
    assert err <= tol


def test_merge_from_gguf_source(adapter, tmp_path):
    """Base tiny-llama.gguf (mixed quant types, q/k in llama.cpp order): safetensors f32/bf16
    in HF order, and GGUF Q8_0 in GGUF order, equal to numpy on gguf-py's dequantization."""
    cfg, base = R.load_gguf(str(TINY_GGUF))  # HF layout, exact dequantization
    want = merged_want(base, adapter)
    for dtype in ("f32", "bf16"):
        out = tmp_path / dtype
        merge(["--model", TINY_GGUF, "--adapter", adapter, "--out", out, "--dtype", dtype])
        got = st_raw(str(out))
        assert set(got) == set(want)
        for name, w in want.items():
            dt, shape, data = got[name]
            assert shape == w.shape, name
            if dtype == "f32":
                assert np.array_equal(np.frombuffer(data, "<f4").reshape(shape), w), name
            else:
                assert np.array_equal(np.frombuffer(data, "<u2").reshape(shape), bf16_bits(w)), name
        c = json.loads((out / "config.json").read_text())
        assert c["num_key_value_heads"] == 2 and c["tie_word_embeddings"] is True
        assert c["head_dim"] == 16 and c["architectures"] == ["LlamaForCausalLM"]
    ref = logits(TINY_GGUF, ["--adapter", adapter], tmp=tmp_path)
    err = np.abs(logits(tmp_path / "f32", tmp=tmp_path) - ref).max() / np.abs(ref).max()
    print(f"GGUF -> safetensors f32 merge vs --adapter on the GGUF: {err:.3g}")
    assert err <= TOL_LOGITS_F32
    out = tmp_path / "q.gguf"
    merge(["--model", TINY_GGUF, "--adapter", adapter, "--out", out, "--format", "gguf",
           "--dtype", "q8_0"])
    rd, kv = gguf_fields(out)
    assert kv["general.name"] == "tiny-llama" and kv["tokenizer.ggml.bos_token_id"] == 1
    assert check_gguf_weights(rd, want, "q8_0", cfg) == len(want)


def test_merge_bad_inputs(adapter, tmp_path):
    out = tmp_path / "o"
    r = run_ftune(["merge", "--model", ROOT / "tests/fixtures/gguf/qwen2-tiny.gguf", "--adapter",
                   adapter, "--out", out])
    assert_clean_error(r, None, "adapter_model.safetensors", "another base model")
    assert not out.exists() or not list(out.iterdir())
    r = run_ftune(["merge", "--model", TINY, "--adapter", adapter, "--out", out, "--dtype", "q8_0"])
    assert_clean_error(r, None, "bf16, f16 or f32")
    r = run_ftune(["merge", "--model", TINY, "--adapter", adapter, "--out", out, "--format", "onnx"])
    assert r.returncode == 2


# ---- continuing from a PEFT adapter (--init-adapter) ----------------------------------------

def mutated(adapter, tmp_path, name, cfg_edit=None, t_edit=None):
    d = tmp_path / name
    d.mkdir()
    acfg, t, _ = R.read_peft_adapter(str(adapter))
    if cfg_edit:
        cfg_edit(acfg)
    if t_edit:
        t_edit(t)
    (d / "adapter_config.json").write_text(json.dumps(acfg))
    save_file({k: np.ascontiguousarray(v) for k, v in t.items()}, str(d / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    return d


def test_init_adapter_compatibility(adapter, tmp_path):
    args = ["train", "--model", TINY, "--data", SEED_DATA, "--max-steps", 1, "--seq-len", 64,
            "--batch-size", 1, "--threads", 2, "--quiet"]
    r = run_ftune(args + ["--out", tmp_path / "ok", "--init-adapter", adapter])
    assert r.returncode == 0, r.stderr
    pre = "base_model.model.model.layers"

    def drop_layer1(t):
        for k in [k for k in t if k.startswith(pre + ".1.")]:
            del t[k]

    def drop_one(t):
        del t[pre + ".0.self_attn.v_proj.lora_B.weight"]

    def add_layer2(t):
        for k in [k for k in t if k.startswith(pre + ".1.")]:
            t[k.replace(".1.", ".2.", 1)] = t[k]

    def narrow_q(t):
        for k in [k for k in t if ".q_proj.lora_A" in k]:
            t[k] = t[k][:, :32]

    cases = [
        ("rank", lambda c: c.update(r=8), None, ["rank 16", "r = 8"]),
        ("targets", lambda c: c.update(target_modules=["q_proj", "v_proj"]), None,
         ["is not in target_modules", "adapter_config.json"]),
        ("lmhead", None, lambda t: t.update({"base_model.model.lm_head.lora_A.weight": np.zeros((16, 64), np.float32)}),
         ["lm_head"]),
        ("missing", None, drop_one, ["missing tensor", "layers.0.self_attn.v_proj.lora_B"]),
        ("fewer", None, drop_layer1, ["1 layers", "has 2", "another base model"]),
        ("layers", None, add_layer2, ["3 layers", "has 2", "another base model"]),
        ("shape", None, narrow_q, ["q_proj", "another base model"]),
        ("mts", lambda c: c.update(modules_to_save=["lm_head"]), None, ["modules_to_save"]),
        ("dora", lambda c: c.update(use_dora=True), None, ["DoRA"]),
    ]
    for name, ce, te, needles in cases:
        d = mutated(adapter, tmp_path, name, ce, te)
        out = tmp_path / ("out-" + name)
        r = run_ftune(args + ["--out", out, "--init-adapter", d])
        line = assert_clean_error(r, out, *needles)
        print(f"{name}: {line}")


# ---- the example model: peak memory, exactness on a real layer, llama.cpp -------------------

def example_gguf():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "fetch_example.sh")], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0 or not r.stdout.strip():
        pytest.skip("example model not available: " + r.stderr.strip()[-200:])
    return r.stdout.strip().splitlines()[-1]


def test_example_merge_memory_and_values(tmp_path):
    path = example_gguf()
    rd = gguf.GGUFReader(path)
    f = {k: v.contents() for k, v in rd.fields.items() if k.startswith("llama.")}
    C, F, L = f["llama.embedding_length"], f["llama.feed_forward_length"], f["llama.block_count"]
    H, KV = f["llama.attention.head_count"], f["llama.attention.head_count_kv"]
    D = C // H
    V = [t for t in rd.tensors if t.name == "token_embd.weight"][0].shape[1]
    r_ = 8
    dims = {"q_proj": (H * D, C), "k_proj": (KV * D, C), "v_proj": (KV * D, C), "o_proj": (C, H * D),
            "gate_proj": (F, C), "up_proj": (F, C), "down_proj": (C, F)}
    par = {p: ("self_attn" if p in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp") for p in dims}
    rng = np.random.default_rng(0)
    t = {}
    for l in range(L):
        for p, (o, i) in dims.items():
            t[f"base_model.model.model.layers.{l}.{par[p]}.{p}.lora_A.weight"] = \
                (rng.uniform(-1, 1, (r_, i)) / np.sqrt(i)).astype(np.float32)
            t[f"base_model.model.model.layers.{l}.{par[p]}.{p}.lora_B.weight"] = \
                rng.normal(0, 0.02, (o, r_)).astype(np.float32)
    ad = tmp_path / "ad"
    ad.mkdir()
    save_file(t, str(ad / "adapter_model.safetensors"), metadata={"format": "pt"})
    (ad / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": r_, "lora_alpha": 16, "target_modules": list(dims),
        "bias": "none", "task_type": "CAUSAL_LM", "base_model_name_or_path": path}))
    layer_f32 = 4 * (2 * C + sum(o * i for o, i in dims.values()))
    emb_f32 = 4 * V * C
    bound = (layer_f32 + emb_f32) / 2**20 + RSS_OVERHEAD_MIB
    size = os.path.getsize(path) / 2**20
    figures = {}
    for fmt in ("safetensors", "gguf"):
        out = tmp_path / fmt
        r = merge(["--model", path, "--adapter", ad, "--out", out, "--format", fmt])
        rss = float(re.search(r"peak RSS ([0-9.]+) MiB", r.stderr).group(1))
        outsz = sum(p.stat().st_size for p in out.glob("model*")) / 2**20
        figures[fmt] = (rss, outsz)
        print(f"example merge -> {fmt}: peak RSS {rss:.1f} MiB; source GGUF {size:.1f} MiB, output "
              f"{outsz:.1f} MiB; bound one fp32 layer + fp32 embeddings + {RSS_OVERHEAD_MIB} = "
              f"{bound:.1f} MiB")
        assert rss < bound
    # a real layer, exactly: layer 7 q_proj (permuted, Q4_1) and down_proj, bf16 bits
    tens = {ti.name: ti for ti in rd.tensors}
    for g, hf, heads in (("attn_q", "q_proj", H), ("ffn_down", "down_proj", None)):
        ti = tens[f"blk.7.{g}.weight"]
        shape = tuple(int(x) for x in reversed(ti.shape))
        w = gguf.quants.dequantize(ti.data, ti.tensor_type).astype(np.float32).reshape(shape)
        if heads:
            w = R.gguf_unpermute(w, heads)
        p = "self_attn" if hf == "q_proj" else "mlp"
        A = t[f"base_model.model.model.layers.7.{p}.{hf}.lora_A.weight"]
        B = t[f"base_model.model.model.layers.7.{p}.{hf}.lora_B.weight"]
        want = bf16_bits(merged_ref(w, A, B, 16 / r_))
        sh, have = st_one(str(tmp_path / "safetensors" / "model.safetensors"), f"model.layers.7.{p}.{hf}.weight")
        assert sh == want.shape and np.array_equal(have, want), hf
    # ftune on the merged GGUF (F16) against the adapter applied at run time
    ids = [504, 3575, 282, 4649, 314, 7042, 30, 657, 314, 1343, 327, 260]
    ref = logits(path, ["--adapter", ad], ids=ids, tmp=tmp_path)
    err = np.abs(logits(tmp_path / "gguf" / "model.gguf", ids=ids, tmp=tmp_path) - ref).max() / np.abs(ref).max()
    print(f"example: merged F16 GGUF vs --adapter on the Q4_1 GGUF: {err:.3g} (bound {TOL_LOGITS_F16:g})")
    assert err <= TOL_LOGITS_F16


def test_llamacpp_loads_merged_gguf(adapter, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    out = tmp_path / "m.gguf"
    merge(["--model", TINY, "--adapter", adapter, "--out", out, "--format", "gguf", "--dtype", "f32"])
    m = llama_cpp.Llama(model_path=str(out), n_ctx=64, logits_all=True, verbose=False, n_threads=2,
                        type_k=0, type_v=0)
    # llama.cpp's tokenizer on our tokenizer.ggml.* metadata gives ftune's (tokenizer.json) ids
    text = "The quick brown fox jumps over the lazy dog near the river."
    r = run_ftune(["tokenize", "--model", TINY, "--text", text])
    assert r.returncode == 0, r.stderr
    assert m.tokenize(text.encode(), add_bos=True) == json.loads(r.stdout)["ids"]
    m.eval(TINY_IDS)
    cpp = np.array(m.scores[:len(TINY_IDS)], dtype=np.float64)
    m.close()
    ref = logits(TINY, ["--adapter", adapter], tmp=tmp_path)
    err = np.abs(cpp - ref).max() / np.abs(ref).max()
    print(f"llama.cpp on the merged F32 GGUF vs ftune --adapter: {err:.3g} (bound {TOL_LLAMACPP:g})")
    assert err <= TOL_LLAMACPP


def test_merge_gguf_byte_level_tokenizer(adapter, tmp_path):
    """A byte-level BPE tokenizer.json (Llama-3's) becomes tokenizer.ggml.model "gpt2" with
    pre "llama-bpe", its merges and token types; ftune (and llama.cpp, vocab only, when
    importable) tokenize from the GGUF exactly as from tokenizer.json."""
    src = model_copy(tmp_path, TINY, "l3")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(ROOT / "tests/fixtures/tokenizers/llama3" / f, src / f)
    out = tmp_path / "l3.gguf"
    merge(["--model", src, "--adapter", adapter, "--out", out, "--format", "gguf"])
    kv = gguf_kv_fast(out)  # gguf-py's reader needs ~15 s for 400k strings
    tj = json.loads((src / "tokenizer.json").read_text())
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "llama-bpe"
    n = max(max(tj["model"]["vocab"].values()), max(a["id"] for a in tj["added_tokens"])) + 1
    toks, merges, ttypes = (kv["tokenizer.ggml." + k] for k in ("tokens", "merges", "token_type"))
    assert len(toks) == n and len(ttypes) == n
    assert merges == [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    for t, i in tj["model"]["vocab"].items():
        assert toks[i] == t
    for a in tj["added_tokens"]:
        assert toks[a["id"]] == a["content"] and ttypes[a["id"]] == (3 if a["special"] else 4), a
    text = "Hello world 12345 I've  done it, don't!\n\n\u6211\u60f3\u5728apple\u5de5\u4f5c <|begin_of_text|>x"
    ids = []
    for m in (src, out):
        r = run_ftune(["tokenize", "--model", m, "--text", text])
        assert r.returncode == 0, r.stderr
        ids.append(json.loads(r.stdout)["ids"])
    assert ids[0] == ids[1]
    try:
        import llama_cpp
    except ImportError:
        return
    m = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    assert m.tokenize(text.encode(), add_bos=False, special=True) == ids[0]
