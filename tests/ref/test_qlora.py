"""QLoRA (`ftune train --quant nf4`) and the pack cache, end to end through the CLI.

  - the example model (SmolLM2-135M-Instruct, Q4_1 GGUF; skipped if scripts/fetch_example.sh
    cannot fetch it): a short run of the demo settings with --quant nf4 and the same run with
    --quant bf16; the plan line names the base each used, both runs learn, and the QLoRA
    run's final eval loss is compared with the LoRA run's (see TOL_QLORA_* below for what is
    asserted and why);
  - the pack cache through `ftune pack` and `ftune train --quant nf4` on the tiny-llama
    fixture: built once, reused by the next run, a changed quantization setting gets a pack
    of its own and a pack with other settings under the name is rebuilt, a corrupted byte
    and a truncated file are detected and the pack rebuilt with a message naming the cause.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import time

import numpy as np
import pytest

from cli_helpers import ROOT, SEED_DATA, TINY, run_ftune

DEMO = ["--seq-len", "256", "--batch-size", "2", "--grad-accum", "2", "--lr", "1e-3",
        "--eval-fraction", "0.1", "--seed", "42"]
STEPS = 4

# The issue's acceptance: QLoRA's final eval loss within 5% of the LoRA run's (same settings).
TOL_QLORA_REL_ISSUE = 0.05
# What this model allows: the example model is already 4-bit (Q4_1), and NF4 on top of it
# moves the untrained eval loss by +9.2% (2.2243 -> 2.4289; mean |dequant error| 9.5% of
# mean |W|, the usual NF4 error of ~0.075 std). LoRA training shrinks the gap only slowly:
# +9.6% after these 4 steps, +7.0% after the full 20-step demo (eval 2.0688 vs 2.2135),
# measured on the 2-core VM, 2026-11-23; over 3 epochs (60 steps) it reaches +4.9%
# (scripts/qlora_vs_lora.sh, bench/results/qlora.md). So a few steps cannot meet 5% on this
# model (the test prints whether it was met); asserted instead: the final gap is no larger than the
# initial quantization gap plus 1% (training through the NF4 base is not worse than the
# quantization itself), and below this bound.
TOL_QLORA_REL_SHORT = 0.10
TOL_GAP_GROWTH = 0.01
# The calibrated correction keeps at most this fraction of the untrained gap (measured:
# 4.2 / 9.2 = 0.46).
TOL_QCORR_GAP0_FRACTION = 0.6
# ftune's fp32 forward (CPU) over the NF4 base vs numpy's float64 on the same dequantized
# weights: fp32 rounding of GEMMs over <= 128 terms and of the softmax; relative to max |logit|.
TOL_NF4_LOGITS = 1e-5
# Both runs must learn: each lowers its eval loss by at least this fraction of its start.
MIN_REL_IMPROVEMENT = 0.01


def example_model():
    env = dict(os.environ)
    if "FTUNE_CACHE" not in env and os.path.isdir("/tmp/ftcache/examples"):
        env["FTUNE_CACHE"] = "/tmp/ftcache"
    p = subprocess.run(["bash", str(ROOT / "scripts" / "fetch_example.sh")], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=600)
    path = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if p.returncode != 0 or not os.path.isfile(path):
        pytest.skip(f"example model unavailable: {p.stderr.strip()[-300:]}")
    return path


def train(model, out, quant, cache, extra=()):
    t0 = time.time()
    r = run_ftune(["train", "--model", model, "--data", SEED_DATA, "--out", out, "--quant", quant,
                   "--cache-dir", cache, "--save-every", "0", *extra], timeout=600)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    plan = [l for l in r.stderr.splitlines() if l.startswith("ftune: plan: ")]
    assert len(plan) == 1, r.stderr
    return s, plan[0], r.stderr, time.time() - t0


def test_qlora_vs_lora_example_model(tmp_path):
    gguf = example_model()
    cache = tmp_path / "cache"
    args = DEMO + ["--max-steps", str(STEPS)]
    lo, lo_plan, _, lo_t = train(gguf, tmp_path / "lora", "bf16", cache, args)
    ql, ql_plan, ql_err, ql_t = train(gguf, tmp_path / "qlora", "nf4", cache, args)
    assert "base bf16" in lo_plan and "base nf4" in ql_plan, (lo_plan, ql_plan)
    assert lo["base_quant"] == "bf16" and ql["base_quant"] == "nf4"
    assert "pack: built" in ql_err and ql["pack"].startswith(str(cache))
    assert not list(cache.glob("*bf16*")), "--quant bf16 must not build a pack"
    gap0 = ql["initial_eval_loss"] / lo["initial_eval_loss"] - 1
    gap = ql["final_eval_loss"] / lo["final_eval_loss"] - 1
    print(f"example model, {STEPS} steps of the demo settings: LoRA (bf16 base) eval loss "
          f"{lo['initial_eval_loss']:.4f} -> {lo['final_eval_loss']:.4f} in {lo_t:.1f} s; "
          f"QLoRA (nf4 base) {ql['initial_eval_loss']:.4f} -> {ql['final_eval_loss']:.4f} in "
          f"{ql_t:.1f} s; gap {100 * gap0:+.2f}% before training, {100 * gap:+.2f}% after "
          f"(issue's bound {100 * TOL_QLORA_REL_ISSUE:.0f}%: "
          f"{'met' if gap <= TOL_QLORA_REL_ISSUE else 'NOT met on this 4-bit model'})")
    for s in (lo, ql):
        assert s["steps"] == STEPS and s["bad_steps"] == 0
        assert s["final_eval_loss"] < s["initial_eval_loss"] * (1 - MIN_REL_IMPROVEMENT), s
    assert gap0 > 0, "the NF4 base should cost something on a 4-bit model; same loss = not quantized?"
    assert gap <= gap0 + TOL_GAP_GROWTH, (gap0, gap)
    assert gap <= TOL_QLORA_REL_SHORT, (gap0, gap)

    # The same QLoRA run with the calibrated correction of the NF4 error (adapters/qcorr.h):
    # measured 2026-11-23 (2-core VM, 20-step demo): untrained gap +9.2% -> +4.2%, final
    # +3.7% (bench/results/qlora.md). Asserted: it at least ~halves the untrained gap, and the
    # gap after these steps is smaller than without it and within the issue's 5%.
    qc, qc_plan, qc_err, qc_t = train(gguf, tmp_path / "qcorr", "nf4", cache,
                                      args + ["--quant-correction", "calibrated"])
    assert "quant correction: calibrated, rank 16" in qc_err, qc_err
    assert (tmp_path / "qcorr" / "quant_correction" / "adapter_model.safetensors").is_file()
    assert qc["quant_correction"] == "calibrated" and qc["quant_correction_error_reduction"] > 0.5, qc
    cgap0 = qc["initial_eval_loss"] / lo["initial_eval_loss"] - 1
    cgap = qc["final_eval_loss"] / lo["final_eval_loss"] - 1
    print(f"with --quant-correction calibrated: {qc['initial_eval_loss']:.4f} -> "
          f"{qc['final_eval_loss']:.4f} in {qc_t:.1f} s; gap {100 * cgap0:+.2f}% before training, "
          f"{100 * cgap:+.2f}% after")
    assert cgap0 < TOL_QCORR_GAP0_FRACTION * gap0, (gap0, cgap0)
    assert cgap < gap and cgap <= TOL_QLORA_REL_ISSUE, (gap, cgap)


# ---------------------------------------------------------------------------------------
# the pack cache

def pack(cache, quant="nf4", model=TINY, extra=()):
    r = run_ftune(["pack", "--model", model, "--quant", quant, "--cache-dir", cache, *extra])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_pack_reuse_settings_corruption(tmp_path):
    cache = tmp_path / "cache"
    a, _ = pack(cache)
    assert a["action"] == "built"
    b, err = pack(cache)
    assert b["action"] == "reused" and b["path"] == a["path"] and "verified" in err
    # another quantization setting: a pack of its own, the first one untouched
    c, _ = pack(cache, "bf16")
    assert c["action"] == "built" and c["path"] != a["path"]
    assert pack(cache)[0]["action"] == "reused"
    # a file under the nf4 name made with other settings (the bf16 pack) is rebuilt
    nf4 = a["path"]
    with open(c["path"], "rb") as f, open(nf4, "wb") as g:
        g.write(f.read())
    d, err = pack(cache)
    assert d["action"] == "rebuilt" and "other quantization settings" in d["reason"], d
    assert "not usable, rebuilding it" in err
    # one flipped byte in layer 1's block: detected (checksum), rebuilt, the message says so
    size = os.path.getsize(nf4)
    raw = bytearray(open(nf4, "rb").read())
    good = bytes(raw)
    table = struct.unpack_from("<q", raw, 48)[0]              # ft_pack_hdr.block_table_off
    off1, bytes1 = struct.unpack_from("<QQ", raw, table + 32)  # ft_pack_block of layer 1
    raw[off1 + bytes1 // 3] ^= 0x10
    open(nf4, "wb").write(bytes(raw))
    e, err = pack(cache)
    print("corrupted byte:", err.strip().splitlines()[0])
    assert e["action"] == "rebuilt" and "checksum" in e["reason"], e
    assert re.search(r"rebuilding it: .*layer 1.*checksum", err)
    assert open(nf4, "rb").read() == good, "the rebuilt pack differs from the original build"
    # truncated: detected by the size check, rebuilt
    os.truncate(nf4, size - 4096)
    f, _ = pack(cache)
    assert f["action"] == "rebuilt" and "truncated" in f["reason"], f
    assert os.path.getsize(nf4) == size


def test_train_nf4_pack_cache(tmp_path):
    """ftune train --quant nf4 on tiny-llama: builds the pack, the next run reuses it, a
    corrupted pack is rebuilt with a warning; results do not depend on where it came from."""
    cache = tmp_path / "cache"
    args = ["--max-steps", "2", "--seq-len", "64", "--batch-size", "2", "--eval-fraction", "0.1",
            "--lora-r", "4", "--threads", "1"]
    s1, plan, err1, _ = train(str(TINY), tmp_path / "a", "nf4", cache, args)
    assert "base nf4" in plan and "pack: built" in err1
    s2, _, err2, _ = train(str(TINY), tmp_path / "b", "nf4", cache, args)
    assert "pack: reusing" in err2 and "pack: built" not in err2
    path = s1["pack"]
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) - 5000] ^= 1
    open(path, "wb").write(bytes(raw))
    s3, _, err3, _ = train(str(TINY), tmp_path / "c", "nf4", cache, args)
    warn = [l for l in err3.splitlines() if l.startswith("ftune: warning: the cached pack")]
    print(warn)
    assert warn and "checksum" in warn[0] and "rebuilt" in warn[0]
    for k in ("initial_eval_loss", "final_eval_loss", "final_train_loss"):
        assert s1[k] == s2[k] == s3[k], k
    # the bf16 run of the same settings differs (the base is not quantized there)
    s4, plan4, _, _ = train(str(TINY), tmp_path / "d", "bf16", cache, args)
    assert "base bf16" in plan4 and s4["initial_eval_loss"] != s1["initial_eval_loss"]


def test_eval_nf4_matches_training(tmp_path):
    """`ftune eval --quant nf4` scores an adapter on the NF4 base as QLoRA training does: the
    training run's final eval loss (the same held-out file, the same packing) to the 6
    printed decimals, where the bf16 base gives another; the pack is reused from --cache-dir."""
    cache, out = tmp_path / "cache", tmp_path / "q"
    r = run_ftune(["train", "--model", TINY, "--data", SEED_DATA, "--eval-data", SEED_DATA,
                   "--quant", "nf4", "--cache-dir", cache, "--max-steps", "2", "--seq-len", "128",
                   "--threads", "1", "--save-every", "0", "--out", out, "--quiet"])
    assert r.returncode == 0, r.stderr
    final = json.loads((out / "summary.json").read_text())["final_eval_loss"]
    got = {}
    for q in ("nf4", "bf16"):
        r = run_ftune(["eval", "--model", TINY, "--adapter", out, "--data", SEED_DATA,
                       "--seq-len", "128", "--threads", "1", "--quant", q, "--cache-dir", cache])
        assert r.returncode == 0, r.stderr
        assert "pack: built" not in r.stderr
        got[q] = json.loads(r.stdout)["loss"]
    print(f"final eval {final!r}; ftune eval --quant nf4 {got['nf4']}, bf16 {got['bf16']}")
    assert abs(got["nf4"] - final) <= 1e-6  # printed with 6 decimals
    assert abs(got["bf16"] - final) > 1e-5
    r = run_ftune(["eval", "--model", TINY, "--data", SEED_DATA, "--quant", "int8"])
    assert r.returncode == 2 and "bf16, nf4" in r.stderr


def test_eval_nf4_with_correction(tmp_path):
    """An adapter trained with --quant-correction: `ftune eval --quant nf4` adds the run's
    frozen correction back to the NF4 base (OUT/quant_correction, also for OUT/checkpoint-N)
    and gives the training run's final eval loss; DPO scoring of such an adapter is refused."""
    cache, out = tmp_path / "cache", tmp_path / "qc"
    r = run_ftune(["train", "--model", TINY, "--data", SEED_DATA, "--eval-data", SEED_DATA,
                   "--quant", "nf4", "--quant-correction", "calibrated", "--cache-dir", cache,
                   "--max-steps", "2", "--seq-len", "128", "--threads", "1", "--save-every", "1",
                   "--keep", "0", "--out", out, "--quiet"])
    assert r.returncode == 0, r.stderr
    final = json.loads((out / "summary.json").read_text())["final_eval_loss"]
    for a in (out, out / "checkpoint-2"):
        r = run_ftune(["eval", "--model", TINY, "--adapter", a, "--data", SEED_DATA,
                       "--seq-len", "128", "--threads", "1", "--quant", "nf4", "--cache-dir", cache])
        assert r.returncode == 0, r.stderr
        assert "quantization correction" in r.stderr
        got = json.loads(r.stdout)["loss"]
        print(f"{a.name}: ftune eval --quant nf4 {got}, training's final eval {final!r}")
        assert abs(got - final) <= 1e-6
    pref = ROOT / "examples" / "data" / "alpaca-seed-tasks" / "alpaca_seed_pref.jsonl"
    r = run_ftune(["eval", "--method", "dpo", "--model", TINY, "--adapter", out, "--data", pref,
                   "--seq-len", "128", "--threads", "1", "--quant", "nf4", "--cache-dir", cache])
    assert r.returncode == 1 and "not supported yet" in r.stderr, r.stderr


def nf4_base_weights(pack_path, w):
    """The weights a pack serves, as float64 arrays by HF name: its NF4 projections dequantized
    as bitsandbytes does (nf4_ref), every other tensor of w as it is (the tiny model is bf16,
    so the pack's norms and bf16 embeddings are exact)."""
    import nf4_ref as N
    out = {k: np.asarray(v, np.float64) for k, v in w.items()}
    _, blocks = N.read_pack(pack_path)
    for b in blocks:
        if b["layer"] < 0:
            continue
        for p, proj in enumerate(N.PROJ_ORDER):
            t = b["tensors"][N.PACK_ROLE_W0 + p]
            key = f"model.layers.{b['layer']}.{'self_attn' if p < 4 else 'mlp'}.{proj}.weight"
            am = N.absmax_from_nested(t["qabsmax"], t["nested_absmax"], t["nested_map"],
                                      t["offset"], t["nested_blocksize"])
            dq = N.dequantize_nf4(t["codes"], am, t["n"], t["blocksize"])
            out[key] = dq.reshape(out[key].shape).astype(np.float64)
    return out


def test_generate_and_logits_nf4_with_correction(tmp_path):
    """`ftune generate --quant nf4` and `ftune logits --quant nf4` of a QLoRA adapter trained
    with --quant-correction run on the base it was trained on: the NF4 pack (reused from
    --cache-dir), the run's frozen correction and the adapter. Checked against numpy (float64)
    on the pack's dequantized weights + the correction + the adapter: the logits within
    TOL_NF4_LOGITS of max |logit| (and farther without the correction), and generate's greedy
    tokens are the reference's argmax over its own prefix at every step."""
    import llama_ref as L
    cache, out = tmp_path / "cache", tmp_path / "qc"
    r = run_ftune(["train", "--model", TINY, "--data", SEED_DATA, "--quant", "nf4",
                   "--quant-correction", "calibrated", "--cache-dir", cache, "--max-steps", "3",
                   "--lr", "3e-3", "--seq-len", "128", "--threads", "1", "--save-every", "0",
                   "--out", out, "--quiet"])
    assert r.returncode == 0, r.stderr
    info, _ = pack(cache)
    assert info["action"] == "reused"
    cfg, w = L.load_model(str(TINY))
    base = nf4_base_weights(info["path"], w)
    with_corr = L.apply_peft_adapter(cfg, L.apply_peft_adapter(cfg, base, str(out / "quant_correction")), str(out))
    without = L.apply_peft_adapter(cfg, base, str(out))

    ids = [1, 415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898, 28705]
    f = tmp_path / "logits.bin"
    r = run_ftune(["logits", "--model", TINY, "--adapter", out, "--ids", ",".join(map(str, ids)),
                   "--out", f, "--threads", "1", "--quant", "nf4", "--cache-dir", cache])
    assert r.returncode == 0, r.stderr
    assert "pack: built" not in r.stderr and "quantization correction" in r.stderr, r.stderr
    got = np.fromfile(f, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)
    ref, ref_nc = L.forward(cfg, with_corr, ids), L.forward(cfg, without, ids)
    scale = float(np.abs(ref).max())
    d, d_nc = float(np.abs(got - ref).max()), float(np.abs(got - ref_nc).max())
    print(f"ftune logits --quant nf4 vs numpy: max diff {d:.3e} ({d / scale:.1e} of max |logit|); "
          f"vs numpy without the correction {d_nc:.3e}")
    assert d <= TOL_NF4_LOGITS * scale
    assert d_nc > 100 * TOL_NF4_LOGITS * scale

    n_new = 12
    r = run_ftune(["generate", "--model", TINY, "--adapter", out, "--raw", "--prompt",
                   "Once upon a time, in a quiet village by the sea,", "--max-new-tokens", n_new,
                   "--json", "--threads", "1", "--quant", "nf4", "--cache-dir", cache])
    assert r.returncode == 0, r.stderr
    assert "pack: built" not in r.stderr and "quantization correction" in r.stderr, r.stderr
    g = json.loads(r.stdout)
    prompt, new = g["prompt_ids"], g["ids"]
    assert 0 < len(new) <= n_new
    z = L.forward(cfg, with_corr, prompt + new)[len(prompt) - 1:len(prompt) - 1 + len(new)]
    ref_ids = [int(np.argmax(row)) for row in z]
    top2 = np.sort(np.partition(z, -2, axis=1)[:, -2:], axis=1)
    print(f"generate --quant nf4: {len(new)} tokens {new}; numpy argmax {ref_ids}; smallest "
          f"top-2 margin {float((top2[:, 1] - top2[:, 0]).min()):.3e}")
    assert new == ref_ids
    # the flags are checked
    r = run_ftune(["generate", "--model", TINY, "--prompt", "x", "--quant", "int8"])
    assert r.returncode == 2 and "bf16, nf4" in r.stderr
    # --cache-dir without --quant nf4 is taken (a bf16 base that does not fit a GPU is streamed
    # from its bf16 pack there); on the CPU the bf16 base is read as it is, no pack is built
    r = run_ftune(["logits", "--model", TINY, "--ids", "1,2", "--cache-dir", tmp_path / "c2",
                   "--threads", "1"])
    assert r.returncode == 0 and not (tmp_path / "c2").exists(), r.stderr


def test_quant_flag_errors(tmp_path):
    r = run_ftune(["train", "--model", TINY, "--data", SEED_DATA, "--quant", "int8"])
    assert r.returncode == 2 and "nf4, bf16, auto" in r.stderr
    r = run_ftune(["train", "--help"])
    assert r.returncode == 0 and "--quant TYPE" in r.stdout + r.stderr and "--cache-dir" in r.stdout + r.stderr


def resume_matches(base, tmp_path):
    """Runs `base` (3 steps, a checkpoint each) into tmp/part, removes what came after
    checkpoint 1 as if killed there, resumes, and checks the final adapter against the
    uninterrupted run's in tmp/full byte for byte. Returns the resumed run's result."""
    part = tmp_path / "part"
    r = run_ftune(base + ["--out", part])
    assert r.returncode == 0, r.stderr
    for k in (2, 3):
        shutil.rmtree(part / f"checkpoint-{k}")
    (part / "adapter_model.safetensors").unlink()
    r = run_ftune(base + ["--out", part, "--resume", part / "checkpoint-1"])
    assert r.returncode == 0, r.stderr
    a = (tmp_path / "full" / "adapter_model.safetensors").read_bytes()
    assert (part / "adapter_model.safetensors").read_bytes() == a
    return r


def test_nf4_resume(tmp_path):
    """The base's quantization is part of the run config: resuming an nf4 run gives the
    uninterrupted run's adapter byte for byte; resuming it with --quant bf16 is refused."""
    cache = tmp_path / "cache"
    base = ["train", "--model", TINY, "--data", SEED_DATA, "--max-steps", "3", "--seq-len", "64",
            "--threads", "1", "--save-every", "1", "--keep", "0", "--cache-dir", cache, "--quiet",
            "--quant", "nf4"]
    r = run_ftune(base + ["--out", tmp_path / "full"])
    assert r.returncode == 0, r.stderr
    r = run_ftune(base[:-1] + ["bf16", "--out", tmp_path / "full", "--resume",
                               tmp_path / "full" / "checkpoint-1"])
    assert r.returncode == 1 and 'base_quant: "nf4" -> (absent)' in r.stderr, r.stderr
    resume_matches(base, tmp_path)


# `ftune plan` must stay quick: on the tiny model it takes ~0.1 s (2-core VM); the bound only
# catches a plan that does a run's work (the absent OUT/quant_correction is the real check).
MAX_PLAN_SECONDS = 30


def test_quant_correction_plan_only(tmp_path):
    """`ftune plan` of a fresh --quant-correction run on an NF4 base neither reads the weights
    nor computes or writes the correction (no OUT/quant_correction): it says the correction
    is computed at the start of the real run, and the plan counts its memory (a zero
    correction is installed on the adapter, src/train/trainer.c setup_correction)."""
    cache, out = tmp_path / "cache", tmp_path / "plan"
    pack(cache)  # built beforehand: the time below is the plan's
    t0 = time.time()
    r = run_ftune(["plan", "--model", TINY, "--data", SEED_DATA, "--quant", "nf4",
                   "--quant-correction", "calibrated", "--cache-dir", cache, "--seq-len", "64",
                   "--threads", "1", "--out", out])
    dt = time.time() - t0
    print(f"ftune plan with --quant-correction calibrated: {dt:.2f} s\n{r.stderr}")
    assert r.returncode == 0, r.stderr
    assert "quant correction: calibrated, computed at the start of the real run" in r.stderr, r.stderr
    assert "calibration tokens" not in r.stderr and "ftune: plan: " in r.stderr, r.stderr
    assert not (out / "quant_correction").exists()
    assert dt < MAX_PLAN_SECONDS


def test_quant_correction_resume_and_errors(tmp_path):
    """--quant-correction on the tiny model: the correction is written to OUT/quant_correction,
    a resumed run reads it back and ends with the uninterrupted run's adapter byte for byte;
    without the folder the resume is refused naming it; a bf16 base has nothing to correct;
    --init-adapter with a fresh correction is refused."""
    cache = tmp_path / "cache"
    base = ["train", "--model", TINY, "--data", SEED_DATA, "--max-steps", "3", "--seq-len", "64",
            "--threads", "1", "--save-every", "1", "--keep", "0", "--cache-dir", cache,
            "--quant", "nf4", "--quant-correction", "calibrated", "--quant-correction-tokens", "128"]
    r = run_ftune(base + ["--out", tmp_path / "full"])
    assert r.returncode == 0, r.stderr
    assert "quant correction: calibrated" in r.stderr and "calibration tokens" in r.stderr, r.stderr
    qdir = tmp_path / "full" / "quant_correction"
    cfg = json.loads((qdir / "adapter_config.json").read_text())
    assert cfg["r"] == 16 and (qdir / "adapter_model.safetensors").stat().st_size > 0
    part = tmp_path / "part"
    r = resume_matches(base, tmp_path)
    assert "read from" in r.stderr, r.stderr
    # the run config records the correction: resuming without it is refused
    r = run_ftune(base[:-4] + ["--out", part, "--resume", part / "checkpoint-1"])
    assert r.returncode == 1 and "quant_correction" in r.stderr, r.stderr
    shutil.rmtree(part / "quant_correction")
    r = run_ftune(base + ["--out", part, "--resume", part / "checkpoint-1"])
    assert r.returncode == 1 and "quant_correction" in r.stderr, r.stderr
    r = run_ftune(["train", "--model", TINY, "--data", SEED_DATA, "--max-steps", "1", "--seq-len", "64",
                   "--quant", "bf16", "--quant-correction", "weight", "--out", tmp_path / "bf16"])
    assert r.returncode == 0 and "quant correction: none (the base is not quantized)" in r.stderr, r.stderr
    r = run_ftune(base + ["--out", tmp_path / "init", "--init-adapter", tmp_path / "full"])
    assert r.returncode == 1 and "--init-adapter" in r.stderr, r.stderr
    r = run_ftune(base + ["--out", tmp_path / "x", "--quant-correction", "loftq"])
    assert r.returncode == 2 and "none, calibrated, weight" in r.stderr, r.stderr
