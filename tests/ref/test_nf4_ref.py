"""NF4 / double quantization and the pack file, checked against the independent numpy
reference tests/ref/nf4_ref.py (written from formats.md 5 and the bitsandbytes sources).

  - `ftune pack --quant nf4` of tests/fixtures/tiny-llama and of the example model
    (SmolLM2-135M GGUF, skipped if it cannot be fetched): every linear weight's NF4 codes,
    absmax codes, nested absmax, nested map and offset bit-identical to the reference
    quantizing the same fp32 weights (llama_ref reads them: safetensors, or gguf-py's
    dequantization with the q/k permutation undone); norms and embeddings exact; the mean
    absolute dequantization error printed;
  - pre-quantized bitsandbytes 4-bit checkpoints: no real `*-bnb-4bit` model can be
    downloaded here, so the reference writes one from tiny-llama in the exact layout
    transformers + bitsandbytes save (formats.md 5.5: U8 weight [(n+1)/2, 1], .absmax,
    .quant_map, .nested_absmax, .nested_quant_map, .quant_state.bitsandbytes__nf4 JSON,
    config.json quantization_config), nested and not nested; `ftune pack --quant nf4` must
    carry its bytes over unchanged and `--quant bf16` must hold its bnb dequantization
    rounded to bf16;
  - optionally (FTUNE_BNB_LIB=path/to/libbitsandbytes_cpu.so from a bitsandbytes wheel):
    the dequantization in the pack against bitsandbytes' own CPU kernels through ctypes.
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import llama_ref as L
import nf4_ref as R
from cli_helpers import ROOT, TINY, run_ftune

F32 = np.float32


def pack(tmp, model, quant="nf4", extra=()):
    r = run_ftune(["pack", "--model", model, "--quant", quant, "--cache-dir", tmp / "cache",
                   "--quiet", *extra])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def hf_linear_name(l, p):
    return f"model.layers.{l}.{'self_attn' if p < 4 else 'mlp'}.{R.PROJ_ORDER[p]}.weight"


def compare_nf4_pack(pack_path, weights):
    """Counts bit-identical linear weights; returns (n_ok, n, mean abs dequant error, worst)."""
    h, blocks = R.read_pack(pack_path)
    code8 = R.dynamic_map()
    n_ok = n = 0
    err_sum, count, worst = 0.0, 0, []
    for b in blocks:
        if b["layer"] < 0:
            continue
        for p in range(7):
            t = b["tensors"][R.PACK_ROLE_W0 + p]
            W = weights[hf_linear_name(b["layer"], p)]
            q = R.quantize_nf4(W)
            same = {
                "codes": np.array_equal(t["codes"], q["codes"]),
                "qabsmax": np.array_equal(t["qabsmax"], q["qabsmax"]),
                "nested_absmax": np.array_equal(t["nested_absmax"].view(np.uint32),
                                                q["nested_absmax"].view(np.uint32)),
                "offset": F32(t["offset"]).view(np.uint32) == F32(q["offset"]).view(np.uint32),
                "nested_map": np.array_equal(t["nested_map"].view(np.uint32), code8.view(np.uint32)),
                "code": np.array_equal(t["code"], R.NF4_CODE),
            }
            n += 1
            n_ok += all(same.values())
            if not all(same.values()):
                worst.append((b["layer"], R.PROJ_ORDER[p], [k for k, v in same.items() if not v]))
            am = R.absmax_from_nested(t["qabsmax"], t["nested_absmax"], t["nested_map"], t["offset"])
            dq = R.dequantize_nf4(t["codes"], am, t["n"])
            err_sum += float(np.abs(dq.astype(np.float64) - W.reshape(-1)).sum())
            count += W.size
    return n_ok, n, err_sum / count, worst


def test_tiny_llama_nf4_bit_identical(tmp_path):
    info = pack(tmp_path, TINY)
    assert info["action"] == "built"
    cfg, w = L.load_model(str(TINY))
    n_ok, n, mae, bad = compare_nf4_pack(info["path"], w)
    std = np.mean([w[hf_linear_name(l, p)].std() for l in range(cfg["num_hidden_layers"]) for p in range(7)])
    print(f"tiny-llama: {n_ok}/{n} linear weights bit-identical (codes, absmax codes, nested "
          f"absmax, offset); mean |dequant error| {mae:.4e} = {mae / std:.4f} std")
    assert n_ok == n, bad
    # norms (F32) and embeddings (BF16) are exact for a bf16 model
    h, blocks = R.read_pack(info["path"])
    for b in blocks:
        if b["layer"] < 0:
            assert np.array_equal(b["tensors"][R.PACK_ROLE_EMBED]["data"], w["model.embed_tokens.weight"])
            assert np.array_equal(b["tensors"][R.PACK_ROLE_FINAL_NORM]["data"].reshape(-1), w["model.norm.weight"])
        else:
            l = b["layer"]
            assert np.array_equal(b["tensors"][R.PACK_ROLE_ATTN_NORM]["data"].reshape(-1),
                                  w[f"model.layers.{l}.input_layernorm.weight"])
    assert h["config"]["hidden_size"] == cfg["hidden_size"]
    # the second run reuses it
    assert pack(tmp_path, TINY)["action"] == "reused"


def test_example_model_nf4_bit_identical(tmp_path):
    env = dict(os.environ)
    env.setdefault("FTUNE_CACHE", "/tmp/ftcache")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "fetch_example.sh")], capture_output=True,
                       text=True, env=env, timeout=600)
    if r.returncode != 0:
        pytest.skip("example model unavailable: " + r.stderr.strip()[-200:])
    gguf = r.stdout.strip().splitlines()[-1]
    info = pack(tmp_path, gguf)
    cfg, w = L.load_model(gguf)
    n_ok, n, mae, bad = compare_nf4_pack(info["path"], w)
    mean_abs = np.mean([np.abs(w[hf_linear_name(l, p)]).mean()
                        for l in range(cfg["num_hidden_layers"]) for p in range(7)])
    print(f"example model ({cfg['num_hidden_layers']} layers): {n_ok}/{n} linear weights "
          f"bit-identical; mean |dequant error| {mae:.4e} (mean |W| {mean_abs:.4e}); pack "
          f"{info['bytes'] / 1e6:.1f} MB in {info['seconds']:.1f} s")
    assert n_ok == n, bad


def test_thresholds_and_map():
    # the four thresholds that are exact code midpoints round away from np.float32(float(s))
    naive = np.array([F32(float(s)) for s in R.NF4_THRESHOLD_LITERALS], dtype=F32)
    diff = np.nonzero(naive != R.NF4_THRESHOLDS)[0].tolist()
    assert diff == [0, 8, 12, 14]
    mids = (R.NF4_CODE[:-1].astype(np.float64) + R.NF4_CODE[1:]) / 2
    assert np.all(np.abs(R.NF4_THRESHOLDS - mids) <= np.spacing(np.abs(mids).astype(F32)))
    m = R.dynamic_map()
    assert m.size == 256 and np.all(np.diff(m) > 0) and m[127] == 0 and m[255] == 1
    # bnb's map as dumped from an install (mistral.rs INT8_CODE): spot values whose last bit
    # depends on torch's fused linspace
    assert m[18] == F32(-0.7398437261581421) and m[20] == F32(-0.7117187976837158)
    assert m[0] == F32(-0.992968738079071) and m[65] == F32(-0.09578125923871994)


# ---------------------------------------------------------------------------------------
# pre-quantized bitsandbytes checkpoints

QUANT_CONFIG = {"_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "bfloat16",
                "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": True, "llm_int8_enable_fp32_cpu_offload": False,
                "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None,
                "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False,
                "quant_method": "bitsandbytes"}


def f32_to_bf16_bits(a):
    u = np.ascontiguousarray(a, dtype=F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_bnb_checkpoint(dst, nested=True):
    """tiny-llama re-saved as transformers + bitsandbytes save a 4-bit model."""
    cfg, w = L.load_model(str(TINY))
    os.makedirs(dst)
    tensors, qstates = {}, {}
    for name, a in w.items():
        parts = name.split(".")
        if len(parts) > 4 and parts[-2] in R.PROJ_ORDER and parts[-1] == "weight":
            q = R.quantize_nf4(a, nested_blocksize=256 if nested else 0)
            qstates[name] = q
            if nested:
                tensors.update(R.bnb_tensors(name[:-len("weight")], a.shape, q))
            else:
                meta = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": list(a.shape)}
                blob = json.dumps(meta).encode()
                tensors[name] = ("U8", [q["codes"].size, 1], q["codes"].tobytes())
                tensors[name + ".absmax"] = ("F32", [q["absmax"].size], q["absmax"].tobytes())
                tensors[name + ".quant_map"] = ("F32", [16], R.NF4_CODE.tobytes())
                tensors[name + ".quant_state.bitsandbytes__nf4"] = ("U8", [len(blob)], blob)
        else:
            tensors[name] = ("BF16", list(a.shape), f32_to_bf16_bits(a).tobytes())
    R.write_safetensors(os.path.join(dst, "model.safetensors"), tensors, {"format": "pt"})
    with open(TINY / "config.json") as f:
        c = json.load(f)
    c["quantization_config"] = dict(QUANT_CONFIG, bnb_4bit_use_double_quant=nested)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.realpath(TINY / fn), os.path.join(dst, fn))
    return cfg, w, qstates


@pytest.mark.parametrize("nested", [True, False])
def test_bnb_checkpoint_packs_verbatim(tmp_path, nested):
    src = tmp_path / "tiny-bnb-4bit"
    cfg, w, qs = write_bnb_checkpoint(str(src), nested)
    info = pack(tmp_path, src, "nf4")
    h, blocks = R.read_pack(info["path"])
    n = n_ok = 0
    for b in blocks:
        if b["layer"] < 0:
            continue
        for p in range(7):
            t = b["tensors"][R.PACK_ROLE_W0 + p]
            q = qs[hf_linear_name(b["layer"], p)]
            n += 1
            ok = np.array_equal(t["codes"], q["codes"]) and t["nested_blocksize"] == (256 if nested else 0)
            if nested:
                ok = ok and np.array_equal(t["qabsmax"], q["qabsmax"]) and \
                    np.array_equal(t["nested_absmax"], q["nested_absmax"]) and \
                    F32(t["offset"]) == q["offset"] and np.array_equal(t["nested_map"], q["nested_map"])
            else:
                ok = ok and np.array_equal(t["absmax"], q["absmax"])
            n_ok += ok
    print(f"bnb checkpoint ({'nested' if nested else 'fp32 absmax'}): {n_ok}/{n} weights packed "
          f"byte for byte")
    assert n_ok == n

    # --quant bf16: the bitsandbytes dequantization, rounded to bf16
    info = pack(tmp_path, src, "bf16")
    h, blocks = R.read_pack(info["path"])
    worst = 0
    for b in blocks:
        if b["layer"] < 0:
            continue
        for p in range(7):
            q = qs[hf_linear_name(b["layer"], p)]
            am = (R.absmax_from_nested(q["qabsmax"], q["nested_absmax"], q["nested_map"], q["offset"])
                  if nested else q["absmax"])
            want = R.dequantize_nf4(q["codes"], am, q["n"])
            want = (f32_to_bf16_bits(want).astype(np.uint32) << 16).view(F32)
            got = b["tensors"][R.PACK_ROLE_W0 + p]["data"].reshape(-1)
            worst = max(worst, int(np.sum(got.view(np.uint32) != want.view(np.uint32))))
    assert worst == 0


def test_bnb_checkpoint_errors(tmp_path):
    src = tmp_path / "bad-bnb"
    write_bnb_checkpoint(str(src), True)
    # make one quant state claim fp4: the pack refuses it, naming the tensor
    path = src / "model.safetensors"
    raw = bytearray(path.read_bytes())
    i = raw.find(b'"quant_type": "nf4"')
    assert i > 0
    raw[i:i + 19] = b'"quant_type": "fp4"'
    path.write_bytes(bytes(raw))
    r = run_ftune(["pack", "--model", src, "--cache-dir", tmp_path / "cache"])
    assert r.returncode == 1
    assert "fp4" in r.stderr and "proj.weight" in r.stderr
    assert not any((tmp_path / "cache").glob("*.ftpack"))


def test_against_bitsandbytes_cpu_library(tmp_path):
    """bitsandbytes' own CPU dequantization kernels (libbitsandbytes_cpu.so, called through
    ctypes; no torch needed) applied to the bytes in ftune's pack."""
    lib_path = os.environ.get("FTUNE_BNB_LIB")
    if not lib_path or not os.path.exists(lib_path):
        pytest.skip("set FTUNE_BNB_LIB to libbitsandbytes_cpu.so (from a bitsandbytes wheel)")
    import ctypes as ct
    lib = ct.CDLL(lib_path)

    def P(a):
        return a.ctypes.data_as(ct.c_void_p)
    info = pack(tmp_path, TINY)
    h, blocks = R.read_pack(info["path"])
    cfg, w = L.load_model(str(TINY))
    n = same = lut_diff = total = 0
    for b in blocks:
        if b["layer"] < 0:
            continue
        for p in range(7):
            t = b["tensors"][R.PACK_ROLE_W0 + p]
            rows, cols = t["rows"], t["cols"]
            qa, na, code8 = t["qabsmax"].copy(), t["nested_absmax"].copy(), t["nested_map"].copy()
            am = np.zeros(qa.size, F32)
            lib.cdequantize_blockwise_cpu_fp32(P(code8), P(qa), P(na), P(am), ct.c_longlong(256),
                                               ct.c_longlong(qa.size))
            am = (am + F32(t["offset"])).astype(F32)         # dequantize_blockwise, += offset
            out = np.zeros(rows * cols, F32)
            codes = t["codes"].copy()
            lib.cdequantize_blockwise_cpu_nf4_fp32(P(codes), P(am), P(out), ct.c_longlong(64),
                                                   ct.c_longlong(rows), ct.c_longlong(cols))
            ref_am = R.absmax_from_nested(t["qabsmax"], t["nested_absmax"], t["nested_map"], t["offset"])
            ref = R.dequantize_nf4(t["codes"], ref_am, t["n"])
            n += 1
            same += np.array_equal(out.view(np.uint32), ref.view(np.uint32))
            # bnb's CPU 8-bit quantizer (a 65536-bin lookup table) on the same absmax values
            q = R.quantize_nf4(w[hf_linear_name(b["layer"], p)])
            centered = (q["absmax"] - q["offset"]).astype(F32)
            lut = np.zeros(centered.size, np.uint8)
            amx = np.zeros(-(-centered.size // 256), F32)
            lib.cquantize_blockwise_cpu_fp32(P(code8), P(centered), P(amx), P(lut), ct.c_longlong(256),
                                             ct.c_longlong(centered.size))
            lut_diff += int(np.sum(lut != t["qabsmax"]))
            total += centered.size
    print(f"bitsandbytes CPU dequantization: {same}/{n} weights bit-identical; its LUT 8-bit "
          f"quantizer differs from the CUDA-exact nested codes on {lut_diff}/{total} absmax values")
    assert same == n


def test_pack_bad_source(tmp_path):
    """A safetensors tensor that does not match config.json: one error line naming the file,
    the tensor and both shapes; nothing left in the cache."""
    src = tmp_path / "model"
    shutil.copytree(TINY, src, symlinks=False)
    c = json.loads((src / "config.json").read_text())
    c["intermediate_size"] = 96
    (src / "config.json").write_text(json.dumps(c))
    r = run_ftune(["pack", "--model", src, "--cache-dir", tmp_path / "cache"])
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert "model.safetensors" in line and "gate_proj.weight" in line and "[96, 64]" in line, line
    assert not list((tmp_path / "cache").glob("*"))
