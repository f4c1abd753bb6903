"""Issue 31, classes 7 and 8, on tests/fixtures/tiny-llama. Every subprocess runs under a
timeout.

  7 one run per --out: a folder another live process holds (an ftune run, or a plain flock
    holder with or without its pid written) is refused at once, naming the holder's pid,
    for a fresh run, a bare --resume and a --resume DIR, and the holder's checkpoints stay
    as they were; a stale lock (its process SIGKILLed) is taken over with one line naming
    the dead pid; a finished or failed run leaves no lock file behind. The same for every
    other command that writes a folder: ftune sweep --out, merge --out DIR (safetensors, and
    gguf into a folder) and init-model --out: a held folder refused at once (exit 1, the
    folder and the holder's pid named, nothing in it changed), a stale lock taken over with
    the line, no lock file left anywhere under the folder (trials/, best/) after a normal or
    a failed run, and a failed run into a new folder leaves no folder
  8 every byte of a checkpoint is covered: a byte flipped in any file of the newest
    checkpoint (at its start, middle and end) makes --resume DIR refuse, naming the file,
    and a bare --resume fall back to the earlier intact checkpoint and say so; the final
    adapter is then byte for byte that of the uninterrupted run
"""
import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_helpers import SEED_DATA, TINY, assert_clean_error, ftune_bin, tree

TIMEOUT = 120
BASE = ["--seq-len", "64", "--threads", "1", "--eval-fraction", "0", "--seed", "3"]
CKPT_FILES = ("trainer_state.json", "adapter_config.json", "adapter_model.safetensors",
              "optimizer.safetensors")


def argv(out, *extra):
    return [ftune_bin(), "train", "--model", str(TINY), "--data", str(SEED_DATA),
            "--out", str(out)] + BASE + [str(a) for a in extra]


def ftune(out, *extra):
    return subprocess.run(argv(out, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, errors="replace", timeout=TIMEOUT)


# ---- class 7: the lock ------------------------------------------------------------------

@pytest.mark.parametrize("pid_text", ["4242\n", ""], ids=["pid", "no-pid"])
@pytest.mark.parametrize("mode", ["fresh", "resume", "resume-dir"])
def test_held_folder_refused(tmp_path, pid_text, mode):
    out = tmp_path / "out"
    r = ftune(out, "--max-steps", "2", "--save-every", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    before = tree(out)
    with open(out / ".ftune.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write(pid_text)
        f.flush()
        extra = {"fresh": [], "resume": ["--resume"],
                 "resume-dir": ["--resume", out / "checkpoint-2"]}[mode]
        t0 = time.monotonic()
        r = ftune(out, "--max-steps", "4", "--save-every", "1", *extra)
        assert time.monotonic() - t0 < TIMEOUT
        assert r.returncode == 1, r.stderr
        line = assert_clean_error(r, None, "--out", str(out), "in use by another ftune run",
                                  "pid 4242" if pid_text else "pid unknown")
        assert "model " not in line
        after = tree(out)
        assert after.pop(".ftune.lock") == pid_text.encode()
        assert after == before  # the holder's checkpoints and adapter untouched


def test_stale_lock_taken_over(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    # a pid that cannot be alive: above the kernel's pid_max
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 7
    (out / ".ftune.lock").write_text(f"{dead}\n")
    r = ftune(out, "--max-steps", "2", "--quiet")
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert lines == [f"ftune: --out {out}: took over the stale lock of pid {dead} "
                     "(that run ended without releasing it)"], lines
    assert not (out / ".ftune.lock").exists()
    assert (out / "adapter_model.safetensors").exists()


def test_no_lock_left_behind(tmp_path):
    out = tmp_path / "out"
    assert ftune(out, "--max-steps", "1", "--quiet").returncode == 0
    assert not (out / ".ftune.lock").exists()
    r = ftune(out, "--max-steps", "1", "--resume", out / "nowhere")  # fails after the lock
    assert r.returncode != 0
    assert not (out / ".ftune.lock").exists()
    r = ftune(out, "--max-steps", "1", "--quiet")
    assert r.returncode == 0 and "stale" not in r.stderr, r.stderr


def wait_for(pred, timeout):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_two_live_runs(tmp_path):
    """A real holder: a long run; a second run on its --out is refused naming its pid, and
    after it is SIGKILLed a third one takes the stale lock over, naming that pid."""
    out = tmp_path / "out"
    a = subprocess.Popen(argv(out, "--max-steps", "100000", "--save-every", "50", "--keep", "1",
                              "--quiet"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        lock = out / ".ftune.lock"
        assert wait_for(lambda: lock.exists() and lock.read_text() == f"{a.pid}\n", 60)
        assert wait_for(lambda: any(out.glob("checkpoint-*")), 60)
        r = ftune(out, "--max-steps", "3", "--save-every", "1")
        assert r.returncode == 1, r.stderr
        assert_clean_error(r, None, f"pid {a.pid}", "in use")
        r = ftune(out, "--max-steps", "3", "--resume")
        assert r.returncode == 1 and f"pid {a.pid}" in r.stderr, r.stderr
        assert a.poll() is None  # the holder is still running, undisturbed
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=TIMEOUT)
    r = ftune(out, "--max-steps", "3", "--quiet")
    assert r.returncode == 0, r.stderr
    assert f"took over the stale lock of pid {a.pid}" in r.stderr


# ---- class 7 for the other commands that write a folder -----------------------------------

SWEEP = ["--grid", "lr=1e-3,2e-3", "--max-steps", "2", "--seq-len", "64", "--threads", "1",
         "--seed", "3", "--eval-fraction", "0.2", "--eval-max", "2", "--eval-every", "1"]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    out = tmp_path_factory.mktemp("ad") / "ad"
    r = ftune(out, "--max-steps", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    return out


def folder_argv(cmd, out, adapter, bad=False):
    """argv of a folder-writing command into out; bad: one that fails after the lock (its
    input is wrong in a way found only when it is read)."""
    b = ftune_bin()
    if cmd == "sweep":  # bad: data that is not JSON lines (read after the lock is taken)
        return [b, "sweep", "--model", str(TINY), "--data",
                str(TINY / "config.json" if bad else SEED_DATA), "--out", str(out), *SWEEP]
    if cmd in ("merge", "merge-gguf"):
        fmt = ["--format", "gguf"] if cmd == "merge-gguf" else []
        return [b, "merge", "--model", str(TINY), "--adapter",  # bad: a model, not an adapter
                str(TINY if bad else adapter), "--out", str(out), *fmt]
    if cmd == "init-model":
        cfg = TINY / ("tokenizer.json" if bad else "config.json")  # bad: not a model config
        return [b, "init-model", "--config", str(cfg), "--out", str(out), "--threads", "1"]
    raise ValueError(cmd)


def run_folder(cmd, out, adapter, bad=False):
    return subprocess.run(folder_argv(cmd, out, adapter, bad), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, errors="replace", timeout=TIMEOUT)


def locks_under(out):
    return sorted(str(p) for p in Path(out).rglob(".ftune.lock"))


FOLDER_CMDS = ["sweep", "merge", "merge-gguf", "init-model"]


@pytest.mark.parametrize("pid_text", ["4242\n", ""], ids=["pid", "no-pid"])
@pytest.mark.parametrize("cmd", FOLDER_CMDS)
def test_folder_cmd_held_refused(tmp_path, adapter, cmd, pid_text):
    out = tmp_path / "out"
    r = run_folder(cmd, out, adapter)
    assert r.returncode == 0, r.stderr
    before = tree(out)
    assert before and ".ftune.lock" not in before
    with open(out / ".ftune.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write(pid_text)
        f.flush()
        t0 = time.monotonic()
        r = run_folder(cmd, out, adapter)
        assert time.monotonic() - t0 < 30  # at once: it does not wait for the holder
        assert r.returncode == 1, r.stderr
        assert_clean_error(r, None, f"--out {out} is in use by another ftune run",
                           "pid 4242" if pid_text else "pid unknown", f"{out}/.ftune.lock")
        after = tree(out)
        assert after.pop(".ftune.lock") == pid_text.encode()
        assert after == before  # nothing in the holder's folder changed


@pytest.mark.parametrize("cmd", FOLDER_CMDS)
def test_folder_cmd_stale_lock_taken_over(tmp_path, adapter, cmd):
    out = tmp_path / "out"
    out.mkdir()
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 7  # cannot be alive
    (out / ".ftune.lock").write_text(f"{dead}\n")
    r = run_folder(cmd, out, adapter)
    assert r.returncode == 0, r.stderr
    line = (f"ftune: --out {out}: took over the stale lock of pid {dead} "
            "(that run ended without releasing it)")
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert lines.count(line) == 1 and sum("took over" in l for l in lines) == 1, lines
    assert locks_under(out) == []
    assert len(tree(out)) > 0


@pytest.mark.parametrize("cmd", FOLDER_CMDS)
def test_folder_cmd_no_lock_left_behind(tmp_path, adapter, cmd):
    out = tmp_path / "out"
    r = run_folder(cmd, out, adapter)
    assert r.returncode == 0, r.stderr
    assert locks_under(out) == []
    if cmd == "sweep":  # the published artefacts: every trial's folder, best/, report.html
        assert (out / "best" / "adapter_model.safetensors").exists()
        assert sorted(p.name for p in (out / "best").iterdir()) == [
            "adapter_config.json", "adapter_model.safetensors"]
    r = run_folder(cmd, out, adapter)  # a second run over the first: no lock met, none left
    assert r.returncode == 0 and "took over" not in r.stderr, r.stderr
    assert locks_under(out) == []
    new = tmp_path / "new"
    r = run_folder(cmd, new, adapter, bad=True)  # fails after taking the lock
    assert r.returncode == 1, r.stderr
    assert "in use" not in r.stderr and "took over" not in r.stderr, r.stderr
    assert not new.exists()  # the folder it made for the lock is removed again, empty
    r = run_folder(cmd, out, adapter, bad=True)
    assert r.returncode == 1, r.stderr
    assert locks_under(out) == []


@pytest.mark.parametrize("cmd", FOLDER_CMDS + ["train"])
def test_folder_cmd_out_is_a_file(tmp_path, adapter, cmd):
    out = tmp_path / "out"
    out.write_text("not a folder\n")
    r = (ftune(out, "--max-steps", "1") if cmd == "train" else run_folder(cmd, out, adapter))
    assert r.returncode == 1, r.stderr
    assert_clean_error(r, None, f"--out {out} is a file, not a folder")
    assert out.read_text() == "not a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# ---- class 8: every byte of a checkpoint checked -----------------------------------------

STEPS = ["--max-steps", "6", "--save-every", "2", "--keep", "3", "--quiet"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run and its checkpoints 2, 4, 6."""
    out = tmp_path_factory.mktemp("ref") / "out"
    r = ftune(out, *STEPS)
    assert r.returncode == 0, r.stderr
    return out


def flip(path, where):
    b = bytearray(path.read_bytes())
    i = {"start": 0, "middle": len(b) // 2, "end": len(b) - 1}[where]
    b[i] ^= 0x01
    path.write_bytes(bytes(b))
    return i


@pytest.mark.parametrize("where", ["start", "middle", "end"])
@pytest.mark.parametrize("name", CKPT_FILES)
def test_flipped_byte(tmp_path, reference, name, where):
    out = tmp_path / "out"
    r = ftune(out, *STEPS)
    assert r.returncode == 0, r.stderr
    ck = out / "checkpoint-6"
    flip(ck / name, where)
    damaged = tree(ck)
    r = ftune(out, *STEPS, "--resume", ck)
    assert r.returncode == 1, r.stderr
    assert_clean_error(r, None, f"{ck}/{name}")
    assert tree(ck) == damaged  # refused, nothing rewritten
    r = ftune(out, *STEPS, "--resume")
    assert r.returncode == 0, r.stderr
    assert (f"ftune: --resume: {ck} is damaged ({ck}/{name}" in r.stderr and
            "resuming from the earlier intact checkpoint-4" in r.stderr), r.stderr
    ref = reference / "adapter_model.safetensors"
    assert (out / "adapter_model.safetensors").read_bytes() == ref.read_bytes()
    for f in ("adapter_model.safetensors", "optimizer.safetensors"):  # the step-6 one again
        assert (out / "checkpoint-6" / f).read_bytes() == (reference / "checkpoint-6" / f).read_bytes()
