"""Bad input through the CLI (issue: CPU foundation, acceptance "Bad input"): each case gives
exactly one stderr line "ftune: ..." naming the file and the position, a non-zero exit that
is not a signal, and no adapter under --out.

The model is tests/fixtures/tiny-llama (copied with its tokenizer symlinks resolved); the data
is the bundled Alpaca seed tasks.
"""
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FTUNE = os.environ.get("FTUNE_BIN", str(ROOT / "build" / "ftune"))
TINY = ROOT / "tests" / "fixtures" / "tiny-llama"
DATA = ROOT / "examples" / "data" / "alpaca-seed-tasks" / "alpaca_seed_175.jsonl"
GOOD = '{"instruction": "Add 2 and 3.", "input": "", "output": "5"}\n'


def run(args, cwd):
    return subprocess.run([FTUNE] + [str(a) for a in args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def train(tmp, model, data, *extra):
    out = tmp / "out"
    r = run(["train", "--model", model, "--data", data, "--out", out, "--max-steps", "1",
             "--seq-len", "64", "--quiet", *extra], tmp)
    return r, out


def model_copy(tmp):
    dst = tmp / "model"
    shutil.copytree(TINY, dst, symlinks=False)
    return dst


def assert_clean_error(r, out, *needles):
    """One 'ftune: ' line with every needle; non-zero exit, not a signal; no adapter."""
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    print("stderr:", r.stderr.strip())
    assert 0 < r.returncode < 128, f"exit {r.returncode}"
    assert len(lines) == 1, f"expected one line, got {lines}"
    assert lines[0].startswith("ftune: "), lines[0]
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    assert not (out / "adapter_model.safetensors").exists()
    assert not (out / "adapter_config.json").exists()


def st_header(path):
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return b, n, json.loads(b[8:8 + n])


def st_rewrite(path, header, data):
    hb = json.dumps(header).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + data)


def test_truncated_safetensors(tmp_path):
    m = model_copy(tmp_path)
    st = m / "model.safetensors"
    size = st.stat().st_size
    os.truncate(st, size // 2)
    r, out = train(tmp_path, m, DATA)
    assert_clean_error(r, out, "model.safetensors", "data_offsets", "file size %d" % (size // 2))


def test_offsets_past_end(tmp_path):
    """A header whose last tensor's data_offsets end beyond the file (sizes kept consistent
    with the dtype by moving the tensor's start as well)."""
    m = model_copy(tmp_path)
    st = m / "model.safetensors"
    b, n, h = st_header(st)
    data = b[8 + n:]
    name = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])
    a, e = h[name]["data_offsets"]
    h[name]["data_offsets"] = [a + 4096, e + 4096]
    st_rewrite(st, h, data)
    r, out = train(tmp_path, m, DATA)
    assert_clean_error(r, out, "model.safetensors", name, "past the end")


def test_header_length_larger_than_file(tmp_path):
    m = model_copy(tmp_path)
    st = m / "model.safetensors"
    b = bytearray(st.read_bytes())
    b[:8] = struct.pack("<Q", len(b) * 2)
    st.write_bytes(bytes(b))
    r, out = train(tmp_path, m, DATA)
    assert_clean_error(r, out, "model.safetensors", "header length %d" % (len(b) * 2),
                       "file size %d" % len(b))


def test_config_missing_hidden_size(tmp_path):
    m = model_copy(tmp_path)
    cfg = json.loads((m / "config.json").read_text())
    del cfg["hidden_size"]
    (m / "config.json").write_text(json.dumps(cfg))
    r, out = train(tmp_path, m, DATA)
    assert_clean_error(r, out, "config.json", "hidden_size")


def test_malformed_jsonl_line(tmp_path):
    d = tmp_path / "bad.jsonl"
    d.write_text(GOOD + GOOD + '{"instruction": "a", oops}\n' + GOOD)
    r, out = train(tmp_path, TINY, d)
    assert_clean_error(r, out, "bad.jsonl", "line 3", "malformed JSON")


def test_skip_bad_records_counts(tmp_path):
    d = tmp_path / "bad.jsonl"
    d.write_text(GOOD * 4 + '{"instruction": "a", oops}\n' + '{"instruction": "x"}\n' + GOOD * 4)
    r, out = train(tmp_path, TINY, d, "--skip-bad-records", "--eval-fraction", "0")
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_skipped"] == 2
    assert summary["n_train"] == 8
    assert (out / "adapter_model.safetensors").exists()


def test_empty_data_file(tmp_path):
    d = tmp_path / "empty.jsonl"
    d.write_text("")
    r, out = train(tmp_path, TINY, d)
    assert_clean_error(r, out, "empty.jsonl", "no records")


def test_unknown_schema(tmp_path):
    d = tmp_path / "unknown.jsonl"
    d.write_text('{"question": "a", "answer": "b"}\n')
    r, out = train(tmp_path, TINY, d)
    assert_clean_error(r, out, "unknown.jsonl", "line 1", "unknown data schema", "'question'")


def test_bad_record_in_json_array(tmp_path):
    d = tmp_path / "arr.json"
    d.write_text('[{"instruction": "a", "input": "", "output": "b"}, {"instruction": "c"}]')
    r, out = train(tmp_path, TINY, d)
    assert_clean_error(r, out, "arr.json", "record 2", "'output'")


def test_missing_model_path(tmp_path):
    r, out = train(tmp_path, tmp_path / "no-such-model", DATA)
    assert_clean_error(r, out, "no-such-model", "No such file")


def test_missing_data_path(tmp_path):
    r, out = train(tmp_path, TINY, tmp_path / "no-such-data.jsonl")
    assert_clean_error(r, out, "no-such-data.jsonl", "No such file")


def test_truncated_gguf(tmp_path):
    src = ROOT / "tests" / "fixtures" / "gguf" / "tiny-llama.gguf"
    g = tmp_path / "t.gguf"
    b = src.read_bytes()
    g.write_bytes(b[: len(b) // 3])
    r, out = train(tmp_path, g, DATA)
    assert_clean_error(r, out, "t.gguf")


def test_eval_missing_adapter(tmp_path):
    out = tmp_path / "out"
    r = run(["eval", "--model", TINY, "--adapter", tmp_path / "no-adapter", "--data", DATA,
             "--seq-len", "64"], tmp_path)
    assert_clean_error(r, out, "no-adapter")
