"""`ftune train --tensorboard` (src/formats/tfevents.c, src/train/metrics.c): the event files
read back with the `tensorboard` package, as TensorBoard itself reads them.

- a 10-step run with evals: every scalar of metrics.jsonl is in the event file under its tag
  (train/<key>, eval/<key less eval_>, and eval/perplexity = exp(eval_loss)) at its step,
  equal to the float32 of the number metrics.jsonl holds, and nothing else is; every record
  passes TensorBoard's record reader's CRC checks; the file is named as TensorFlow names it
  and starts with the file_version event;
- a run killed with SIGKILL mid-training leaves a file whose every record is whole, holding
  every line of metrics.jsonl but at most the last;
- a run resumed from a mid-run checkpoint writes a second event file; TensorBoard's reader
  (purge_orphaned_data, the default) then shows exactly the final metrics.jsonl;
- metrics.jsonl is byte-identical with and without --tensorboard (its elapsed_s and
  tokens_per_s aside, which are wall-clock figures).
"""
import glob
import json
import math
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from cli_helpers import SEED_DATA, TINY, ftune_bin

np = pytest.importorskip("numpy")
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator")
tb_records = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")
tb_errors = pytest.importorskip("tensorboard.compat.tensorflow_stub.errors")
event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")

ARGS = ["--seq-len", "64", "--threads", "2", "--seed", "7", "--eval-fraction", "0.2",
        "--eval-max", "8", "--warmup-steps", "2"]
TIMEOUT = 300
WALL_CLOCK = ("elapsed_s", "tokens_per_s")  # differ between two runs of the same command


def train(out, *extra, ok=True):
    r = subprocess.run([ftune_bin(), "train", "--model", str(TINY), "--data", str(SEED_DATA),
                        "--out", str(out)] + ARGS + [str(a) for a in extra],
                       capture_output=True, text=True, timeout=TIMEOUT)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def jsonl_rows(out):
    """The complete lines of OUT/metrics.jsonl (a torn last line is left out)."""
    txt = (Path(out) / "metrics.jsonl").read_text()
    return [json.loads(l) for l in txt.split("\n")[:-1]]


def expected_scalars(rows):
    """{(tag, step): float32} of metrics.jsonl rows, as ft_metrics_tensorboard names them."""
    exp = {}
    for r in rows:
        is_eval = "eval_loss" in r
        for k, v in r.items():
            if k == "step" or isinstance(v, bool) or not (v is None or isinstance(v, (int, float))):
                continue
            tag = ("eval/" + (k[5:] if k.startswith("eval_") else k)) if is_eval else "train/" + k
            x = math.nan if v is None else float(v)
            assert (tag, r["step"]) not in exp, (tag, r["step"])
            exp[(tag, r["step"])] = np.float32(x)
            if k == "eval_loss":
                exp[("eval/perplexity", r["step"])] = np.float32(math.exp(x))
    return exp


def tb_scalars(tb_dir):
    """{(tag, step): float32} as TensorBoard's EventAccumulator reads tb_dir (every event,
    no sampling), asserting no tag has two values at one step."""
    acc = event_accumulator.EventAccumulator(str(tb_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            assert (tag, e.step) not in got, (tag, e.step)
            got[(tag, e.step)] = np.float32(e.value)
    return got


def same(a, b):
    return (np.isnan(a) and np.isnan(b)) or a == b


def records(path):
    """The Event protos of one file through TensorBoard's record reader, which checks the
    length and data CRC-32Cs of every record (DataLossError on a mismatch or a torn
    record)."""
    reader = tb_records.PyRecordReader_New(str(path))
    evs = []
    while True:
        try:
            reader.GetNext()
        except tb_errors.OutOfRangeError:
            return evs
        ev = event_pb2.Event()
        ev.ParseFromString(reader.record())
        evs.append(ev)


def event_files(tb_dir):
    return sorted(glob.glob(os.path.join(str(tb_dir), "events.out.tfevents.*")))


def test_scalars_equal_metrics(tmp_path):
    out = tmp_path / "run"
    t0 = int(time.time())
    train(out, "--max-steps", "10", "--eval-every", "5", "--tensorboard")
    files = event_files(out / "tb")  # the default folder: OUT/tb
    assert len(files) == 1, files
    m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)", os.path.basename(files[0]))
    assert m and m.group(2) == socket.gethostname(), files[0]
    assert t0 - 1 <= int(m.group(1)) <= time.time() + 1
    evs = records(files[0])
    assert evs[0].file_version == "brain.Event:2"
    assert evs[1].session_log.status == event_pb2.SessionLog.START and evs[1].step == 0
    rows = jsonl_rows(out)
    assert len(evs) == 2 + len(rows)  # one event per metrics.jsonl line
    assert sum("loss" in r for r in rows) == 10 and sum("eval_loss" in r for r in rows) == 3
    exp, got = expected_scalars(rows), tb_scalars(out / "tb")
    assert set(got) == set(exp), set(got) ^ set(exp)
    bad = [(k, exp[k], got[k]) for k in exp if not same(exp[k], got[k])]
    assert not bad, bad[:5]
    tags = {t for t, _ in got}
    for t in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/bad_steps",
              "eval/loss", "eval/perplexity"):
        assert t in tags, (t, sorted(tags))
    print(f"{len(got)} scalars in {len(tags)} tags equal to metrics.jsonl ({len(rows)} lines)")

    # metrics.jsonl is the same without --tensorboard
    plain = tmp_path / "plain"
    train(plain, "--max-steps", "10", "--eval-every", "5")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]
    assert strip(jsonl_rows(plain)) == strip(rows)
    assert not (plain / "tb").exists()


def test_explicit_dir_and_resume(tmp_path):
    """--tensorboard DIR; a run resumed from its mid-run checkpoint adds a second file and
    TensorBoard's reader shows the final metrics.jsonl, no step twice."""
    out, tb = tmp_path / "run", tmp_path / "board"
    train(out, "--max-steps", "10", "--eval-every", "2", "--save-every", "4", "--keep", "0",
          "--tensorboard", tb)
    assert not (out / "tb").exists() and len(event_files(tb)) == 1
    assert (out / "checkpoint-4").is_dir()
    train(out, "--max-steps", "10", "--eval-every", "2", "--save-every", "4", "--keep", "0",
          "--tensorboard", tb, "--resume", out / "checkpoint-4")
    files = event_files(tb)
    assert len(files) == 2, files
    rows = jsonl_rows(out)
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 11))
    exp, got = expected_scalars(rows), tb_scalars(tb)
    assert set(got) == set(exp), set(got) ^ set(exp)
    assert all(same(exp[k], got[k]) for k in exp)
    # the second file alone holds the whole run: the kept lines, then the new ones
    assert len(records(files[1])) == 2 + len(rows)


def test_sigkill_leaves_readable_file(tmp_path):
    out = tmp_path / "killed"
    p = subprocess.Popen([ftune_bin(), "train", "--model", str(TINY), "--data", str(SEED_DATA),
                          "--out", str(out), "--max-steps", "100000", "--eval-every", "7",
                          "--save-every", "0", "--tensorboard"] + ARGS,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + TIMEOUT
        path = out / "metrics.jsonl"
        while time.time() < deadline and p.poll() is None:
            if path.exists() and path.read_text().count("\n") >= 30:
                break
            time.sleep(0.05)
        assert p.poll() is None, "the run ended before it was killed"
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    files = event_files(out / "tb")
    assert len(files) == 1
    evs = records(files[0])  # every record whole: no DataLossError
    rows = jsonl_rows(out)
    assert len(rows) >= 30
    # a crash loses at most one line: the one written to metrics.jsonl and not yet here
    assert len(rows) - 1 <= len(evs) - 2 <= len(rows), (len(rows), len(evs))
    exp, got = expected_scalars(rows), tb_scalars(out / "tb")
    assert set(got) <= set(exp)
    last = rows[-1]["step"]
    missing = {k for k in exp if k not in got}
    assert all(s == last for _, s in missing), sorted(missing)[:5]
    assert all(same(exp[k], got[k]) for k in got)
    print(f"killed after {len(rows)} metrics lines: {len(evs) - 2} events, all records whole")
