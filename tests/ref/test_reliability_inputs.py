"""Issue 31, classes 1-6: inputs that once gave a silently wrong result, or outputs that
replaced an input. Each case must end with one "ftune: " line naming the file (and the key,
line, column, offset or tensor), exit 1 (2 for a flag's value), no adapter, no output file,
and every input file byte for byte as it was (hashed before and after); where the input is
valid it must work. Every subprocess runs under a timeout.

  1 a NUL in a JSON string (the escape \\u0000 or a raw 0 byte): refused by line and column,
    never cut (records, preference pairs, prompts, --config, adapter_config.json,
    tokenizer_config.json); a literal backslash-u0000 text is not one
  2 special tokens that do not exist: a GGUF bos/eos/unknown id past the vocabulary; a
    tokenizer id past the model's embedding rows (an added token, a larger vocabulary)
  3 numeric settings: every flag's domain (torch's AdamW, PEFT), --seq-len 0 is not the
    default, --config values too, and every numeric option of every command has a domain
  4 adapter_config.json of the wrong JSON types (PEFT's LoraConfig)
  5 an adapter holding inf or NaN: export, merge, eval and --init-adapter refuse it
  6 outputs that are, or are inside, an input (symlinks and hard links resolved)
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from cli_helpers import (ADAPTER_FILES, ROOT, SEED_DATA, TINY, assert_clean_error, ftune_bin,
                         model_copy, st_read, st_write)

TIMEOUT = 120
TRAIN = ["--max-steps", "1", "--seq-len", "64", "--quiet", "--threads", "1",
         "--eval-fraction", "0"]
GGUF_TOK = ROOT / "tests" / "fuzz" / "corpus" / "gguf" / "tiny_llama_tok_gpt2.gguf"
GOOD = {"instruction": "Add 2 and 3.", "input": "", "output": "5"}


def ftune(*args, cwd=None, stdout=None):
    return subprocess.run([ftune_bin()] + [str(a) for a in args], cwd=cwd,
                          stdout=stdout if stdout is not None else subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, errors="replace", timeout=TIMEOUT)


def digest(*paths):
    """sha256 of every file under each path (a file or a folder), by path."""
    out = {}
    for p in map(Path, paths):
        files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def refused(r, rc, *needles, out=None):
    assert r.returncode == rc, (r.returncode, r.stderr)
    return assert_clean_error(r, out, *needles)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A real adapter: tiny-llama trained one step."""
    out = tmp_path_factory.mktemp("adapter") / "a"
    r = ftune("train", "--model", TINY, "--data", SEED_DATA, "--out", out, *TRAIN)
    assert r.returncode == 0, r.stderr
    return out


def copy_adapter(src, dst):
    dst.mkdir(parents=True)
    for f in ADAPTER_FILES:
        shutil.copy(src / f, dst / f)
    return dst


def train_refused(tmp_path, data, rc, *needles, extra=()):
    inputs = digest(data, TINY)
    out = tmp_path / "out"
    r = ftune("train", "--model", TINY, "--data", data, "--out", out, *TRAIN, *extra)
    line = refused(r, rc, *needles, out=out)
    assert digest(data, TINY) == inputs
    return line


# ---- 1: a NUL in a JSON string ---------------------------------------------------------

NUL_ESC = '"alpha\\u0000 beta gamma"'  # the JSON text of a string holding U+0000


def col(line, needle="\\u0000"):
    """1-based column of needle in line (what the reader names)."""
    return line.index(needle) + 1


@pytest.mark.parametrize("lines", [
    ['{"instruction": %s, "input": "", "output": "5"}' % NUL_ESC],
    [json.dumps(GOOD), json.dumps(GOOD), '{"instruction": "x", "input": "", "output": %s}' % NUL_ESC],
    ['{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": %s}]}'
     % NUL_ESC],
    ['{"text": %s}' % NUL_ESC],
    ['{"prompt": "p", "completion": "a\\u0000"}'],
])
def test_nul_escape_refuses_the_record(tmp_path, lines):
    d = tmp_path / "d.jsonl"
    d.write_text("\n".join(lines) + "\n")
    n = len(lines)
    line = train_refused(tmp_path, d, 1, str(d), f"line {n}: column {col(lines[-1])}", "U+0000")
    assert "its rest would be lost" in line


def test_nul_raw_byte_and_json_array(tmp_path):
    d = tmp_path / "raw.jsonl"
    raw = '{"instruction": "a\x00b", "input": "", "output": "5"}'
    d.write_text(raw + "\n")
    train_refused(tmp_path, d, 1, str(d), f"line 1: column {col(raw, chr(0))}", "raw NUL byte")
    a = tmp_path / "arr.json"
    second = ' {"instruction": "x", "input": %s, "output": "y"}]' % NUL_ESC
    a.write_text("[%s,\n%s" % (json.dumps(GOOD), second))
    train_refused(tmp_path, a, 1, str(a), f"record 2: line 2, column {col(second)}")


def test_nul_skip_bad_records_counts_it(tmp_path):
    """--skip-bad-records: the record is skipped and counted, the others train."""
    d = tmp_path / "d.jsonl"
    d.write_text((json.dumps(GOOD) + "\n") * 3 +
                 '{"instruction": %s, "input": "", "output": "5"}\n' % NUL_ESC)
    out = tmp_path / "out"
    r = ftune("train", "--model", TINY, "--data", d, "--out", out, *TRAIN, "--skip-bad-records")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["n_skipped"] == 1


def test_literal_backslash_u0000_is_text(tmp_path):
    """"\\\\u0000" in JSON is the six characters \\u0000, not a NUL: the whole string trains."""
    d = tmp_path / "d.jsonl"
    text = "alpha \\u0000 beta gamma delta"
    d.write_text(json.dumps({"text": text}) + "\n")
    r = ftune("tokenize", "--model", TINY, "--data", d)
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)["ids"]
    r = ftune("tokenize", "--model", TINY, "--text", text)
    want = json.loads(r.stdout)["ids"]
    assert ids[:len(want)] == want and len(ids) >= len(want), (ids, want)
    out = tmp_path / "out"
    r = ftune("train", "--model", TINY, "--data", d, "--out", out, *TRAIN, "--data-format", "text")
    assert r.returncode == 0, r.stderr


def test_nul_in_other_json_inputs(tmp_path, adapter):
    # preference pairs (--method dpo reads them through the same records)
    p = tmp_path / "pref.jsonl"
    pair = '{"prompt": "q", "chosen": "a\\u0000", "rejected": "b"}'
    p.write_text(pair + "\n")
    r = ftune("tokenize", "--model", TINY, "--data", p, "--preference")
    refused(r, 1, str(p), f"line 1: column {col(pair)}", "U+0000")
    # generate --prompts
    q = tmp_path / "p.jsonl"
    q.write_text('"hi"\n{"prompt": "x\\u0000y"}\n')
    r = ftune("generate", "--model", TINY, "--prompts", q, "--max-new-tokens", "2",
              "--threads", "1")
    refused(r, 1, str(q), "line 2", "U+0000")
    # --config: a path cut at the NUL would be another path
    c = tmp_path / "opts.json"
    c.write_text('{"out": "run\\u0000/../../elsewhere"}')
    r = ftune("train", "--config", c, "--model", TINY, "--data", SEED_DATA)
    refused(r, 2, str(c), "offset %d" % c.read_text().index("\\u0000"), "U+0000")
    # adapter_config.json: "q_proj\u0000junk" would read as q_proj
    a = copy_adapter(adapter, tmp_path / "a")
    cfg = (a / "adapter_config.json").read_text()
    (a / "adapter_config.json").write_text(cfg.replace('"q_proj"', '"q_proj\\u0000junk"', 1))
    r = ftune("eval", "--model", TINY, "--adapter", a, "--data", SEED_DATA, "--seq-len", "64")
    refused(r, 1, str(a / "adapter_config.json"), "offset", "U+0000")
    # tokenizer_config.json: a chat template cut at the NUL
    m = model_copy(tmp_path)
    tc = json.loads((m / "tokenizer_config.json").read_text())
    tc["chat_template"] = "{{ bos_token }}\u0000{{ messages }}"
    (m / "tokenizer_config.json").write_text(json.dumps(tc))
    r = ftune("tokenize", "--model", m, "--text", "hi")
    refused(r, 1, str(m / "tokenizer_config.json"), "offset", "U+0000")


# ---- 2: special tokens that do not exist -------------------------------------------------

def gguf_with(tmp_path, key, value):
    b = bytearray(GGUF_TOK.read_bytes())
    i = b.find(key.encode())
    assert i > 0
    i += len(key) + 4  # the name, then its uint32 value type
    assert struct.unpack("<I", b[i - 4:i])[0] == 4  # GGUF_TYPE_UINT32
    b[i:i + 4] = struct.pack("<I", value)
    p = tmp_path / (key.split(".")[-1] + ".gguf")
    p.write_bytes(bytes(b))
    return p


@pytest.mark.parametrize("key", ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"])
@pytest.mark.parametrize("value", [262, 99999])
def test_gguf_special_id_past_vocabulary(tmp_path, key, value):
    g = gguf_with(tmp_path, key, value)
    before = digest(g)
    for args in (["train", "--model", g, "--data", SEED_DATA, "--out", tmp_path / "out", *TRAIN],
                 ["tokenize", "--model", g, "--text", "hi"],
                 ["generate", "--model", g, "--prompt", "hi", "--max-new-tokens", "1"]):
        r = ftune(*args)
        line = refused(r, 1, str(g), f"{key} = {value}", "262 tokens", out=tmp_path / "out")
        assert "ids 0..261" in line
    assert digest(g) == before


def add_token(m, tok_id, content, vocab=False):
    t = json.loads((m / "tokenizer.json").read_text())
    if vocab:
        t["model"]["vocab"][content] = tok_id
    else:
        t["added_tokens"].append({"id": tok_id, "content": content, "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": False,
                                  "special": True})
    (m / "tokenizer.json").write_text(json.dumps(t))


@pytest.mark.parametrize("tok_id, vocab", [(32000, False), (99999, False), (32000, True)])
def test_tokenizer_past_the_embedding(tmp_path, tok_id, vocab):
    """An added token (or a vocabulary entry) at or past vocab_size has no embedding row:
    refused at load, naming tokenizer.json and config.json, by every command that loads the
    model (found once only inside the embedding kernel, naming no file)."""
    m = model_copy(tmp_path)
    add_token(m, tok_id, "<extra>")
    if vocab:  # a larger vocabulary instead of an added token
        m2 = model_copy(tmp_path, name="model2")
        add_token(m2, tok_id, "zzzq", vocab=True)
        m = m2
    before = digest(m)
    out = tmp_path / "out"
    for args in (["train", "--model", m, "--data", SEED_DATA, "--out", out, *TRAIN],
                 ["eval", "--model", m, "--data", SEED_DATA, "--seq-len", "64"],
                 ["generate", "--model", m, "--prompt", "hi", "--max-new-tokens", "1"]):
        r = ftune(*args)
        refused(r, 1, f"{m}/tokenizer.json", f"has id {tok_id}", f"{m}/config.json",
                "32000 token embeddings", out=out)
    assert digest(m) == before


def test_logits_ids_past_the_vocabulary(tmp_path):
    r = ftune("logits", "--model", TINY, "--ids", "1,2,32000")
    refused(r, 1, "--ids", "id 32000 (position 2)", "ids 0..31999")


# ---- 3: numeric settings --------------------------------------------------------------------

@pytest.mark.parametrize("flag, value", [
    ("--adam-eps", "0"), ("--adam-eps", "-1e-8"), ("--lora-alpha", "nan"), ("--lora-alpha", "inf"),
    ("--lora-alpha", "0"), ("--lora-alpha", "1e-50"), ("--seq-len", "0"), ("--seq-len", "-64"),
    ("--weight-decay", "-1"), ("--adam-beta1", "1"), ("--adam-beta2", "-0.5"),
    ("--max-grad-norm", "-1"), ("--warmup-ratio", "1.5"), ("--min-lr-ratio", "nan"),
    ("--epochs", "0"), ("--epochs", "1e300"), ("--lr", "0"), ("--lr", "inf"),
    ("--batch-size", "0"), ("--max-steps", "0"), ("--lora-r", "0"), ("--lora-r", "5000"),
    ("--eval-fraction", "0.9"), ("--threads", "0"), ("--max-bad-steps", "0"),
    ("--warmup-steps", "-1"), ("--log-every", "0"), ("--save-every", "-2"),
])
def test_train_numeric_domain(tmp_path, flag, value):
    out = tmp_path / "out"
    args = [a for a in TRAIN]
    if flag in args:  # the flag under test replaces TRAIN's own
        i = args.index(flag)
        del args[i:i + 2]
    r = ftune("train", "--model", TINY, "--data", SEED_DATA, "--out", out, *args, flag, value)
    line = refused(r, 2, f"{flag} {value}: expected", out=out)
    assert not out.exists()
    print(line)


@pytest.mark.parametrize("config, needle", [
    ({"lora_alpha": "nan"}, "--lora-alpha nan: expected"),
    ({"adam_eps": 0}, "--adam-eps 0: expected"),
    ({"lora_r": 8.5}, 'key "lora_r": expected an integer, found 8.5'),
    ({"seq_len": 0}, "--seq-len 0: expected"),
    ({"out": 5}, 'key "out": expected a string, found a number'),
])
def test_config_file_numeric_domain(tmp_path, config, needle):
    c = tmp_path / "opts.json"
    c.write_text(json.dumps(config))
    r = ftune("train", "--config", c, "--model", TINY, "--data", SEED_DATA, "--out",
              tmp_path / "out")
    refused(r, 2, str(c), needle, out=tmp_path / "out")


@pytest.mark.parametrize("args, needle", [
    (["eval", "--model", TINY, "--data", SEED_DATA, "--batch-size", "0"], "--batch-size 0"),
    (["eval", "--model", TINY, "--data", SEED_DATA, "--seq-len", "0"], "--seq-len 0"),
    (["eval", "--model", TINY, "--data", SEED_DATA, "--dpo-beta", "nan"], "--dpo-beta nan"),
    (["generate", "--model", TINY, "--prompt", "x", "--batch", "0"], "--batch 0"),
    (["generate", "--model", TINY, "--chat", "--ctx-size", "0"], "--ctx-size 0"),
    (["generate", "--model", TINY, "--prompt", "x", "--seed", "-1"], "--seed -1"),
    (["generate", "--model", TINY, "--prompt", "x", "--temperature", "nan"], "--temperature nan"),
    (["generate", "--model", TINY, "--prompt", "x", "--top-p", "0"], "--top-p 0"),
    (["generate", "--model", TINY, "--prompt", "x", "--min-p", "-0.1"], "--min-p -0.1"),
    (["generate", "--model", TINY, "--prompt", "x", "--repetition-penalty", "0"],
     "--repetition-penalty 0"),
    (["generate", "--model", TINY, "--prompt", "x", "--threads", "-3"], "--threads -3"),
    (["logits", "--model", TINY, "--ids", "1", "--threads", "0"], "--threads 0"),
    (["pack", "--model", TINY, "--threads", "99999"], "--threads 99999"),
    (["init-model", "--config", TINY / "config.json", "--out", "x", "--shard-size", "0"],
     "--shard-size 0"),
    (["train", "--model", TINY, "--data", SEED_DATA, "--seed", "99999999999999999999999"],
     "--seed"),
])
def test_other_commands_numeric_domain(tmp_path, args, needle):
    r = ftune(*args, cwd=tmp_path)
    refused(r, 2, needle)
    assert not (tmp_path / "x").exists()


def test_every_numeric_option_has_a_domain():
    """ft_args_parse refuses a table whose numeric option has no domain (an internal error),
    before --help is printed: every command's --help passing proves the table complete."""
    for cmd in (["train"], ["plan"], ["eval"], ["generate"], ["export"], ["merge"], ["pack"],
                ["init-model"], ["logits"], ["bench", "io"]):
        r = ftune(*cmd, "--help")
        assert r.returncode == 0 and "internal error" not in r.stderr, (cmd, r.stderr)


# ---- 4: adapter_config.json read strictly -----------------------------------------------------

def edit_config(a, fn):
    p = a / "adapter_config.json"
    s = p.read_text()
    t = fn(s)
    assert t != s
    p.write_text(t)


def set_key(key, value):
    def fn(s):
        c = json.loads(s)
        c[key] = value
        return json.dumps(c, indent=1)
    return fn


@pytest.mark.parametrize("fn, needle", [
    (set_key("lora_alpha", "32"), 'key "lora_alpha": expected a number, found a string'),
    (set_key("use_rslora", "true"), 'key "use_rslora": expected true or false, found a string'),
    (set_key("use_dora", 1), 'key "use_dora": expected true or false, found a number'),
    (set_key("r", "16"), 'key "r": expected a positive integer, found a string'),
    (set_key("r", 16.5), '"r" must be a positive integer'),
    (set_key("lora_dropout", None), 'key "lora_dropout": expected a number, found null'),
    (set_key("lora_dropout", 2), 'key "lora_dropout": 2 is not a probability'),
    (set_key("target_modules", ["q_proj", 1]), 'key "target_modules": expected a string or a list'),
    (set_key("bias", False), 'key "bias": expected a string, found a boolean'),
    (set_key("fan_in_fan_out", "no"), 'key "fan_in_fan_out": expected true or false'),
    (set_key("base_model_name_or_path", 7), 'key "base_model_name_or_path": expected a string'),
    (lambda s: s.replace('"lora_alpha":\t32', '"lora_alpha":\t1e999'), '"lora_alpha": inf'),
    (lambda s: s.replace('"r":', '"r":\t16,\n\t"r":', 1), 'key "r" appears twice'),
    (lambda s: s + "{}", "text after the JSON object"),
    (set_key("exclude_modules", ["q_proj"]), '"exclude_modules" is set'),
    (set_key("layer_replication", [[0, 1]]), '"layer_replication" is set'),
    (set_key("use_qalora", True), '"use_qalora"'),
])
def test_adapter_config_wrong_types(tmp_path, adapter, fn, needle):
    a = copy_adapter(adapter, tmp_path / "a")
    edit_config(a, fn)
    before = digest(a, TINY)
    cf = str(a / "adapter_config.json")
    for args in (["merge", "--model", TINY, "--adapter", a, "--out", tmp_path / "m"],
                 ["export", "--adapter", a, "--out", tmp_path / "x.gguf", "--model", TINY],
                 ["eval", "--model", TINY, "--adapter", a, "--data", SEED_DATA, "--seq-len", "64"]):
        r = ftune(*args)
        refused(r, 1, cf, needle)
    assert not (tmp_path / "m").exists() and not (tmp_path / "x.gguf").exists()
    assert digest(a, TINY) == before


def test_adapter_config_nulls_as_peft_writes_them(tmp_path, adapter):
    """PEFT writes null for unset flags ("fan_in_fan_out": null, "use_rslora" absent in old
    versions): those read as PEFT reads them, the merge works."""
    a = copy_adapter(adapter, tmp_path / "a")
    edit_config(a, lambda s: set_key("use_qalora", False)(
        set_key("exclude_modules", None)(set_key("fan_in_fan_out", None)(s))))
    r = ftune("merge", "--model", TINY, "--adapter", a, "--out", tmp_path / "m")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("file, edit, needle", [
    ("tokenizer.json", lambda t: t["model"].__setitem__("byte_fallback", "true"),
     'key "byte_fallback": expected true or false, found a string'),
    ("tokenizer.json", lambda t: t["added_tokens"][0].__setitem__("special", 1),
     'key "special": expected true or false, found a number'),
    ("tokenizer_config.json", lambda t: t.__setitem__("add_bos_token", "false"),
     'key "add_bos_token": expected true or false, found a string'),
    ("tokenizer_config.json", lambda t: t.__setitem__("eos_token", 2),
     'key "eos_token": expected a token'),
    ("tokenizer_config.json", lambda t: t.__setitem__("chat_template", {"default": "x"}),
     'key "chat_template": expected a string or a list of templates, found an object'),
])
def test_tokenizer_files_wrong_types(tmp_path, file, edit, needle):
    """tokenizer.json's flags and tokenizer_config.json's tokens, flags and template, of
    another JSON type, are refused by key (huggingface/tokenizers' serde refuses them; read as
    absent they tokenized otherwise: "byte_fallback": "true" was false)."""
    m = model_copy(tmp_path)
    t = json.loads((m / file).read_text())
    edit(t)
    (m / file).write_text(json.dumps(t))
    r = ftune("tokenize", "--model", m, "--text", "hi")
    refused(r, 1, str(m / file), needle)


# ---- 5: non-finite adapters never leave the tool --------------------------------------------

def damage(a, tensor_index, value, dtype=None):
    """Writes value into element 2 of the tensor_index-th tensor (by name) of a's weights,
    first converting every tensor to dtype ("F16") when given. Returns the tensor's name."""
    p = a / "adapter_model.safetensors"
    n, h, data = st_read(p)
    names = sorted(k for k in h if k != "__metadata__")
    if dtype == "F16":
        import numpy as np
        blob, hdr, off = b"", {"__metadata__": h.get("__metadata__", {})}, 0
        for k in names:
            s, e = h[k]["data_offsets"]
            x = np.frombuffer(data[s:e], dtype="<f4").astype("<f2").tobytes()
            hdr[k] = {"dtype": "F16", "shape": h[k]["shape"], "data_offsets": [off, off + len(x)]}
            blob += x
            off += len(x)
        st_write(p, hdr, blob)
        n, h, data = st_read(p)
    k = names[tensor_index]
    size = 2 if h[k]["dtype"] == "F16" else 4
    off = h[k]["data_offsets"][0] + 2 * size
    b = bytearray(data)
    b[off:off + size] = struct.pack("<e" if size == 2 else "<f", value)
    hb = p.read_bytes()[:8 + n]
    p.write_bytes(hb + bytes(b))
    return k


@pytest.mark.parametrize("value, what, dtype", [
    (float("inf"), "infinite", None), (float("nan"), "NaN", None), (float("-inf"), "infinite", "F16"),
])
@pytest.mark.parametrize("idx", [0, 5])
def test_nonfinite_adapter_refused(tmp_path, adapter, value, what, dtype, idx):
    a = copy_adapter(adapter, tmp_path / "a")
    name = damage(a, idx, value, dtype)
    before = digest(a, TINY)
    w = str(a / "adapter_model.safetensors")
    runs = {
        "export": ["export", "--adapter", a, "--out", tmp_path / "x.gguf", "--model", TINY],
        "export-f16": ["export", "--adapter", a, "--out", tmp_path / "y.gguf", "--dtype", "f16",
                       "--model", TINY],
        "merge": ["merge", "--model", TINY, "--adapter", a, "--out", tmp_path / "m"],
        "merge-gguf": ["merge", "--model", TINY, "--adapter", a, "--out", tmp_path / "m.gguf",
                       "--format", "gguf"],
        "eval": ["eval", "--model", TINY, "--adapter", a, "--data", SEED_DATA, "--seq-len", "64"],
        "init-adapter": ["train", "--model", TINY, "--data", SEED_DATA, "--out", tmp_path / "o",
                         *TRAIN, "--init-adapter", a],
    }
    for label, args in runs.items():
        r = ftune(*args)
        refused(r, 1, w, f'tensor "{name}" element 2 is {what}', out=tmp_path / "o")
    for f in ("x.gguf", "y.gguf", "m", "m.gguf", "o"):
        assert not (tmp_path / f).exists(), f
    assert digest(a, TINY) == before


# ---- 6: outputs over inputs ----------------------------------------------------------------

def test_outputs_over_inputs(tmp_path, adapter):
    a = copy_adapter(adapter, tmp_path / "A")
    m = model_copy(tmp_path, name="M")
    (tmp_path / "linkM").symlink_to("M")
    (tmp_path / "linkA").symlink_to("A")
    d = tmp_path / "d.jsonl"
    d.write_text("".join(SEED_DATA.read_text().splitlines(True)[:8]))
    os.link(d, tmp_path / "hard.jsonl")
    p = tmp_path / "p.jsonl"
    p.write_text('"hi"\n')
    before = digest(a, m, d, p)
    T = ["--max-steps", "1", "--seq-len", "64", "--quiet", "--threads", "1"]
    cases = [
        (["export", "--adapter", "A", "--out", "A/adapter_model.safetensors"],
         "would replace A/adapter_model.safetensors, inside the --adapter folder A"),
        (["export", "--adapter", "A", "--out", "linkA/x.gguf"], "inside the --adapter folder A"),
        (["export", "--adapter", "A", "--model", "M", "--out", "M/x.gguf"],
         "inside the --model folder M"),
        (["merge", "--model", "M", "--adapter", "A", "--out", "M"], "is the --model folder M"),
        (["merge", "--model", "M", "--adapter", "A", "--out", "linkM"], "is the --model folder M"),
        (["merge", "--model", "M", "--adapter", "A", "--out", "M/sub"], "inside the --model folder M"),
        (["merge", "--model", "M", "--adapter", "A", "--out", "A", "--format", "gguf"],
         "is the --adapter folder A"),
        (["merge", "--model", "linkM", "--adapter", "A", "--out", "M/../M"],
         "is the --model folder linkM"),
        (["train", "--model", "M", "--data", "d.jsonl", "--out", "M", *T], "is the --model folder M"),
        (["train", "--model", "M", "--data", "d.jsonl", "--out", "A", "--init-adapter", "A", *T],
         "is the --init-adapter folder A"),
        (["train", "--model", "M", "--data", "A/adapter_config.json", "--out", "A", *T],
         "A/adapter_config.json would replace the --data file A/adapter_config.json"),
        (["train", "--model", "M", "--data", "d.jsonl", "--out", "o", "--timeline",
          "M/config.json", *T], "--timeline M/config.json would replace M/config.json"),
        (["train", "--model", "M", "--data", "d.jsonl", "--eval-data", "hard.jsonl", "--out", "o",
          "--timeline", "d.jsonl", *T], "is the --eval-data file hard.jsonl"),
        (["eval", "--model", "M", "--data", "d.jsonl", "--seq-len", "64", "--per-example",
          "M/config.json"], "--per-example M/config.json would replace M/config.json"),
        (["eval", "--model", "M", "--adapter", "A", "--data", "d.jsonl", "--seq-len", "64",
          "--per-example", "linkA/adapter_config.json"], "inside the --adapter folder A"),
        (["generate", "--model", "M", "--prompts", "p.jsonl", "--max-new-tokens", "1", "--out",
          "p.jsonl"], "--out p.jsonl is the --prompts file p.jsonl"),
        (["generate", "--model", "M", "--prompts", "p.jsonl", "--max-new-tokens", "1", "--out",
          "M/x.jsonl"], "inside the --model folder M"),
        (["logits", "--model", "M", "--ids", "1,2", "--out", "M/model.safetensors"],
         "would replace M/model.safetensors"),
        (["init-model", "--config", "M/config.json", "--out", "M"],
         "M/config.json would replace the --config file M/config.json"),
        (["init-model", "--config", "M/config.json", "--tokenizer", "A", "--out", "A"],
         "is the --tokenizer folder A"),
    ]
    for args, needle in cases:
        r = ftune(*args, cwd=tmp_path)
        refused(r, 1, needle, out=tmp_path / "o")
        assert digest(a, m, d, p) == before, args
    assert not (tmp_path / "o").exists() and not (m / "sub").exists()


def test_standard_output_over_an_input(tmp_path):
    """tokenize and generate --prompts write to standard output: appended to their own input
    (>>), they refuse (a shell's > has emptied the file before ftune starts)."""
    d = tmp_path / "d.jsonl"
    d.write_text(json.dumps(GOOD) + "\n")
    p = tmp_path / "p.jsonl"
    p.write_text('"hi"\n')
    for args, f, flag in ((["tokenize", "--model", TINY, "--data", d], d, "--data"),
                          (["generate", "--model", TINY, "--prompts", p, "--max-new-tokens", "1"],
                           p, "--prompts")):
        before = f.read_bytes()
        with open(f, "a") as out:
            r = ftune(*args, stdout=out)
        refused(r, 1, f"standard output is the {flag} file {f}")
        assert f.read_bytes() == before


def test_outputs_elsewhere_still_work(tmp_path, adapter):
    """The control: the same commands with their outputs beside the inputs succeed."""
    a = copy_adapter(adapter, tmp_path / "A")
    m = model_copy(tmp_path, name="M")
    for args in (["export", "--adapter", a, "--out", tmp_path / "a.gguf", "--model", m],
                 ["merge", "--model", m, "--adapter", a, "--out", tmp_path / "merged"],
                 ["train", "--model", m, "--data", SEED_DATA, "--out", tmp_path / "o", *TRAIN,
                  "--init-adapter", a]):
        r = ftune(*args)
        assert r.returncode == 0, (args, r.stderr)
