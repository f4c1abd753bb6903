"""`ftune merge` of a GGUF model into a Hugging Face folder writes tokenizer.json and
tokenizer_config.json rebuilt from the GGUF's tokenizer.ggml.* metadata (adapters/export/hf_tok.c).

The folder's tokenizer.json, loaded by the `tokenizers` package, must give the ids that
`ftune tokenize --model X.gguf` gives (with and without special tokens) on varied texts
(English, code, digits, CJK, emoji, whitespace runs, combining accents, special tokens), and
decode them to the same text. GGUFs: the example SmolLM2 Q4_1 (gpt2/smollm; skipped if not
in the cache), tiny-llama converted to GGUF by `ftune merge --format gguf` with its Llama-2
tokenizer (llama/SentencePiece) and with the Llama-3 tokenizer fixture (gpt2/llama-bpe), and
the latter with tokenizer.ggml.pre rewritten to qwen2, gpt2, smollm. Also: the merges derived
from SentencePiece scores equal transformers' own (the fixture's tokenizer.json), and the
GGUFs with add_eos_token (EOS appended by both, as llama.cpp does); the refusals: GGUF
fixtures without a tokenizer, an unknown pre-tokenizer, equal scores; each leaves a note and no tokenizer file. With transformers importable, AutoTokenizer
on the folder gives the same ids and carries the chat template.
Run: python3 -m pytest -q -s tests/ref/test_merge_tok.py  (FTUNE_BIN selects the binary).
"""
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cli_helpers import ROOT, TINY, TINY_GGUF, run_ftune  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")
from safetensors.numpy import save_file  # noqa: E402

GGUF_DIR = ROOT / "tests" / "fixtures" / "gguf"
LLAMA3_TOK = ROOT / "tests" / "fixtures" / "tokenizers" / "llama3"
CACHE = Path(os.environ.get("FTUNE_CACHE") or
             Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ftune")
EXAMPLE = CACHE / "examples" / "SmolLM2-135M-Instruct.Q4_1.gguf"
NO_TOKENIZER_NOTE = "but no tokenizer files"

TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # sum\r\n\tif x:\n\t\tpass\n",
    "3 33 333 3333 12345678 3.14159 1,000,000 \u0663\u0664",
    "\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e \u4e2d\u6587\u5206\u8bcd",
    "\U0001F680 \U0001F636\u200d\U0001F32B\ufe0f \u2705 \U0001F999\U0001F999 \u2764\ufe0f",
    "\n \n\n \t\t  \n   x   \n\n\n",
    "   leading and trailing   ",
    "I've 'RE 'M We'Ve a'lL don't HELLO'S",
    "cafe\u0301 caf\u00e9 na\u00efve \u00c5 A\u030a \ufb01 \u212b \u041f\u0440\u0438\u0432\u0435\u0442",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<s> Hello</s><unk> x<s>",
    "<|begin_of_text|>x<|eot_id|> <|start_header_id|>user<|end_header_id|>",
    "a<|reserved_special_token_0|>b <|reserved_special_token_1|>",
    "",
    " ",
    "a\u00a0b\u2003c\u3000d",
]


# ---- GGUF metadata: read, and rewrite with some keys changed ------------------------------

SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
FMT = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<?",
       10: "<u8", 11: "<i8", 12: "<f8"}


def _skip(b, t, p):
    if t == 8:
        return p + 8 + struct.unpack_from("<Q", b, p)[0]
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, p)
        p += 12
        if et != 8:
            return p + n * SIZE[et]
        for _ in range(n):
            p += 8 + struct.unpack_from("<Q", b, p)[0]
        return p
    return p + SIZE[t]


def _value(b, t, p):
    if t == 8:
        n = struct.unpack_from("<Q", b, p)[0]
        return b[p + 8:p + 8 + n].decode()
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, p)
        p += 12
        if et != 8:
            return np.frombuffer(b, FMT[et], n, p).tolist()
        out = []
        for _ in range(n):
            k = struct.unpack_from("<Q", b, p)[0]
            out.append(b[p + 8:p + 8 + k].decode())
            p += 8 + k
        return out
    return np.frombuffer(b, FMT[t], 1, p)[0].item()


def gguf_parse(path):
    """(file bytes, [(key, type, key start, value start, end)], tensor infos [(name, ne)],
    tensor-info span (start, end), data start); formats.md 4.3."""
    b = Path(path).read_bytes()
    assert b[:4] == b"GGUF" and struct.unpack_from("<I", b, 4)[0] == 3
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    p, kvs = 24, []
    for _ in range(n_kv):
        k0, n = p, struct.unpack_from("<Q", b, p)[0]
        key = b[p + 8:p + 8 + n].decode()
        t = struct.unpack_from("<I", b, p + 8 + n)[0]
        v0 = p + 12 + n
        p = _skip(b, t, v0)
        kvs.append((key, t, k0, v0, p))
    ti, infos = p, []
    for _ in range(n_t):
        n = struct.unpack_from("<Q", b, p)[0]
        name = b[p + 8:p + 8 + n].decode()
        nd = struct.unpack_from("<I", b, p + 8 + n)[0]
        infos.append((name, struct.unpack_from(f"<{nd}Q", b, p + 12 + n)))
        p += 12 + n + 8 * nd + 12
    align = next((_value(b, t, v) for k, t, _, v, _ in kvs if k == "general.alignment"), 32)
    return b, kvs, infos, (ti, p), (p + align - 1) // align * align, align


def gguf_meta(path):
    b, kvs = gguf_parse(path)[:2]
    return {k: _value(b, t, v) for k, t, _, v, _ in kvs}


def _encode(key, v):
    kb = key.encode()
    head = struct.pack("<Q", len(kb)) + kb
    if isinstance(v, bool):
        return head + struct.pack("<I?", 7, v)
    if isinstance(v, str):
        s = v.encode()
        return head + struct.pack("<IQ", 8, len(s)) + s
    a = np.asarray(v)
    et, dt = (5, "<i4") if a.dtype.kind in "iu" else (6, "<f4")
    return head + struct.pack("<IIQ", 9, et, a.size) + a.astype(dt).tobytes()


def gguf_edit(src, dst, changes):
    """Copies GGUF src to dst with the keys in `changes` replaced or added (str, bool, or a
    numpy array written as i32 or f32); tensor infos and data unchanged."""
    b, kvs, _, (ti0, ti1), data, align = gguf_parse(src)
    changes = dict(changes)
    body = bytearray()
    for key, _, k0, _, end in kvs:
        body += _encode(key, changes.pop(key)) if key in changes else b[k0:end]
    for key, v in changes.items():
        body += _encode(key, v)
    n_kv = len(kvs) + len(changes)
    out = bytearray(b[:16]) + struct.pack("<Q", n_kv) + body + b[ti0:ti1]
    out += bytes(-len(out) % align)
    out += b[data:]
    Path(dst).write_bytes(out)
    return dst


# ---- helpers --------------------------------------------------------------------------------

def make_adapter(dst, gguf):
    """A LoRA adapter on q_proj (r 2, small random B) sized from a GGUF's blk.N.attn_q.weight."""
    infos = gguf_parse(gguf)[2]
    q = {int(n.split(".")[1]): ne for n, ne in infos if n.endswith(".attn_q.weight")}
    rng = np.random.default_rng(0)
    t = {}
    for layer, (n_in, n_out) in q.items():
        p = f"base_model.model.model.layers.{layer}.self_attn.q_proj."
        t[p + "lora_A.weight"] = rng.uniform(-0.1, 0.1, (2, n_in)).astype(np.float32)
        t[p + "lora_B.weight"] = rng.normal(0, 1e-3, (n_out, 2)).astype(np.float32)
    dst.mkdir(parents=True, exist_ok=True)
    save_file(t, str(dst / "adapter_model.safetensors"), metadata={"format": "pt"})
    (dst / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"],
        "bias": "none", "task_type": "CAUSAL_LM"}))
    return dst


def merge(model, adapter, out, fmt="safetensors"):
    """Runs ftune merge; returns the note line ("" if none)."""
    r = run_ftune(["merge", "--model", model, "--adapter", adapter, "--out", out, "--format", fmt])
    assert r.returncode == 0, r.stderr
    notes = [l for l in r.stderr.splitlines() if l.startswith("ftune: note: ")]
    return notes[0] if notes else ""


def ftune_ids(gguf, tmp, special, texts):
    """[(ids, decoded text)] of texts by ftune's tokenizer on the GGUF file."""
    p = Path(tmp) / "texts.jsonl"
    p.write_text("".join(json.dumps(t) + "\n" for t in texts))
    r = run_ftune(["tokenize", "--model", gguf, "--texts", p, "--decode"] +
                  ([] if special else ["--no-special"]))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert len(rows) == len(texts)
    return [(row["ids"], row["text"]) for row in rows]


def check_folder(gguf, out, tmp):
    """tokenizer.json of `out` encodes and decodes TEXTS like ftune on `gguf`; the config
    carries the GGUF's BOS/EOS/chat template. Returns the GGUF metadata."""
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert not list(out.glob(".hf_tok.tmp*")) and not list(out.glob("*.tmp.*"))
    kv = gguf_meta(gguf)
    toks, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    hf = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    texts = TEXTS + ["cafe\u0301 \u212b \u1100\u1161", "e\u0301\u0327"]  # not NFC
    if (json.loads((out / "tokenizer.json").read_text())["normalizer"] or {}).get("type") == "NFC":
        # Qwen2: both tokenizers compose (ftune through utf8proc, src/tokenizer/tok_pretok.c)
        assert hf.encode("cafe\u0301 \u212b").ids == hf.encode("caf\u00e9 \u00c5").ids
    assert hf.get_vocab_size(with_added_tokens=True) == len(toks)
    for i in (0, 1, len(toks) // 2, len(toks) - 1):
        assert hf.id_to_token(i) == toks[i], i
    rows, n_ctl = {}, 0
    for special in (True, False):
        rows[special] = ftune_ids(gguf, tmp, special, texts)
        for text, (ids, dec) in zip(texts, rows[special]):
            got = hf.encode(text, add_special_tokens=special).ids
            assert got == ids, f"{text!r} (special={special}): tokenizers {got}, ftune {ids}"
            back = hf.decode(ids, skip_special_tokens=False)
            assert back == dec, f"decode of {text!r}: tokenizers {back!r}, ftune {dec!r}"
            n_ctl += not special and any(types[i] == 3 for i in ids)
    assert n_ctl >= 1, "no text exercised a control token"
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    bos, eos = kv.get("tokenizer.ggml.bos_token_id"), kv.get("tokenizer.ggml.eos_token_id")
    assert cfg["bos_token"] == (toks[bos] if bos is not None else None)
    assert cfg["eos_token"] == (toks[eos] if eos is not None else None)
    assert cfg.get("chat_template") == kv.get("tokenizer.chat_template")
    spm = kv["tokenizer.ggml.model"] == "llama"
    assert cfg["add_bos_token"] == bool(kv.get("tokenizer.ggml.add_bos_token", spm))
    assert cfg.get("model_max_length") == kv.get(kv["general.architecture"] + ".context_length")
    print(f"{gguf.name}: {len(texts)} texts x 2 (with/without special tokens) equal in tokenizers "
          f"and ftune, {n_ctl} of them with control tokens")
    check_transformers(out, kv, texts, rows[True])
    return kv


def check_transformers(out, kv, texts, rows):
    """AutoTokenizer on the folder: same ids (special tokens added) and the chat template."""
    try:
        import transformers
    except ImportError:
        print("transformers not importable: AutoTokenizer check skipped")
        return
    at = transformers.AutoTokenizer.from_pretrained(str(out))
    for text, (ids, _) in zip(texts, rows):
        assert at(text)["input_ids"] == ids, text
    tmpl = kv.get("tokenizer.chat_template")
    assert at.chat_template == tmpl
    if tmpl:
        s = at.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False,
                                   add_generation_prompt=True)
        assert "Hi there" in s
        print("transformers: chat template renders:", repr(s[:80]))


def check_refused(out, note, *needles):
    print(note)
    assert NO_TOKENIZER_NOTE in note, note
    for n in needles:
        assert n in note, (n, note)
    assert not (out / "tokenizer.json").exists() and not (out / "tokenizer_config.json").exists()
    assert not list(out.glob(".hf_tok.tmp*"))


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("merge_tok")


@pytest.fixture(scope="module")
def tiny_adapter(work):
    return make_adapter(work / "ad_tiny", TINY_GGUF)


@pytest.fixture(scope="module")
def l2_gguf(work, tiny_adapter):
    """tiny-llama with its Llama-2 tokenizer.json as a GGUF (tokenizer.ggml.model llama)."""
    out = work / "l2.gguf"
    merge(TINY, tiny_adapter, out, "gguf")
    return out


@pytest.fixture(scope="module")
def l3_gguf(work, tiny_adapter):
    """tiny-llama with the Llama-3 tokenizer fixture as a GGUF (gpt2, pre llama-bpe)."""
    src = work / "l3src"
    src.mkdir()
    for f in ("config.json", "model.safetensors"):
        (src / f).write_bytes((TINY / f).read_bytes())
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (src / f).write_bytes((LLAMA3_TOK / f).read_bytes())
    out = work / "l3.gguf"
    merge(src, tiny_adapter, out, "gguf")
    return out


def run_case(gguf, adapter, out, tmp):
    assert merge(gguf, adapter, out) == ""
    return check_folder(gguf, out, tmp)


# ---- tests ------------------------------------------------------------------------------------

def test_example_smollm(work):
    if not EXAMPLE.is_file():
        pytest.skip(f"example model not in the cache ({EXAMPLE}); scripts/fetch_example.sh gets it")
    ad = make_adapter(work / "ad_smol", EXAMPLE)
    out = work / "smol"
    kv = run_case(EXAMPLE, ad, out, work)
    assert (kv["tokenizer.ggml.model"], kv["tokenizer.ggml.pre"]) == ("gpt2", "smollm")
    tj = json.loads((out / "tokenizer.json").read_text())
    assert tj["model"]["merges"] == kv["tokenizer.ggml.merges"]
    assert [a["content"] for a in tj["added_tokens"]] == \
        [t for t, ty in zip(kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]) if ty == 3]


def test_spm_llama2(work, tiny_adapter, l2_gguf):
    out = work / "l2"
    kv = run_case(l2_gguf, tiny_adapter, out, work)
    assert kv["tokenizer.ggml.model"] == "llama"
    # the merges rebuilt from the scores are transformers' (LlamaConverter) merges, in order
    want = json.loads((TINY / "tokenizer.json").read_text())["model"]["merges"]
    got = json.loads((out / "tokenizer.json").read_text())["model"]["merges"]
    assert got == want, f"{len(got)} merges vs {len(want)}"
    # without the SentencePiece space prefix
    g2 = gguf_edit(l2_gguf, work / "l2-noprefix.gguf", {"tokenizer.ggml.add_space_prefix": False})
    out2 = work / "l2-noprefix"
    run_case(g2, tiny_adapter, out2, work)
    tj = json.loads((out2 / "tokenizer.json").read_text())
    assert tj["normalizer"]["type"] == "Replace"


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt2", "smollm"])
def test_byte_level_pre(work, tiny_adapter, l3_gguf, pre):
    # the gpt2 case also adds BOS (a Sequence[ByteLevel, TemplateProcessing] post-processor),
    # the qwen2 case makes one token user-defined (type 4: an added token, not special)
    change = {"tokenizer.ggml.pre": pre}
    if pre == "gpt2":
        change["tokenizer.ggml.add_bos_token"] = True
    if pre == "qwen2":
        types = np.array(gguf_meta(l3_gguf)["tokenizer.ggml.token_type"], np.int32)
        types[128002] = 4
        change["tokenizer.ggml.token_type"] = types
    g = l3_gguf if pre == "llama-bpe" else gguf_edit(l3_gguf, work / f"l3-{pre}.gguf", change)
    out = work / f"l3-{pre}"
    kv = run_case(g, tiny_adapter, out, work)
    assert (kv["tokenizer.ggml.model"], kv["tokenizer.ggml.pre"]) == ("gpt2", pre)
    if pre == "qwen2":
        added = {a["id"]: a for a in json.loads((out / "tokenizer.json").read_text())["added_tokens"]}
        assert added[128002]["special"] is False and added[128003]["special"] is True
    if pre == "gpt2":
        assert json.loads((out / "tokenizer.json").read_text())["post_processor"]["type"] == "Sequence"
        assert ftune_ids(g, work, True, ["x"])[0][0][0] == kv["tokenizer.ggml.bos_token_id"]
    if pre == "llama-bpe":  # the Llama-3 vocabulary and merges come back unchanged
        src = json.loads((LLAMA3_TOK / "tokenizer.json").read_text())
        tj = json.loads((out / "tokenizer.json").read_text())
        assert tj["model"]["ignore_merges"] is True
        assert all(tj["model"]["vocab"][t] == i for t, i in src["model"]["vocab"].items())
        assert tj["model"]["merges"] == src["model"]["merges"]
        assert [(a["id"], a["content"], a["special"]) for a in tj["added_tokens"]] == \
            [(a["id"], a["content"], a["special"]) for a in src["added_tokens"]]


# (rope-llama3.gguf cannot be merged into safetensors at all: its rope_freqs has no config.json form)
@pytest.mark.parametrize("name", ["tiny-llama.gguf", "qwen2-tiny.gguf"])
def test_fixture_without_tokenizer(work, name):
    g = GGUF_DIR / name
    assert "tokenizer.ggml.model" not in gguf_meta(g)  # the fixtures carry no tokenizer
    out = work / ("fx-" + name)
    check_refused(out, merge(g, make_adapter(work / ("ad-" + name), g), out), "tokenizer.ggml.model")
    assert (out / "config.json").is_file()


def test_refusal_removes_stale_files(work, tiny_adapter):
    """A merge into a folder that an earlier merge filled: the HF source's tokenizer files
    (copied there) must not survive a GGUF merge whose tokenizer cannot be rebuilt, since
    transformers would load them with the new weights."""
    out = work / "restale"
    assert merge(TINY, tiny_adapter, out) == ""
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    (out / "special_tokens_map.json").write_text("{}")  # as another source would leave it
    (out / "unrelated.txt").write_text("kept")
    check_refused(out, merge(TINY_GGUF, tiny_adapter, out), "tokenizer.ggml.model")
    assert not (out / "special_tokens_map.json").exists()
    assert (out / "unrelated.txt").read_text() == "kept" and (out / "config.json").is_file()


def test_add_eos(work, tiny_adapter, l2_gguf, l3_gguf):
    for i, src in enumerate((l2_gguf, l3_gguf)):
        g = gguf_edit(src, work / f"eos{i}.gguf", {"tokenizer.ggml.add_eos_token": True})
        out = work / f"eos{i}"
        kv = run_case(g, tiny_adapter, out, work)
        eos = kv["tokenizer.ggml.eos_token_id"]
        hf = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
        ids = hf.encode("Hello world").ids
        assert ids[-1] == eos and hf.encode("Hello world", add_special_tokens=False).ids[-1] != eos
        assert json.loads((out / "tokenizer_config.json").read_text())["add_eos_token"] is True


def test_refusals(work, tiny_adapter, l2_gguf, l3_gguf):
    cases = [
        (l3_gguf, {"tokenizer.ggml.pre": "deepseek-llm"}, "deepseek-llm"),
        (l2_gguf, {"tokenizer.ggml.scores": np.zeros(32000, np.float32)}, "same score"),
    ]
    for i, (src, change, needle) in enumerate(cases):
        g = gguf_edit(src, work / f"bad{i}.gguf", change)
        out = work / f"bad{i}"
        check_refused(out, merge(g, tiny_adapter, out), needle)
