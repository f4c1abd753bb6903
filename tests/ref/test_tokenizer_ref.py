"""ftune's tokenizer against the `tokenizers` package, on every record of the example data
(instruction, input, output, full Alpaca prompt+output) plus edge cases:
  - the Llama-2 (SentencePiece-style BPE) and Llama-3 (byte-level BPE) tokenizer.json fixtures;
  - the example model's tokenizer (SmolLM2, GGUF tokenizer.ggml.*), both through the GGUF
    file and through a tokenizer.json written from the GGUF's tokens and merges;
  - decode(encode(text)) == text for the byte-level tokenizers.
Run: python3 -m pytest -q -s tests/ref/test_tokenizer_ref.py  (FTUNE_BIN selects the binary).
"""
import copy
import json
import re

import pytest

import tok_helpers as th

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def texts():
    return th.all_texts()


@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    """(gguf path, tokenizers.Tokenizer built from its metadata), or a skip."""
    path, why = th.fetch_example()
    if path is None:
        pytest.skip(f"example model not available: {why}")
    return path, th.gguf_hf_tokenizer(path)


@pytest.mark.parametrize("name", ["llama2", "llama3"])
def test_fixture_tokenizer_matches(name, texts, tmp_path):
    d = th.TOK_DIR / name
    ref = [e.ids for e in tokenizers.Tokenizer.from_file(str(d / "tokenizer.json")).encode_batch(texts)]
    got, err = th.run_ftune_texts(d, texts, tmp_path)
    assert err is None, f"ftune tokenize failed: {err}"
    th.compare_ids(name, texts, got, ref)


@pytest.mark.parametrize("name", ["llama2", "llama3"])
def test_fixture_tokenizer_no_special(name, texts, tmp_path):
    d = th.TOK_DIR / name
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    sub = texts[::7]
    ref = [e.ids for e in tok.encode_batch(sub, add_special_tokens=False)]
    got, err = th.run_ftune_texts(d, sub, tmp_path, ["--no-special"])
    assert err is None, f"ftune tokenize failed: {err}"
    th.compare_ids(name + " --no-special", sub, got, ref)


def check_roundtrip(name, model, texts, tmp_path):
    got, err = th.run_ftune_texts(model, texts, tmp_path, ["--no-special", "--decode"])
    assert err is None, f"ftune tokenize failed: {err}"
    bad = [i for i, g in enumerate(got) if g["text"] != texts[i]]
    print(f"{name}: decode(encode(text)) == text for {len(texts) - len(bad)}/{len(texts)} texts")
    assert not bad, f"{name}: round trip differs for {len(bad)} texts, first: " + \
        "; ".join(f"{texts[i][:40]!r} -> {got[i]['text'][:40]!r}" for i in bad[:3])


def test_llama3_decode_roundtrip(texts, tmp_path):
    check_roundtrip("llama3", th.TOK_DIR / "llama3", texts, tmp_path)


def test_smollm_tokenizer_json_matches(smollm, texts, tmp_path):
    """The SmolLM2 tokenizer as tokenizer.json (written by `tokenizers` itself, so merges are in
    the [["a","b"]] form) in a temp dir: checked even without the GGUF reader."""
    path, tok = smollm
    d = tmp_path / "smollm_json"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    ref = [e.ids for e in tok.encode_batch(texts)]
    got, err = th.run_ftune_texts(d, texts, tmp_path)
    assert err is None, f"ftune tokenize failed: {err}"
    th.compare_ids("smollm tokenizer.json", texts, got, ref)
    check_roundtrip("smollm tokenizer.json", d, texts, tmp_path)


GGUF_NOT_BUILT = re.compile(r"not (yet )?(built|implemented)", re.I)


def test_smollm_gguf_matches(smollm, texts, tmp_path):
    path, tok = smollm
    ref = [e.ids for e in tok.encode_batch(texts)]
    got, err = th.run_ftune_texts(path, texts, tmp_path)
    if err is not None and GGUF_NOT_BUILT.search(err):
        pytest.skip(f"GGUF tokenizer reader not built yet: {err}")
    assert err is None, f"ftune tokenize --model {path} failed: {err}"
    th.compare_ids("smollm gguf", texts, got, ref)
    check_roundtrip("smollm gguf", path, texts, tmp_path)


# ---- pipeline variants: small BPE models trained here, each pipeline option written as
# ---- tokenizer.json and compared with `tokenizers` on the same file ------------------------

ADDED_TEXTS = [
    "Say hello to the [MASK]   world, hello!", "helloworld and   [MASK]x and hello_there", "Water WATER water",
    "a<sep>   b<sep>", "[MASK][MASK] <sep><sep>", "hello", " hello ", "héllo hello2 (hello)",
]


def _bytelevel_base(corpus):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=3000, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return json.loads(tok.to_str())


def _metaspace_base(corpus):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    special = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=3000, show_progress=False, special_tokens=special, limit_alphabet=150))
    return json.loads(tok.to_str())


def _bl(prefix=False, regex=False):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": regex}


def _split(pat, behavior, invert=False, kind="Regex"):
    return {"type": "Split", "pattern": {kind: pat}, "behavior": behavior, "invert": invert}


def _added(vocab_n, specs):
    return [dict({"id": vocab_n + i, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": False}, **s) for i, s in enumerate(specs)]


LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")
BL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
SPM_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def _variants(bl, ms):
    nb, nm = len(bl["model"]["vocab"]), len(ms["model"]["vocab"])
    v = {}
    for b in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        v["split_" + b] = (bl, {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            _split(r"[\s,.!?]", b), _bl()]}, "decoder": BL_DECODER})
    v["split_invert_string"] = (bl, {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        _split(" ", "MergedWithPrevious", True, "String"), _bl()]}, "decoder": BL_DECODER})
    v["digits_lower_replace_prepend"] = (bl, {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Lowercase"}, {"type": "Replace", "pattern": {"Regex": r"\d\d"}, "content": "7"},
            {"type": "Prepend", "prepend": "_"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False}, _bl(True, True)]},
        "decoder": BL_DECODER})
    v["llama3_ignore_merges_array_merges"] = (bl, {
        "model": dict(bl["model"], ignore_merges=True,
                      merges=[m.split(" ") if isinstance(m, str) else m for m in bl["model"]["merges"]]),
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [_split(LLAMA3_RE, "Isolated"), _bl()]},
        "decoder": BL_DECODER})
    v["qwen2_nfc_added_flags"] = (bl, {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [_split(QWEN2_RE, "Isolated"), _bl()]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": BL_DECODER,
        "added_tokens": _added(nb, [
            {"content": "[MASK]", "lstrip": True, "rstrip": True, "special": True},
            {"content": "hello", "single_word": True, "normalized": True},
            {"content": "Water", "normalized": True}, {"content": "<sep>", "rstrip": True, "special": True}])})
    tmpl = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                               "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}
    v["metaspace_first_template"] = (ms, {
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        "post_processor": {"type": "Sequence", "processors": [tmpl]}, "decoder": SPM_DECODER})
    v["metaspace_always_split"] = (ms, {
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}})
    v["metaspace_never"] = (ms, {
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True},
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True}})
    v["metaspace_legacy_fields"] = (ms, {  # no prepend_scheme/split: always, split
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True},
        "decoder": {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}})
    v["spm_legacy_normalizer"] = (ms, {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None, "post_processor": tmpl, "decoder": SPM_DECODER,
        "added_tokens": ms["added_tokens"][:3] + _added(nm, [{"content": "hello", "normalized": True}])})
    v["unk_no_fallback"] = (ms, {"model": dict(ms["model"], byte_fallback=False, fuse_unk=False),
                                 "decoder": SPM_DECODER})
    v["unk_fused_no_fallback"] = (ms, {"model": dict(ms["model"], byte_fallback=False, fuse_unk=True)})
    return v


@pytest.fixture(scope="module")
def variants(texts):
    corpus = texts[::3]
    return _variants(_bytelevel_base(corpus), _metaspace_base(corpus))


VARIANT_NAMES = ["split_Removed", "split_Isolated", "split_MergedWithPrevious", "split_MergedWithNext",
                 "split_Contiguous", "split_invert_string", "digits_lower_replace_prepend",
                 "llama3_ignore_merges_array_merges", "qwen2_nfc_added_flags", "metaspace_first_template",
                 "metaspace_always_split", "metaspace_never", "metaspace_legacy_fields", "spm_legacy_normalizer",
                 "unk_no_fallback", "unk_fused_no_fallback"]


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_pipeline_variant(name, variants, texts, tmp_path):
    base, change = variants[name]
    j = copy.deepcopy(base)
    j.update(copy.deepcopy(change))
    d = tmp_path / name
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    sub = texts[::5] + th.EDGE_TEXTS + ADDED_TEXTS
    ref = [e.ids for e in tok.encode_batch(sub)]
    got, err = th.run_ftune_texts(d, sub, tmp_path)
    assert err is None, f"ftune tokenize failed: {err}"
    th.compare_ids(name, sub, got, ref)
    # decode: the same ids through both decoders
    ref_ids = [e.ids for e in tok.encode_batch(sub, add_special_tokens=False)]
    ref_txt = tok.decode_batch(ref_ids, skip_special_tokens=False)
    got, err = th.run_ftune_texts(d, sub, tmp_path, ["--no-special", "--decode"])
    assert err is None, f"ftune tokenize --decode failed: {err}"
    bad = [i for i in range(len(sub)) if got[i]["text"] != ref_txt[i]]
    print(f"{name}: decode equal for {len(sub) - len(bad)}/{len(sub)} texts")
    assert not bad, f"{name}: decode differs for {len(bad)} texts, first: " + "; ".join(
        f"{sub[i][:30]!r}: ftune {got[i]['text'][:40]!r} vs tokenizers {ref_txt[i][:40]!r}" for i in bad[:3])


def _run(*args):
    import subprocess
    return subprocess.run([th.ftune_bin(), "tokenize", *map(str, args)], capture_output=True, text=True,
                          encoding="utf-8", timeout=120)


def test_cli_text_decode_and_errors(tmp_path):
    l2 = th.TOK_DIR / "llama2"
    p = _run("--model", l2, "--text", "Hello world", "--decode")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out == {"ids": [1, 22557, 1526], "text": "<s> Hello world"}
    p = _run("--model", l2, "--text", "Hello world", "--no-special")
    assert json.loads(p.stdout) == {"ids": [22557, 1526]}
    # usage errors: exit 2
    assert _run().returncode == 2
    assert _run("--model", l2).returncode == 2
    assert _run("--model", l2, "--text", "a", "--texts", "f").returncode == 2
    assert _run("--model", l2, "--text", "a", "--bogus").returncode == 2
    # errors: exit 1 and one "ftune: " line naming the file
    p = _run("--model", tmp_path / "missing", "--text", "a")
    assert p.returncode == 1 and p.stderr.startswith("ftune: ") and "tokenizer.json" in p.stderr, p.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [')
    p = _run("--model", bad, "--text", "a")
    assert p.returncode == 1 and str(bad / "tokenizer.json") in p.stderr and "invalid JSON" in p.stderr, p.stderr
    f = tmp_path / "texts.jsonl"
    f.write_text('"ok"\nnot json\n')
    p = _run("--model", l2, "--texts", f)
    assert p.returncode == 1 and "line 2" in p.stderr, p.stderr
