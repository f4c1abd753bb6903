#!/usr/bin/env python3
"""Synthetic training data for bench/run: JSONL records {"text": ...} of random words, each
long enough to fill a whole --seq-len row after tokenization (ftune truncates an example to
the row length, so every row of a micro-batch is one full sequence: batch x seq tokens per
step, as the peer's random ids).

Words: whole-word tokens of the tokenizer's vocabulary ("Ġ" + 3 or more ASCII letters in a
byte-level BPE such as Llama-3's), so a word is about one token; --words-per-token extra words
make sure the text is longer than the row.

Usage: bench/make_data.py --out FILE [--records 64] [--seq 2048] [--seed 0]
       [--tokenizer tests/fixtures/tokenizers/llama3/tokenizer.json]
"""
import argparse
import json
import os
import random


def vocab_words(tokenizer_json, n=5000):
    with open(tokenizer_json, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    words = sorted(t[1:] for t in vocab if t.startswith("\u0120") and len(t) >= 4 and t[1:].isascii()
                   and t[1:].isalpha())
    if len(words) < 100:  # not a byte-level BPE: plain alphabetic tokens
        words = sorted(t for t in vocab if t.isascii() and t.isalpha() and len(t) >= 3)
    if len(words) < 100:
        raise SystemExit(f"{tokenizer_json}: too few word tokens ({len(words)})")
    return words[:n] if len(words) <= n else random.Random(1).sample(words, n)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="synthetic long-text JSONL for bench/run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--records", type=int, default=64)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--words-per-token", type=float, default=1.3)
    ap.add_argument("--tokenizer", default=os.path.join(here, "..", "tests", "fixtures", "tokenizers",
                                                        "llama3", "tokenizer.json"))
    a = ap.parse_args()
    words = vocab_words(a.tokenizer)
    rng = random.Random(a.seed)
    n_words = int(a.seq * a.words_per_token) + 16
    with open(a.out, "w", encoding="utf-8") as f:
        for _ in range(a.records):
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(n_words))}) + "\n")
    print(f"{a.out}: {a.records} records of {n_words} random words ({len(words)}-word list)")


if __name__ == "__main__":
    main()
