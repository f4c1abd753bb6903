"""`ftune sweep` end to end on tests/fixtures/tiny-llama (issue 32):

- equivalence: each trial of a 4-trial sweep (lr 1e-3, 2e-3 x lora_r 8, 16) trained in one pass
  of 4 adapters has the per-step losses, gradient norms, eval losses and final adapter bytes of
  the same settings trained alone with `ftune train` (the executor runs one frozen GEMM per
  adapter's rows, so every adapter gets the bits of its run alone); the same on cpu-device with
  the NF4 base streamed from the pack file (layers on the NVMe tier);
- weight traffic: the same sweep with 4 adapters per pass reads the pack a quarter as often as
  with 1 (the executor's pack_reads, printed at the end);
- pruning (--prune halving) is deterministic: two runs give the same sweep.json and adapters,
  pruned trials keep their adapter and metrics, freed slots are refilled;
- a sweep killed with SIGKILL (after a resume point, --save-every 2) and continued with
  --resume ends with every trial's adapter, metrics and sweep.json as the uninterrupted sweep;
  a different --adapters-per-pass is refused;
- sweep.json validates against tests/ref/sweep_schema.json; report.html opens in headless
  Chromium with one eval-loss curve per trial (a screenshot is taken);
- errors: an unknown key, a value of the wrong type, no grid, more trials than --max-trials,
  the seed as a key, --prune halving without --eval-every are one line each; a trial that
  fails on its own (NaN steps, its own bad setting) is "failed" with its error, the others end.
"""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest

from cli_helpers import SEED_DATA, TINY, adapter_bytes, ftune_path, metrics, run_argv
from gen_helpers import streamed_nf4_model

FTUNE = ftune_path()
TIMEOUT = 600
SCHEMA = json.loads((Path(__file__).parent / "sweep_schema.json").read_text())
BASE = ["--data", SEED_DATA, "--seq-len", "64", "--threads", "2", "--seed", "5",
        "--eval-fraction", "0.2", "--eval-max", "4"]
GRID = ["--grid", "lr=1e-3,2e-3", "--grid", "lora_r=8,16"]
TRIALS = {"lr1e-3_r8": ["--lr", "1e-3", "--lora-r", "8"],
          "lr1e-3_r16": ["--lr", "1e-3", "--lora-r", "16"],
          "lr2e-3_r8": ["--lr", "2e-3", "--lora-r", "8"],
          "lr2e-3_r16": ["--lr", "2e-3", "--lora-r", "16"]}


def sweep(out, *extra, model=TINY, ok=True, base=BASE):
    r = run_argv([FTUNE, "sweep", "--model", str(model), "--out", str(out)] + base +
                 [str(a) for a in extra], ok=False, timeout=TIMEOUT)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def train(out, *extra, model=TINY):
    return run_argv([FTUNE, "train", "--model", str(model), "--out", str(out)] + BASE +
                    [str(a) for a in extra], timeout=TIMEOUT)


def state(out):
    j = json.loads((Path(out) / "sweep.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(j)
    return j


def steps_of(out):
    """The trajectory of a run folder: per-step (step, loss, grad_norm, lr, tokens, bad_steps)
    and per-eval (step, eval_loss)."""
    st, ev = metrics(out)
    keys = ("step", "loss", "grad_norm", "lr", "tokens", "bad_steps")
    return [tuple(s.get(k) for k in keys) for s in st], [(e["step"], e["eval_loss"]) for e in ev]


def assert_same_run(trial, alone):
    assert steps_of(trial) == steps_of(alone), trial
    assert adapter_bytes(trial) == adapter_bytes(alone), trial


def test_equivalence_cpu(tmp_path):
    out = tmp_path / "sw"
    r = sweep(out, *GRID, "--max-steps", "6", "--eval-every", "3", "--adapters-per-pass", "4")
    assert "4 adapters per pass" in r.stderr
    j = state(out)
    assert [t["name"] for t in j["trials"]] == list(TRIALS)
    assert all(t["status"] == "completed" and t["steps"] == 6 for t in j["trials"])
    for name, flags in TRIALS.items():
        alone = tmp_path / name
        train(alone, *flags, "--max-steps", "6", "--eval-every", "3")
        trial = out / "trials" / name
        for f in ("adapter_config.json", "summary.json", "metrics.jsonl", "report.html"):
            assert (trial / f).is_file(), (trial, f)
        assert_same_run(trial, alone)
    best = j["best"]
    assert best == min((t for t in j["trials"]), key=lambda t: t["best_eval_loss"])["name"]
    assert adapter_bytes(out / "best") == adapter_bytes(out / "trials" / best)


def test_equivalence_cpu_device_streamed(tmp_path):
    model = streamed_nf4_model(tmp_path)
    dev = ["--device", "cpu-device", "--quant", "nf4", "--host-mem", "12M",
           "--max-steps", "2", "--eval-max", "1"]
    # the smallest budget of the 4-adapter pass, from its refusal of 1 MiB
    r = sweep(tmp_path / "floor", *GRID, *dev, "--gpu-mem", "1M", "--adapters-per-pass", "4",
              "--plan", model=model, ok=False)
    import re
    m = re.search(r"needs at least --gpu-mem ([0-9.]+)G", r.stderr)
    assert r.returncode == 1 and m, r.stderr
    budget = f"{int(float(m.group(1)) * 1024) + 24}M"
    out = tmp_path / "sw"
    r = sweep(out, *GRID, *dev, "--gpu-mem", budget, "--adapters-per-pass", "4", model=model)
    disk = re.search(r"plan: 16 layers: .* ([0-9]+) on NVMe", r.stderr)
    assert disk and int(disk.group(1)) > 0, r.stderr
    for name, flags in TRIALS.items():
        alone = tmp_path / name
        train(alone, *flags, *dev, "--gpu-mem", budget, model=model)
        assert_same_run(out / "trials" / name, alone)


def traffic(r):
    import re
    m = re.search(r"sweep: ([0-9]+) passes over the base: ([0-9]+) layer fetches, ([0-9]+) pack reads",
                  r.stderr)
    assert m, r.stderr
    return tuple(int(x) for x in m.groups())


def test_weight_traffic(tmp_path):
    args = [*GRID, "--quant", "nf4", "--cache-dir", tmp_path / "cache", "--max-steps", "3",
            "--eval-fraction", "0"]
    p4, f4, r4 = traffic(sweep(tmp_path / "k4", *args, "--adapters-per-pass", "4"))
    p1, f1, r1 = traffic(sweep(tmp_path / "k1", *args, "--adapters-per-pass", "1"))
    print("K=4:", p4, f4, r4, "K=1:", p1, f1, r1)
    # the same fetches and reads per pass whatever K (plus one read of the global tensors at
    # the start), so K = 4 reads the pack a quarter as often as 4 trials one after another
    assert p1 == 4 * p4 and f1 == 4 * f4 and r1 - 1 == 4 * (r4 - 1) and r4 > 1
    assert f4 == p4 * 2 * 2  # 2 layers, fetched once in the forward and once in the backward
    for name in TRIALS:
        assert_same_run(tmp_path / "k4" / "trials" / name, tmp_path / "k1" / "trials" / name)


PRUNE = [*GRID, "--grid", "lora_alpha=16,32", "--max-steps", "8", "--eval-every", "2",
         "--prune", "halving", "--save-every", "2", "--adapters-per-pass", "3"]


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    out = tmp_path_factory.mktemp("pruned") / "sw"
    r = sweep(out, *PRUNE)
    return out, r


def test_pruning_deterministic(pruned, tmp_path):
    out, r = pruned
    j = state(out)
    status = [t["status"] for t in j["trials"]]
    print(status, r.stderr[-1500:])
    assert status.count("pruned") >= 2 and status.count("completed") >= 1
    assert "failed" not in status and "running" not in status and "pending" not in status
    for t in j["trials"]:
        d = out / "trials" / t["name"]
        assert (d / "adapter_model.safetensors").is_file() and (d / "summary.json").is_file()
        if t["status"] == "pruned":
            assert t["steps"] < 8 and len(t["rung_losses"]) >= 1
    again = tmp_path / "again"
    sweep(again, *PRUNE)
    j2 = state(again)
    assert j2 == j
    for t in j["trials"]:
        assert adapter_bytes(out / "trials" / t["name"]) == adapter_bytes(again / "trials" / t["name"])


def test_resume_after_sigkill(pruned, tmp_path):
    ref, _ = pruned
    out = tmp_path / "sw"
    cmd = [FTUNE, "sweep", "--model", str(TINY), "--out", str(out)] + BASE + [str(a) for a in PRUNE]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + TIMEOUT
    try:
        while time.time() < deadline and p.poll() is None:
            try:  # a resume point with some progress
                j = json.loads((out / "sweep.resume.json").read_text())
                if sum(t["steps"] for t in j["trials"]) >= 10:
                    break
            except (FileNotFoundError, json.JSONDecodeError):
                pass
            time.sleep(0.01)
        killed = p.poll() is None
        if killed:
            p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    if not killed:
        pytest.skip("the sweep ended before it could be killed (machine too fast)")
    bad = sweep(out, *PRUNE[:-1], "2", "--resume", ok=False)  # --adapters-per-pass 2
    assert bad.returncode == 1 and "adapters_per_pass: 3 in the file" in bad.stderr.strip().splitlines()[-1], bad.stderr
    sweep(out, *PRUNE, "--resume")
    assert state(out) == state(ref)
    for t in state(ref)["trials"]:
        assert adapter_bytes(out / "trials" / t["name"]) == adapter_bytes(ref / "trials" / t["name"])
        assert steps_of(out / "trials" / t["name"]) == steps_of(ref / "trials" / t["name"])


def chromium():
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    pytest.skip("headless Chromium not installed (Debian package chromium)")


def test_report_in_chromium(pruned, tmp_path):
    out, _ = pruned
    html = out / "report.html"
    names = [t["name"] for t in state(out)["trials"]]
    prof = tmp_path / "prof"
    base = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", f"--user-data-dir={prof}", "--window-size=1200,1400"]
    r = subprocess.run(base + ["--dump-dom", html.resolve().as_uri()], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    from test_report import curves
    charts = curves(r.stdout)
    runs = sorted(c["data-run"] for c in charts["eval_loss"] if c["data-series"] == "eval_loss")
    assert runs == sorted(names)
    png = Path(os.environ.get("FTUNE_SWEEP_PNG", tmp_path / "sweep-report.png"))
    r = subprocess.run(base + [f"--screenshot={png}", html.resolve().as_uri()],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and png.stat().st_size > 10000, r.stderr[-2000:]


@pytest.mark.parametrize("args,want", [
    (["--grid", "learning_rate=1e-3"], "--grid learning_rate: not a training option"),
    (["--grid", "lora_r=8,x"], "--grid lora_r"),
    ([], "give --grid KEY=V1,V2,... or --config FILE"),
    (["--grid", "lr=1e-3,2e-3,3e-3", "--grid", "lora_r=4,8", "--max-trials", "5"], "--max-trials"),
    (["--grid", "seed=1,2"], "seed cannot be a sweep key"),
    (["--grid", "lr=1e-3,2e-3", "--prune", "halving"], "--prune halving ranks the trials"),
])
def test_errors(tmp_path, args, want):
    r = sweep(tmp_path / "sw", *args, "--max-steps", "2", ok=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode in (1, 2) and want in lines[-1], r.stderr
    assert all(l.startswith("ftune: ") for l in lines)
    assert not (tmp_path / "sw" / "trials").exists()


def test_failed_trials_others_go_on(tmp_path):
    out = tmp_path / "sw"
    # 1e30 diverges (NaN steps, --max-bad-steps 2); patience 2 without --eval-every is a bad
    # setting of that trial alone
    r = sweep(out, "--grid", "lr=1e-3,1e30", "--grid", "early_stopping_patience=0,2",
              "--max-steps", "6", "--max-bad-steps", "2")
    j = state(out)
    st = {t["name"]: (t["status"], t.get("error", "")) for t in j["trials"]}
    print(st)
    assert st["lr1e-3_pat0"][0] == "completed"
    assert st["lr1e30_pat0"][0] == "failed" and "--max-bad-steps 2" in st["lr1e30_pat0"][1]
    assert st["lr1e-3_pat2"][0] == "failed" and "--early-stopping-patience" in st["lr1e-3_pat2"][1]
    assert "[lr1e30_pat0] failed: " in r.stderr
    assert j["best"] == "lr1e-3_pat0"


def test_quiet_sweep_still_names_a_failed_trial(tmp_path):
    # --quiet drops the progress but keeps warnings: a failed trial is one line, nothing else
    r = sweep(tmp_path / "sw", "--grid", "early_stopping_patience=0,2", "--max-steps", "2", "--quiet")
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "warning: [pat2] failed: --early-stopping-patience" in lines[0], r.stderr
