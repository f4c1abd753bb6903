"""Helpers for the CLI-level reference tests (test_cli_errors.py, test_train_e2e.py,
test_chat_ref.py, test_resume.py, test_early_stop.py, test_dpo_ref.py, ...): locating and
running the ftune binary, copying the tiny-llama fixture, reading a training run's outputs
(metrics.jsonl, summary.json, the adapter, checkpoint-N folders), and checking the bad-input
contract (one "ftune: " line naming the file and the position, a non-zero exit that is not a
signal, no adapter under the final name), and reading a running process's pipes without
Python's read-ahead buffer (wait_output, read_until, drain: os.read on the descriptor).
"""
import json
import os
import select
import shutil
import struct
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "tiny-llama"
TINY_GGUF = ROOT / "tests" / "fixtures" / "gguf" / "tiny-llama.gguf"
TOKENIZERS = ROOT / "tests" / "fixtures" / "tokenizers"
SEED_DATA = ROOT / "examples" / "data" / "alpaca-seed-tasks" / "alpaca_seed_175.jsonl"
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
# stderr lines the trainer prints before it can fail (progress, not errors; --quiet drops them)
INFO_PREFIXES = ("ftune: model ", "ftune: data ", "ftune: plan: ")


def ftune_path():
    """FTUNE_BIN (a relative path is taken from the repository root) or build/ftune, as a
    str; not checked (a module constant may hold it before the binary is built)."""
    b = Path(os.environ.get("FTUNE_BIN") or "build/ftune")
    return str(b if b.is_absolute() else ROOT / b)


def ftune_bin():
    """ftune_path(), asserted to exist."""
    b = ftune_path()
    assert Path(b).exists(), f"ftune binary not found at {b} (build it, or set FTUNE_BIN)"
    return b


def run_ftune(args, cwd=None, timeout=300):
    """Runs ftune with args (converted to str); returns the CompletedProcess (text mode)."""
    return subprocess.run([ftune_bin()] + [str(a) for a in args], cwd=cwd, capture_output=True,
                          text=True, encoding="utf-8", errors="replace", timeout=timeout)


def run_argv(argv, env=None, ok=True, timeout=300):
    """Runs a whole command line (argv[0] included) in text mode; with ok, asserts exit 0
    (the message is its stderr). Returns the CompletedProcess."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def metrics(out):
    """The rows of OUT/metrics.jsonl: (step rows, those with "loss"; eval rows, "eval_loss")."""
    rows = [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r], [r for r in rows if "eval_loss" in r]


def summary(out):
    """OUT/summary.json as a dict."""
    return json.loads((Path(out) / "summary.json").read_text())


def adapter_bytes(folder):
    """The bytes of FOLDER/adapter_model.safetensors."""
    return (Path(folder) / "adapter_model.safetensors").read_bytes()


def tree(out):
    """Bytes of every file under out, by relative path."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(Path(out).rglob("*"))
            if p.is_file()}


def max_ckpt(out):
    """Highest step of the checkpoint-N folders of out (0 if none, or no out yet)."""
    try:
        return max([int(d.name.split("-")[1]) for d in Path(out).iterdir()
                    if d.name.startswith("checkpoint-")] or [0])
    except FileNotFoundError:
        return 0


def model_copy(tmp, src=TINY, name="model"):
    """A private copy of a model folder with symlinks (the tokenizer files) resolved."""
    dst = Path(tmp) / name
    shutil.copytree(src, dst, symlinks=False)
    return dst


def stderr_lines(r):
    return [l for l in r.stderr.splitlines() if l.strip()]


def assert_clean_error(r, out, *needles):
    """The bad-input contract for one run: exit 0 < rc < 128 (an error, not a signal such as
    SIGSEGV = -11 from subprocess or 128+n from a shell), exactly one non-progress stderr
    line, starting "ftune: " and containing every needle, and no adapter file in `out`.
    Returns the error line."""
    lines = stderr_lines(r)
    print("stderr:", r.stderr.strip())
    assert 0 < r.returncode < 128, f"exit status {r.returncode} (negative: killed by a signal)"
    errs = [l for l in lines if not l.startswith(INFO_PREFIXES)]
    assert len(errs) == 1, f"expected one error line on stderr, got {lines}"
    assert lines[-1] == errs[0], f"the error is not the last stderr line: {lines}"
    line = errs[0]
    assert line.startswith("ftune: "), line
    assert "(null)" not in line and not line.rstrip().endswith(":"), f"incomplete message: {line}"
    for n in needles:
        assert str(n) in line, f"{n!r} not in {line!r}"
    if out is not None:
        for f in ADAPTER_FILES:
            assert not (Path(out) / f).exists(), f"{f} written to {out} despite the error"
    return line


def st_read(path):
    """(header length, header dict, data bytes) of a safetensors file."""
    b = Path(path).read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return n, json.loads(b[8:8 + n]), b[8 + n:]


def st_write(path, header, data):
    """Writes a safetensors file: u64 LE header length, the JSON header padded with spaces to
    a multiple of 8 (safetensors' own writer does the same), the data bytes."""
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(hb)) + hb + data)
    return len(hb)


def wait_output(stream, timeout):
    """Blocks until `stream` (a pipe) has data, or timeout seconds; returns its first bytes."""
    r, _, _ = select.select([stream], [], [], timeout)
    return os.read(stream.fileno(), 4096) if r else b""


def read_until(stream, needle, timeout):
    """The bytes of `stream` (a pipe) up to and including the first read that holds needle."""
    got = b""
    while needle not in got:
        chunk = wait_output(stream, timeout)
        assert chunk, f"no {needle!r} within {timeout} s: {got!r}"
        got += chunk
    return got


def drain(stream):
    """What `stream` (a pipe) holds now, without waiting."""
    got = b""
    while select.select([stream], [], [], 0)[0]:
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            break
        got += chunk
    return got


def mpi_skip_reason(ftune):
    """Why the MPI tests cannot run with the ftune binary at `ftune` (None when they can):
    no mpirun, no binary, or a binary built without MPI."""
    if not shutil.which("mpirun"):
        return "mpirun not found (Debian: openmpi-bin, libopenmpi-dev; scripts/deps.sh installs them)"
    if not Path(ftune).exists():
        return f"{ftune} not built"
    ldd = subprocess.run(["ldd", str(ftune)], capture_output=True, text=True).stdout
    if "libmpi" not in ldd:
        return "ftune was built without MPI (the Makefile's [ftune] line says mpi=NO)"
    return None
