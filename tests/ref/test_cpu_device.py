"""The trainer's GPU paths end to end without a GPU: `--device cpu-device` is the CPU backend in
device mode (kernels/kernels.h ft_backend_cpu_device_init: backend memory that is not host
memory, bf16 products, NF4 dequantized to bf16, copy lanes, a device-memory count that
--gpu-mem budgets see), so the device memory budget, the offload planner and placement, the
streamed tiers and generation through the executor run as they do on CUDA, only slowly.

  - a bf16 base that does not fit --gpu-mem is streamed from its bf16 pack by the offload
    executor (pinned host tier), and trains the bit-identical adapter of the run that holds
    every layer in device memory; `ftune eval` and `generate` of it within the same budget
    stream it from the same pack, with the resident run's loss and tokens;
  - QLoRA of the tied-embedding tiny model (its table read from the pack into device memory),
    `ftune eval --quant nf4` of the adapter against training's final eval, and `ftune generate`
    (--quant nf4 and bf16) whose greedy tokens are the argmax of `ftune logits` over the same
    prefixes on the same device path;
  - a folder holding only a bf16 pack trains its safetensors twin's adapter bit for bit, on the
    CPU and on cpu-device;
  - `ftune eval` and `generate` of an NF4 base within a --gpu-mem that streams part of it give
    the loss and tokens of the all-resident run.
"""
import json
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

from cli_helpers import SEED_DATA, TINY, run_ftune
from gen_helpers import plan_floor_gib, streamed_budget, streamed_nf4_model

# FTUNE_TEST_DEVICE=cuda runs the same checks on a GPU (bench/gpu_session.sh, `python3
# tests/ref/test_cpu_device.py` there: the GPU machine has no pytest)
DEV = ["--device", os.environ.get("FTUNE_TEST_DEVICE", "cpu-device"), "--threads", "2"]
# A Llama-shaped model whose layers outweigh the rest (24 layers of hidden 256, MLP 2048;
# embeddings 32000 x 256 from the tiny model's tokenizer): with every layer resident it needs
# ~0.08 GiB more than with its layers streamed through two device slots.
MID = {"hidden_size": 256, "intermediate_size": 2048, "num_hidden_layers": 24,
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
TRAIN = ["--data", SEED_DATA, "--max-steps", "2", "--seq-len", "64", "--eval-max", "1",
         "--lora-r", "2", "--save-every", "0"]
# cached decode vs a full forward on a device backend: activations are rounded to bf16 before
# each GEMM, so the two may round one to neighbouring values (test_generate.c's bound)
TOL_BF16_REL = 2 ** -8


def mid_model(tmp_path):
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update(MID)
    (tmp_path / "mid.json").write_text(json.dumps(cfg))
    out = tmp_path / "mid"
    r = run_ftune(["init-model", "--config", tmp_path / "mid.json", "--out", out, "--tokenizer",
                   TINY, "--seed", "3"])
    assert r.returncode == 0, r.stderr
    return out


def test_bf16_streamed_equals_resident(tmp_path):
    model, cache = mid_model(tmp_path), tmp_path / "cache"
    # the budget the resident run needs (the trainer's line: beyond what is in use on the
    # device, 0 on cpu-device, the CUDA context's ~0.7 GiB on a GPU) and the streamed plan's
    # smallest (its fixed part and two layer slots), from one run at 1 MiB, which fits neither
    # way and is refused after saying both; the streamed run takes the middle of the two
    r = run_ftune(["train", "--model", model, "--out", tmp_path / "none", "--quant", "bf16",
                   "--gpu-mem", "1M", "--cache-dir", cache, *TRAIN, *DEV])
    m = re.search(r"the bf16 base run needs ([0-9.]+) GiB of GPU memory with every layer "
                  r"resident, --gpu-mem allows [0-9.-]+ GiB \(([0-9.]+) GiB in use\)", r.stderr)
    assert r.returncode == 1 and m and "does not fit" in r.stderr, r.stderr
    need, used = float(m.group(1)), float(m.group(2))
    lo, hi = plan_floor_gib(r), need + used
    print(f"streamed plan from {lo:.3f} GiB, resident from {hi:.3f} GiB ({used} in use)")
    assert lo < hi, (lo, hi)
    runs = {}
    for name, budget in (("resident", f"{int((hi + 1) * 1024)}M"),
                         ("streamed", f"{int((lo + hi) / 2 * 1024)}M")):
        out = tmp_path / name
        r = run_ftune(["train", "--model", model, "--out", out, "--quant", "bf16", "--gpu-mem",
                       budget, "--cache-dir", cache, *TRAIN, *DEV], timeout=600)
        assert r.returncode == 0, r.stderr
        runs[name] = (out, r.stderr)
    plan = [l for l in runs["streamed"][1].splitlines() if "layers:" in l]
    print(f"resident need {need} GiB; streamed run: {plan}")
    assert "streamed from its bf16 pack" in runs["streamed"][1]
    assert plan and "in pinned host memory" in plan[0]
    assert "streamed from" not in runs["resident"][1]
    placed = json.loads((runs["streamed"][0] / "summary.json").read_text())["base_layers"]
    assert placed["host"] > 0 and sum(placed.values()) == MID["num_hidden_layers"], placed
    assert "base_layers" not in json.loads((runs["resident"][0] / "summary.json").read_text())
    a, b = ((runs[k][0] / "adapter_model.safetensors").read_bytes() for k in ("resident", "streamed"))
    assert a == b, "the streamed bf16 base trained another adapter than the resident one"
    # eval, generate and logits of that adapter decide as training did: within the same
    # --gpu-mem the base is streamed from the pack training built (reused: no fp32 model in
    # host memory), with the loss, tokens and logits (bit for bit) of the resident run; DPO
    # eval too, its reference pass (the base: the adapter switched off) on the streamed base
    out = runs["streamed"][0]
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"instruction": "Name a colour.", "input": "", "output": "Blue."}) + "\n")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "The sky is", "chosen": " blue.", "rejected": " green."})
                     + "\n")
    got, streamed, built = {}, {}, {}
    for name, budget in (("resident", "8G"), ("streamed", f"{int((hi - 0.03) * 1024)}M")):
        common = ["--model", model, "--adapter", out, "--gpu-mem", budget, "--cache-dir", cache, *DEV]
        runs_ = {"eval": ["eval", "--data", one, "--seq-len", "64"],
                 "dpo": ["eval", "--method", "dpo", "--data", pairs, "--seq-len", "64"],
                 "generate": ["generate", "--raw", "--prompt", "Once upon a time",
                              "--max-new-tokens", "3", "--json"],
                 "logits": ["logits", "--ids", "1,450,4996,17354,1701", "--out",
                            tmp_path / f"logits-{name}.bin"]}
        res = {}
        for cmd, args in runs_.items():
            r = run_ftune([*args, *common])
            assert r.returncode == 0, f"{cmd} ({name}): {r.stderr}"
            res[cmd] = r
        got[name] = (json.loads(res["eval"].stdout)["loss"], json.loads(res["dpo"].stdout)["loss"],
                     json.loads(res["generate"].stdout)["ids"],
                     (tmp_path / f"logits-{name}.bin").read_bytes())
        streamed[name] = {k: "streamed from its bf16 pack" in r.stderr for k, r in res.items()}
        built[name] = [k for k, r in res.items() if "pack: built" in r.stderr]
    print(f"eval/dpo/generate of the streamed run's adapter: "
          f"{ {k: v[:3] for k, v in got.items()} }; streamed: {streamed}")
    assert all(streamed["streamed"].values()) and not any(streamed["resident"].values()), streamed
    assert not built["streamed"], f"{built} rebuilt the bf16 pack training had built"
    assert got["streamed"][:3] == got["resident"][:3], got
    assert got["streamed"][3] == got["resident"][3], "streamed logits differ from the resident ones"
    # DPO eval against a reference adapter of another rank places the streamed base twice
    # (for the reference, then for the policy), and scores as the resident run does
    r4 = tmp_path / "r4"
    r = run_ftune(["train", "--model", model, "--out", r4, "--quant", "bf16", "--gpu-mem", "8G",
                   "--cache-dir", cache, "--data", SEED_DATA, "--max-steps", "1", "--seq-len",
                   "64", "--eval-max", "1", "--lora-r", "4", "--save-every", "0", *DEV])
    assert r.returncode == 0, r.stderr
    refd = {}
    for name, budget in (("resident", "8G"), ("streamed", f"{int((hi - 0.03) * 1024)}M")):
        r = run_ftune(["eval", "--method", "dpo", "--data", pairs, "--seq-len", "64", "--model",
                       model, "--adapter", out, "--ref-adapter", r4, "--gpu-mem", budget,
                       "--cache-dir", cache, *DEV])
        assert r.returncode == 0, r.stderr
        refd[name] = (json.loads(r.stdout)["loss"], sum(" layers: " in l for l in r.stderr.splitlines()))
    print(f"dpo eval with a rank-4 reference adapter: {refd}")
    assert refd["streamed"][1] == 2 and refd["resident"][1] == 0, refd
    assert refd["streamed"][0] == refd["resident"][0], refd


def test_generate_budget_keeps_cache(tmp_path):
    """generate places the base with its own KV cache and buffers kept out of --gpu-mem
    (ft_gen_source_bytes): at a budget between the two, a short prompt's run holds every layer,
    while a 900-token prompt's larger cache sends the base to its bf16 pack."""
    model, cache = mid_model(tmp_path), tmp_path / "cache"
    msg = re.compile(r"the bf16 base run needs ([0-9.]+) GiB of GPU memory with every layer "
                     r"resident, --gpu-mem allows [0-9.]+ GiB \(([0-9.]+) GiB in use, ([0-9.]+) "
                     r"GiB kept for generation's KV cache and buffers\)")
    prompts = {"short": " ".join(["word"] * 80), "long": " ".join(["word"] * 900)}
    gen = ["generate", "--model", model, "--raw", "--max-new-tokens", "2", "--json",
           "--cache-dir", cache, *DEV]
    parts = {}
    for name, p in prompts.items():  # a 1 MiB budget: the need, what is in use, the reserve
        r = run_ftune([*gen, "--prompt", p, "--gpu-mem", "1M"])
        m = msg.search(r.stderr)
        assert r.returncode == 1 and m, r.stderr
        parts[name] = tuple(float(x) for x in m.groups())
    (need, used, r_short), (need_l, used_l, r_long) = parts["short"], parts["long"]
    print(f"need {need} GiB, in use {used}, kept for generation: {r_short} vs {r_long}")
    assert need == need_l and used == used_l and r_long > r_short + 0.02, parts
    budget = f"{int((need + used + (r_short + r_long) / 2) * 1024)}M"
    out = {}
    for name, p in prompts.items():
        r = run_ftune([*gen, "--prompt", p, "--gpu-mem", budget])
        out[name] = ("streamed from its bf16 pack" in r.stderr, r.returncode, r.stderr)
    print(f"--gpu-mem {budget}: short streamed {out['short'][0]}, long streamed {out['long'][0]}")
    assert not out["short"][0] and out["short"][1] == 0, out["short"][2]
    # the long prompt's run streams (the planner may then place it or refuse the budget)
    assert out["long"][0] and (out["long"][1] == 0 or "does not fit" in out["long"][2]), out["long"][2]


def greedy_matches_logits(model, adapter, extra):
    """generate's greedy tokens == the argmax of `ftune logits` on prompt + the tokens before,
    both on cpu-device, to the bf16 bound where two logits are that close."""
    r = run_ftune(["generate", "--model", model, "--adapter", adapter, "--raw", "--prompt",
                   "Once upon a time, in a quiet village", "--max-new-tokens", "6", "--json",
                   *extra, *DEV])
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)
    prompt, new = g["prompt_ids"], g["ids"]
    assert new
    ids = prompt + new
    r = run_ftune(["logits", "--model", model, "--adapter", adapter, "--ids",
                   ",".join(map(str, ids)), "--out", adapter.parent / "logits.bin", *extra, *DEV])
    assert r.returncode == 0, r.stderr
    z = np.fromfile(adapter.parent / "logits.bin", np.float32).reshape(len(ids), -1)
    rows = z[len(prompt) - 1:len(ids) - 1]
    for t, row in enumerate(rows):
        top = float(row.max())
        assert row[new[t]] >= top - TOL_BF16_REL * float(np.abs(row).max()), (t, new, row.argmax())
    print(f"generate {extra}: {new} (logits argmax {[int(r.argmax()) for r in rows]})")


def test_qlora_tied_eval_generate(tmp_path):
    out, cache, held = tmp_path / "q", tmp_path / "cache", tmp_path / "held.jsonl"
    held.write_text("".join(SEED_DATA.read_text().splitlines(keepends=True)[:4]))
    r = run_ftune(["train", "--model", TINY, "--out", out, "--quant", "nf4", "--cache-dir", cache,
                   "--data", SEED_DATA, "--eval-data", held, "--max-steps", "2", "--seq-len", "128",
                   "--save-every", "0", "--quiet", *DEV])
    assert r.returncode == 0, r.stderr
    final = json.loads((out / "summary.json").read_text())["final_eval_loss"]
    r = run_ftune(["eval", "--model", TINY, "--adapter", out, "--data", held, "--seq-len",
                   "128", "--quant", "nf4", "--cache-dir", cache, *DEV])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["loss"]
    print(f"cpu-device QLoRA: final eval {final!r}, ftune eval --quant nf4 {got}")
    assert abs(got - final) <= 1e-6
    greedy_matches_logits(TINY, out, ["--quant", "nf4", "--cache-dir", cache])
    greedy_matches_logits(TINY, out, [])


def test_bf16_pack_only_folder(tmp_path):
    """A folder holding only a bf16 pack (init-model --pack --quant bf16) trains, on the CPU
    (every layer read from the pack per visit) and on cpu-device, the adapter its safetensors
    twin (the same seed) trains: bit for bit, as bf16 -> fp32 is exact."""
    for name, extra in (("pack", ["--pack", "--quant", "bf16"]), ("st", [])):
        r = run_ftune(["init-model", "--config", TINY / "config.json", "--out", tmp_path / name,
                       "--tokenizer", TINY, "--seed", "7", *extra])
        assert r.returncode == 0, r.stderr
    assert not list((tmp_path / "pack").glob("*.safetensors"))
    for dev in (["--device", "cpu", "--threads", "1"], DEV):
        got = []
        for name in ("pack", "st"):
            out = tmp_path / f"o-{name}-{dev[1]}"
            r = run_ftune(["train", "--model", tmp_path / name, "--out", out, "--data", SEED_DATA,
                           "--max-steps", "2", "--seq-len", "128", "--save-every", "0", "--quiet",
                           "--cache-dir", tmp_path / "cache", *dev])
            assert r.returncode == 0, r.stderr
            got.append((out / "adapter_model.safetensors").read_bytes())
        assert got[0] == got[1], f"{dev[1]}: the bf16 pack-only folder trained another adapter"


def test_eval_generate_streamed_nf4(tmp_path):
    """`ftune eval` and `generate` on a device place an NF4 base as training does: within
    --gpu-mem, the layers that do not fit are streamed from pinned host memory (plan lines on
    stderr); the eval loss and the greedy tokens are those of the run holding every layer."""
    model = streamed_nf4_model(tmp_path)
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"instruction": "What is the relation between the given pairs?",
                               "input": "Night : Day :: Right : Left",
                               "output": "They are opposites."}) + "\n")
    ev = ["eval", "--model", model, "--data", one, "--seq-len", "128", *DEV]
    # the fixed part and the slots of the smallest plan, from the refusal of a 1 MiB budget
    r = run_ftune(ev + ["--gpu-mem", "1M"])
    # room for a few of the 16 layers (3.7 MB each) beyond the slots: the rest streamed
    budget = streamed_budget(r, 0.04)
    # planned as forward passes: no optimizer state or backward in the refusal
    assert "(a forward pass of 128 tokens)" in r.stderr and "AdamW" not in r.stderr, r.stderr
    gen = ["generate", "--model", model, "--raw", "--prompt", "Once upon a time",
           "--max-new-tokens", "3", "--json", *DEV]
    got = {}
    for name, extra in (("resident", []), ("streamed", ["--gpu-mem", budget])):
        r = run_ftune(ev + extra)
        assert r.returncode == 0, r.stderr
        plan = [l for l in r.stderr.splitlines() if "plan: " in l]
        loss = json.loads(r.stdout)["loss"]
        g = run_ftune(gen + extra)
        assert g.returncode == 0, g.stderr
        got[name] = (loss, json.loads(g.stdout)["ids"], plan)
    print(f"budget {budget}: {got}")
    assert not got["resident"][2]
    assert got["streamed"][2] and "in pinned host memory" in got["streamed"][2][0]
    assert " 0 in pinned host memory" not in got["streamed"][2][0]
    assert any(" s/forward pass " in l for l in got["streamed"][2]), got["streamed"][2]
    assert got["streamed"][:2] == got["resident"][:2]


def test_odd_hidden_grad_accum(tmp_path):
    """A hidden size that is not a multiple of 4 (66), an odd sequence length and two
    micro-batches: each micro-batch's d(hidden) in the executor starts on 64 bytes, as the
    device's bf16 rounding of the down and o projections' dy needs (CUDA reads it as float4;
    cpu-device checks the same alignment). It was refused before the stride was padded."""
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update({"hidden_size": 66, "num_attention_heads": 3, "num_key_value_heads": 1,
                "head_dim": 22})
    (tmp_path / "c66.json").write_text(json.dumps(cfg))
    model = tmp_path / "m66"
    r = run_ftune(["init-model", "--config", tmp_path / "c66.json", "--out", model, "--tokenizer",
                   TINY, "--seed", "3"])
    assert r.returncode == 0, r.stderr
    r = run_ftune(["train", "--model", model, "--data", SEED_DATA, "--seq-len", "137",
                   "--grad-accum", "2", "--max-steps", "2", "--save-every", "0", "--eval-max", "1",
                   "--out", tmp_path / "o", *DEV])
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    print(f"hidden 66, seq 137, grad-accum 2: final eval loss {summary['final_eval_loss']}")
    assert np.isfinite(summary["final_eval_loss"])


def test_generate_default_batch_fits_budget(tmp_path):
    """`generate --prompts` on a device lowers its default --batch (here the 4 records) until
    the KV caches of the sequences decoded together take at most a quarter of --gpu-mem, and
    says so; the lines are those of --batch 1, which is taken as given. The model is made for
    large caches at little compute: 8 layers of 64 KV heads of 256, 1 MiB of K and V per token."""
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8,
                "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 256})
    (tmp_path / "kv.json").write_text(json.dumps(cfg))
    model = tmp_path / "kv"
    r = run_ftune(["init-model", "--config", tmp_path / "kv.json", "--out", model, "--tokenizer",
                   TINY, "--seed", "3"])
    assert r.returncode == 0, r.stderr
    # the budget: 1600 MiB on cpu-device; on a GPU, where the CUDA context and workspaces take
    # ~1.8 GiB before any layer, enough that three quarters of it still hold the smallest plan
    # (its fixed part and layer slots, read from a refused 1 MiB run); the prompts grow with
    # the budget's quarter, so that about three sequences' caches fit in it as on cpu-device
    r = run_ftune(["generate", "--model", model, "--raw", "--prompt", "word word",
                   "--max-new-tokens", "3", "--gpu-mem", "1M", *DEV])
    floor_mib = (plan_floor_gib(r) + 0.05) * 1024
    budget_mib = max(1600, int(floor_mib / 0.75) + 1)
    quarter = budget_mib / 4 * 2**20
    scale = budget_mib / 1600
    recs = [{"prompt": " ".join(["word"] * int((90 + 3 * i) * scale))} for i in range(4)]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in recs))
    gen = ["generate", "--model", model, "--raw", "--prompts", prompts, "--max-new-tokens", "3",
           "--gpu-mem", f"{budget_mib}M", *DEV]
    capped = run_ftune(gen)
    assert capped.returncode == 0, capped.stderr
    m = re.search(r"ftune: (\d+) prompts at a time, not 4: their KV caches of (\d+) tokens would "
                  r"take more than a quarter of the GPU budget", capped.stderr)
    assert m, capped.stderr
    n, ctx = int(m.group(1)), int(m.group(2))
    # the budget's quarter holds the caches of n sequences (and the buffers), not n + 1
    kv = 2 * 8 * 64 * 256 * 4 * ctx
    print(f"--gpu-mem {budget_mib}M: default batch lowered to {n} (caches of {ctx} tokens, "
          f"{kv / 2**20:.1f} MiB each)")
    assert 1 <= n < 4 and n * kv <= quarter < (n + 1) * kv + 100 * 2**20, (n, ctx)
    one = run_ftune(gen + ["--batch", "1"])
    assert one.returncode == 0, one.stderr
    assert "prompts at a time" not in one.stderr
    strip = lambda out: [{k: v for k, v in json.loads(l).items() if k != "seconds"}
                         for l in out.splitlines()]
    assert len(strip(capped.stdout)) == 4
    if DEV[1] == "cpu-device":  # its row products do not depend on the rows beside them
        assert strip(capped.stdout) == strip(one.stdout)


if __name__ == "__main__":  # a plain runner: every test_* in its own temporary folder
    failed = 0
    names = [n for n in sorted(globals()) if n.startswith("test_")]
    for n in names:
        with tempfile.TemporaryDirectory() as d:
            try:
                globals()[n](Path(d))
                print(f"PASS {n}", flush=True)
            except Exception:
                failed += 1
                traceback.print_exc()
                print(f"FAIL {n}", flush=True)
    print(f"{len(names) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
