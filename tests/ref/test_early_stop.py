"""Early stopping and the best adapter by eval loss on tests/fixtures/tiny-llama
(--early-stopping-patience, --early-stopping-threshold, --save-best):

- the step a run stops at, its best eval loss and best step are those of transformers'
  rules (EarlyStoppingCallback.check_metric_value, then Trainer._determine_best_metric)
  applied in this test to the eval losses of metrics.jsonl (written with 17 digits: the
  exact doubles the trainer compared), not hard-coded; the step-0 eval is no candidate;
- --save-best: OUT/best holds the adapter of the checkpoint at best_eval_step (tensors and
  bytes), OUT the last step's; summary.json names them;
- a run killed with SIGKILL and resumed, or resumed from a copied checkpoint one step
  before the stop (the counter of evaluations without improvement must survive), or from
  the final checkpoint of the early-stopped run, stops at the same step with the same best
  and the same OUT/best;
- bad values are refused naming the flag.
"""
import json
import math
import os
import random
import shutil
import signal
import subprocess
import time
from functools import partial
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

import pytest

from cli_helpers import (SEED_DATA, TINY, adapter_bytes, ftune_path, max_ckpt, metrics,
                         run_argv, summary)

FTUNE = ftune_path()
DATA = SEED_DATA
STEPS = 14
# lr 0.1 without warmup: on the tiny model the eval loss falls, rises once, falls again
# and then flattens out, so --early-stopping-patience 2 stops mid-run after a reset of the
# counter (the test derives where from metrics.jsonl)
ARGS = ["--seq-len", "64", "--max-steps", str(STEPS), "--threads", "2", "--seed", "5",
        "--lr", "0.1", "--warmup-ratio", "0", "--grad-accum", "2", "--eval-fraction", "0.5",
        "--eval-every", "1", "--save-every", "1", "--keep", "0",
        "--early-stopping-patience", "2", "--save-best"]
TIMEOUT = 300  # seconds for one ftune run (2 shared cores)
POLL = 0.02


def cmd(out, *extra, args=ARGS):
    return [FTUNE, "train", "--model", str(TINY), "--data", str(DATA), "--out", str(out)] + \
        list(args) + list(extra)


run = partial(run_argv, timeout=TIMEOUT)  # run(argv, ok=True)


def without(args, flag, n_values=1):
    i = args.index(flag)
    return args[:i] + args[i + 1 + n_values:]


def hf_rule(evals, patience, threshold):
    """transformers' Trainer with metric_for_best_model="eval_loss" and EarlyStoppingCallback,
    over the (step, loss) of the evaluations in order: the callback's on_evaluate
    (check_metric_value against the best before this eval) runs before
    _determine_best_metric (strictly lower is the new best, no threshold). Returns
    (stop step or None, best step, best loss)."""
    best, best_step, counter = None, None, 0
    for step, loss in evals:
        if best is None or (loss < best and abs(loss - best) > threshold):
            counter = 0
        else:
            counter += 1
        if best is None:
            best = math.inf
        if loss < best:
            best, best_step = loss, step
        if counter >= patience:
            return step, best_step, best
    return None, best_step, best


def tensors(folder):
    return load_file(str(Path(folder) / "adapter_model.safetensors"))


def same_tensors(a, b):
    ta, tb = tensors(a), tensors(b)
    return sorted(ta) == sorted(tb) and all(np.array_equal(ta[k], tb[k]) for k in ta)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run; returns (out, stop step, best step, best loss)."""
    out = tmp_path_factory.mktemp("ref")
    r = run(cmd(out))
    steps, evals = metrics(out)
    cand = [(e["step"], e["eval_loss"]) for e in evals if e["step"] > 0]  # step 0: no candidate
    print("eval losses:", " ".join(f"{s}:{l:.5f}" for s, l in cand))
    stop, best_step, best = hf_rule(cand, patience=2, threshold=0.0)
    assert stop is not None and stop < STEPS, "the eval loss never stalled: no early stop to test"
    return out, stop, best_step, best, r.stderr


def test_early_stop_follows_hf_rule_and_keeps_best(reference):
    out, stop, best_step, best, err = reference
    steps, evals = metrics(out)
    s = summary(out)
    print(f"stopped at {stop}, best {best:.6f} at {best_step}; summary: "
          f"steps {s['steps']}, best {s['best_eval_loss']} at {s['best_eval_step']}")
    assert s["early_stopped"] is True and s["steps"] == stop
    assert [r["step"] for r in steps] == list(range(1, stop + 1))
    # one eval per step up to the stop, none after (the stop's eval is the final one)
    assert [e["step"] for e in evals] == list(range(0, stop + 1))
    assert s["final_eval_loss"] == evals[-1]["eval_loss"]
    assert f"early stopping after step {stop}/{STEPS}: 2 evaluations in a row" in err, err
    # the best: the lowest eval loss after step 0, exactly the trainer's double
    assert s["best_eval_step"] == best_step and s["best_eval_loss"] == best
    assert best == min(e["eval_loss"] for e in evals if e["step"] > 0)
    assert best_step < stop  # else OUT and OUT/best would not be told apart
    # OUT/best = the checkpoint at the best step, tensor for tensor (and byte for byte);
    # OUT = the last step's adapter
    assert s["best_adapter"] == str(out / "best")
    assert same_tensors(out / "best", out / f"checkpoint-{best_step}")
    assert adapter_bytes(out / "best") == adapter_bytes(out / f"checkpoint-{best_step}")
    assert not same_tensors(out / "best", out)
    assert adapter_bytes(out) == adapter_bytes(out / f"checkpoint-{stop}")
    assert sorted(p.name for p in (out / "best").iterdir()) == \
        ["adapter_config.json", "adapter_model.safetensors", "ftune_step.json"]
    assert json.loads((out / "best" / "ftune_step.json").read_text())["step"] == best_step
    assert (out / "best" / "adapter_config.json").read_text() == (out / "adapter_config.json").read_text()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "leftover temporary folders"
    assert max_ckpt(out) == stop


def test_threshold_and_best_without_save_best(tmp_path):
    """--early-stopping-threshold: an improvement not larger than it counts as none for
    patience, yet still moves the best (as transformers: the threshold is only the
    callback's). Without --save-best summary.json has the best but no best_adapter."""
    out = tmp_path / "thr"
    args = without(without(ARGS, "--save-best", 0), "--save-every") + ["--save-every", "0"]
    args[args.index("--lr") + 1] = "1"
    thr = 0.02
    r = run(cmd(out, "--early-stopping-threshold", str(thr), args=args))
    _, evals = metrics(out)
    cand = [(e["step"], e["eval_loss"]) for e in evals if e["step"] > 0]
    print("eval losses:", " ".join(f"{s}:{l:.5f}" for s, l in cand))
    stop, best_step, best = hf_rule(cand, 2, thr)
    s = summary(out)
    print(f"threshold {thr}: stopped at {s['steps']} (rule {stop}), best {s['best_eval_loss']} at "
          f"{s['best_eval_step']}; without the threshold the rule stops at {hf_rule(cand, 2, 0.0)[0]}")
    assert stop is not None and s["early_stopped"] is True and s["steps"] == stop
    assert s["best_eval_step"] == best_step and s["best_eval_loss"] == best
    assert "best_adapter" not in s and not (out / "best").exists()
    assert f"early stopping after step {stop}/{STEPS}" in r.stderr


def test_no_eval_no_best_keys(tmp_path):
    out = tmp_path / "noeval"
    args = without(without(ARGS, "--save-best", 0), "--early-stopping-patience")
    args[args.index("--eval-fraction") + 1] = "0"
    args[args.index("--max-steps") + 1] = "2"
    run(cmd(out, args=args))
    s = summary(out)
    assert "best_eval_loss" not in s and "best_eval_step" not in s and s["early_stopped"] is False


def test_sigkill_and_resume_stop_at_same_step(tmp_path, reference):
    ref, stop, best_step, best, _ = reference
    seed = int(os.environ.get("FTUNE_TEST_SEED", random.randrange(1 << 30)))
    k = random.Random(seed).randrange(1, stop)
    print(f"FTUNE_TEST_SEED={seed}: SIGKILL after checkpoint {k} (the run stops at {stop})")
    out = tmp_path / "run"
    p = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while max_ckpt(out) < k:
        if p.poll() is not None:  # finished first (k = stop - 1 on a stall): still a valid case
            assert p.returncode == 0, p.stderr.read()
            break
        assert time.time() - t0 < TIMEOUT
        time.sleep(POLL)
    if p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
    p.wait()
    p.stderr.close()
    at = max_ckpt(out)
    r = run(cmd(out, "--resume"))
    assert f"resuming from {out}/checkpoint-{at}" in r.stderr
    s, rs = summary(out), summary(ref)
    for key in ("steps", "early_stopped", "best_eval_step", "best_eval_loss", "final_eval_loss"):
        assert s[key] == rs[key], key
    assert s["resumed_from_step"] == at
    for got, want in zip(metrics(out), metrics(ref)):  # step lines, eval lines
        assert [(x["step"], x.get("loss"), x.get("eval_loss")) for x in got] == \
            [(x["step"], x.get("loss"), x.get("eval_loss")) for x in want]
    assert adapter_bytes(out) == adapter_bytes(ref)
    assert adapter_bytes(out / "best") == adapter_bytes(ref / "best")
    assert not [q.name for q in out.iterdir() if q.name.startswith(".")]


def test_resume_keeps_counter_and_restores_best(tmp_path, reference):
    """From checkpoint stop-1 (one evaluation without improvement already counted) the run
    takes one step and stops, as the uninterrupted one; OUT/best, absent in the new folder,
    is restored from the checkpoint of the best step. From the final checkpoint of the
    early-stopped run it stops at once."""
    ref, stop, best_step, best, _ = reference
    out = tmp_path / "run"
    for st in sorted({best_step, stop - 1}):
        shutil.copytree(ref / f"checkpoint-{st}", out / f"checkpoint-{st}")
    state = json.loads((out / f"checkpoint-{stop - 1}" / "trainer_state.json").read_text())
    assert state["evals_no_improve"] == 1 and state["best_eval_step"] == best_step, state
    r = run(cmd(out, "--resume", str(out / f"checkpoint-{stop - 1}")))
    print(r.stderr.strip().splitlines()[-3])
    if best_step < stop - 1:
        assert f"holds the best adapter so far (eval loss {best:.4f} at step {best_step}), copied from " \
            f"{out}/checkpoint-{best_step}" in r.stderr, r.stderr
    s, rs = summary(out), summary(ref)
    assert s["steps"] == stop and s["early_stopped"] is True
    assert s["best_eval_step"] == best_step and s["best_eval_loss"] == best
    assert adapter_bytes(out) == adapter_bytes(ref)
    assert adapter_bytes(out / "best") == adapter_bytes(ref / "best")

    fin = tmp_path / "fin"
    shutil.copytree(ref / f"checkpoint-{stop}", fin / f"checkpoint-{stop}")
    shutil.copytree(ref / "best", fin / "best")
    r = run(cmd(fin, "--resume"))
    assert f"early stopping after step {stop}/{STEPS}" in r.stderr
    s = summary(fin)
    assert s["steps"] == stop and s["early_stopped"] is True and s["best_eval_step"] == best_step
    assert [x["step"] for x in metrics(fin)[0]] == []  # no step trained
    assert adapter_bytes(fin) == adapter_bytes(ref)
    assert adapter_bytes(fin / "best") == adapter_bytes(ref / "best")
    # OUT/best holding another step's adapter than the checkpoint's best (written after that
    # checkpoint, e.g. by a final eval on other eval data) is not trusted: restored from
    # checkpoint-<best>
    stale = tmp_path / "stale"
    for k in (stop, best_step):
        shutil.copytree(ref / f"checkpoint-{k}", stale / f"checkpoint-{k}")
    shutil.copytree(ref / f"checkpoint-{stop}", stale / "best")
    (stale / "best" / "ftune_step.json").write_text(json.dumps({"step": stop, "eval_loss": 0.0}))
    for junk in ("optimizer.safetensors", "trainer_state.json"):
        (stale / "best" / junk).unlink(missing_ok=True)
    run(cmd(stale, "--resume", str(stale / f"checkpoint-{stop}")))
    assert adapter_bytes(stale / "best") == adapter_bytes(ref / "best")
    assert json.loads((stale / "best" / "ftune_step.json").read_text())["step"] == best_step
    # a larger patience on resume lets the run go on (the flags may change on resume)
    more = tmp_path / "more"
    shutil.copytree(ref / f"checkpoint-{stop}", more / f"checkpoint-{stop}")
    a = cmd(more, "--resume")
    a[a.index("--early-stopping-patience") + 1] = "1000"
    run(a)
    assert summary(more)["steps"] == STEPS and summary(more)["early_stopped"] is False


def test_resume_with_other_eval_data_starts_best_over(tmp_path):
    """Eval losses of another held-out set do not compare with the checkpoint's best: a resume
    with another --eval-data warns, and the best eval loss and OUT/best then come from the
    evaluations after the resume only (the first counted one is the new best). A resume with
    the same --eval-data keeps the uninterrupted run's best."""
    lines = DATA.read_text().splitlines()
    ea, eb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    ea.write_text("\n".join(lines[:30]) + "\n")
    eb.write_text("\n".join(lines[30:60]) + "\n")
    args = without(ARGS, "--eval-fraction") + ["--eval-data", str(ea)]
    args[args.index("--early-stopping-patience") + 1] = "1000"
    ref = tmp_path / "ref"
    run(cmd(ref, args=args))
    rs = summary(ref)
    k = 3
    assert rs["best_eval_step"] > 0 and rs["steps"] == STEPS
    same = tmp_path / "same"
    shutil.copytree(ref / f"checkpoint-{k}", same / f"checkpoint-{k}")
    r = run(cmd(same, "--resume", args=args))
    assert "held-out set differs" not in r.stderr
    s = summary(same)
    assert (s["best_eval_step"], s["best_eval_loss"]) == (rs["best_eval_step"], rs["best_eval_loss"])
    assert adapter_bytes(same / "best") == adapter_bytes(ref / "best")

    other = tmp_path / "other"
    shutil.copytree(ref / f"checkpoint-{k}", other / f"checkpoint-{k}")
    old = json.loads((other / f"checkpoint-{k}" / "trainer_state.json").read_text())
    assert old["n_evals"] == k and len(old["eval_set"]) == 16
    b_args = [str(eb) if x == str(ea) else x for x in args]
    r = run(cmd(other, "--resume", args=b_args))
    assert "held-out set differs from the one of the checkpoint's eval losses" in r.stderr, r.stderr
    after = [(e["step"], e["eval_loss"]) for e in metrics(other)[1] if e["step"] > k]
    assert len(after) == STEPS - k
    best_step, best = min(after, key=lambda t: (t[1], t[0]))
    s = summary(other)
    assert (s["best_eval_step"], s["best_eval_loss"]) == (best_step, best), (s, after)
    assert json.loads((other / "best" / "ftune_step.json").read_text())["step"] == best_step
    new = json.loads((other / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    # counted since the resume: steps k+1 .. STEPS-1 (the last step's eval is the final one,
    # made after its checkpoint)
    assert new["eval_set"] != old["eval_set"] and new["n_evals"] == STEPS - k - 1


@pytest.mark.parametrize("change, flag_text", [
    (lambda a: a + ["--early-stopping-patience", "-1"], "--early-stopping-patience must be >= 0"),
    (lambda a: a + ["--early-stopping-threshold", "-0.5"], "--early-stopping-threshold must be"),
    (lambda a: without(a, "--eval-every"), "--early-stopping-patience needs --eval-every"),
    (lambda a: without(without(a, "--eval-every"), "--early-stopping-patience"),
     "--save-best needs --eval-every"),
    (lambda a: [x if x != "0.5" else "0" for x in a], "--early-stopping-patience needs evaluation"),
    (lambda a: [x if x != "0.5" else "0" for x in without(a, "--early-stopping-patience")],
     "--save-best needs evaluation"),
])
def test_bad_values_are_refused(tmp_path, change, flag_text):
    r = run(cmd(tmp_path / "bad", args=change(list(ARGS))), ok=False)
    last = r.stderr.strip().splitlines()[-1]
    print(last)
    assert r.returncode == 1 and flag_text in last, r.stderr
    assert not (tmp_path / "bad" / "adapter_model.safetensors").exists()
