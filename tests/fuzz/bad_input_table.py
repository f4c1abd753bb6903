#!/usr/bin/env python3
"""Runs ftune on every bad input we know of and writes docs/bad-input.md: what was wrong, the
command, the exit status and exactly what the user saw on stderr (nothing here is typed by
hand: each message is the binary's own output).

    python3 tests/fuzz/bad_input_table.py [--ftune build/ftune] [--out docs/bad-input.md]

Sources of the cases: tests/ref/test_bad_input.py (CLI bad input), the error cases of the C
unit tests (test_config.c, test_safetensors.c, test_gguf.c, test_dataset.c, test_tokenizer.c,
test_exec.c) made reachable through the CLI, and the fuzzers' findings (tests/fuzz/RESULTS.md).
Each case runs in a fresh folder; paths in messages are relative to it. Needs the tiny model
(tests/fixtures/tiny-llama) and the fuzz corpus GGUF (tests/fuzz/corpus/gguf).
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "tiny-llama"
GGUF_TOK = ROOT / "tests" / "fuzz" / "corpus" / "gguf" / "tiny_llama_tok_gpt2.gguf"
GGUF_NOTOK = ROOT / "tests" / "fixtures" / "gguf" / "tiny-llama.gguf"
ALPACA = ROOT / "examples" / "data" / "alpaca-seed-tasks" / "alpaca_seed_175.jsonl"
GOOD = '{"instruction": "Add 2 and 3.", "input": "", "output": "5"}\n'
TRAIN = ["--max-steps", "1", "--seq-len", "64", "--quiet", "--threads", "1", "--eval-fraction", "0"]

CASES = []  # (group, what, source, setup(dir) -> argv)


def case(group, what, source):
    def deco(fn):
        CASES.append((group, what, source, fn))
        return fn
    return deco


def model(d, name="model"):
    dst = d / name
    shutil.copytree(TINY, dst, symlinks=False)
    return dst


def data(d, text, name="data.jsonl"):
    p = d / name
    p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
    return p


def st_read(path):
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return b, n, json.loads(b[8:8 + n])


def st_write(path, header, blob):
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + blob)


def edit_config(m, **kv):
    c = json.loads((m / "config.json").read_text())
    for k, v in kv.items():
        if v is ...:
            c.pop(k, None)
        else:
            c[k] = v
    (m / "config.json").write_text(json.dumps(c, indent=1))


def train(m, d, *extra):
    return ["train", "--model", m, "--data", d, "--out", "out", *TRAIN, *extra]


# ---- model folder: config.json ------------------------------------------------------------

@case("config.json", "`hidden_size` missing", "test_bad_input.py, test_config.c")
def _(d):
    m = model(d); edit_config(m, hidden_size=...)
    return train("model", ALPACA)


@case("config.json", "`hidden_size` is a string", "test_config.c test_type_errors")
def _(d):
    m = model(d); edit_config(m, hidden_size="64")
    return train("model", ALPACA)


@case("config.json", "not valid JSON", "test_config.c test_type_errors")
def _(d):
    m = model(d); (m / "config.json").write_text('{"model_type": "llama", oops}')
    return train("model", ALPACA)


@case("config.json", "`model_type` \"phi3\"", "test_config.c test_unsupported")
def _(d):
    m = model(d); edit_config(m, model_type="phi3")
    return train("model", ALPACA)


@case("config.json", "`rope_scaling` type \"longrope\"", "test_config.c test_unsupported")
def _(d):
    m = model(d); edit_config(m, rope_scaling={"rope_type": "longrope", "factor": 4})
    return train("model", ALPACA)


@case("config.json", "`hidden_act` \"gelu\"", "test_config.c test_unsupported")
def _(d):
    m = model(d); edit_config(m, hidden_act="gelu")
    return train("model", ALPACA)


@case("config.json", "`num_key_value_heads` does not divide the heads", "test_config.c")
def _(d):
    m = model(d); edit_config(m, num_key_value_heads=3)
    return train("model", ALPACA)


@case("config.json", "`eos_token_id` 2.2e27 (a float that does not fit int64)",
      "fuzz_config (UBSan float-cast-overflow, fixed)")
def _(d):
    m = model(d); edit_config(m, eos_token_id=[2222222222222222222222222209])
    return train("model", ALPACA)


@case("config.json", "file missing", "test_safetensors.c test_load_errors")
def _(d):
    m = model(d); (m / "config.json").unlink()
    return train("model", ALPACA)


# ---- model folder: safetensors ------------------------------------------------------------

@case("model.safetensors", "truncated to half its size", "test_bad_input.py")
def _(d):
    m = model(d); st = m / "model.safetensors"
    os.truncate(st, st.stat().st_size // 2)
    return train("model", ALPACA)


def _st_cut(label, keep_fn):
    @case("model.safetensors", f"truncated {label}", "test_cli_errors.py test_truncated_safetensors")
    def _(d):
        m = model(d); st = m / "model.safetensors"
        b = st.read_bytes()
        n = struct.unpack("<Q", b[:8])[0]
        st.write_bytes(b[:keep_fn(n, len(b))])
        return train("model", ALPACA)


_st_cut("to 0 bytes", lambda n, size: 0)
_st_cut("inside the 8-byte length", lambda n, size: 4)
_st_cut("right after the length", lambda n, size: 8)
_st_cut("inside the JSON header", lambda n, size: 8 + n // 2)


@case("model.safetensors", "header length 2^64-1", "test_cli_errors.py")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b = bytearray(st.read_bytes()); b[:8] = struct.pack("<Q", 2**64 - 1)
    st.write_bytes(bytes(b))
    return train("model", ALPACA)


@case("model.safetensors", "the last tensor's end offset alone enlarged", "test_cli_errors.py")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b, n, h = st_read(st)
    name = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])
    h[name]["data_offsets"][1] += 1000
    st_write(st, h, b[8 + n:])
    return train("model", ALPACA)


@case("model.safetensors", "a tensor's data_offsets moved past the end", "test_bad_input.py")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b, n, h = st_read(st)
    name = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])
    a, e = h[name]["data_offsets"]
    h[name]["data_offsets"] = [a + 4096, e + 4096]
    st_write(st, h, b[8 + n:])
    return train("model", ALPACA)


@case("model.safetensors", "header length larger than the file", "test_bad_input.py")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b = bytearray(st.read_bytes()); b[:8] = struct.pack("<Q", len(b) * 2)
    st.write_bytes(bytes(b))
    return train("model", ALPACA)


@case("model.safetensors", "5-byte file", "test_safetensors.c test_bad_files")
def _(d):
    m = model(d); (m / "model.safetensors").write_bytes(b"\x10\0\0\0\0")
    return train("model", ALPACA)


@case("model.safetensors", "header is not JSON", "test_safetensors.c test_bad_files")
def _(d):
    m = model(d); hb = b'{"w": oops}     '
    (m / "model.safetensors").write_bytes(struct.pack("<Q", len(hb)) + hb)
    return train("model", ALPACA)


@case("model.safetensors", "unknown dtype \"F17\"", "test_safetensors.c test_bad_files")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b, n, h = st_read(st)
    h["model.norm.weight"]["dtype"] = "F17"
    st_write(st, h, b[8 + n:])
    return train("model", ALPACA)


@case("model.safetensors", "a tensor's size disagrees with shape x dtype", "test_safetensors.c test_bad_files")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b, n, h = st_read(st)
    h["model.norm.weight"]["shape"] = [h["model.norm.weight"]["shape"][0] + 1]
    st_write(st, h, b[8 + n:])
    return train("model", ALPACA)


@case("model.safetensors", "two tensors overlap (not contiguous)", "test_safetensors.c test_bad_files")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b, n, h = st_read(st)
    ks = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    k = ks[1]
    a, e = h[k]["data_offsets"]
    h[k]["data_offsets"] = [a - 2, e - 2]
    st_write(st, h, b[8 + n:])
    return train("model", ALPACA)


@case("model.safetensors", "a required tensor renamed", "test_safetensors.c test_load_errors")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b, n, h = st_read(st)
    h["model.layers.1.mlp.up_proj.wxxxxx"] = h.pop("model.layers.1.mlp.up_proj.weight")
    st_write(st, h, b[8 + n:])
    return train("model", ALPACA)


@case("model.safetensors", "a tensor with the wrong shape (same bytes)", "test_safetensors.c test_load_errors")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b, n, h = st_read(st)
    s = h["model.layers.0.mlp.up_proj.weight"]["shape"]
    h["model.layers.0.mlp.up_proj.weight"]["shape"] = [s[1], s[0]]
    st_write(st, h, b[8 + n:])
    return train("model", ALPACA)


@case("model.safetensors", "a weight stored as I16 (unsupported dtype)", "test_safetensors.c test_load_errors")
def _(d):
    m = model(d); st = m / "model.safetensors"
    b, n, h = st_read(st)
    t = h["model.norm.weight"]
    t["dtype"] = "I16"
    st_write(st, h, b[8 + n:])
    return train("model", ALPACA)


def _st_nan(d, name, elem):
    """The tiny model with element `elem` of tensor `name` (BF16) set to NaN."""
    m = model(d); st = m / "model.safetensors"
    b, n, h = st_read(st)
    t = h[name]
    assert t["dtype"] == "BF16"
    off = 8 + n + t["data_offsets"][0] + 2 * elem
    b = bytearray(b); b[off:off + 2] = struct.pack("<H", 0x7fc0)
    st.write_bytes(bytes(b))
    return m


@case("model.safetensors", "a NaN weight (element 7 of the final norm)",
      "test_safetensors.c test_load_errors, test_roundtrip")
def _(d):
    _st_nan(d, "model.norm.weight", 7)
    return train("model", ALPACA)


@case("model.safetensors", "a NaN in a projection, --quant nf4 (read while building the pack)",
      "test_safetensors.c test_roundtrip")
def _(d):
    _st_nan(d, "model.layers.1.mlp.up_proj.weight", 64 * 3 + 5)
    return train("model", ALPACA, "--quant", "nf4", "--cache-dir", "cache")


@case("model folder", "only pytorch_model.bin", "test_safetensors.c test_sets")
def _(d):
    m = model(d); (m / "model.safetensors").unlink(); (m / "pytorch_model.bin").write_bytes(b"PK")
    return train("model", ALPACA)


@case("model folder", "sharded index names a missing shard", "test_safetensors.c test_sets")
def _(d):
    m = model(d); (m / "model.safetensors").rename(m / "model-00001-of-00002.safetensors")
    _, _, h = st_read(m / "model-00001-of-00002.safetensors")
    wm = {k: "model-00001-of-00002.safetensors" for k in h if k != "__metadata__"}
    wm["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (m / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return train("model", ALPACA)


@case("model folder", "a Hugging Face id that is not in the local cache",
      "test_hub_cache.c, test_hub_cache.py")
def _(d):
    # relative to the case's folder; the later cases name local paths, which the cache never affects
    os.environ["HF_HUB_CACHE"] = "hub"
    return train("meta-llama/Llama-3.1-8B", ALPACA)


@case("model folder", "path does not exist", "test_bad_input.py")
def _(d):
    return train("no-such-model", ALPACA)


# ---- tokenizer ----------------------------------------------------------------------------

@case("tokenizer.json", "model type Unigram", "test_tokenizer.c")
def _(d):
    m = model(d); (m / "tokenizer.json").write_text('{"model":{"type":"Unigram","vocab":[]}}')
    return train("model", ALPACA)


@case("tokenizer.json", "truncated JSON", "test_tokenizer.c")
def _(d):
    m = model(d); t = (m / "tokenizer.json").read_bytes()
    (m / "tokenizer.json").write_bytes(t[: len(t) // 2])
    return train("model", ALPACA)


@case("tokenizer.json", "a merge names a token not in the vocabulary", "test_tokenizer.c")
def _(d):
    m = model(d); (m / "tokenizer.json").write_text(
        '{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}}')
    return train("model", ALPACA)


@case("tokenizer.json", "Split pre-tokenizer with an invalid regex", "test_tokenizer.c")
def _(d):
    m = model(d); (m / "tokenizer.json").write_text(
        '{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"("},"behavior":"Isolated",'
        '"invert":false},"model":{"type":"BPE","vocab":{},"merges":[]}}')
    return train("model", ALPACA)


@case("tokenizer.json", "a vocabulary id of 2.2e69", "fuzz_tokenizer (UBSan float-cast-overflow, fixed)")
def _(d):
    m = model(d); j = json.loads((m / "tokenizer.json").read_text())
    j["model"]["vocab"]["<unk>"] = 2.2222e69
    (m / "tokenizer.json").write_text(json.dumps(j))
    return train("model", ALPACA)


@case("tokenizer.json", "the post-processor's BOS id (1) has no token; no tokenizer_config.json", "fuzz_tokenizer (NULL strlen crash, fixed)")
def _(d):
    m = model(d); j = json.loads((m / "tokenizer.json").read_text())
    del j["model"]["vocab"]["<s>"]
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] != "<s>"]
    (m / "tokenizer.json").write_text(json.dumps(j))
    (m / "tokenizer_config.json").unlink()  # no bos_token: BOS comes from the post-processor
    return train("model", ALPACA)


@case("tokenizer.json", "missing from the model folder", "test_tokenizer.c")
def _(d):
    m = model(d); (m / "tokenizer.json").unlink()
    return train("model", ALPACA)


# ---- GGUF ---------------------------------------------------------------------------------

def gguf_patch(d, fn):
    b = bytearray(GGUF_TOK.read_bytes())
    fn(b)
    (d / "m.gguf").write_bytes(bytes(b))
    return train("m.gguf", ALPACA)


@case("GGUF", "truncated to a third", "test_bad_input.py")
def _(d):
    b = GGUF_NOTOK.read_bytes()
    (d / "t.gguf").write_bytes(b[: len(b) // 3])
    return train("t.gguf", ALPACA)


def _gguf_cut(keep):
    @case("GGUF", f"cut to {keep} bytes", "test_cli_errors.py test_truncated_gguf")
    def _(d):
        (d / "t.gguf").write_bytes(GGUF_NOTOK.read_bytes()[:keep])
        return train("t.gguf", ALPACA)


for _k in (0, 3, 24, 100, 600, 1000):
    _gguf_cut(_k)


@case("GGUF", "magic \"GGML\" instead of \"GGUF\"", "test_gguf.c test_bad_files")
def _(d):
    return gguf_patch(d, lambda b: b.__setitem__(slice(0, 4), b"GGML"))


@case("GGUF", "version 4", "test_gguf.c test_bad_files")
def _(d):
    return gguf_patch(d, lambda b: b.__setitem__(slice(4, 8), struct.pack("<I", 4)))


@case("GGUF", "key/value count 2^60", "test_gguf.c test_bad_files")
def _(d):
    return gguf_patch(d, lambda b: b.__setitem__(slice(16, 24), struct.pack("<Q", 1 << 60)))


@case("GGUF", "general.architecture \"bloom\"", "test_gguf.c test_model_errors")
def _(d):
    def f(b):
        i = b.find(b"general.architecture") + len("general.architecture") + 4 + 8
        b[i:i + 5] = b"bloom"
    return gguf_patch(d, f)


@case("GGUF", "a tensor of unknown ggml type 99", "test_gguf.c test_bad_files")
def _(d):
    def f(b):
        i = b.find(b"blk.0.attn_v.weight") + len("blk.0.attn_v.weight") + 4 + 16
        b[i:i + 4] = struct.pack("<I", 99)
    return gguf_patch(d, f)


@case("GGUF", "a weight that dequantizes to NaN (element 5 of an F32 norm)",
      "test_gguf.c test_nonfinite_weights; fuzz_gguf")
def _(d):
    import gguf
    t = [t for t in gguf.GGUFReader(str(GGUF_TOK)).tensors if t.name == "blk.0.attn_norm.weight"][0]
    off = int(t.data_offset) + 5 * 4

    def f(b):
        b[off:off + 4] = struct.pack("<I", 0x7fc00000)
    return gguf_patch(d, f)


@case("GGUF", "llama.block_count missing (key renamed)", "test_gguf.c test_model_errors")
def _(d):
    def f(b):
        i = b.find(b"llama.block_count")
        b[i:i + 17] = b"llama.block_cnxxx"
    return gguf_patch(d, f)


@case("GGUF", "no tokenizer metadata", "test_gguf.c test_tiny_model_equals_safetensors")
def _(d):
    shutil.copy(GGUF_NOTOK, d / "m.gguf")
    return train("m.gguf", ALPACA)


# ---- data ---------------------------------------------------------------------------------

@case("data", "malformed JSONL line 3", "test_bad_input.py, test_dataset.c")
def _(d):
    data(d, GOOD + GOOD + '{"instruction": "a", oops}\n' + GOOD)
    return train(TINY, "data.jsonl")


@case("data", "malformed line 5 after blank lines", "test_cli_errors.py")
def _(d):
    data(d, GOOD + "\n" + GOOD + "\n" + '{"instruction": oops}\n')
    return train(TINY, "data.jsonl")


@case("data", "every record bad, with --skip-bad-records", "test_cli_errors.py")
def _(d):
    data(d, '{"instruction": oops}\n{"instruction": "x"}\n')
    return train(TINY, "data.jsonl", "--skip-bad-records")


@case("config.json", "truncated JSON", "test_cli_errors.py")
def _(d):
    m = model(d); t = (m / "config.json").read_text()
    (m / "config.json").write_text(t[: len(t) // 2])
    return train("model", ALPACA)


@case("data", "gzip file cut off mid-stream", "test_fsutil.c, test_data_input.py")
def _(d):
    import gzip
    z = gzip.compress((GOOD * 40).encode())
    (d / "data.jsonl.gz").write_bytes(z[: len(z) // 2])
    return train(TINY, "data.jsonl.gz")


@case("data", "gzip file with a corrupt byte", "test_fsutil.c, test_data_input.py")
def _(d):
    import gzip
    z = bytearray(gzip.compress((GOOD * 40).encode()))
    z[len(z) // 2] ^= 0x55
    (d / "data.jsonl.gz").write_bytes(bytes(z))
    return train(TINY, "data.jsonl.gz")


@case("data", "a named FIFO that no program writes (had hung in open())",
      "test_fsutil.c, test_data_input.py")
def _(d):
    os.mkfifo(d / "fifo.jsonl")
    return train(TINY, "fifo.jsonl")


@case("data", "empty file", "test_bad_input.py, test_dataset.c")
def _(d):
    data(d, "")
    return train(TINY, "data.jsonl")


@case("data", "blank lines only", "test_dataset.c")
def _(d):
    data(d, "\n  \n")
    return train(TINY, "data.jsonl")


@case("data", "unknown schema (keys question/answer)", "test_bad_input.py, test_dataset.c")
def _(d):
    data(d, '{"question": "a", "answer": "b"}\n')
    return train(TINY, "data.jsonl")


@case("data", "alpaca record without `output` in a JSON array", "test_bad_input.py")
def _(d):
    data(d, '[{"instruction": "a", "input": "", "output": "b"}, {"instruction": "c"}]', "arr.json")
    return train(TINY, "arr.json")


@case("data", "JSON array element is not an object", "test_dataset.c")
def _(d):
    data(d, '[{"text": "a"}, 5]', "arr.json")
    return train(TINY, "arr.json")


@case("data", "JSON array cut off", "test_dataset.c")
def _(d):
    data(d, '[{"text": "a"},\n {"text": }]', "arr.json")
    return train(TINY, "arr.json")


@case("data", "messages with role \"wizard\"", "test_dataset.c")
def _(d):
    data(d, '{"messages":[{"role":"wizard","content":"x"}]}\n')
    return train(TINY, "data.jsonl")


@case("data", "a key twice in one record (`instruction`, line 2)", "test_data_dupkeys.py")
def _(d):
    data(d, '{"instruction":"a","output":"b"}\n{"instruction":"a","output":"b","instruction":"c"}\n')
    return train(TINY, "data.jsonl")


@case("data", "a key twice in a message (`content`)", "test_data_dupkeys.py")
def _(d):
    data(d, '{"messages":[{"role":"user","content":"a","content":"b"},'
            '{"role":"assistant","content":"c"}]}\n')
    return train(TINY, "data.jsonl")


@case("data", "messages: two user turns in a row", "test_dataset.c")
def _(d):
    data(d, '{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},'
            '{"role":"assistant","content":"c"}]}\n')
    return train(TINY, "data.jsonl", "--chat-template", "llama2")


@case("data", "`--data-format sharegpt` on alpaca records", "fuzz_dataset seeds")
def _(d):
    data(d, GOOD)
    return train(TINY, "data.jsonl", "--data-format", "sharegpt")


@case("data", "every response starts after --seq-len 16", "fuzz_dataset seeds")
def _(d):
    data(d, '{"instruction": "' + "word " * 40 + '", "input": "", "output": "5"}\n')
    return ["train", "--model", TINY, "--data", "data.jsonl", "--out", "out", "--max-steps", "1",
            "--seq-len", "16", "--quiet", "--threads", "1", "--eval-fraction", "0"]


@case("data", "bad records with --skip-bad-records (trains; counts them)", "test_bad_input.py")
def _(d):
    data(d, GOOD * 4 + '{"instruction": "a", oops}\n' + '{"instruction": "x"}\n' + GOOD * 4)
    return train(TINY, "data.jsonl", "--skip-bad-records")


@case("data", "invalid UTF-8 bytes inside a string (not an error: byte fallback)", "fuzz_dataset")
def _(d):
    data(d, b'{"instruction": "caf\xe9 \xff", "input": "", "output": "ok \xc3"}\n' * 2)
    return train(TINY, "data.jsonl")


@case("data", "file does not exist", "test_bad_input.py")
def _(d):
    return train(TINY, "no-such-data.jsonl")


@case("data", "a folder instead of a file", "fsutil (open_regular)")
def _(d):
    (d / "dir.jsonl").mkdir()
    return train(TINY, "dir.jsonl")


# ---- adapters -----------------------------------------------------------------------------

def adapter(d):
    """A real adapter trained by ftune itself (1 step), then copied for each edit."""
    r = subprocess.run([FTUNE, "train", "--model", str(TINY), "--data", str(ALPACA), "--out",
                        str(d / "good"), *TRAIN], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit("cannot train the reference adapter: " + r.stderr)
    return d / "good"


@case("adapter", "`eval --adapter` folder does not exist", "test_bad_input.py")
def _(d):
    return ["eval", "--model", TINY, "--adapter", "no-adapter", "--data", ALPACA, "--seq-len", "64"]


@case("adapter", "adapter_config.json with use_dora true", "peft.c; fuzz_peft seeds")
def _(d):
    a = adapter(d)
    c = json.loads((a / "adapter_config.json").read_text()); c["use_dora"] = True
    (a / "adapter_config.json").write_text(json.dumps(c))
    return ["eval", "--model", TINY, "--adapter", "good", "--data", ALPACA, "--seq-len", "64"]


@case("adapter", "adapter_config.json with an unknown target module", "peft.c; fuzz_peft seeds")
def _(d):
    a = adapter(d)
    c = json.loads((a / "adapter_config.json").read_text()); c["target_modules"] = ["qkv_proj"]
    (a / "adapter_config.json").write_text(json.dumps(c))
    return ["eval", "--model", TINY, "--adapter", "good", "--data", ALPACA, "--seq-len", "64"]


@case("adapter", "adapter_config.json with `target_modules` []", "fuzz_peft (fixed: was accepted)")
def _(d):
    a = adapter(d)
    c = json.loads((a / "adapter_config.json").read_text()); c["target_modules"] = []
    (a / "adapter_config.json").write_text(json.dumps(c))
    return ["eval", "--model", TINY, "--adapter", "good", "--data", ALPACA, "--seq-len", "64"]


@case("adapter", "adapter_config.json with r 1e300", "fuzz_peft (UBSan float-cast-overflow, fixed)")
def _(d):
    a = adapter(d)
    c = json.loads((a / "adapter_config.json").read_text()); c["r"] = 1e300
    (a / "adapter_config.json").write_text(json.dumps(c))
    return ["eval", "--model", TINY, "--adapter", "good", "--data", ALPACA, "--seq-len", "64"]


@case("adapter", "adapter rank differs from its weights (r 16 -> 8)", "test_exec.c; fuzz_peft")
def _(d):
    a = adapter(d)
    c = json.loads((a / "adapter_config.json").read_text()); c["r"] = 8
    (a / "adapter_config.json").write_text(json.dumps(c))
    return ["eval", "--model", TINY, "--adapter", "good", "--data", ALPACA, "--seq-len", "64"]


@case("adapter", "adapter_model.safetensors truncated", "fuzz_peft")
def _(d):
    a = adapter(d)
    st = a / "adapter_model.safetensors"
    os.truncate(st, st.stat().st_size - 100)
    return train(TINY, ALPACA, "--init-adapter", "good")


# ---- options ------------------------------------------------------------------------------

@case("options", "unknown option", "cli/args.c")
def _(d):
    return train(TINY, ALPACA, "--learning-rate", "1e-4")


@case("options", "`--lora-r 0`", "cli/args.c g_domains (lora.c in the library)")
def _(d):
    return train(TINY, ALPACA, "--lora-r", "0")


@case("options", "`--lora-target qkv`", "lora.c ft_lora_parse_targets")
def _(d):
    return train(TINY, ALPACA, "--lora-target", "qkv")


@case("options", "`--eval-fraction 0.9`", "cli/args.c g_domains (dataset.c in the library)")
def _(d):
    return train(TINY, ALPACA, "--eval-fraction", "0.9")


@case("options", "`--seq-len abc`", "cli/args.c")
def _(d):
    return train(TINY, ALPACA, "--seq-len", "abc")


@case("options", "`--config` file that is not JSON", "cli/args.c")
def _(d):
    (d / "opts.json").write_text("{lr: 1}")
    return ["train", "--config", "opts.json", "--model", TINY, "--data", ALPACA]


@case("options", "`generate --quant int8` (unknown quantization)", "cli/cmd_generate.c")
def _(d):
    return ["generate", "--model", TINY, "--prompt", "hi", "--max-new-tokens", "2",
            "--quant", "int8"]


@case("options", "`train --device cpu-device --quant bf16 --gpu-mem 1M` (the base cannot fit)",
      "offload/plan.c (budget refusal); --host-mem given so the row does not depend on the machine")
def _(d):
    return train(TINY, ALPACA, "--device", "cpu-device", "--quant", "bf16", "--gpu-mem", "1M",
                 "--host-mem", "4G")


# ---- generate --prompts files and --chat -----------------------------------------------------

def prompts_file(d, *lines):
    (d / "p.jsonl").write_text("".join(x + "\n" for x in lines))
    return ["generate", "--model", TINY, "--prompts", "p.jsonl", "--max-new-tokens", "2",
            "--threads", "1"]


@case("generate", "`--prompts` record that is a number (line 2)", "src/infer/gen_prompt.c ft_gen_req_parse")
def _(d):
    return prompts_file(d, '"hi"', '42')


@case("generate", "`--prompts` record with `\"temperature\": -1`", "src/infer/gen_prompt.c req_params")
def _(d):
    return prompts_file(d, '{"prompt": "hi", "temperature": -1}')


@case("generate", "`--prompts` OpenAI batch request (the removed Batch-API emulation)",
      "src/infer/gen_prompt.c req_params")
def _(d):
    return prompts_file(d, '{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
                           '"body": {"messages": [{"role": "user", "content": "hi"}]}}')


@case("generate", "`--prompts` record with `\"logit_bias\"` (removed)", "src/infer/gen_prompt.c req_params")
def _(d):
    return prompts_file(d, '{"prompt": "hi", "logit_bias": {"1": 5}}')


@case("generate", "`--prompts` record with `\"stop_token_ids\": [999999]` (id past the vocabulary)",
      "cli/gen_prompts.c")
def _(d):
    return prompts_file(d, '{"prompt": "hi", "stop_token_ids": [999999]}')


@case("options", "`eval --per-example` into a folder that does not exist", "cli/cmd_eval.c")
def _(d):
    return ["eval", "--model", TINY, "--data", ALPACA, "--seq-len", "64", "--per-example",
            "no-such-dir/losses.jsonl"]


@case("options", "`eval --per-example` naming the `--data` file itself", "cli/cmd_eval.c")
def _(d):
    shutil.copy(ALPACA, d / "data.jsonl")
    return ["eval", "--model", TINY, "--data", "data.jsonl", "--seq-len", "64", "--per-example",
            "data.jsonl"]


@case("generate", "`--chat` with `--prompt`", "cli/cmd_generate.c")
def _(d):
    return ["generate", "--model", TINY, "--chat", "--prompt", "hi"]


@case("generate", "`--presence-penalty 0.5` (removed)", "cli/cmd_generate.c removed_flag")
def _(d):
    return ["generate", "--model", TINY, "--prompt", "hi", "--presence-penalty", "0.5"]


# ---- issue 31: silent wrong results, outputs over inputs -------------------------------------

NUL_REC = '{"instruction": "alpha\\u0000 beta gamma", "input": "", "output": "5"}\n'


@case("data", "a string holding U+0000 as the escape `\\u0000` (was cut there, trained as "
      "`alpha</s>`, exit 0)", "test_reliability_inputs.py; src/data/records.c")
def _(d):
    data(d, NUL_REC)
    return train(TINY, "data.jsonl")


@case("data", "a raw NUL byte inside a string (line 2)", "test_reliability_inputs.py; src/core/json.c")
def _(d):
    data(d, (GOOD + '{"instruction": "a\x00b", "input": "", "output": "5"}\n').encode())
    return train(TINY, "data.jsonl")


@case("data", "JSON array: record 2's output holds `\\u0000`", "test_reliability_inputs.py")
def _(d):
    data(d, '[%s,\n {"instruction": "x", "input": "", "output": "y\\u0000z"}]' % GOOD.strip(),
         "arr.json")
    return train(TINY, "arr.json")


@case("data", "`\\u0000` in a record, with --skip-bad-records (trains; counts it)",
      "test_reliability_inputs.py")
def _(d):
    data(d, GOOD * 3 + NUL_REC)
    return train(TINY, "data.jsonl", "--skip-bad-records")


def gguf_id(d, key, value):
    """The fuzz corpus's tiny GGUF (262 tokens) with the uint32 metadata value of key set."""
    b = bytearray(GGUF_TOK.read_bytes())
    i = b.find(key.encode()) + len(key) + 4
    b[i:i + 4] = struct.pack("<I", value)
    (d / "t.gguf").write_bytes(bytes(b))
    return train("t.gguf", ALPACA)


@case("GGUF", "`tokenizer.ggml.bos_token_id` 99999, past the 262 tokens (BOS had vanished from "
      "every example, exit 0)", "test_reliability_inputs.py; src/tokenizer/tok_spec.c")
def _(d):
    return gguf_id(d, "tokenizer.ggml.bos_token_id", 99999)


@case("GGUF", "`tokenizer.ggml.eos_token_id` 262, just past the vocabulary (EOS had vanished)",
      "test_reliability_inputs.py; src/tokenizer/tok_spec.c")
def _(d):
    return gguf_id(d, "tokenizer.ggml.eos_token_id", 262)


@case("tokenizer.json", "an added token with id 32005, past the model's vocab_size 32000 (was "
      "found inside the embedding kernel, naming no file)", "test_reliability_inputs.py; "
      "src/model/loader.c ft_model_tokenizer")
def _(d):
    m = model(d)
    t = json.loads((m / "tokenizer.json").read_text())
    t["added_tokens"].append({"id": 32005, "content": "<extra>", "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False,
                              "special": True})
    (m / "tokenizer.json").write_text(json.dumps(t))
    return train("model", ALPACA)


def _opt_case(flag, value, was):
    @case("options", f"`{flag} {value}` ({was})", "test_reliability_inputs.py; cli/args.c g_domains")
    def _(d):
        return train(TINY, ALPACA, flag, value)


_opt_case("--adam-eps", "0", "trained to an adapter of NaN, exit 0")
_opt_case("--lora-alpha", "nan", 'wrote "lora_alpha": null, exit 0')
_opt_case("--seq-len", "0", "silently the default")
_opt_case("--weight-decay", "-1", "accepted; torch's AdamW refuses it")
_opt_case("--max-steps", "0", "silently a whole epoch")


@case("options", "`--config` holding `\"lora_r\": 8.5` (was rounded to 9)", "cli/args.c")
def _(d):
    (d / "opts.json").write_text('{"lora_r": 8.5}')
    return ["train", "--config", "opts.json", "--model", TINY, "--data", ALPACA]


def _adapter_type_case(key, value, was):
    @case("adapter", f"adapter_config.json with `\"{key}\": {json.dumps(value)}` ({was})",
          "test_reliability_inputs.py; adapters/peft.c (PEFT's LoraConfig types)")
    def _(d):
        a = adapter(d)
        c = json.loads((a / "adapter_config.json").read_text())
        c[key] = value
        (a / "adapter_config.json").write_text(json.dumps(c, indent=1))
        return ["merge", "--model", TINY, "--adapter", "good", "--out", "merged"]


_adapter_type_case("lora_alpha", "32", "merged with alpha 8, exit 0")
_adapter_type_case("use_rslora", "true", "read as false")
_adapter_type_case("use_dora", 1, "merged as plain LoRA")


def damage_adapter(a, value):
    """value written into element 2 of the first tensor (by name) of a's weights."""
    p = a / "adapter_model.safetensors"
    b, n, h = st_read(p)
    k = sorted(x for x in h if x != "__metadata__")[0]
    off = 8 + n + h[k]["data_offsets"][0] + 8
    b = bytearray(b)
    b[off:off + 4] = struct.pack("<f", value)
    p.write_bytes(bytes(b))


@case("adapter", "`export` of an adapter holding +inf (wrote a non-finite GGUF, exit 0)",
      "test_reliability_inputs.py; adapters/peft.c ft_peft_open")
def _(d):
    damage_adapter(adapter(d), float("inf"))
    return ["export", "--adapter", "good", "--out", "a.gguf", "--model", TINY]


@case("adapter", "`merge` of an adapter holding NaN (wrote a non-finite model, exit 0)",
      "test_reliability_inputs.py; adapters/peft.c ft_peft_open")
def _(d):
    damage_adapter(adapter(d), float("nan"))
    return ["merge", "--model", TINY, "--adapter", "good", "--out", "merged"]


@case("outputs", "`export --out` the adapter's own weights file (replaced them with the GGUF)",
      "test_reliability_inputs.py; src/core/paths.c")
def _(d):
    adapter(d)
    return ["export", "--adapter", "good", "--out", "good/adapter_model.safetensors"]


@case("outputs", "`merge --out` the `--model` folder (replaced the base's weights)",
      "test_reliability_inputs.py; src/core/paths.c")
def _(d):
    adapter(d)
    model(d)
    return ["merge", "--model", "model", "--adapter", "good", "--out", "model"]


@case("outputs", "`merge --out` a symlink into the `--model` folder", "test_reliability_inputs.py")
def _(d):
    adapter(d)
    model(d)
    (d / "link").symlink_to("model")
    return ["merge", "--model", "model", "--adapter", "good", "--out", "link/merged"]


@case("outputs", "`train --out` the `--init-adapter` folder (the final adapter would replace it)",
      "test_reliability_inputs.py")
def _(d):
    adapter(d)
    return ["train", "--model", TINY, "--data", ALPACA, "--out", "good", *TRAIN, "--init-adapter",
            "good"]


# ---- pack-only model folders --------------------------------------------------------------

def pack_only(d, *quant):
    """A model folder holding only a pack (init-model --pack [--quant bf16]): random weights of
    tiny-llama's shapes, its tokenizer."""
    r = subprocess.run([FTUNE, "init-model", "--config", str(TINY / "config.json"), "--out",
                        str(d / "packed"), "--pack", *quant, "--tokenizer", str(TINY)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit("cannot build the pack-only folder: " + r.stderr)
    return "packed"


def _pack_only_cases():
    cmds = {
        "eval": lambda q: ["eval", "--model", "packed", "--data", ALPACA, "--seq-len", "64",
                           "--threads", "1", *q],
        "generate": lambda q: ["generate", "--model", "packed", "--prompt", "hi",
                               "--max-new-tokens", "2", "--threads", "1", *q],
        "logits": lambda q: ["logits", "--model", "packed", "--ids", "1,2,3", "--out",
                             "logits.bin", "--threads", "1", *q],
    }
    for name, argv in cmds.items():
        @case("model folder",
              f"`{name} --quant bf16` on a folder holding only an NF4 pack (`init-model --pack`)",
              "offload/session.c ft_session_open_backend")
        def _(d, argv=argv):
            pack_only(d)
            return argv(["--quant", "bf16"])

        @case("model folder", f"`{name} --quant nf4` on a folder holding only a bf16 pack "
              "(`init-model --pack --quant bf16`)",
              "offload/session.c open_forward_base")
        def _(d, argv=argv):
            pack_only(d, "--quant", "bf16")
            return argv(["--quant", "nf4", "--cache-dir", "cache"])


_pack_only_cases()


# ---- checkpoints (--resume) ---------------------------------------------------------------

M64 = (1 << 64) - 1


def ckpt_hash(b, h=0xcbf29ce484222325):
    """checkpoint.c ft_ckpt_hash: FNV-1a's step over 8-byte little-endian words, then bytes."""
    n8 = len(b) - len(b) % 8
    for i in range(0, n8, 8):
        h = ((h ^ int.from_bytes(b[i:i + 8], "little")) * 0x100000001b3) & M64
    for x in b[n8:]:
        h = ((h ^ x) * 0x100000001b3) & M64
    return h


def checkpoint(d):
    """A real checkpoint: tiny-llama trained 1 step with --save-every 1 into out/; the final
    adapter is removed so that the adapter column tells what the resumed run wrote."""
    r = subprocess.run([FTUNE, "train", "--model", str(TINY), "--data", str(ALPACA), "--out",
                        str(d / "out"), *TRAIN, "--save-every", "1"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit("cannot train the reference checkpoint: " + r.stderr)
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        (d / "out" / f).unlink()
    return d / "out" / "checkpoint-1"


def resume(*extra):
    return train(TINY, ALPACA, "--save-every", "1", *extra, "--resume", "out/checkpoint-1")


def seal_state(t):
    """checkpoint.c ft_ckpt_state_seal: the 16 digits of the last "state_fnv1a64" become the
    hash of the text with those digits read as '0' (version 2's own hash of the state)."""
    m = None
    for m in re.finditer(r'"state_fnv1a64"\s*:\s*"([0-9a-f]{16})"', t):
        pass
    if not m:
        return t
    a, b = m.span(1)
    z = (t[:a] + "0" * 16 + t[b:]).encode()
    return t[:a] + "%016x" % ckpt_hash(z) + t[b:]


def edit_state(ck, fn, seal=True):
    """Edits trainer_state.json by fn, then (seal) records its own hash anew, so that the
    check behind the hash is what the row shows."""
    p = ck / "trainer_state.json"
    s = p.read_text()
    t = fn(s)
    assert t != s, "the trainer state edit changed nothing"
    p.write_text(seal_state(t) if seal else t)


def _num_key(key, value):
    """Replaces the number after "key": (the first one) with value, as text."""
    return lambda s: re.sub(r'("%s":\s*)[-+0-9.eE]+' % key, lambda m: m.group(1) + value, s,
                            count=1)


@case("checkpoint", "trainer_state.json: key `step` twice in one object", "fuzz_ckptstate (fixed)")
def _(d):
    edit_state(checkpoint(d), lambda s: s.replace('"run_id"', '"step":\t1,\n\t"run_id"', 1))
    return resume()


@case("checkpoint", "trainer_state.json: text after the JSON object", "fuzz_ckptstate (fixed)")
def _(d):
    # elapsed_s (a valid 1.5) given a fixed width, so that the offset is the same on every run
    # (it still depends on the length of the checkout's path, recorded under "info")
    edit_state(checkpoint(d), lambda s: _num_key("elapsed_s", "1.5")(s) + '{"step": 2}\n')
    return resume()


@case("checkpoint", "trainer_state.json: `elapsed_s` -1.5", "fuzz_ckptstate (fixed)")
def _(d):
    edit_state(checkpoint(d), _num_key("elapsed_s", "-1.5"))
    return resume()


@case("checkpoint", "trainer_state.json: `last_loss` 1e999 (infinite)", "fuzz_ckptstate (fixed)")
def _(d):
    edit_state(checkpoint(d), _num_key("last_loss", "1e999"))
    return resume()


def damage_moment(ck, name, i, value):
    """Writes value into element i of tensor name of optimizer.safetensors, then records the
    file's new hash in trainer_state.json's "files" (as fuzz_ckptstate does), so the load gets
    past the hash check to the moment check."""
    p = ck / "optimizer.safetensors"
    old = "%016x" % ckpt_hash(p.read_bytes())
    b, n, h = st_read(p)
    b = bytearray(b)
    off = 8 + n + h[name]["data_offsets"][0] + 4 * i
    b[off:off + 4] = struct.pack("<f", value)
    p.write_bytes(bytes(b))
    edit_state(ck, lambda s: s.replace(old, "%016x" % ckpt_hash(bytes(b)), 1))


@case("checkpoint", "optimizer.safetensors: `exp_avg[3]` NaN (hash recorded anew)",
      "fuzz_ckptstate (fixed)")
def _(d):
    damage_moment(checkpoint(d), "exp_avg", 3, float("nan"))
    return resume()


@case("checkpoint", "optimizer.safetensors: `exp_avg_sq[5]` -1 (hash recorded anew)",
      "fuzz_ckptstate (fixed)")
def _(d):
    damage_moment(checkpoint(d), "exp_avg_sq", 5, -1.0)
    return resume()


# ---- DPO reference cache ------------------------------------------------------------------

PREF = ROOT / "examples" / "data" / "alpaca-seed-tasks" / "alpaca_seed_pref.jsonl"
DPO = ["--method", "dpo", "--max-steps", "2", "--seq-len", "256", "--threads", "1",
       "--eval-fraction", "0", "--save-every", "1"]


# ---- issue 31 classes 7-10: the output folder's lock, every checkpoint byte, memory -------

HOLDERS = []  # flock(1) processes holding a lock for a row; ended after the table


HOLD = """import fcntl, sys
f = open(sys.argv[1], "a+")
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
f.truncate(0); f.write(sys.argv[2]); f.flush()
print("held", flush=True)
sys.stdin.read()  # until the table ends (HOLDERS closes its stdin)
"""


def held(d, pid_text, out="out"):
    """d/out locked by a live process (a Python helper holding d/out/.ftune.lock, whose text
    is pid_text, as a running ftune's would be); returns once the lock is held."""
    (d / out).mkdir(exist_ok=True)
    lock = d / out / ".ftune.lock"
    h = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), pid_text], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    HOLDERS.append(h)
    if h.stdout.readline().strip() != "held":
        raise SystemExit(f"cannot hold {lock} for the row")


@case("output folder", "`--out` held by another live run (its pid in out/.ftune.lock)", "issue 31 class 7")
def _(d):
    held(d, "4242\n")
    return train(TINY, ALPACA)


@case("output folder", "`--resume` on an `--out` another run holds (no pid written yet)", "issue 31 class 7")
def _(d):
    held(d, "")
    return train(TINY, ALPACA, "--resume")


@case("output folder", "stale lock: out/.ftune.lock names a process that is gone (exit 0)", "issue 31 class 7")
def _(d):
    (d / "out").mkdir()
    (d / "out" / ".ftune.lock").write_text("%d\n" % (int(Path("/proc/sys/kernel/pid_max").read_text()) + 7))
    return train(TINY, ALPACA)


def sweep(*extra, out="out"):
    return ["sweep", "--model", TINY, "--data", ALPACA, "--out", out, *TRAIN, *extra]


@case("output folder", "`ftune sweep --out` held by another live run (its pid in out/.ftune.lock)",
      "issue 31 class 7, test_reliability_runs.py")
def _(d):
    held(d, "4242\n")
    return sweep("--grid", "lr=1e-3,2e-3")


@case("output folder", "`ftune merge --out` held by another live run (its pid in out/.ftune.lock)",
      "issue 31 class 7, test_reliability_runs.py")
def _(d):
    ad = adapter(d)
    held(d, "4242\n")
    return ["merge", "--model", TINY, "--adapter", ad.name, "--out", "out"]


@case("output folder", "`ftune merge --format gguf --out` (a folder) held by another live run "
      "(no pid written yet)", "issue 31 class 7, test_reliability_runs.py")
def _(d):
    ad = adapter(d)
    held(d, "")
    return ["merge", "--model", TINY, "--adapter", ad.name, "--out", "out", "--format", "gguf"]


@case("output folder", "`ftune init-model --out` held by another live run (its pid in "
      "out/.ftune.lock)", "issue 31 class 7, test_reliability_runs.py")
def _(d):
    held(d, "4242\n")
    return ["init-model", "--config", TINY / "config.json", "--out", "out", "--threads", "1"]


@case("output folder", "`ftune init-model`: stale lock in out/ (its process is gone; exit 0, "
      "only the lock's line shown)", "issue 31 class 7, test_reliability_runs.py")
def _(d):
    (d / "out").mkdir()
    (d / "out" / ".ftune.lock").write_text("%d\n" % (int(Path("/proc/sys/kernel/pid_max").read_text()) + 7))
    return ["init-model", "--config", TINY / "config.json", "--out", "out", "--threads", "1"], "lock"


@case("output folder", "`train --out` names an existing file", "test_reliability_runs.py")
def _(d):
    data(d, "not a folder\n", "out")
    return train(TINY, ALPACA)


@case("output folder", "`merge --out` names an existing file", "test_reliability_runs.py")
def _(d):
    ad = adapter(d)
    data(d, "not a folder\n", "out")
    return ["merge", "--model", TINY, "--adapter", ad.name, "--out", "out"]


# ---- ftune sweep: the search space ---------------------------------------------------------

# (what, source, the sweep's extra flags), one row each, in this order
SWEEP_FLAG_CASES = [
    ("`--grid` key that is not a training option", "test_sweep_run.py test_errors",
     ["--grid", "learning_rate=1e-3,2e-3"]),
    ("`--grid` key of an option of the whole pass (`seq_len`)", "test_sweep_run.py",
     ["--grid", "seq_len=64,128"]),
    ("`--grid lora_r=8,abc`: a value of the wrong type", "test_sweep_run.py test_errors",
     ["--grid", "lora_r=8,abc"]),
    ("`--grid lr=`: an empty list of values", "sweep_space.c", ["--grid", "lr="]),
    ("`--grid lr=1e-3,,2e-3`: an empty value in the list", "sweep_space.c",
     ["--grid", "lr=1e-3,,2e-3"]),
    ("no `--grid` and no `--config`", "test_sweep_run.py test_errors", []),
    ("a grid of 6 trials with `--max-trials 5`", "test_sweep_run.py test_errors",
     ["--grid", "lr=1e-3,2e-3,3e-3", "--grid", "lora_r=4,8", "--max-trials", "5"]),
    ("`seed` as a grid key", "test_sweep_run.py test_errors", ["--grid", "seed=1,2"]),
]
for _what, _source, _flags in SWEEP_FLAG_CASES:
    case("sweep", _what, _source)(lambda d, flags=_flags: sweep(*flags))

# (what, the text of sweep.json) for `--config sweep.json`, one row each, in this order
SWEEP_CONFIG_CASES = [
    ("an unknown top-level key (`grids`)", '{"grids": {"lora_r": [8, 16]}}\n'),
    ("a grid key that is not a training option", '{"grid": {"learning_rate": [1e-3, 2e-3]}}\n'),
    ("a grid value of the wrong type (`\"lora_r\": [8, \"x\"]`)", '{"grid": {"lora_r": [8, "x"]}}\n'),
    ("a grid dimension that is not a list (`\"lora_r\": \"8\"`)", '{"grid": {"lora_r": "8"}}\n'),
    ("not valid JSON", '{"grid": {"lora_r": [8, 16]}\n'),
]


def _sweep_config(d, text):
    data(d, text, "sweep.json")
    return sweep("--config", "sweep.json")


for _what, _text in SWEEP_CONFIG_CASES:
    case("sweep", "`--config sweep.json`: " + _what, "sweep_space.c")(
        lambda d, text=_text: _sweep_config(d, text))


@case("sweep", "one trial fails on its own setting (`early_stopping_patience` 2 without "
      "`--eval-every`), the other goes on (exit 0; under --quiet the failure is the one line shown)",
      "test_sweep_run.py test_quiet_sweep_still_names_a_failed_trial")
def _(d):
    return sweep("--grid", "early_stopping_patience=0,2"), ("] failed:",)


def flip_byte(p, i, x=1):
    b = bytearray(p.read_bytes())
    b[i] ^= x
    p.write_bytes(bytes(b))


@case("checkpoint", "trainer_state.json: one bit of the `cursor` value flipped", "issue 31 class 8")
def _(d):
    ck = checkpoint(d)
    t = (ck / "trainer_state.json").read_text()
    i = re.search(r'"cursor":\s*(\d)', t).start(1)
    flip_byte(ck / "trainer_state.json", i)
    return resume()


@case("checkpoint", "trainer_state.json: a tab turned into a newline (still valid JSON)", "issue 31 class 8")
def _(d):
    ck = checkpoint(d)
    t = (ck / "trainer_state.json").read_text()
    flip_byte(ck / "trainer_state.json", t.index("\t"), 0x09 ^ 0x0a)
    return resume()


@case("checkpoint", "trainer_state.json (version 2) without its own hash `state_fnv1a64`", "issue 31 class 8")
def _(d):
    ck = checkpoint(d)
    edit_state(ck, lambda s: re.sub(r',\s*"state_fnv1a64"\s*:\s*"[0-9a-f]{16}"', "", s), seal=False)
    return resume()


@case("checkpoint", "bare `--resume`: the newest checkpoint's adapter has a byte flipped; the "
      "earlier one is used (exit 0)", "issue 31 class 8")
def _(d):
    r = subprocess.run([FTUNE, "train", "--model", str(TINY), "--data", str(ALPACA), "--out",
                        str(d / "out"), *TRAIN[2:], "--max-steps", "2", "--save-every", "1"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit("cannot train the reference checkpoints: " + r.stderr)
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        (d / "out" / f).unlink()
    flip_byte(d / "out" / "checkpoint-2" / "adapter_model.safetensors", 5000)
    return (["train", "--model", TINY, "--data", ALPACA, "--out", "out", *TRAIN[2:], "--max-steps",
             "2", "--save-every", "1", "--resume"], "--resume")


@case("memory", "training under `ulimit -v` 200 MB (RLIMIT_AS)", "issue 31 class 9")
def _(d):
    return {"argv": train(TINY, ALPACA, "--threads", "2"), "as_mb": 200}


@case("memory", "training the example-sized model under `ulimit -v` 50 MB", "issue 31 class 9")
def _(d):
    return {"argv": train(TINY, ALPACA), "as_mb": 50}


@case("data file", "`--data /dev/zero` (endless) under `ulimit -v` 1500 MB", "issue 31 class 10")
def _(d):
    return {"argv": train(TINY, "/dev/zero"), "as_mb": 1500}


@case("data file", "`--data -` from an endless pipe (`yes`) under `ulimit -v` 1500 MB", "issue 31 class 10")
def _(d):
    return {"argv": train(TINY, "-"), "as_mb": 1500, "stdin_cmd": ["yes", '{"text": "endless"}']}


@case("data file", "a gzip data file expanding to 400 MiB, under `ulimit -v` 1500 MB", "issue 31 class 10")
def _(d):
    import gzip
    with gzip.open(d / "bomb.jsonl.gz", "wb", compresslevel=1) as f:
        for _ in range(400):
            f.write(b" " * (1 << 20))
    return {"argv": train(TINY, "bomb.jsonl.gz"), "as_mb": 1500}


@case("DPO reference", "dpo_reference.bin of a 2-step run on the first 8 pairs of "
      "alpaca_seed_pref.jsonl: train value 0 NaN, checksum valid (not an error: computed "
      "again; only the stderr lines naming the reference are shown, the run prints its "
      "progress too)", "fuzz_dporef (fixed)")
def _(d):
    data(d, "".join(PREF.read_text().splitlines(True)[:8]), "pref.jsonl")
    argv = ["train", "--model", str(TINY), "--data", "pref.jsonl", "--out", "out", *DPO]
    r = subprocess.run([FTUNE, *argv, "--quiet"], cwd=d, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise SystemExit("cannot train the reference DPO run: " + r.stderr)
    p = d / "out" / "dpo_reference.bin"
    b = bytearray(p.read_bytes())
    assert ckpt_hash(bytes(b[:-8])) == struct.unpack("<Q", b[-8:])[0]
    b[104:112] = struct.pack("<d", float("nan"))  # dpo_refcache.h: train[0] at offset 104
    b[-8:] = struct.pack("<Q", ckpt_hash(bytes(b[:-8])))
    p.write_bytes(bytes(b))
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        (d / "out" / f).unlink()
    return argv + ["--resume", "out/checkpoint-1"], "DPO reference"


# ---- --eval-prompts (src/train/eval_samples.c) ---------------------------------------------

EVAL = ["--eval-fraction", "0.2", "--eval-prompts", "prompts.jsonl"]


@case("eval prompts", "`--eval-prompts` file missing", "test_eval_prompts.py")
def _(d):
    return train(TINY, ALPACA, *EVAL)


@case("eval prompts", "`--eval-prompts` file empty", "test_eval_prompts.py")
def _(d):
    data(d, "", "prompts.jsonl")
    return train(TINY, ALPACA, *EVAL)


@case("eval prompts", "`--eval-prompts` line 2 malformed JSON", "test_eval_prompts.py")
def _(d):
    data(d, '"Hi."\n{"prompt": \n', "prompts.jsonl")
    return train(TINY, ALPACA, *EVAL)


@case("eval prompts", "`--eval-prompts` line 2 no prompt (`{\"foo\": 1}`)", "test_eval_prompts.py")
def _(d):
    data(d, '"Hi."\n{"foo": 1}\n', "prompts.jsonl")
    return train(TINY, ALPACA, *EVAL)


@case("eval prompts", "`--eval-prompts` of 65 prompts (at most 64)", "test_eval_prompts.py")
def _(d):
    data(d, '"Hi."\n' * 65, "prompts.jsonl")
    return train(TINY, ALPACA, *EVAL)


@case("eval prompts", "`--eval-prompts` in a run without evaluation (`--eval-fraction 0`)",
      "test_eval_prompts.py")
def _(d):
    data(d, '"Hi."\n', "prompts.jsonl")
    return train(TINY, ALPACA, "--eval-prompts", "prompts.jsonl")


def md(s):
    return s.strip().replace("|", "\\|").replace("\n", "<br>") or "(nothing)"


def main():
    global FTUNE
    ap = argparse.ArgumentParser()
    ap.add_argument("--ftune", default=os.environ.get("FTUNE_BIN", str(ROOT / "build" / "ftune")))
    ap.add_argument("--out", default=str(ROOT / "docs" / "bad-input.md"))
    a = ap.parse_args()
    FTUNE = os.path.abspath(a.ftune)
    rows = []
    crashes = 0
    for group, what, source, fn in CASES:
        with tempfile.TemporaryDirectory(prefix="ftune-bad-") as td:
            d = Path(td)
            lead = ""
            got = fn(d)  # argv, or (argv, text): then only stderr lines holding text are shown,
            # or {"argv", "as_mb" (an address-space limit), "stdin_cmd" (a command piped in)}
            opts = got if isinstance(got, dict) else {}
            got = opts.get("argv", got)
            got, keep = got if isinstance(got, tuple) else (got, None)
            argv = [str(x) for x in got]  # repository files absolute, the rest relative to d
            feed = subprocess.Popen(opts["stdin_cmd"], stdout=subprocess.PIPE) if "stdin_cmd" in opts else None
            mb = opts.get("as_mb")
            pre = (lambda: __import__("resource").setrlimit(
                __import__("resource").RLIMIT_AS, (mb * 10**6, mb * 10**6))) if mb else None
            r = subprocess.run([FTUNE] + argv, cwd=d, capture_output=True, preexec_fn=pre,
                               stdin=feed.stdout if feed else subprocess.DEVNULL,
                               text=True, timeout=600, errors="replace")
            if feed:
                feed.kill()
                feed.wait()
            lead = ("ulimit -v %d; " % (mb * 10**6 // 1024)) if mb else ""
            if "stdin_cmd" in opts:
                lead += opts["stdin_cmd"][0] + " ... | "
            adapter_written = (d / "out" / "adapter_model.safetensors").exists()
            err = r.stderr.replace(td + "/", "").replace(str(ROOT) + "/", "")
            if keep:  # one text, or a tuple of texts: the lines holding one of them
                keep = keep if isinstance(keep, tuple) else (keep,)
                err = "".join(ln for ln in err.splitlines(True) if any(k in ln for k in keep))
            if r.returncode < 0 or r.returncode >= 128:
                crashes += 1
            shown = " ".join(argv).replace(str(ROOT) + "/", "")
            rows.append((group, what, source, lead + "ftune " + shown, r.returncode, err, adapter_written))
            print(f"[{r.returncode:3d}] {group}: {what}: {err.strip()[:150]}")
    for h in HOLDERS:
        h.stdin.close()
        h.wait(timeout=60)
    out = [
        "# Bad input: what the user sees",
        "",
        "Every row was produced by running `ftune` on the input described (generated by",
        "`python3 tests/fuzz/bad_input_table.py --ftune build/ftune`; nothing in the message",
        "column is typed by hand). Paths are relative to the folder the command ran in; the",
        "model is `tests/fixtures/tiny-llama` (copied into `model/` and edited where the row",
        "says so), the data `examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl`, and",
        "training runs use `--max-steps 1 --seq-len 64 --quiet --threads 1 --eval-fraction 0`",
        "(shortened to `...` below). The contract (err.h, STYLE C2): one line `ftune: ...`",
        "naming the file and the offset, line, record, key or tensor; exit status 1 or 2,",
        "never a signal; no adapter written. Exit status 0 marks an input that is accepted on",
        "purpose (skipped records, byte fallback, a damaged DPO reference computed again).",
        "Rows that need a checkpoint, a pack-only folder or a DPO run build it first with",
        "`ftune` itself (a real run), then damage it as the row says; where a file's recorded",
        "hash would catch the damage first, the hash is recorded anew (as the fuzz target",
        "tests/fuzz/fuzz_ckptstate.c does) so that the check behind it is what the row shows.",
        "",
        f"{len(rows)} cases, {crashes} crashes (exit by a signal). Rows whose source names a",
        "fuzz target are the fuzzers' findings: before the fix, the `eos_token_id`, vocabulary",
        "id and `r` rows were undefined behaviour (a double cast to int64 out of range; UBSan),",
        "the BOS-id row crashed `ftune train` with SIGSEGV (exit 139, strlen(NULL) in",
        "src/tokenizer/tokenizer.c tk_finalize) and the empty `target_modules` row was accepted and",
        "failed later without naming the file.",
        "",
        "| # | file | bad input | source | exit | what the user sees (stderr) | adapter |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (g, what, src, cmd, rc, err, aw) in enumerate(rows, 1):
        out.append(f"| {i} | {g} | {md(what)} | {md(src)} | {rc} | `{md(err)}` | "
                   f"{'written' if aw else 'none'} |")
    out += ["", "## Commands", ""]
    for i, (g, what, src, cmd, rc, err, aw) in enumerate(rows, 1):
        cmd = cmd.replace(" ".join(TRAIN), "...")
        out.append(f"{i}. `{cmd}`")
    out += ["", "## Fuzzing", "",
            "The parsers behind these files are fuzzed by `make fuzz` (tests/fuzz/, libFuzzer with",
            "ASan + UBSan); their seed corpora are replayed by `make test`. Inputs that crashed",
            "a target are kept in `tests/fuzz/corpus/<target>/regress-*` once fixed, and listed",
            "with exec counts in `tests/fuzz/RESULTS.md`.", ""]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(out))
    print(f"wrote {a.out}: {len(rows)} cases, {crashes} crashes")


if __name__ == "__main__":
    main()
