"""Bad input through `ftune train` (issue acceptance "Bad input"): every case below gives exactly
one stderr line starting "ftune: " that names the file and, where one exists, the position
(byte offset or size, line or record), a non-zero exit that is not a signal (0 < rc < 128),
and no adapter_model.safetensors / adapter_config.json in --out.

Each case runs twice: with --quiet (stderr must be that one line and nothing else) and with the
default output, where the trainer's progress lines ("ftune: model ...", "ftune: data ...") may
come first but the error must be the only other line and the last one.

The model is a copy of tests/fixtures/tiny-llama (tokenizer symlinks resolved) that each test
damages; the data is the bundled Alpaca seed tasks unless the data is what is being damaged.
"""
import json
import re
import struct

import pytest

from cli_helpers import (SEED_DATA, TINY, TINY_GGUF, assert_clean_error, model_copy, run_ftune,
                         st_read, st_write, stderr_lines)

GOOD = '{"instruction": "Add 2 and 3.", "input": "", "output": "5"}\n'
BAD_LINE = '{"instruction": "a", oops}\n'


def train(tmp, model, data, *extra, quiet=True):
    out = tmp / ("out-q" if quiet else "out")
    args = ["train", "--model", model, "--data", data, "--out", out, "--max-steps", "1",
            "--seq-len", "64", "--threads", "1", *extra]
    if quiet:
        args.append("--quiet")
    return run_ftune(args, cwd=tmp, timeout=120), out


def expect_error(tmp, model, data, *needles):
    """Runs the case quiet and not quiet; both must satisfy the contract with the same error
    line. Returns the line."""
    rq, outq = train(tmp, model, data, quiet=True)
    lq = assert_clean_error(rq, outq, *needles)
    assert len(stderr_lines(rq)) == 1, f"--quiet: expected exactly one stderr line: {rq.stderr!r}"
    rv, outv = train(tmp, model, data, quiet=False)
    lv = assert_clean_error(rv, outv, *needles)
    assert lv == lq, (lv, lq)
    return lq


# ---- safetensors -----------------------------------------------------------------------------

ST_SIZE = (TINY / "model.safetensors").stat().st_size
ST_HLEN = struct.unpack("<Q", (TINY / "model.safetensors").read_bytes()[:8])[0]


@pytest.mark.parametrize("keep", [0, 4, 8, 8 + ST_HLEN // 2, 8 + ST_HLEN + 1, ST_SIZE // 2,
                                  ST_SIZE - 1],
                         ids=["empty", "4B", "length-only", "mid-header", "header+1B",
                              "half", "minus-1B"])
def test_truncated_safetensors(tmp_path, keep):
    """Truncated at the length prefix, inside the JSON header, and inside the tensor data: the
    message names the file and its (truncated) size."""
    m = model_copy(tmp_path)
    st = m / "model.safetensors"
    st.write_bytes(st.read_bytes()[:keep])
    line = expect_error(tmp_path, m, SEED_DATA, "model.safetensors")
    assert re.search(r"\b%d\b" % keep, line), f"the file size {keep} is not named: {line}"


def _last_tensor(h):
    return max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])


def _first_tensor(h):
    return min((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])


@pytest.mark.parametrize("which", ["first", "last"])
def test_offsets_past_end_consistent_size(tmp_path, which):
    """A tensor's data_offsets moved beyond the data section, its byte count kept equal to
    shape x dtype (so only the bound is wrong); the 8-byte length prefix is rewritten to match
    the new header."""
    m = model_copy(tmp_path)
    st = m / "model.safetensors"
    _, h, data = st_read(st)
    name = (_first_tensor if which == "first" else _last_tensor)(h)
    a, e = h[name]["data_offsets"]
    shift = len(data)  # starts where the data section ends
    h[name]["data_offsets"] = [a + shift, e + shift]
    st_write(st, h, data)
    line = expect_error(tmp_path, m, SEED_DATA, "model.safetensors", name)
    assert str(e + shift) in line, f"the bad end offset {e + shift} is not named: {line}"


def test_offsets_end_enlarged(tmp_path):
    """The last tensor's end offset alone made larger than the file (its byte count no longer
    matches shape x dtype either): still one clean error naming the tensor and the offset."""
    m = model_copy(tmp_path)
    st = m / "model.safetensors"
    _, h, data = st_read(st)
    name = _last_tensor(h)
    a, e = h[name]["data_offsets"]
    h[name]["data_offsets"] = [a, len(data) + 1000]
    st_write(st, h, data)
    expect_error(tmp_path, m, SEED_DATA, "model.safetensors", name, str(len(data) + 1000))


@pytest.mark.parametrize("factor", ["size-7", "2x", "u64max"])
def test_header_length_larger_than_file(tmp_path, factor):
    """The u64 header length larger than the file: by one byte, twice the file, and 2^64-1
    (which wraps around if added to 8 without a check)."""
    m = model_copy(tmp_path)
    st = m / "model.safetensors"
    b = bytearray(st.read_bytes())
    n = {"size-7": len(b) - 7, "2x": 2 * len(b), "u64max": 2**64 - 1}[factor]
    b[:8] = struct.pack("<Q", n)
    st.write_bytes(bytes(b))
    line = expect_error(tmp_path, m, SEED_DATA, "model.safetensors", "header length")
    assert str(n) in line, f"the header length {n} is not named: {line}"


def test_header_not_json(tmp_path):
    """A header of the right length that does not parse: the file offset of the bad byte."""
    m = model_copy(tmp_path)
    st = m / "model.safetensors"
    b = bytearray(st.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    at = 8 + b[8:8 + n].index(b'"shape":') + len(b'"shape"')  # the ':' after the first "shape"
    b[at] = ord(";")
    st.write_bytes(bytes(b))
    expect_error(tmp_path, m, SEED_DATA, "model.safetensors", "offset %d" % at)


# ---- config.json ------------------------------------------------------------------------------

def test_config_missing_hidden_size(tmp_path):
    m = model_copy(tmp_path)
    cfg = json.loads((m / "config.json").read_text())
    del cfg["hidden_size"]
    (m / "config.json").write_text(json.dumps(cfg, indent=2))
    expect_error(tmp_path, m, SEED_DATA, "config.json", "hidden_size")


def test_config_truncated_json(tmp_path):
    m = model_copy(tmp_path)
    txt = (m / "config.json").read_text()
    (m / "config.json").write_text(txt[: len(txt) // 2])
    expect_error(tmp_path, m, SEED_DATA, "config.json", "byte")


# ---- data files -------------------------------------------------------------------------------

def test_malformed_jsonl_line(tmp_path):
    d = tmp_path / "bad.jsonl"
    d.write_text(GOOD + GOOD + BAD_LINE + GOOD)
    expect_error(tmp_path, TINY, d, "bad.jsonl", "line 3")


def test_malformed_jsonl_line_after_blank_lines(tmp_path):
    """Blank lines count as lines: the bad record on physical line 5 is reported as line 5."""
    d = tmp_path / "blank.jsonl"
    d.write_text(GOOD + "\n" + GOOD + "   \n" + BAD_LINE)
    expect_error(tmp_path, TINY, d, "blank.jsonl", "line 5")


def test_record_missing_field(tmp_path):
    d = tmp_path / "missing.jsonl"
    d.write_text(GOOD + '{"instruction": "no output here"}\n')
    expect_error(tmp_path, TINY, d, "missing.jsonl", "line 2", "output")


def test_malformed_json_array(tmp_path):
    d = tmp_path / "arr.json"
    d.write_text('[\n  {"instruction": "a", "input": "", "output": "b"},\n  {"instruction": oops}\n]\n')
    expect_error(tmp_path, TINY, d, "arr.json", "line 3")


def test_bad_record_in_json_array(tmp_path):
    d = tmp_path / "arr.json"
    d.write_text('[{"instruction": "a", "input": "", "output": "b"}, {"instruction": "c"}]')
    expect_error(tmp_path, TINY, d, "arr.json", "record 2")


@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["empty", "blank-lines"])
def test_empty_data_file(tmp_path, content):
    d = tmp_path / "empty.jsonl"
    d.write_text(content)
    expect_error(tmp_path, TINY, d, "empty.jsonl")


def test_unknown_schema(tmp_path):
    d = tmp_path / "unknown.jsonl"
    d.write_text('{"foo": "a", "bar": 1}\n{"foo": "b", "bar": 2}\n')
    expect_error(tmp_path, TINY, d, "unknown.jsonl", "line 1", "schema", "'foo'")


def test_missing_model_path(tmp_path):
    expect_error(tmp_path, tmp_path / "no-such-model", SEED_DATA, "no-such-model")


def test_missing_data_path(tmp_path):
    expect_error(tmp_path, TINY, tmp_path / "no-such-data.jsonl", "no-such-data.jsonl")


# ---- --skip-bad-records -------------------------------------------------------------------------

def test_skip_bad_records_reports_count(tmp_path):
    """The malformed-line case with --skip-bad-records trains, and both summary.json and the
    data progress line report the skipped records (a malformed line and one missing 'output')."""
    d = tmp_path / "bad.jsonl"
    d.write_text(GOOD * 2 + BAD_LINE + GOOD * 3 + '{"instruction": "x"}\n' + GOOD * 3)
    out = tmp_path / "out"
    r = run_ftune(["train", "--model", TINY, "--data", d, "--out", out, "--max-steps", "1",
                   "--seq-len", "64", "--threads", "1", "--eval-fraction", "0",
                   "--skip-bad-records"], cwd=tmp_path, timeout=120)
    print(r.stderr)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    print("summary:", s)
    assert s["n_skipped"] == 2, s
    assert s["n_train"] == 8, s
    assert s["steps"] == 1
    data_line = [l for l in stderr_lines(r) if l.startswith("ftune: data ")]
    assert len(data_line) == 1 and "2 skipped" in data_line[0], data_line
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        assert (out / f).exists(), f


def test_skip_bad_records_all_bad(tmp_path):
    """Every record bad even when skipping: a clean error, no adapter."""
    d = tmp_path / "allbad.jsonl"
    d.write_text(BAD_LINE * 3)
    r, out = train(tmp_path, TINY, d, "--skip-bad-records")
    assert_clean_error(r, out, "allbad.jsonl")


# ---- GGUF ---------------------------------------------------------------------------------------

GGUF_SIZE = TINY_GGUF.stat().st_size


@pytest.mark.parametrize("keep", [0, 3, 24, 100, 600, 1000, GGUF_SIZE // 2, GGUF_SIZE - 1])
def test_truncated_gguf(tmp_path, keep):
    """tests/fixtures/gguf/tiny-llama.gguf cut in the fixed header, the metadata, the tensor
    infos and the tensor data: the error names the file and an offset or the file size, and
    is about the truncation (found before the tokenizer, which this fixture lacks)."""
    g = tmp_path / "t.gguf"
    g.write_bytes(TINY_GGUF.read_bytes()[:keep])
    line = expect_error(tmp_path, g, SEED_DATA, "t.gguf")
    assert re.search(r"offset \d+", line) or re.search(r"\b%d\b" % keep, line), line
    assert "tokenizer" not in line, line
