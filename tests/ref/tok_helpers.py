"""Helpers for the tokenizer reference tests (test_tokenizer_ref.py).

The texts come from the real example data sets: for every record the instruction, the
input, the output, and the full Stanford Alpaca prompt followed by the output
(formats.md 8.1), plus a few hand-written edge cases (special tokens written in the text,
whitespace runs, digits, emoji, CRLF, contractions).
"""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOK_DIR = ROOT / "tests" / "fixtures" / "tokenizers"
SEED_JSONL = ROOT / "examples" / "data" / "alpaca-seed-tasks" / "alpaca_seed_175.jsonl"
ZH_JSON = ROOT / "examples" / "data" / "alpaca-zh" / "alpaca_zh_1000.json"

PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
                "further context. Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that "
                   "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
                   "### Response:")

EDGE_TEXTS = [
    "", " ", "  leading and trailing  ", "multiple   internal    spaces", "\n\n\t\n",
    "tabs\tand\nnewlines\r\nmixed", "I'm sure they'LL say it's fine, DON'T you think? We've seen it.",
    "Numbers 12345 and 3.14159 and 1,000,000", "Emoji: 😀👍🏽🇺🇸 and ❤️", "Café naïve résumé Ångström",
    "你好，世界！这是一个测试。", "日本語のテキスト ー", "Россия и Українa", "مرحبا بالعالم",
    "def foo(x):\n    return x ** 2  \n", "<s>[INST] hi [/INST] there</s>", "a<s>b </s> c <unk>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>x<|endoftext|>",
    "zero\u200bwidth and\u00a0nbsp", "ＡＢＣ１２３ full width", "x" * 300, " " * 40 + "end",
    # not NFC: decomposed accents, singletons (Angstrom/Ohm signs), Hangul jamo, combining
    # marks out of canonical order (an NFC normalizer composes/reorders them; others must not)
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m", "\u212b \u2126 \u1100\u1161\u11a8",
    "e\u0301\u0327 q\u0307\u0323 \u0301lead",
]


def ftune_bin():
    b = os.environ.get("FTUNE_BIN") or str(ROOT / "build" / "ftune")
    assert os.path.exists(b), f"ftune binary not found at {b} (build it, or set FTUNE_BIN)"
    return b


def records():
    recs = [json.loads(line) for line in SEED_JSONL.read_text(encoding="utf-8").splitlines() if line.strip()]
    recs += json.loads(ZH_JSON.read_text(encoding="utf-8"))
    return recs


def alpaca_full(r):
    p = PROMPT_INPUT if r.get("input") else PROMPT_NO_INPUT
    return p.format(instruction=r["instruction"], input=r.get("input", "")) + r["output"]


def all_texts():
    out = []
    for r in records():
        out += [r["instruction"], r.get("input", ""), r["output"], alpaca_full(r)]
    return out + EDGE_TEXTS


def run_ftune_texts(model, texts, tmp_path, extra=()):
    """Runs `ftune tokenize --model MODEL --texts FILE` and returns one parsed JSON value per
    text (a list of ids, or {"ids","text"} with --decode). Returns (values, None) or
    (None, stderr) when ftune fails."""
    f = Path(tmp_path) / "texts.jsonl"
    f.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    p = subprocess.run([ftune_bin(), "tokenize", "--model", str(model), "--texts", str(f), *extra],
                       capture_output=True, text=True, encoding="utf-8", timeout=300)
    if p.returncode != 0:
        return None, p.stderr.strip()
    lines = p.stdout.splitlines()
    assert len(lines) == len(texts), f"ftune printed {len(lines)} lines for {len(texts)} texts"
    return [json.loads(x) for x in lines], None


def compare_ids(name, texts, got, ref, max_show=5):
    """Asserts got[i] == ref[i] for every text; prints the count compared."""
    bad = [i for i in range(len(texts)) if got[i] != ref[i]]
    print(f"{name}: {len(texts) - len(bad)}/{len(texts)} texts identical "
          f"({sum(len(r) for r in ref)} reference ids)")
    msg = []
    for i in bad[:max_show]:
        g, r = got[i], ref[i]
        k = next((j for j in range(min(len(g), len(r))) if g[j] != r[j]), min(len(g), len(r)))
        msg.append(f"  text {i} {texts[i][:60]!r}: first difference at token {k}: "
                   f"ftune {g[k:k + 6]} vs tokenizers {r[k:k + 6]}")
    assert not bad, f"{name}: {len(bad)} of {len(texts)} texts differ\n" + "\n".join(msg)


def fetch_example(env=None):
    """Path of the example GGUF, or None (with the reason) if it cannot be fetched; env: the
    script's environment (None: this process's)."""
    p = subprocess.run(["bash", str(ROOT / "scripts" / "fetch_example.sh")], capture_output=True,
                       text=True, timeout=600, env=env)
    path = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if p.returncode != 0 or not path or not os.path.exists(path):
        return None, (p.stderr.strip().splitlines() or ["fetch_example.sh failed"])[-1]
    return path, None


def gguf_hf_tokenizer(gguf_path):
    """A tokenizers.Tokenizer built from the GGUF's tokenizer.ggml.tokens/merges/token_type:
    BPE, Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False,
    use_regex=True)] (SmolLM2's tokenizer.json pipeline), ByteLevel decoder, control tokens
    (type 3) as special added tokens."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = GGUFReader(gguf_path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok
