"""`ftune eval --per-example FILE` (cli/cmd_eval.c) on tests/fixtures/tiny-llama (no chat
template: the Alpaca prompt) with records of the bundled Alpaca seed tasks:

  - one line per example in data-file order: two --data files (JSONL, then a JSON array;
    each example's JSONL "line", null in the array), a bad record skipped with --skip-bad-records (its index missing, the next ones counted on),
    a blank JSONL line (not a record), a record whose answer starts past --seq-len (dropped:
    no line, counted in the summary's "dropped"), records cut to --seq-len ("truncated");
    each line's "tokens" and "truncated" as computed here from `ftune tokenize --data` (the
    labels != -100 after the next-token shift within the first --seq-len tokens);
  - each line's loss equals `ftune eval` of a one-record file holding just that record;
  - the lines' nll-weighted mean is the summary's loss and their nll sum its "nll"; the
    summary line is the same with and without the flag; with `-` the lines go to stdout and
    the summary to stderr;
  - --batch-size 1 and 4 (examples packed together) give the same per-example numbers;
  - FILE is complete or absent: a failing run leaves no FILE (an existing one untouched) and
    no temporary file; bad --per-example paths and --method dpo are refused, naming them;
  - one case on --device cpu-device (the executor's device mode), as the existing eval tests.

The device: FTUNE_DEVICE (tests/run_tests.sh sets cpu), else cpu, never "auto".
"""
import json
import math
import os
from pathlib import Path

import pytest

from cli_helpers import SEED_DATA, TINY, assert_clean_error, run_ftune

DEVICE = os.environ.get("FTUNE_DEVICE") or "cpu"
SEQ = 128
BASE = ["--model", TINY, "--seq-len", str(SEQ), "--threads", "1"]
# The lines' nll (each example's head alone) vs the summary's (the micro-batch's head): the
# LM head's fp32 GEMM over another row count rounds a row's logits otherwise now and then,
# and the double sums run in another order (test_exec.c measured up to 7e-10 relative on one
# micro-batch; the whole file's sum averages such differences).
TOL_NLL_REL = 1e-9
# The summary prints loss with 6 decimals: half a unit of the last one.
TOL_PRINT = 5e-7
# One example in a micro-batch of its own vs packed with others, or vs a one-record file:
# the same rows through GEMMs of other row counts (fp32 rounding, ~1e-8 measured; bf16
# products on cpu-device ~5e-8).
TOL_EXAMPLE_REL = 1e-5

LONG_PROMPT = " ".join(["Describe the history of every town and river in this long list."] * 12)
LONG_ANSWER = " ".join(["The answer goes on and on with many words."] * 20)


def seed_records(n):
    with open(SEED_DATA) as f:
        return [json.loads(l) for l in f.read().splitlines()[:n]]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """File A (JSONL): records 0..7 with record 3 a bad line, a blank line after record 5,
    record 5's answer past --seq-len (dropped), record 1 with a long answer (truncated).
    File B (JSON array): 3 records. good_a: A's good records in order, for `tokenize`."""
    d = tmp_path_factory.mktemp("per_example")
    recs = seed_records(12)
    a = [dict(r) for r in recs[:8]]
    a[1]["output"] = LONG_ANSWER
    a[5] = {"instruction": LONG_PROMPT, "input": "", "output": "Fine."}
    lines = []
    for i, r in enumerate(a):
        lines.append("{oops" if i == 3 else json.dumps(r))
        if i == 5:
            lines.append("")
    pa = d / "a.jsonl"
    pa.write_text("\n".join(lines) + "\n")
    pb = d / "b.json"
    pb.write_text(json.dumps(recs[8:11], indent=1))
    good_a = d / "good_a.jsonl"
    good_a.write_text("".join(json.dumps(r) + "\n" for i, r in enumerate(a) if i != 3))
    return {"dir": d, "a": pa, "b": pb, "a_recs": a, "b_recs": recs[8:11], "good_a": good_a}


def ftune_eval(args, ok=True):
    r = run_ftune(["eval", *BASE, "--device", DEVICE, *args], timeout=300)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def summary_of(text):
    lines = [l for l in text.splitlines() if l.strip()]
    assert len(lines) == 1, text
    return json.loads(lines[0])


def read_lines(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines()]


def expected(file_path, n_records, skip=()):
    """(record, tokens, truncated) of each example of a file whose good records are
    tokenized by `ftune tokenize --data` (file order, no truncation), the bad indices in
    skip; examples without a scored token within SEQ are left out."""
    src = file_path
    r = run_ftune(["tokenize", "--model", TINY, "--data", src], timeout=120)
    assert r.returncode == 0, r.stderr
    toks = [json.loads(l) for l in r.stdout.splitlines()]
    good = [i for i in range(n_records) if i not in skip]
    assert len(toks) == len(good)
    out = []
    for rec, t in zip(good, toks):
        n = len(t["ids"])
        labels = t["labels"][:SEQ]
        scored = sum(1 for x in labels[1:] if x != -100)
        if scored:
            out.append((rec, scored, n > SEQ))
    return out


@pytest.fixture(scope="module")
def two_files(data):
    """The eval of A then B with --skip-bad-records: (summary, lines, the stdout summary of
    the same command without the flag)."""
    out = data["dir"] / "lines.jsonl"
    common = ["--data", data["a"], "--data", data["b"], "--skip-bad-records"]
    r = ftune_eval(common + ["--per-example", out])
    plain = ftune_eval(common)
    return summary_of(r.stdout), read_lines(out), plain.stdout, r.stdout


def test_order_records_tokens(data, two_files):
    s, lines, _, _ = two_files
    want_a = expected(data["good_a"], 8, skip=(3,))
    b_file = data["b"]
    want_b = expected(b_file, 3)
    got = [(l["file"], l["record"], l["tokens"], l["truncated"]) for l in lines]
    want = [(str(data["a"]), *w) for w in want_a] + [(str(b_file), *w) for w in want_b]
    print("lines:", got)
    assert got == want
    recs_a = [l["record"] for l in lines if l["file"] == str(data["a"])]
    assert recs_a == [0, 1, 2, 4, 6, 7]  # 3 bad (skipped), 5 dropped, the blank line no record
    assert [l["record"] for l in lines if l["file"] == str(b_file)] == [0, 1, 2]
    # the JSONL line of each (the blank line after record 5 moves 6 and 7 down); none in an array
    assert [l["line"] for l in lines if l["file"] == str(data["a"])] == [1, 2, 3, 5, 8, 9]
    assert [l["line"] for l in lines if l["file"] == str(b_file)] == [None, None, None]
    assert any(l["truncated"] for l in lines) and not all(l["truncated"] for l in lines)
    assert lines[1]["truncated"] and lines[1]["record"] == 1  # the long answer
    assert s["examples"] == len(lines) == 9 and s["skipped"] == 1 and s["dropped"] == 1
    for l in lines:
        assert set(l) == {"file", "record", "line", "tokens", "loss", "nll", "truncated"}
        assert l["tokens"] >= 1 and math.isfinite(l["loss"])
        assert abs(l["loss"] - l["nll"] / l["tokens"]) <= 1e-15 * abs(l["loss"]) + 1e-15


def test_mean_equals_summary(two_files):
    s, lines, _, _ = two_files
    nll = math.fsum(l["nll"] for l in lines)
    tokens = sum(l["tokens"] for l in lines)
    rel = abs(nll - s["nll"]) / s["nll"]
    print(f"lines' nll sum {nll!r} vs summary {s['nll']!r}: rel {rel:.3g}")
    assert tokens == s["tokens"]
    assert rel <= TOL_NLL_REL
    assert abs(nll / tokens - s["loss"]) <= TOL_PRINT + TOL_NLL_REL * s["loss"]


def test_summary_unchanged_by_flag(data, two_files):
    _, lines, plain, flagged = two_files
    assert flagged == plain  # the same summary line, byte for byte
    # "-": the lines on stdout, the summary on stderr
    r = ftune_eval(["--data", data["a"], "--data", data["b"], "--skip-bad-records",
                    "--per-example", "-"])
    assert [json.loads(l) for l in r.stdout.splitlines()] == lines
    assert summary_of(r.stderr) == summary_of(plain)


def test_line_equals_single_record_eval(data, two_files):
    _, lines, _, _ = two_files
    picks = [lines[0], lines[1], lines[3], lines[-1]]  # A: 0, the long answer, 4 (after the bad one); B: 2
    for l in picks:
        recs = data["a_recs"] if l["file"] == str(data["a"]) else data["b_recs"]
        one = data["dir"] / f"one_{Path(l['file']).stem}_{l['record']}.jsonl"
        one.write_text(json.dumps(recs[l["record"]]) + "\n")
        s = summary_of(ftune_eval(["--data", one]).stdout)
        rel = abs(s["nll"] - l["nll"]) / l["nll"]
        print(f"{l['file']} record {l['record']}: line {l['loss']:.9f} alone {s['loss']:.6f} (rel {rel:.2g})")
        assert s["tokens"] == l["tokens"]
        assert rel <= TOL_EXAMPLE_REL


def per_example(data, extra, name):
    """(summary, lines) of A and B with --per-example and extra; the summary line is asserted
    to be the one the same command prints without --per-example."""
    out = data["dir"] / name
    common = ["--data", data["a"], "--data", data["b"], "--skip-bad-records", *extra]
    r = ftune_eval(common + ["--per-example", out])
    assert r.stdout == ftune_eval(common).stdout
    return summary_of(r.stdout), read_lines(out)


def same_lines(x, y, tol):
    assert [(l["file"], l["record"], l["tokens"], l["truncated"]) for l in x] == \
           [(l["file"], l["record"], l["tokens"], l["truncated"]) for l in y]
    worst = max(abs(a["nll"] - b["nll"]) / b["nll"] for a, b in zip(x, y))
    assert worst <= tol, worst
    return worst


def test_batch_size_1_vs_4(data, two_files):
    _, one, _, _ = two_files
    s4, four = per_example(data, ["--batch-size", "4"], "b4.jsonl")
    worst = same_lines(four, one, TOL_EXAMPLE_REL)
    # several examples per micro-batch: the spans' heads and the micro-batch's head differ
    rel = abs(math.fsum(l["nll"] for l in four) - s4["nll"]) / s4["nll"]
    print(f"batch-size 4 vs 1: max rel nll diff {worst:.3g}; lines' nll sum vs summary {rel:.3g}")
    assert sum(l["tokens"] for l in four) == s4["tokens"]
    assert rel <= TOL_NLL_REL


def test_cpu_device(data, two_files):
    """The executor's device mode (bf16 products): the same lines as the CPU's up to bf16,
    self-consistent with its summary, and batch-size 4 vs 1 alike."""
    if DEVICE != "cpu":
        pytest.skip("cpu-device is compared with the cpu run")
    _, cpu, _, _ = two_files
    dev = ["--device", "cpu-device", "--threads", "2"]
    s1, d1 = per_example(data, dev, "dev1.jsonl")
    s4, d4 = per_example(data, dev + ["--batch-size", "4"], "dev4.jsonl")
    worst = same_lines(d4, d1, TOL_EXAMPLE_REL)
    # bf16 products against fp32: the tiny model's losses agree to ~1e-4 relative
    vs_cpu = same_lines(d1, cpu, 1e-3)
    print(f"cpu-device: batch-size 4 vs 1 max rel {worst:.3g}; vs cpu {vs_cpu:.3g}")
    for s, lines in ((s1, d1), (s4, d4)):
        rel = abs(math.fsum(l["nll"] for l in lines) - s["nll"]) / s["nll"]
        print(f"  lines' nll sum vs summary {rel:.3g}")
        assert sum(l["tokens"] for l in lines) == s["tokens"]
        assert rel <= TOL_NLL_REL


def no_temp(folder):
    left = [p.name for p in Path(folder).iterdir() if ".tmp." in p.name]
    assert not left, left


def test_complete_or_absent(data, tmp_path):
    out = tmp_path / "x.jsonl"
    # a bad record without --skip-bad-records: the run fails, no file, no temporary
    r = ftune_eval(["--data", data["a"], "--per-example", out], ok=False)
    assert_clean_error(r, None, str(data["a"]), "line 4")
    assert not out.exists()
    no_temp(tmp_path)
    # an existing FILE is left as it was by a failing run
    out.write_text("old\n")
    r = ftune_eval(["--data", data["a"], "--per-example", out], ok=False)
    assert r.returncode == 1 and out.read_text() == "old\n"
    no_temp(tmp_path)
    # and replaced whole by a run that succeeds
    s = summary_of(ftune_eval(["--data", data["b"], "--per-example", out]).stdout)
    assert len(read_lines(out)) == s["examples"] == 3
    no_temp(tmp_path)


def test_refused(data, tmp_path):
    r = ftune_eval(["--data", data["b"], "--per-example", tmp_path / "no" / "x.jsonl"], ok=False)
    assert_clean_error(r, None, "--per-example", "does not exist")
    r = ftune_eval(["--data", data["b"], "--per-example", tmp_path], ok=False)
    assert_clean_error(r, None, "--per-example", "expected a file name")
    r = ftune_eval(["--data", data["b"], "--per-example", data["b"]], ok=False)
    assert_clean_error(r, None, "--per-example", "is the --data file")
    assert json.loads(data["b"].read_text())  # untouched
    r = ftune_eval(["--method", "dpo", "--data", data["b"], "--per-example", tmp_path / "d.jsonl"],
                   ok=False)
    assert_clean_error(r, None, "--per-example", "--method dpo")
    assert r.returncode == 2
    assert not list(tmp_path.iterdir())
