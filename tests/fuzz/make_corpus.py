#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets (tests/fuzz/corpus/<target>/) and the two
small tokenizers the dataset target loads (tests/fuzz/data/tok_spm, tok_bytelevel).

    python3 tests/fuzz/make_corpus.py

Everything is derived from committed files (tests/fixtures, examples/data) or written here,
small on purpose (the whole corpus stays well under 2 MB): libFuzzer mutates small inputs
far faster, and `make test` replays every file. Deterministic: running it twice gives the
same bytes. Inputs with two files join them with FUZZ_SEP (tests/fuzz/fuzz_util.h).
Files named crash-* / regress-* in the corpus folders are kept (they are found bugs).
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
CORPUS = os.path.join(HERE, "corpus")
DATA = os.path.join(HERE, "data")
SEP = b"\n--FTSEP--\n"

# The fixed model of fuzz_safetensors.c (k_config) and fuzz_peft.c (PM_*).
TINY = dict(C=8, F=16, L=1, H=2, Hkv=1, D=4, V=32)
PEFT = dict(C=8, F=16, L=2, KV=4)
PROJ = [("q_proj", "self_attn"), ("k_proj", "self_attn"), ("v_proj", "self_attn"),
        ("o_proj", "self_attn"), ("gate_proj", "mlp"), ("up_proj", "mlp"), ("down_proj", "mlp")]

_written = set()


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    _written.add((target, name))


def jdump(o):
    return json.dumps(o, ensure_ascii=False, separators=(",", ":"))


# ---- safetensors --------------------------------------------------------------------------

DT = {"F32": (np.float32, 4), "F16": (np.float16, 2), "F64": (np.float64, 8),
      "I8": (np.int8, 1), "U8": (np.uint8, 1), "I16": (np.int16, 2), "I32": (np.int32, 4),
      "I64": (np.int64, 8), "BOOL": (np.bool_, 1), "U16": (np.uint16, 2)}


def st_bytes(tensors, meta=None, pad_to=8):
    """tensors: list of (name, dtype, shape, raw bytes). Writes the safetensors layout."""
    hdr = {}
    if meta is not None:
        hdr["__metadata__"] = meta
    off = 0
    blobs = []
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    if pad_to:
        h += b" " * (-len(h) % pad_to)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def arr(dt, shape, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    if dt == "BF16":
        f = rng.standard_normal(n).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    t, _ = DT[dt]
    if dt in ("F32", "F16", "F64"):
        return rng.standard_normal(n).astype(t).tobytes()
    if dt == "BOOL":
        return (rng.integers(0, 2, n)).astype(np.uint8).tobytes()
    return rng.integers(0, 100, n).astype(t).tobytes()


def tiny_model_tensors(dtypes):
    C, F, H, Hkv, D, V = TINY["C"], TINY["F"], TINY["H"], TINY["Hkv"], TINY["D"], TINY["V"]
    shapes = [("model.embed_tokens.weight", (V, C)), ("model.norm.weight", (C,))]
    p = "model.layers.0."
    shapes += [(p + "input_layernorm.weight", (C,)), (p + "post_attention_layernorm.weight", (C,)),
               (p + "self_attn.q_proj.weight", (H * D, C)),
               (p + "self_attn.k_proj.weight", (Hkv * D, C)),
               (p + "self_attn.v_proj.weight", (Hkv * D, C)),
               (p + "self_attn.o_proj.weight", (C, H * D)), (p + "mlp.gate_proj.weight", (F, C)),
               (p + "mlp.up_proj.weight", (F, C)), (p + "mlp.down_proj.weight", (C, F))]
    out = []
    for i, (n, s) in enumerate(shapes):
        dt = dtypes[i % len(dtypes)]
        out.append((n, dt, s, arr(dt, s, i)))
    return out


def safetensors_corpus():
    put("safetensors", "tiny_model_f32.safetensors",
        st_bytes(tiny_model_tensors(["F32"]), {"format": "pt"}))
    put("safetensors", "tiny_model_mixed.safetensors",
        st_bytes(tiny_model_tensors(["BF16", "F16", "F32"]), None))
    dts = ["F32", "F16", "BF16", "F64", "I8", "U8", "I16", "U16", "I32", "I64", "BOOL"]
    put("safetensors", "all_dtypes.safetensors",
        st_bytes([(f"t_{d.lower()}", d, (2, 3), arr(d, (2, 3), k)) for k, d in enumerate(dts)],
                 {"format": "pt", "note": "every dtype"}))
    put("safetensors", "scalar_and_empty.safetensors",
        st_bytes([("scalar", "F32", (), arr("F32", (), 1)), ("empty", "F32", (0, 4), b""),
                  ("f8", "F8_E4M3", (4,), bytes(range(4)))]))
    put("safetensors", "empty_header.safetensors", struct.pack("<Q", 2) + b"{}")
    put("safetensors", "unpadded.safetensors",
        st_bytes([("a", "F32", (3,), arr("F32", (3,), 2))], pad_to=0))
    fx = open(os.path.join(REPO, "tests/fixtures/tiny-llama/model.safetensors"), "rb").read()
    n = struct.unpack("<Q", fx[:8])[0]
    put("safetensors", "tiny_llama_header_only.safetensors", fx[:8 + n])  # data section cut off


# ---- config.json --------------------------------------------------------------------------

def config_corpus():
    base = json.load(open(os.path.join(REPO, "tests/fixtures/tiny-llama/config.json")))
    put("config", "tiny_llama.json", open(os.path.join(REPO, "tests/fixtures/tiny-llama/config.json")).read())
    small = {k: base[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                  "num_attention_heads", "num_key_value_heads", "vocab_size")}
    small["model_type"] = "llama"
    variants = {
        "llama3_rope": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192},
                        "rope_theta": 500000.0, "eos_token_id": [128001, 128008, 128009],
                        "bos_token_id": 128000},
        "yarn_rope": {"rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                                       "original_max_position_embeddings": 4096}},
        "dynamic_rope": {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
        "linear_rope": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
        "rope_parameters_v5": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6,
                                                   "factor": 2.0, "attention_factor": 1.2}},
        "qwen2": {"model_type": "qwen2", "use_sliding_window": False, "max_window_layers": 2,
                  "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "bos_token_id": None,
                  "eos_token_id": 151645},
        "mistral_head_dim": {"model_type": "mistral", "head_dim": 32, "sliding_window": None,
                             "attention_bias": True},
        "architectures_only": {"model_type": None, "architectures": ["LlamaForCausalLM"]},
    }
    for name, extra in variants.items():
        c = dict(small)
        c.update(extra)
        if c.get("model_type") is None:
            c.pop("model_type")
        put("config", name + ".json", json.dumps(c, indent=1))
    put("config", "not_object.json", "[1, 2, 3]")
    put("config", "missing_key.json", jdump({"model_type": "llama", "hidden_size": 64}))


# ---- tokenizers ---------------------------------------------------------------------------

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def merge_parts(m):
    return m.split(" ", 1) if isinstance(m, str) else m


def subset_bpe(j, keep):
    """Keeps vocab ids < keep and the merges whose parts and result survive (ranks kept)."""
    vocab = {t: i for t, i in j["model"]["vocab"].items() if i < keep}
    merges = []
    for m in j["model"]["merges"]:
        a, b = merge_parts(m)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(f"{a} {b}")
    j["model"]["vocab"] = vocab
    j["model"]["merges"] = merges
    return j


def tok_spm():
    j = json.load(open(os.path.join(REPO, "tests/fixtures/tokenizers/llama2/tokenizer.json")))
    j = subset_bpe(j, 700)
    cfg = json.load(open(os.path.join(REPO, "tests/fixtures/tokenizers/llama2/tokenizer_config.json")))
    cfg.pop("added_tokens_decoder", None)
    cfg["chat_template"] = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ bos_token + "
                            "'[INST] ' + m['content'] + ' [/INST]' }}{% elif m['role'] == "
                            "'system' %}{{ '<<SYS>>\\n' + m['content'] + '\\n<</SYS>>\\n\\n' }}"
                            "{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}"
                            "{% endfor %}")
    return j, cfg


def tok_bytelevel():
    j = json.load(open(os.path.join(REPO, "tests/fixtures/tokenizers/llama3/tokenizer.json")))
    keep = 900
    j = subset_bpe(j, keep)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
    j["added_tokens"] = [{"id": keep + k, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for k, s in enumerate(specials)]
    bos = keep
    j["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                      "tokens": ["<|begin_of_text|>"]}}}]}
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>",
           "clean_up_tokenization_spaces": True, "tokenizer_class": "PreTrainedTokenizerFast",
           "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                            "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"}
    return j, cfg


def tiny_tok(pre=None, norm=None, dec=None, post=None, vocab=None, merges=None, added=None, **model):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
         "byte_fallback": False, "ignore_merges": False,
         "vocab": vocab or {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4},
         "merges": merges if merges is not None else ["a b", "ab c"]}
    m.update(model)
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added or [],
            "normalizer": norm, "pre_tokenizer": pre, "post_processor": post, "decoder": dec,
            "model": m}


def tokenizer_corpus():
    spm, spm_cfg = tok_spm()
    bl, bl_cfg = tok_bytelevel()
    for d, (j, c) in (("tok_spm", (spm, spm_cfg)), ("tok_bytelevel", (bl, bl_cfg))):
        os.makedirs(os.path.join(DATA, d), exist_ok=True)
        with open(os.path.join(DATA, d, "tokenizer.json"), "w") as f:
            f.write(jdump(j))
        with open(os.path.join(DATA, d, "tokenizer_config.json"), "w") as f:
            f.write(json.dumps(c, indent=1))
    put("tokenizer", "spm_llama2_subset", jdump(spm).encode() + SEP + jdump(spm_cfg).encode())
    put("tokenizer", "bytelevel_llama3_subset", jdump(bl).encode() + SEP + jdump(bl_cfg).encode())
    put("tokenizer", "spm_no_config", jdump(spm))

    b2u = bytes_to_unicode()
    sp = b2u[ord(" ")]
    byte_vocab = {b2u[b]: b for b in range(256)}
    byte_vocab.update({sp + "a": 256, "ab": 257, sp + "ab": 258, "12": 259})
    bmerges = [f"{sp} a", "a b", f"{sp}a b", "1 2"]
    spm_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "a": 4, "b": 5, "▁a": 6, "ab": 7, "▁ab": 8}
    spm_vocab.update({f"<0x{b:02X}>": 9 + b for b in range(256)})
    spm_merges = ["▁ a", "a b", "▁a b"]
    added = [{"id": 1, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True},
             {"id": 2, "content": "</s>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True},
             {"id": 300, "content": "[INST]", "single_word": True, "lstrip": True, "rstrip": True,
              "normalized": True, "special": False}]
    tmpl = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    spm_dec = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    seeds = {
        "tiny_spm_prepend_replace": tiny_tok(
            norm={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                      {"type": "Replace", "pattern": {"String": " "},
                                                       "content": "▁"}]},
            dec=spm_dec, post=tmpl, vocab=spm_vocab, merges=spm_merges, added=added,
            unk_token="<unk>", fuse_unk=True, byte_fallback=True),
        "tiny_metaspace": tiny_tok(
            pre={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
            dec={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
            vocab=spm_vocab, merges=spm_merges, unk_token="<unk>", byte_fallback=True),
        "tiny_bytelevel_regex": tiny_tok(
            pre={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            dec={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            post={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            vocab=byte_vocab, merges=[m.split(" ") for m in bmerges]),
        "tiny_split_digits_nfc": tiny_tok(
            norm={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
            pre={"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}| ?\\p{L}+|\\s+(?!\\S)|\\s+"},
                 "behavior": "Isolated", "invert": False},
                {"type": "Digits", "individual_digits": True},
                {"type": "Split", "pattern": {"String": "x"}, "behavior": "MergedWithPrevious",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            dec={"type": "ByteLevel"}, vocab=byte_vocab, merges=bmerges, ignore_merges=True),
        "tiny_split_behaviors": tiny_tok(
            pre={"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"String": " "}, "behavior": b, "invert": inv}
                for b, inv in (("Removed", False), ("MergedWithNext", False), ("Contiguous", True))]},
            unk_token="c", fuse_unk=True),
    }
    for name, j in seeds.items():
        put("tokenizer", name, jdump(j))
    put("tokenizer", "tiny_with_config",
        jdump(seeds["tiny_spm_prepend_replace"]).encode() + SEP +
        jdump({"bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>",
               "add_bos_token": False, "add_eos_token": True,
               "chat_template": [{"name": "default", "template": "[INST] {{ m }} [/INST]"},
                                 {"name": "tool_use", "template": "<|im_start|>"}]}).encode())
    put("tokenizer", "unigram_unsupported", jdump({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}))


# ---- data sets ----------------------------------------------------------------------------

FORMATS = ["auto", "alpaca", "messages", "sharegpt", "prompt-completion", "text"]
TEMPLATES = ["auto", "llama3", "chatml", "llama2", "alpaca"]


def ctl(fmt, tmpl="auto", train_prompt=0, skip_bad=0, bytelevel=0, no_shuffle=0, eval_k=0, seq_k=3,
        pref=0):
    b0 = FORMATS.index(fmt) | (TEMPLATES.index(tmpl) << 3) | (train_prompt << 6) | (skip_bad << 7)
    b1 = bytelevel | (no_shuffle << 1) | (eval_k << 2) | (seq_k << 4) | (pref << 6)
    return bytes([b0, b1])


def cut(s, n):
    return s if len(s) <= n else s[:n]


def dataset_corpus():
    lines = open(os.path.join(REPO, "examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl")).read().splitlines()
    recs = []
    for ln in lines[:5]:
        r = json.loads(ln)
        recs.append({k: cut(v, 100) for k, v in r.items()})
    alpaca = "\n".join(jdump(r) for r in recs) + "\n"
    zh = json.load(open(os.path.join(REPO, "examples/data/alpaca-zh/alpaca_zh_1000.json")))[:3]
    zh = [{k: cut(v, 80) for k, v in r.items()} for r in zh]
    zh_txt = json.dumps(zh, ensure_ascii=False, indent=1)
    msgs = [{"messages": [{"role": "system", "content": "You are terse."},
                          {"role": "user", "content": recs[i]["instruction"]},
                          {"role": "assistant", "content": recs[i]["output"]},
                          {"role": "user", "content": [{"type": "text", "text": "And again?"}]},
                          {"role": "assistant", "content": "Yes."}]} for i in range(3)]
    msgs_txt = "\n".join(jdump(m) for m in msgs) + "\n"
    share = [{"conversations": [{"from": "system", "value": "Be kind."},
                                {"from": "human", "value": recs[i]["instruction"]},
                                {"from": "gpt", "value": recs[i]["output"]}]} for i in range(3)]
    share_txt = "\n".join(jdump(m) for m in share) + "\n"
    pc = [{"prompt": recs[i]["instruction"], "completion": recs[i]["output"]} for i in range(3)]
    pc.append({"prompt": [{"role": "user", "content": "Hi"}],
               "completion": [{"role": "assistant", "content": "Hello."}]})
    pc_txt = "\n".join(jdump(m) for m in pc) + "\n"
    text_txt = "\n".join(jdump({"text": recs[i]["output"]}) for i in range(4)) + "\n"
    bad = (jdump(recs[0]) + "\n\n{not json\n" + jdump({"instruction": 3}) + "\n" +
           jdump({"foo": "bar"}) + "\n" + jdump(recs[1]) + "\n")
    for fmt, txt, tag in (("alpaca", alpaca, "alpaca_jsonl"), ("alpaca", zh_txt, "alpaca_zh_array"),
                          ("messages", msgs_txt, "messages"), ("sharegpt", share_txt, "sharegpt"),
                          ("prompt-completion", pc_txt, "prompt_completion"), ("text", text_txt, "text")):
        data = txt.encode()
        put("dataset", f"{tag}_auto_spm", ctl("auto") + data)
        put("dataset", f"{tag}_forced_bytelevel", ctl(fmt, bytelevel=1, eval_k=1, seq_k=3) + data)
    for k, t in enumerate(TEMPLATES[1:]):
        put("dataset", f"messages_tmpl_{t}", ctl("messages", t, bytelevel=k & 1, no_shuffle=1) + msgs_txt.encode())
        put("dataset", f"alpaca_tmpl_{t}_train_prompt", ctl("alpaca", t, train_prompt=1, seq_k=k & 1) + alpaca.encode())
    put("dataset", "bad_lines_skip", ctl("auto", skip_bad=1, eval_k=2) + bad.encode())
    put("dataset", "bad_lines_fail", ctl("auto") + bad.encode())
    put("dataset", "bom_blank_lines", ctl("auto") + b"\xef\xbb\xbf\n\n" + text_txt.encode() + b"\n  \n")
    put("dataset", "empty", ctl("auto"))
    put("dataset", "array_bad", ctl("auto") + b'[{"text": "a"}, {"text": ')
    pref_corpus(recs)


def pref_corpus(recs):
    """Preference records (byte 1 bit 6): every schema pref.c reads, and bad ones."""
    u = lambda t: [{"role": "user", "content": t}]
    a = lambda t: [{"role": "assistant", "content": t}]
    r = [recs[i] for i in range(4)]
    pairs = [
        {"prompt": r[0]["instruction"], "chosen": " " + r[0]["output"], "rejected": " " + r[1]["output"]},
        {"prompt": u(r[1]["instruction"]), "chosen": a(r[1]["output"]), "rejected": a(r[2]["output"])},
        {"chosen": "Q: 2+2? A: 4", "rejected": "Q: 2+2? A: 5"},
        {"chosen": u("Sky?") + a("Blue."), "rejected": u("Sky?") + a("Green.")},
        {"prompt": "Sky?", "chosen": u("Sky?") + a("Blue."), "rejected": u("Sky?") + a("Grün é.")},
        {"instruction": r[2]["instruction"], "input": "", "chosen": r[2]["output"], "rejected": r[3]["output"]},
        {"conversations": [{"from": "human", "value": r[3]["instruction"]}],
         "chosen": {"from": "gpt", "value": r[3]["output"]}, "rejected": {"from": "gpt", "value": "No."}},
    ]
    txt = "\n".join(jdump(p) for p in pairs) + "\n"
    put("dataset", "pref_all_schemas_spm", ctl("auto", pref=1, eval_k=1) + txt.encode())
    put("dataset", "pref_all_schemas_bytelevel", ctl("auto", bytelevel=1, pref=1, seq_k=1) + txt.encode())
    put("dataset", "pref_chatml_bytelevel", ctl("auto", "chatml", bytelevel=1, pref=1, eval_k=2) + txt.encode())
    bad = (jdump(pairs[0]) + "\n" + jdump({"chosen": "x"}) + "\n" + jdump({"chosen": 1, "rejected": "y"}) +
           "\n" + jdump({"chosen": "same", "rejected": "same"}) + "\n" +
           jdump({"prompt": [], "chosen": a("x"), "rejected": "y"}) + "\n")
    put("dataset", "pref_bad_skip", ctl("auto", skip_bad=1, pref=1) + bad.encode())
    put("dataset", "pref_bad_fail", ctl("auto", pref=1) + bad.encode())


# ---- PEFT adapters ------------------------------------------------------------------------

def peft_config(r, alpha, targets, **extra):
    c = {"alpha_pattern": {}, "base_model_name_or_path": "tiny", "bias": "none",
         "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
         "layers_pattern": None, "layers_to_transform": None, "lora_alpha": alpha,
         "lora_dropout": 0.0, "modules_to_save": None, "peft_type": "LORA", "r": r,
         "rank_pattern": {}, "revision": None, "target_modules": targets, "task_type": "CAUSAL_LM",
         "use_dora": False, "use_rslora": False}
    c.update(extra)
    return json.dumps(c, indent=2, sort_keys=True).encode()


def peft_dims(p):
    C, F, KV = PEFT["C"], PEFT["F"], PEFT["KV"]
    return {"q_proj": (C, C), "k_proj": (KV, C), "v_proj": (KV, C), "o_proj": (C, C),
            "gate_proj": (F, C), "up_proj": (F, C), "down_proj": (C, F)}[p]


def peft_weights(r, targets, dt="F32"):
    ts = []
    k = 0
    for l in range(PEFT["L"]):
        for p, parent in PROJ:
            if p not in targets:
                continue
            out, inn = peft_dims(p)
            key = f"base_model.model.model.layers.{l}.{parent}.{p}.lora_"
            ts.append((key + "A.weight", dt, (r, inn), arr(dt, (r, inn), k)))
            ts.append((key + "B.weight", dt, (out, r), arr(dt, (out, r), k + 1)))
            k += 2
    return st_bytes(ts, {"format": "pt"})


def peft_corpus():
    qv = ["q_proj", "v_proj"]
    allp = [p for p, _ in PROJ]
    put("peft", "qv_r2_f32", peft_config(2, 16, qv) + SEP + peft_weights(2, qv))
    put("peft", "all_r1_bf16_rslora", peft_config(1, 8, "all-linear", use_rslora=True) + SEP +
        peft_weights(1, allp, "BF16"))
    put("peft", "string_targets_f16", peft_config(3, 4.0, "q_proj,k_proj,down") + SEP +
        peft_weights(3, ["q_proj", "k_proj", "down_proj"], "F16"))
    put("peft", "missing_tensor", peft_config(2, 16, allp) + SEP + peft_weights(2, qv))
    put("peft", "config_only", peft_config(2, 16, qv))
    put("peft", "dora", peft_config(2, 16, qv, use_dora=True))


# ---- GGUF ---------------------------------------------------------------------------------

def gguf_corpus():
    import gguf
    from gguf import GGMLQuantizationType as Q
    sys.path.insert(0, os.path.join(REPO, "tests", "ref"))
    from make_gguf_fixtures import add_tensor, llama_kv, permute
    for n in ("quant_types.gguf", "qwen2-tiny.gguf", "rope-llama3.gguf"):
        put("gguf", n, open(os.path.join(REPO, "tests/fixtures/gguf", n), "rb").read())

    def tiny(path, tok_model):
        C, F, H, Hkv, D = 32, 64, 2, 1, 16
        b2u = bytes_to_unicode()
        if tok_model == "gpt2":
            tokens = [b2u[b] for b in range(256)] + ["Ġa", "ab", "Ġab", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            merges = ["Ġ a", "a b", "Ġa b"]
            types = [1] * 259 + [3, 3, 3]
        else:
            tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b", "▁a", "ab"]
            merges = None
            types = [2, 3, 3] + [6] * 256 + [1] * 5
        V = len(tokens)
        w = gguf.GGUFWriter(path, "llama")
        w.add_name("fuzz-tiny")
        llama_kv(w, 1, C, F, H, Hkv, D, V, 1e-5, 10000.0, 128)
        w.add_tokenizer_model(tok_model)
        w.add_tokenizer_pre("smollm" if tok_model == "gpt2" else "default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        if merges:
            w.add_token_merges(merges)
        else:
            w.add_token_scores([0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0])
        w.add_bos_token_id(V - 3 if tok_model == "gpt2" else 1)
        w.add_eos_token_id(V - 1 if tok_model == "gpt2" else 2)
        w.add_add_bos_token(tok_model != "gpt2")
        w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
        rng = np.random.default_rng(7)
        add_tensor(w, "token_embd.weight", rng.standard_normal((V, C)), Q.Q8_0 if tok_model == "gpt2" else Q.F16)
        add_tensor(w, "output_norm.weight", np.ones(C), Q.F32)
        add_tensor(w, "blk.0.attn_norm.weight", np.ones(C), Q.F32)
        add_tensor(w, "blk.0.ffn_norm.weight", np.ones(C), Q.F32)
        qt = {"attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q8_0, "attn_output": Q.F16,
              "ffn_gate": Q.BF16, "ffn_up": Q.F32, "ffn_down": Q.Q4_0}
        shp = {"attn_q": (H * D, C), "attn_k": (Hkv * D, C), "attn_v": (Hkv * D, C),
               "attn_output": (C, H * D), "ffn_gate": (F, C), "ffn_up": (F, C), "ffn_down": (C, F)}
        for g, s in shp.items():
            x = rng.standard_normal(s).astype(np.float32)
            if g == "attn_q":
                x = permute(x, H, H)
            elif g == "attn_k":
                x = permute(x, H, Hkv)
            add_tensor(w, f"blk.0.{g}.weight", x, qt[g])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    tmp = os.path.join(CORPUS, "gguf", ".tmp.gguf")
    for model in ("gpt2", "llama"):
        tiny(tmp, model)
        data = open(tmp, "rb").read()
        os.remove(tmp)
        put("gguf", f"tiny_llama_tok_{model}.gguf", data)
    # a loadable Llama whose weights are K-quants (and Q5_0/Q5_1/IQ4_NL/IQ4_XS): every
    # dequantizer of quant.c through ft_model_load; the builder and its dims live in
    # tests/ref/test_gguf_kquant.py (write_fuzz_seed)
    from test_gguf_kquant import write_fuzz_seed
    write_fuzz_seed(tmp)
    data = open(tmp, "rb").read()
    os.remove(tmp)
    put("gguf", "kquant_tiny.gguf", data)
    # a header-only cut of the big fixture: every key/tensor info, no data
    big = open(os.path.join(REPO, "tests/fixtures/gguf/tiny-llama.gguf"), "rb").read()
    put("gguf", "tiny_llama_truncated.gguf", big[:4096])


def main():
    # the generated seeds are rewritten in place; every other file stays (found inputs, and
    # hand-written seeds such as dataset/*tools*, which no generator below writes)
    safetensors_corpus()
    config_corpus()
    tokenizer_corpus()
    dataset_corpus()
    peft_corpus()
    gguf_corpus()
    total = 0
    for root, _, files in os.walk(CORPUS):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"make_corpus: {len(_written)} seeds, corpus {total / 1024:.0f} KiB in {CORPUS}")


if __name__ == "__main__":
    main()
