"""Helpers for the generation reference tests (test_generate_*.py, test_gen_*.py,
test_sampling_ref.py, test_openai_batch.py, test_cpu_device.py, test_chat_ref.py): the example
model or a skip, a greedy reference loop with penalties over `ftune logits`, and a tiny
16-layer NF4 pack with the --gpu-mem budget that streams most of it.
"""
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import TINY, run_ftune
from tok_helpers import fetch_example

# a local copy of the example model that some tests prefer to the default cache
LOCAL_CACHE = "/tmp/ftcache"
# where scripts/fetch_example.sh leaves the example model (tests that skip without it, rather
# than fetch it, look here)
CACHED_EXAMPLE = Path(os.environ.get("FTUNE_CACHE") or
                      Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ftune") \
    / "examples" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def example_or_skip(local_cache=False):
    """Path of the example GGUF (scripts/fetch_example.sh), or pytest.skip naming why; with
    local_cache, FTUNE_CACHE=/tmp/ftcache when it holds examples/ and FTUNE_CACHE is unset."""
    env = None
    if local_cache and "FTUNE_CACHE" not in os.environ and \
            os.path.isdir(os.path.join(LOCAL_CACHE, "examples")):
        env = dict(os.environ, FTUNE_CACHE=LOCAL_CACHE)
    path, why = fetch_example(env=env)
    if path is None:
        pytest.skip("example model unavailable: " + why)
    return path


def last_logits(tmp_path, model, ids):
    """The last row, (vocab,) float32, of `ftune logits --model MODEL --ids IDS` (written to
    tmp_path/logits.f32 as (n_tokens, vocab) little-endian f32)."""
    out = Path(tmp_path) / "logits.f32"
    r = run_ftune(["logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out])
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    return np.fromfile(out, dtype="<f4").reshape(j["n_tokens"], j["vocab"])[-1]


def reference_greedy(tmp_path, model, prompt_ids, n_new, stop_ids, repetition=1.0):
    """Greedy decoding, one `ftune logits` call per step over the whole prefix, the float32
    repetition penalty of transformers' RepetitionPenaltyLogitsProcessor: x < 0 ? x * p : x / p
    on the ids of prompt and reply (each once); the argmax. Returns (ids, stopped on a stop id,
    smallest top-2 margin)."""
    seq, out, margin = list(prompt_ids), [], np.inf
    for _ in range(n_new):
        z = last_logits(tmp_path, model, seq).astype(np.float32).copy()
        if repetition != 1:
            idx = np.array(sorted(set(seq)), dtype=np.int64)
            s, p = z[idx], np.float32(repetition)
            z[idx] = np.where(s < 0, s * p, s / p)
        top2 = np.sort(np.partition(z, -2)[-2:])
        margin = min(margin, float(top2[1] - top2[0]))
        t = int(np.argmax(z))
        if t in stop_ids:
            return out, True, margin
        out.append(t)
        seq.append(t)
    return out, False, margin


def streamed_nf4_model(tmp_path):
    """tmp_path/m: `ftune init-model --pack` (NF4) of the fixture's config widened to 16 layers
    of hidden 512 (3.7 MB each), seed 3, with the fixture's tokenizer."""
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update(hidden_size=512, intermediate_size=4096, num_hidden_layers=16,
               num_attention_heads=8, num_key_value_heads=4, head_dim=64)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    model = tmp_path / "m"
    r = run_ftune(["init-model", "--config", tmp_path / "c.json", "--out", model, "--pack",
                   "--tokenizer", TINY, "--seed", "3"])
    assert r.returncode == 0, r.stderr
    return model


def plan_floor_gib(r):
    """GiB of device memory the smallest streamed plan takes (its fixed part and its layer
    slots), read from r, the refusal (exit 1) of a 1 MiB budget."""
    fixed = re.search(r"GPU: ([0-9.]+)G fixed", r.stderr)
    slots = re.search(r"([0-9]+) layer slots ([0-9.]+)G", r.stderr)
    assert r.returncode == 1 and fixed and slots, r.stderr
    return float(fixed.group(1)) + float(slots.group(2))


def streamed_budget(r, extra_gib):
    """--gpu-mem value "<N>M": the smallest plan's floor (plan_floor_gib of r) plus extra_gib
    GiB for a few resident layers."""
    return f"{int((plan_floor_gib(r) + extra_gib) * 1024)}M"


def generate(*args, check=True, model=TINY):
    """`ftune generate --model MODEL ARGS...` (600 s at most); with check, asserts exit 0."""
    r = run_ftune(["generate", "--model", model, *args], timeout=600)
    if check:
        assert r.returncode == 0, f"{args}\n{r.stderr}"
    return r


def write_jsonl(path, recs):
    """recs as JSONL at path (a Path); returns path."""
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def mix64(z):
    """splitmix64's output function (src/core/rng.h ft_mix64) on a 64-bit integer."""
    m = (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & m
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & m
    return z ^ (z >> 31)


def record_seed(seed, i):
    """ft_gen_record_seed (src/infer/generate.h): seed XOR (splitmix64 output i mod 2^53),
    record 0 the seed itself."""
    return seed ^ (mix64((i * 0x9e3779b97f4a7c15) & ((1 << 64) - 1)) & ((1 << 53) - 1))
