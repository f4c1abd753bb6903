"""Data from pipes, standard input and gzip files (src/core/fsutil.c ft_read_input), through
the CLI on tests/fixtures/tiny-llama with the bundled Alpaca seed tasks:

  - `train --data` of the file, of its .gz (one member, and two concatenated as `cat a.gz b.gz`
    writes), of `-` (the bytes on stdin, as `zcat x.gz | ftune --data -`; also gzip bytes on
    stdin) and of /dev/fd/N (a pipe passed to the child, as bash's `<(cmd)` passes it) writes
    bit-identical adapter_model.safetensors (2 steps); a control with another seed differs;
  - `--eval-data -` evaluates as `--eval-data FILE` does;
  - `tokenize --data`/`--texts` and `generate --prompts` read `-` and .gz as the file;
  - two inputs named `-` are a usage error naming both flags; a corrupt .gz, a bad record on
    stdin and a FIFO with no writer are one clean error line each (the FIFO's at once: it used
    to hang in open()).
"""
import gzip
import json
import os
import subprocess
import threading
import time

import pytest

from cli_helpers import SEED_DATA, TINY, assert_clean_error, ftune_bin

TRAIN = ["--seq-len", "64", "--batch-size", "2", "--max-steps", "2", "--threads", "1",
         "--eval-fraction", "0", "--seed", "5", "--quiet"]


def ftune(args, stdin=None, pass_fds=(), timeout=300):
    """Runs ftune with args; stdin: bytes for its standard input (None: /dev/null)."""
    return subprocess.run([ftune_bin()] + [str(a) for a in args], input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, timeout=timeout, pass_fds=pass_fds)


def text(r):
    return r.stderr.decode(errors="replace")


class PipeFd:
    """A pipe whose read end the child gets as /dev/fd/N; a thread writes `data` (more than a
    pipe buffer holds) into the write end, then closes it."""

    def __init__(self, data):
        self.r, w = os.pipe()

        def feed():
            with os.fdopen(w, "wb") as f:
                for i in range(0, len(data), 4096):
                    f.write(data[i:i + 4096])

        self.t = threading.Thread(target=feed, daemon=True)

    def __enter__(self):
        self.t.start()
        return self

    def path(self):
        return f"/dev/fd/{self.r}"

    def __exit__(self, *exc):
        os.close(self.r)  # the writer then ends (EPIPE) if the child did not read everything
        self.t.join(timeout=30)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    raw = SEED_DATA.read_bytes()
    lines = raw.splitlines(keepends=True)
    half = sum(len(l) for l in lines[: len(lines) // 2])
    (d / "train.jsonl").write_bytes(raw)
    (d / "train.jsonl.gz").write_bytes(gzip.compress(raw))
    (d / "two.jsonl.gz").write_bytes(gzip.compress(raw[:half]) + gzip.compress(raw[half:]))
    (d / "gz-without-suffix.jsonl").write_bytes(gzip.compress(raw))
    return d, raw


def adapter(out):
    return (out / "adapter_model.safetensors").read_bytes()


def train(tmp, name, data_arg, stdin=None, pass_fds=(), extra=()):
    out = tmp / name
    r = ftune(["train", "--model", TINY, "--data", data_arg, "--out", out, *TRAIN, *extra],
              stdin=stdin, pass_fds=pass_fds)
    assert r.returncode == 0, text(r)
    return out


def test_train_inputs_bit_identical(data, tmp_path):
    d, raw = data
    ref_out = train(tmp_path, "file", d / "train.jsonl")
    ref, n_train = adapter(ref_out), json.loads((ref_out / "summary.json").read_text())["n_train"]
    got = {
        "gz": train(tmp_path, "gz", d / "train.jsonl.gz"),
        "two-members": train(tmp_path, "two", d / "two.jsonl.gz"),
        "gz-by-magic": train(tmp_path, "magic", d / "gz-without-suffix.jsonl"),
        "stdin": train(tmp_path, "stdin", "-", stdin=raw),
        "stdin-gz": train(tmp_path, "stdin-gz", "-", stdin=gzip.compress(raw)),
    }
    with PipeFd(raw) as p:
        got["dev-fd"] = train(tmp_path, "fd", p.path(), pass_fds=(p.r,))
    with PipeFd(gzip.compress(raw)) as p:
        got["dev-fd-gz"] = train(tmp_path, "fd-gz", p.path(), pass_fds=(p.r,))
    for k, out in got.items():
        assert adapter(out) == ref, f"--data {k}: adapter differs from --data FILE's"
        s = json.loads((out / "summary.json").read_text())
        assert s["n_train"] == n_train, (k, s["n_train"])
    # control: the comparison can fail
    other = train(tmp_path, "seed", d / "train.jsonl", extra=["--seed", "6"])
    assert adapter(other) != ref


def test_eval_data_stdin(data, tmp_path):
    d, raw = data
    ev = ["--eval-every", "1", "--eval-max", "8"]
    a = train(tmp_path, "a", d / "train.jsonl", extra=["--eval-data", d / "train.jsonl", *ev])
    b = train(tmp_path, "b", d / "train.jsonl.gz", extra=["--eval-data", "-", *ev], stdin=raw)
    sa, sb = (json.loads((o / "summary.json").read_text()) for o in (a, b))
    assert sa["final_eval_loss"] == sb["final_eval_loss"] and sa["n_eval"] == sb["n_eval"] == 8
    assert adapter(a) == adapter(b)


def test_stdin_twice_is_usage_error(data, tmp_path):
    d, raw = data
    for args, needles in ((["--data", "-", "--eval-data", "-"], ["--data -", "--eval-data -"]),
                          (["--data", "-", "--data", "-"], ["--data - is given twice"]),
                          (["--data", d / "train.jsonl", "--data", "-", "--eval-data", "-"],
                           ["--data -", "--eval-data -"])):
        r = ftune(["train", "--model", TINY, *args, "--out", tmp_path / "o", *TRAIN], stdin=raw)
        print(text(r))
        assert r.returncode == 2
        for n in needles + ["standard input"]:
            assert n in text(r), (n, text(r))
    r = ftune(["tokenize", "--model", TINY, "--data", "-", "--data", "-"], stdin=raw)
    assert r.returncode == 2 and "standard input can be read once" in text(r), text(r)


def test_bad_inputs_clean_errors(data, tmp_path):
    d, raw = data
    z = gzip.compress(raw)
    bad = bytearray(z)
    bad[-8] ^= 0xFF  # the CRC-32 of the trailer
    (tmp_path / "bad.jsonl.gz").write_bytes(bytes(bad))
    (tmp_path / "cut.jsonl.gz").write_bytes(z[: len(z) // 2])
    cases = [
        (["--data", tmp_path / "bad.jsonl.gz"], None,
         [f"bad.jsonl.gz: gzip data corrupt at byte {len(z) - 4}", "incorrect data check"]),
        (["--data", tmp_path / "cut.jsonl.gz"], None,
         [f"cut.jsonl.gz: gzip data truncated at byte {len(z) // 2}"]),
        (["--data", "-"], raw + b'{"instruction": "x", "output": \n', ["<stdin>: line 176"]),
    ]
    for args, stdin, needles in cases:
        out = tmp_path / "o"
        r = ftune(["train", "--model", TINY, *args, "--out", out, *TRAIN], stdin=stdin)
        r.stderr = text(r)
        assert_clean_error(r, out, *needles)
    # a FIFO with no writer: refused at once (--timeout of this call: a hang fails the test)
    fifo = tmp_path / "data.fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    r = ftune(["train", "--model", TINY, "--data", fifo, "--out", tmp_path / "o", *TRAIN], timeout=60)
    dt = time.monotonic() - t0
    r.stderr = text(r)
    assert_clean_error(r, tmp_path / "o", str(fifo), "a FIFO with no writer")
    print(f"FIFO with no writer: {dt:.2f} s")


def test_tokenize_stdin_and_gz(data):
    d, raw = data
    want = ftune(["tokenize", "--model", TINY, "--data", d / "train.jsonl"])
    assert want.returncode == 0, text(want)
    assert want.stdout.count(b"\n") == 175
    for args, stdin in ((["--data", "-"], raw), (["--data", d / "train.jsonl.gz"], None),
                        (["--data", "-"], gzip.compress(raw))):
        r = ftune(["tokenize", "--model", TINY, *args], stdin=stdin)
        assert r.returncode == 0, text(r)
        assert r.stdout == want.stdout, args
    texts = b"".join(json.dumps(json.loads(l)["instruction"]).encode() + b"\n"
                     for l in raw.splitlines()[:20])
    a = ftune(["tokenize", "--model", TINY, "--texts", "-"], stdin=texts)
    with PipeFd(gzip.compress(texts)) as p:
        b = ftune(["tokenize", "--model", TINY, "--texts", p.path()], pass_fds=(p.r,))
    assert a.returncode == 0 and b.returncode == 0, text(a) + text(b)
    assert a.stdout == b.stdout and a.stdout.count(b"\n") == 20
    r = ftune(["tokenize", "--model", TINY, "--texts", "-"], stdin=b'"ok"\nnot json\n')
    assert r.returncode == 1 and "<stdin>: line 2" in text(r), text(r)


def test_generate_prompts_stdin(tmp_path):
    recs = ["Name three colors.", {"prompt": "Say hi.", "system": "Be brief."}]
    body = "".join(json.dumps(x) + "\n" for x in recs).encode()
    f = tmp_path / "p.jsonl"
    f.write_bytes(body)
    (tmp_path / "p.jsonl.gz").write_bytes(gzip.compress(body))
    args = ["generate", "--model", TINY, "--max-new-tokens", "4", "--temperature", "0", "--threads", "1"]
    def replies(r):  # every field but the timing
        return [{k: v for k, v in json.loads(l).items() if k != "seconds"} for l in r.stdout.splitlines()]

    want = ftune(args + ["--prompts", f])
    assert want.returncode == 0, text(want)
    assert len(replies(want)) == 2
    for p, stdin in (("-", body), (tmp_path / "p.jsonl.gz", None), ("-", gzip.compress(body))):
        r = ftune(args + ["--prompts", p], stdin=stdin)
        assert r.returncode == 0, text(r)
        assert replies(r) == replies(want), p
    r = ftune(args + ["--prompts", "-"], stdin=b'"ok"\n{"prompt": \n')
    assert r.returncode == 1 and "<stdin>: line 2" in text(r), text(r)


def test_resume_from_stdin(data, tmp_path):
    """A resume checks the data by the fingerprint of its tokenized examples (it does not
    read the file again by name): a run on stdin resumes from the same bytes piped again,
    here gzip-compressed, bit-identical to the uninterrupted run."""
    d, raw = data
    steps = ["--max-steps", "4", "--save-every", "2", "--keep", "0"]
    a = train(tmp_path, "a", "-", stdin=raw, extra=steps)
    r = ftune(["train", "--model", TINY, "--data", "-", "--out", tmp_path / "b", *TRAIN, *steps,
               "--resume", a / "checkpoint-2"], stdin=gzip.compress(raw))
    assert r.returncode == 0, text(r)
    assert adapter(tmp_path / "b") == adapter(a)
    # control: other data piped in is refused by the fingerprint
    r = ftune(["train", "--model", TINY, "--data", "-", "--out", tmp_path / "c", *TRAIN, *steps,
               "--resume", a / "checkpoint-2"], stdin=b"".join(raw.splitlines(keepends=True)[:120]))
    assert r.returncode == 1 and "--data differs from the checkpoint's" in text(r), text(r)
