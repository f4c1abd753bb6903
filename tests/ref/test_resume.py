"""Checkpoints and resume on tests/fixtures/tiny-llama (issue 8, points 1-4):

- a run killed with SIGKILL at three random steps and resumed each time ends with an
  adapter whose bytes equal those of an uninterrupted run with the same seed, and the same
  per-step metrics;
- one SIGINT: the step finishes, a checkpoint is saved, exit status 130 and one line with
  the exact command to resume, which completes identically; a second signal exits at once;
- a write failure while saving (injected ENOSPC; a real full tmpfs where `unshare -rm` is
  allowed) leaves the previous checkpoint intact, the error names the file, and resuming
  from it completes identically;
- a step with a non-finite loss (a base model whose embedding row of one token is +Inf)
  is skipped without an update and counted; a diverged run (huge --lr) stops after
  --max-bad-steps consecutive bad steps; a resume with a changed config is refused;
- --eval-data FILE: the held-out examples come from FILE (first --eval-max of it), all of
  --data trains (the same adapter as --eval-fraction 0), and a resume may change FILE but
  not --data.
"""
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import (ROOT, SEED_DATA, TINY, adapter_bytes, ftune_path, max_ckpt, metrics,
                         read_until, run_argv)

FTUNE = ftune_path()
DATA = SEED_DATA
STEPS = 24
# 30 train examples -> 30 micro-batches, grad-accum 2: 15 steps per epoch, so the run crosses
# an epoch boundary (re-packing with seed + epoch) and has a one-micro-batch last step
ARGS = ["--seq-len", "64", "--max-steps", str(STEPS), "--save-every", "1", "--threads", "2",
        "--seed", "5", "--lr", "1e-3", "--grad-accum", "2", "--eval-fraction", "0.5",
        "--eval-every", "8"]
TIMEOUT = 300  # seconds for one ftune run (2 shared cores)
POLL = 0.02    # seconds between looks at metrics.jsonl


def cmd(out, *extra, model=TINY):
    return [FTUNE, "train", "--model", str(model), "--data", str(DATA), "--out", str(out)] + \
        ARGS + list(extra)


run = partial(run_argv, timeout=TIMEOUT)  # run(argv, env=None, ok=True)


def last_step(out):
    """Highest step in metrics.jsonl so far (0 if none); tolerates a line being written."""
    try:
        txt = (Path(out) / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return 0
    best = 0
    for line in txt.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "loss" in r:
            best = max(best, r["step"])
    return best


def start(args):
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_step(p, out, step, probe=last_step):
    t0 = time.time()
    while probe(out) < step:
        if p.poll() is not None:
            err = p.stderr.read()
            err = err.decode() if isinstance(err, bytes) else err
            raise AssertionError(f"ftune ended (status {p.returncode}) before step {step}: {err}")
        assert time.time() - t0 < TIMEOUT, f"step {step} not reached in {TIMEOUT} s"
        time.sleep(POLL)


def started_past(tmp_path, step):
    """A run of cmd(tmp_path/run) started and waited for until metrics.jsonl has step;
    returns (out, the Popen)."""
    out = tmp_path / "run"
    p = start(cmd(out))
    wait_for_step(p, out, step)
    return out, p


def assert_same_run(out, ref):
    """Bit-identical adapter and the same per-step metrics as the uninterrupted run."""
    a, b = adapter_bytes(out), adapter_bytes(ref)
    assert len(a) == len(b)
    n_diff = sum(x != y for x, y in zip(a, b))
    print(f"adapter: {len(a)} bytes, {n_diff} differ from the uninterrupted run")
    assert n_diff == 0
    steps, evals = metrics(out)
    rsteps, revals = metrics(ref)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # each step exactly once
    keys = ("loss", "lr", "grad_norm", "tokens", "bad_steps")
    assert [[r[k] for k in keys] for r in steps] == [[r[k] for k in keys] for r in rsteps]
    assert [r["step"] for r in evals] == [r["step"] for r in revals] == [0, 8, 16, 24]
    assert [r["eval_loss"] for r in evals] == [r["eval_loss"] for r in revals]
    assert not [p.name for p in Path(out).iterdir() if p.name.startswith(".")], \
        "leftover temporary folders"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    t0 = time.time()
    run(cmd(out))
    print(f"uninterrupted run: {time.time() - t0:.1f} s")
    summ = json.loads((out / "summary.json").read_text())
    assert summ["steps"] == STEPS and summ["bad_steps"] == 0 and summ["resumed_from_step"] == 0
    ckpts = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    assert ckpts == ["checkpoint-23", "checkpoint-24"]  # --keep 2
    st = json.loads((out / "checkpoint-24" / "trainer_state.json").read_text())
    assert st["epoch"] == 1, st  # the run crosses an epoch boundary
    return out


def test_sigkill_three_times_then_resume_is_bit_identical(tmp_path, reference):
    seed = int(os.environ.get("FTUNE_TEST_SEED", random.randrange(1 << 30)))
    # kills early enough that the run has steps left to be killed in: a target pushed up by an
    # earlier late kill is capped (when it is met already, the kill lands in the start-up,
    # which is as valid a kill)
    kills = sorted(random.Random(seed).sample(range(2, STEPS - 8), 3))
    print(f"FTUNE_TEST_SEED={seed}: SIGKILL at steps {kills}")
    out = tmp_path / "run"
    resumed_from = []
    for i, k in enumerate(kills):
        # the checkpoints this process writes are those above the latest present now
        target = min(max(k, max_ckpt(out) + 1), STEPS - 6)
        p = start(cmd(out, *(["--resume"] if i else [])))
        wait_for_step(p, out, target, probe=max_ckpt)
        assert p.poll() is None, f"the run ended (status {p.returncode}) before the kill"
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        p.stderr.close()
        assert p.returncode == -signal.SIGKILL
        ck = sorted(int(d.name.split("-")[1]) for d in out.iterdir() if d.name.startswith("checkpoint-"))
        print(f"killed after checkpoint {target} (asked {k}), at step {last_step(out)}; "
              f"checkpoints {ck}, hidden {[d.name for d in out.iterdir() if d.name[0] == '.']}")
        assert ck and max(ck) >= target
        resumed_from.append(max(ck))
    r = run(cmd(out, "--resume"))
    assert f"resuming from {out}/checkpoint-{resumed_from[-1]}" in r.stderr, r.stderr
    summ = json.loads((out / "summary.json").read_text())
    assert summ["resumed_from_step"] == resumed_from[-1]
    assert_same_run(out, reference)


def test_sigint_saves_and_prints_resume_command(tmp_path, reference):
    out, p = started_past(tmp_path, 5)
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=TIMEOUT)[1]
    print(err.strip().splitlines()[-1])
    assert p.returncode == 130, err
    hint = [l for l in err.splitlines() if "resume with: " in l]
    assert len(hint) == 1, err
    stopped = last_step(out)
    assert f"stopped by SIGINT after step {stopped}/{STEPS}, checkpoint {out}/checkpoint-{stopped};" in hint[0]
    assert (out / f"checkpoint-{stopped}" / "trainer_state.json").exists()
    assert not (out / "adapter_model.safetensors").exists()  # only a finished run writes it
    again = shlex.split(hint[0].split("resume with: ", 1)[1])
    assert again[0] == FTUNE and again[-2:] == ["--resume", f"{out}/checkpoint-{stopped}"]
    run(again)
    assert_same_run(out, reference)


def test_second_signal_exits_at_once(tmp_path, reference):
    # the hook holds the stopped run before its checkpoint (else, on 2 loaded cores, the
    # run could save and exit before the second signal is sent); read_until reads the
    # descriptor itself, leaving nothing in a buffer communicate() skips
    out = tmp_path / "run"
    env = dict(os.environ, FTUNE_TEST_STOP_HOLD_MS="120000")
    p = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wait_for_step(p, out, 4)
    p.send_signal(signal.SIGTERM)
    seen = read_until(p.stderr, b"stop requested", TIMEOUT)  # the handler ran: flag set
    p.send_signal(signal.SIGTERM)  # (sent together, two signals would coalesce into one)
    err = (seen + p.communicate(timeout=TIMEOUT)[1]).decode()
    assert p.returncode == 143, err  # 128 + SIGTERM, from the handler's _exit
    assert "exiting now" in err, err
    assert "resume with" not in err, err  # not the first signal's save-and-exit path
    run(cmd(out, "--resume"))
    assert_same_run(out, reference)


def test_injected_write_failure_keeps_previous_checkpoint(tmp_path, reference):
    out = tmp_path / "run"
    # bytes the checkpoint writer produces per checkpoint: optimizer.safetensors +
    # trainer_state.json (the adapter files go through fsutil, not the hook)
    ck = reference / f"checkpoint-{STEPS}"
    per = (ck / "optimizer.safetensors").stat().st_size + (ck / "trainer_state.json").stat().st_size
    fail_at = 5 * per + per // 2  # inside checkpoint 6
    env = dict(os.environ, FTUNE_FAIL_WRITE_AFTER=str(fail_at))
    r = run(cmd(out), env=env, ok=False)
    print(r.stderr.strip().splitlines()[-2])
    assert r.returncode == 1, r.stderr
    assert "checkpoint-6" in r.stderr and "No space left on device" in r.stderr, r.stderr
    assert f"the previous checkpoint {out}/checkpoint-5 is intact" in r.stderr, r.stderr
    assert "--resume" in r.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == \
        ["checkpoint-4", "checkpoint-5"]  # no checkpoint-6, no temporary folder
    r = run(cmd(out, "--resume"))
    assert f"resuming from {out}/checkpoint-5" in r.stderr
    assert_same_run(out, reference)


def unshare_works():
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_full_tmpfs_keeps_previous_checkpoint(tmp_path, reference):
    """A real full disk: --out on a 1.1 MB tmpfs (user + mount namespace). Each checkpoint
    takes ~410 kB of pages, so with --keep 0 the third one fails; the mount is then grown
    and the run resumed inside the same namespace (the tmpfs dies with it)."""
    if not shutil.which("unshare") or not unshare_works():
        pytest.skip("unshare -rm (user + mount namespaces) not permitted here")
    mnt, res = tmp_path / "mnt", tmp_path / "res"
    mnt.mkdir()
    res.mkdir()
    q = shlex.join
    script = f"""
set -u
mount -t tmpfs -o size=1100k tmpfs {q([str(mnt)])} || exit 77
{q(cmd(mnt, "--keep", "0"))} 2>{q([str(res / "err1")])}; echo $? >{q([str(res / "rc1")])}
ls -a {q([str(mnt)])} >{q([str(res / "ls1")])}
mount -o remount,size=64m {q([str(mnt)])}
{q(cmd(mnt, "--keep", "0", "--resume"))} 2>{q([str(res / "err2")])}; echo $? >{q([str(res / "rc2")])}
cp -a {q([str(mnt)])}/. {q([str(res / "out")])}
"""
    r = subprocess.run(["unshare", "-rm", "bash", "-c", script], capture_output=True, text=True,
                       timeout=2 * TIMEOUT)
    if r.returncode == 77:
        pytest.skip("mounting a tmpfs is not permitted here: " + r.stderr)
    assert r.returncode == 0, r.stderr
    err1 = (res / "err1").read_text()
    print(err1.strip().splitlines()[-2])
    assert (res / "rc1").read_text().strip() == "1", err1
    assert "No space left on device" in err1, err1
    listing = (res / "ls1").read_text().split()
    ck = sorted(int(n.split("-")[1]) for n in listing if n.startswith("checkpoint-"))
    print("on the full disk:", listing)
    assert len(ck) >= 1 and f"the previous checkpoint {mnt}/checkpoint-{ck[-1]} is intact" in err1
    assert not [n for n in listing if n.startswith(".checkpoint")]  # temporary folder removed
    assert (res / "rc2").read_text().strip() == "0", (res / "err2").read_text()
    assert f"resuming from {mnt}/checkpoint-{ck[-1]}" in (res / "err2").read_text()
    assert_same_run(res / "out", reference)


def poisoned_model(dst, target_share=0.12):
    """A copy of the tiny model, untied (lm_head = the original embedding), and a token whose
    input embedding row the trainer's fault-injection hook sets to +Inf
    (FTUNE_TEST_INF_EMBEDDING: a model file cannot hold an Inf, the loaders refuse it): a
    micro-batch holding that token yields NaN activations, loss and gradients, the others are
    unaffected. The token is one that appears in about `target_share` of the examples the
    trainer keeps at --seq-len 64 (found with `ftune tokenize`), so some steps are bad and
    most are not."""
    sys.path.insert(0, str(ROOT / "tests" / "ref"))
    from llama_ref import read_safetensors
    from safetensors.numpy import save_file

    toks = run([FTUNE, "tokenize", "--model", str(TINY), "--data", str(DATA)]).stdout
    df, kept = {}, 0
    for line in toks.splitlines():
        r = json.loads(line)
        ids, lab = r["ids"][:64], r["labels"][:64]
        if all(l == -100 for l in lab[1:]):
            continue  # dropped: no trained token within the first 64
        kept += 1
        for t in set(ids):
            df[t] = df.get(t, 0) + 1
    tok = min((t for t in df if t > 2), key=lambda t: (abs(df[t] - target_share * kept), t))
    w, _ = read_safetensors(str(TINY / "model.safetensors"))
    dst.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / f, dst / f)
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update(tie_word_embeddings=False, torch_dtype="float32")
    (dst / "config.json").write_text(json.dumps(cfg))
    w["lm_head.weight"] = w["model.embed_tokens.weight"].copy()
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})
    return tok, df[tok], kept


def test_nonfinite_steps_are_skipped_and_counted(tmp_path):
    model = tmp_path / "model"
    tok, n, kept = poisoned_model(model)
    print(f"token {tok} (+Inf embedding) is in {n} of {kept} kept examples")
    out = tmp_path / "run"
    env = dict(os.environ, FTUNE_TEST_INF_EMBEDDING=str(tok))
    r = run(cmd(out, "--keep", "0", "--max-bad-steps", str(STEPS), model=model), env=env)
    assert f"test hook: the input embedding of token {tok} is +Inf" in r.stderr
    steps, _ = metrics(out)
    bad = [s["step"] for s in steps if s.get("skipped")]
    summ = json.loads((out / "summary.json").read_text())
    print(f"skipped steps {bad}; summary bad_steps {summ['bad_steps']}")
    assert 1 <= len(bad) < STEPS
    assert summ["bad_steps"] == len(bad) == steps[-1]["bad_steps"]
    assert r.stderr.count("warning: step ") == len(bad)
    for s in steps:
        assert (s["loss"] is None) == (s["step"] in bad)
    # a skipped step changes neither the adapter nor the AdamW moments; a good one does
    for s in bad:
        if s == 1:
            continue
        for f in ("adapter_model.safetensors", "optimizer.safetensors"):
            a = (out / f"checkpoint-{s - 1}" / f).read_bytes()
            b = (out / f"checkpoint-{s}" / f).read_bytes()
            assert a == b, f"step {s} was skipped but {f} changed"
    good = [s["step"] for s in steps if not s.get("skipped") and s["step"] > 1]
    g = good[-1]
    assert (out / f"checkpoint-{g - 1}" / "optimizer.safetensors").read_bytes() != \
        (out / f"checkpoint-{g}" / "optimizer.safetensors").read_bytes()
    st = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert st["adam_step"] == STEPS - len(bad) and st["bad_steps"] == len(bad)


def test_diverged_run_stops_after_max_bad_steps(tmp_path):
    out = tmp_path / "run"
    # lr 1e30: the first real update makes the LoRA weights ~1e30, the next forward
    # overflows fp32 and every later step is NaN
    args = cmd(out, "--save-every", "0")
    args[args.index("--lr") + 1] = "1e30"
    r = run(args, ok=False)
    last = r.stderr.strip().splitlines()[-1]
    print(last)
    assert r.returncode == 1
    assert "consecutive steps with a non-finite loss or gradient norm (--max-bad-steps 5)" in last
    assert "resume" not in last
    steps, _ = metrics(out)
    assert [s.get("skipped", False) for s in steps[-5:]] == [True] * 5
    assert steps[-1]["bad_steps"] == 5 and len(steps) < STEPS
    assert not (out / "adapter_model.safetensors").exists()


def test_resume_refuses_changed_config(tmp_path, reference):
    out = tmp_path / "run"
    shutil.copytree(reference / "checkpoint-23", out / "checkpoint-23")
    args = cmd(out, "--resume")
    args[args.index("--seq-len") + 1] = "128"
    args[args.index("--lr") + 1] = "2e-3"
    r = run(args, ok=False)
    print(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 1
    assert "seq_len: 64 -> 128" in r.stderr and "lr: 0.001 -> 0.002" in r.stderr, r.stderr
    # --threads, eval and checkpoint flags may change: the resumed run still matches
    args = cmd(out, "--resume", f"{out}/checkpoint-23")
    args[args.index("--threads") + 1] = "1"
    run(args)
    a, b = adapter_bytes(out), adapter_bytes(reference)
    assert a == b
    r = run(cmd(tmp_path / "empty", "--resume"), ok=False)
    assert r.returncode == 2 and "no complete checkpoint" in r.stderr


def test_resume_refuses_changed_loraplus_ratio(tmp_path, reference):
    """--loraplus-lr-ratio shapes the run: adding it to a run without it, or changing it, is
    refused naming it; the same ratio resumes bit-identically."""
    out = tmp_path / "run"
    shutil.copytree(reference / "checkpoint-23", out / "checkpoint-23")
    r = run(cmd(out, "--resume", "--loraplus-lr-ratio", "16"), ok=False)
    assert r.returncode == 1 and "loraplus_lr_ratio: (absent) -> 16" in r.stderr, r.stderr
    plus = tmp_path / "plus"
    two = ["--max-steps", "2", "--loraplus-lr-ratio", "16"]  # flags after ARGS win
    run(cmd(plus, *two))
    shutil.copytree(plus / "checkpoint-1", out / "checkpoint-1")
    shutil.rmtree(out / "checkpoint-23")
    r = run(cmd(out, "--resume", "--max-steps", "2", "--loraplus-lr-ratio", "8"), ok=False)
    assert r.returncode == 1 and "loraplus_lr_ratio: 16 -> 8" in r.stderr, r.stderr
    run(cmd(out, "--resume", *two))
    assert adapter_bytes(out) == adapter_bytes(plus)


def test_resume_refuses_changed_neftune_alpha(tmp_path, reference):
    """--neftune-noise-alpha shapes the run: adding it to a run without it, changing it or
    dropping it is refused naming it; 0 is off (the reference run resumes with it, to the same
    adapter); the same alpha resumes bit-identically."""
    out = tmp_path / "run"
    shutil.copytree(reference / "checkpoint-23", out / "checkpoint-23")
    r = run(cmd(out, "--resume", "--neftune-noise-alpha", "5"), ok=False)
    assert r.returncode == 1 and "neftune_noise_alpha: (absent) -> 5" in r.stderr, r.stderr
    run(cmd(out, "--resume", "--neftune-noise-alpha", "0"))
    assert adapter_bytes(out) == adapter_bytes(reference)
    noisy = tmp_path / "noisy"
    two = ["--max-steps", "2", "--neftune-noise-alpha", "5"]  # flags after ARGS win
    r = run(cmd(noisy, *two))
    assert "NEFTune: noise alpha 5" in r.stderr, r.stderr
    assert json.loads((noisy / "summary.json").read_text())["neftune_noise_alpha"] == 5
    out2 = tmp_path / "run2"
    shutil.copytree(noisy / "checkpoint-1", out2 / "checkpoint-1")
    r = run(cmd(out2, "--resume", "--max-steps", "2", "--neftune-noise-alpha", "1"), ok=False)
    assert r.returncode == 1 and "neftune_noise_alpha: 5 -> 1" in r.stderr, r.stderr
    r = run(cmd(out2, "--resume", "--max-steps", "2"), ok=False)
    assert r.returncode == 1 and "neftune_noise_alpha: 5 -> (absent)" in r.stderr, r.stderr
    r = run(cmd(out2, "--resume", "--max-steps", "2", "--neftune-noise-alpha", "-1"), ok=False)
    assert r.returncode == 2 and "--neftune-noise-alpha" in r.stderr, r.stderr
    run(cmd(out2, "--resume", *two))
    assert adapter_bytes(out2) == adapter_bytes(noisy)


def test_eval_data_file(tmp_path):
    """--eval-data: summary.json carries the eval file, its count (capped by --eval-max) and
    both eval losses; the adapter equals that of a run without eval (--eval-fraction 0: every
    example trains, eval changes nothing); a resume with another eval file continues that run
    bit-identically, one with another --data is refused; an error in FILE names it."""
    lines = DATA.read_text().splitlines(keepends=True)
    ev1, ev2 = tmp_path / "ev1.jsonl", tmp_path / "ev2.jsonl"
    ev1.write_text("".join(lines[:40]))
    ev2.write_text("".join(lines[40:80]))

    def args(out, *extra):
        a = cmd(out, *extra)
        a[a.index("--max-steps") + 1] = "8"
        a[a.index("--save-every") + 1] = "4"
        return a

    a = tmp_path / "a"
    r = run(args(a, "--eval-data", ev1, "--eval-max", "5"))  # --eval-fraction 0.5 of ARGS: ignored
    data_line = [l for l in r.stderr.splitlines() if l.startswith("ftune: data ")]
    print(data_line[0])
    assert f"eval data {ev1}: " in data_line[0] and "-> 5 eval examples (the first 5" in data_line[0]
    assert r.stderr.count("--eval-fraction 0.5 is ignored with --eval-data") == 1, r.stderr
    sa = json.loads((a / "summary.json").read_text())
    print("summary:", json.dumps(sa))
    assert sa["n_eval"] == 5 and sa["eval_data"] == str(ev1)
    assert sa["initial_eval_loss"] > sa["final_eval_loss"] > 0, sa  # both measured, finite
    _, evals = metrics(a)
    assert [e["step"] for e in evals] == [0, 8]

    b = tmp_path / "b"
    args_b = args(b)
    args_b[args_b.index("--eval-fraction") + 1] = "0"
    run(args_b)
    sb = json.loads((b / "summary.json").read_text())
    assert sb["n_eval"] == 0 and sb["initial_eval_loss"] is None and "eval_data" not in sb
    assert sa["n_train"] == sb["n_train"] > 0, (sa, sb)  # --data not split
    assert adapter_bytes(a) == adapter_bytes(b), "evaluating on --eval-data changed the training"

    c = tmp_path / "c"  # another eval file on resume: allowed, training unchanged
    shutil.copytree(a / "checkpoint-4", c / "checkpoint-4")
    run(args(c, "--eval-data", ev2, "--eval-max", "5", "--resume"))
    sc = json.loads((c / "summary.json").read_text())
    assert sc["resumed_from_step"] == 4 and sc["eval_data"] == str(ev2) and sc["n_eval"] == 5
    assert adapter_bytes(c) == adapter_bytes(a)

    d = tmp_path / "d"  # another --data on resume: refused
    shutil.copytree(a / "checkpoint-4", d / "checkpoint-4")
    args_d = args(d, "--eval-data", ev1, "--eval-max", "5", "--resume")
    args_d[args_d.index("--data") + 1] = str(ev2)
    r = run(args_d, ok=False)
    print(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 1 and "data_fingerprint" in r.stderr, r.stderr
    assert not (d / "adapter_model.safetensors").exists()

    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + '{"instruction": "x"\n' + lines[1])
    # --eval-max 1: the bad record lies after the cap and is still found (the file is checked whole)
    r = run(args(tmp_path / "e", "--eval-data", bad, "--eval-max", "1"), ok=False)
    err = r.stderr.strip().splitlines()[-1]
    print(err)
    assert r.returncode == 1 and err.startswith(f"ftune: --eval-data: {bad}: line 2: "), r.stderr


def test_several_data_files(tmp_path):
    """--data A --data B: the examples of both in the order given, shuffled and split as one,
    so the two halves of DATA train exactly the adapter of DATA itself; the data line and
    summary.json list both; a resume with the same files continues bit-identically, one with
    the files swapped, one removed or one added is refused naming --data."""
    lines = DATA.read_text().splitlines(keepends=True)
    h1, h2 = tmp_path / "h1.jsonl", tmp_path / "h2.jsonl"
    h1.write_text("".join(lines[:100]))
    h2.write_text("".join(lines[100:]))

    def args(out, files, *extra):
        a = cmd(out, *extra)
        a[a.index("--max-steps") + 1] = "4"
        a[a.index("--save-every") + 1] = "2"
        i = a.index("--data")
        a[i:i + 2] = [x for f in files for x in ("--data", str(f))]
        return a

    whole, two = tmp_path / "whole", tmp_path / "two"
    run(args(whole, [DATA]))
    r = run(args(two, [h1, h2]))
    data_line = [l for l in r.stderr.splitlines() if l.startswith("ftune: data ")][0]
    print(data_line)
    assert data_line.startswith(f"ftune: data 2 files ({h1}: 100 records, alpaca; {h2}: 75 records, "
                                "alpaca): 175 records (alpaca, "), data_line
    sw, s2 = (json.loads((o / "summary.json").read_text()) for o in (whole, two))
    assert sw["data"] == str(DATA) and s2["data"] == [str(h1), str(h2)], (sw, s2)
    assert s2["n_train"] == sw["n_train"] and s2["n_eval"] == sw["n_eval"]
    assert adapter_bytes(two) == adapter_bytes(whole), \
        "two halves in order should train as the whole file"

    # --config: "data" may be a list; --data flags replace it rather than add to it
    conf = tmp_path / "conf.json"
    conf.write_text(json.dumps({"data": [str(h1), str(h2)]}))
    cfg_run, cli_run = tmp_path / "cfg", tmp_path / "cli"
    a = args(cfg_run, [h1])
    i = a.index("--data")
    run(a[:i] + a[i + 2:] + ["--config", str(conf)])
    assert adapter_bytes(cfg_run) == adapter_bytes(two)
    run(args(cli_run, [DATA], "--config", str(conf)))
    assert adapter_bytes(cli_run) == adapter_bytes(whole)
    conf.write_text(json.dumps({"data": [str(h1), 3]}))
    r = run(args(tmp_path / "bad", [h1], "--config", str(conf)), ok=False)
    assert r.returncode == 2 and 'key "data": expected a string or a list of strings' in r.stderr, r.stderr

    c = tmp_path / "c"  # the same files: resumes bit-identically
    shutil.copytree(two / "checkpoint-2", c / "checkpoint-2")
    run(args(c, [h1, h2], "--resume"))
    assert adapter_bytes(c) == adapter_bytes(two)
    for name, files in (("swapped", [h2, h1]), ("removed", [h1]), ("added", [h1, h2, h1])):
        d = tmp_path / name
        shutil.copytree(two / "checkpoint-2", d / "checkpoint-2")
        r = run(args(d, files, "--resume"), ok=False)
        err = r.stderr.strip().splitlines()[-1]
        print(name, "->", err[:300])
        assert r.returncode == 1 and "--data differs from the checkpoint's (it trained on " \
            f"{h1}, {h2}; this run reads {', '.join(map(str, files))})" in err, r.stderr
        assert not (d / "adapter_model.safetensors").exists()
