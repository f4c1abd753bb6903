"""`ftune generate` against an independent reference: greedy decoding with the numpy Llama
forward of tests/ref/llama_ref.py (float64, no cache: the whole sequence recomputed),
prompts rendered with the model's own Jinja chat template (add_generation_prompt=True, as
transformers renders it) and tokenized with the `tokenizers` package, text decoded with
`tokenizers`.

The reference's greedy run is checked in one forward over prompt + ftune's tokens
(greedy_check: the model is causal, so matching argmaxes at every row prove by induction
that the reference's own greedy run emits the same tokens and stops at the same place).

ftune decodes in float32 with a KV cache; greedy tokens agree with the float64 reference
as long as no step has a near tie between its two best logits. Each test prints the
smallest top-1/top-2 margin of the reference over the steps, to compare with ftune's
logit error (at most 2e-5 of max |logit| for SmolLM2-135M in test_logits_ref.py), so a
mismatch can be told apart from a tie.

Models: the tiny-llama fixture (always; raw prompt, the Alpaca prompt that its
template-less tokenizer gets, and a LoRA adapter trained by `ftune train`), and the
example SmolLM2-135M-Instruct Q4_1 GGUF with its ChatML template, 24 new tokens (skipped
if scripts/fetch_example.sh cannot provide it).
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import llama_ref as R  # noqa: E402

TINY = os.path.join(REPO, "tests", "fixtures", "tiny-llama")
DATA = os.path.join(REPO, "examples", "data", "alpaca-seed-tasks", "alpaca_seed_175.jsonl")
N_NEW = 24
EXAMPLE_PROMPT = "Describe the city of Paris in a few sentences."
TINY_PROMPT = "Once upon a time, in a quiet village by the sea,"
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that "
                   "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
                   "### Response:")


def ftune_bin():
    b = os.environ.get("FTUNE_BIN", os.path.join(REPO, "build", "ftune"))
    b = b if os.path.isabs(b) else os.path.join(REPO, b)
    assert os.access(b, os.X_OK), f"ftune binary not found at {b} (make build/ftune or set FTUNE_BIN)"
    return b


def ftune_generate(model, *extra, json_out=True, check=True):
    cmd = [ftune_bin(), "generate", "--model", str(model), *map(str, extra)]
    if json_out:
        cmd.append("--json")
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=600)
    if check:
        assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stderr.decode(errors='replace')}"
    out = p.stdout.decode("utf-8")  # invalid UTF-8 on stdout fails here
    if json_out and check:
        return json.loads(out), p.stderr.decode()
    return p.returncode, out, p.stderr.decode()


def greedy_check(label, cfg, w64, prompt_ids, got, n_new, stop_ids):
    """Checks that ftune's tokens are the reference's greedy tokens, in one float64 forward
    over prompt + ftune's tokens (the reference recomputes the whole sequence, no cache).

    The model is causal, so row P-1+t of those logits is what the reference computes at
    greedy step t for the prefix prompt + got[:t]. If its argmax is got[t] for every t,
    then by induction the reference's own greedy run has exactly these prefixes and emits
    exactly these tokens; ftune's stop (a stop token, or the length limit) must then be
    the reference's as well: the argmax after the last token is a stop token iff ftune
    stopped on one. Returns the smallest top-1/top-2 margin over the steps and max |logit|."""
    ids, P = list(got["ids"]), len(prompt_ids)
    assert len(ids) <= n_new and not (set(ids) & set(stop_ids))
    z = R.forward(cfg, w64, list(prompt_ids) + ids)
    stopped = got["stop"] == "stop_token"
    rows = z[P - 1:P - 1 + len(ids) + (1 if stopped else 0)]
    ref = [int(np.argmax(r)) for r in rows]
    top2 = np.sort(np.partition(rows, -2, axis=1)[:, -2:], axis=1)
    margin = float((top2[:, 1] - top2[:, 0]).min())
    scale = float(np.abs(z).max())
    print(f"\n[{label}] {len(ids)} tokens, stop: {got['stop']}; smallest top-2 logit margin of "
          f"the float64 reference {margin:.3e} ({margin / scale:.1e} of max |logit| {scale:.3g})")
    first = next((t for t in range(len(ids)) if ref[t] != ids[t]), None)
    assert first is None, (f"{label}: step {first}: ftune chose {ids[first]}, the reference "
                           f"{ref[first]} (logits {rows[first][ids[first]]:.6g} vs "
                           f"{rows[first][ref[first]]:.6g}); ftune {ids}")
    if stopped:
        assert ref[-1] in stop_ids, f"{label}: ftune stopped, the reference continues with {ref[-1]}"
    else:
        assert len(ids) == n_new, f"{label}: ftune stopped early without a stop token"
    return ref[:len(ids)]


def as64(w):
    return {k: np.asarray(v, dtype=np.float64) for k, v in w.items()}


# ---------------------------------------------------------------------------------------
# tiny-llama (always)

@pytest.fixture(scope="module")
def tiny():
    from tokenizers import Tokenizer
    cfg, w = R.load_hf(TINY)
    tok = Tokenizer.from_file(os.path.join(TINY, "tokenizer.json"))
    return cfg, as64(w), tok


def test_tiny_raw_greedy(tiny):
    cfg, w64, tok = tiny
    got, err = ftune_generate(TINY, "--raw", "--prompt", TINY_PROMPT, "--max-new-tokens", N_NEW)
    want_prompt = tok.encode(TINY_PROMPT, add_special_tokens=True).ids
    assert got["prompt_ids"] == want_prompt and want_prompt[0] == 1
    greedy_check("tiny-llama raw", cfg, w64, want_prompt, got, N_NEW, {2})
    assert got["text"] == tok.decode(got["ids"], skip_special_tokens=True)
    assert re.search(r"decode \d+ tokens in [0-9.]+ s \([0-9.]+ tok/s\)", err), err


def test_tiny_alpaca_prompt_and_stream(tiny):
    """No chat_template in the tokenizer: the Alpaca prompt with BOS (as training builds it);
    the streamed stdout is the decoded text."""
    cfg, w64, tok = tiny
    got, _ = ftune_generate(TINY, "--prompt", "Name three colors.", "--max-new-tokens", 16)
    assert got["template"] == "alpaca"
    want_prompt = tok.encode(ALPACA_NO_INPUT.format(instruction="Name three colors."),
                             add_special_tokens=True).ids
    assert got["prompt_ids"] == want_prompt
    greedy_check("tiny-llama alpaca", cfg, w64, want_prompt, got, 16, {2})
    rc, out, err = ftune_generate(TINY, "--prompt", "Name three colors.", "--max-new-tokens", 16,
                                  json_out=False)
    assert rc == 0, err
    text = got["text"]
    assert out == text + ("" if text.endswith("\n") else "\n")


def test_tiny_adapter_greedy(tmp_path, tiny):
    """A trained adapter (B non-zero) changes the tokens, and ftune's match W + s B A."""
    cfg, w64, tok = tiny
    ad = tmp_path / "ad"
    cmd = [ftune_bin(), "train", "--model", TINY, "--data", DATA, "--out", str(ad),
           "--max-steps", "3", "--lr", "3e-2", "--seq-len", "128", "--quiet"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    wa = as64(R.apply_peft_adapter(cfg, w64, str(ad)))
    got, _ = ftune_generate(TINY, "--raw", "--prompt", TINY_PROMPT, "--max-new-tokens", N_NEW,
                            "--adapter", ad)
    prompt = got["prompt_ids"]
    greedy_check("tiny-llama + LoRA", cfg, wa, prompt, got, N_NEW, {2})
    # control: without the adapter the reference does not choose these tokens
    z = R.forward(cfg, w64, prompt + got["ids"])[len(prompt) - 1:-1]
    assert [int(np.argmax(r)) for r in z] != got["ids"], "the adapter does not change the tokens"


def test_sampling_seeded_and_bad_flags(tiny):
    args = ["--raw", "--prompt", TINY_PROMPT, "--max-new-tokens", 12, "--temperature", 1.0,
            "--top-k", 50, "--top-p", 0.95]
    a, _ = ftune_generate(TINY, *args, "--seed", 7)
    b, _ = ftune_generate(TINY, *args, "--seed", 7)
    c, _ = ftune_generate(TINY, *args, "--seed", 8)
    g, _ = ftune_generate(TINY, "--raw", "--prompt", TINY_PROMPT, "--max-new-tokens", 12)
    assert a["ids"] == b["ids"], "same seed, different tokens"
    assert a["ids"] != c["ids"] or a["ids"] != g["ids"], "sampling never departs from greedy"
    for bad in (["--top-p", "0"], ["--temperature", "-1"], ["--max-new-tokens", "0"], ["--top-k", "-2"]):
        rc, _, err = ftune_generate(TINY, "--prompt", "x", *bad, json_out=False, check=False)
        assert rc == 2 and err.startswith("ftune:") and len(err.splitlines()) == 1, (bad, err)
    rc, _, err = ftune_generate(TINY, json_out=False, check=False)
    assert rc == 2 and "--prompt" in err
    rc, _, err = ftune_generate(TINY, "--prompt", "x", "--adapter", "/nonexistent/adapter",
                                json_out=False, check=False)
    assert rc == 1 and "/nonexistent/adapter" in err and len(err.splitlines()) == 1, err


# ---------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (the example model)

@pytest.fixture(scope="module")
def example():
    from tok_helpers import fetch_example, gguf_hf_tokenizer
    env_set = "FTUNE_CACHE" not in os.environ and os.path.isdir("/tmp/ftcache/examples")
    if env_set:
        os.environ["FTUNE_CACHE"] = "/tmp/ftcache"
    try:
        path, why = fetch_example()
    finally:
        if env_set:
            del os.environ["FTUNE_CACHE"]
    if path is None:
        pytest.skip("example model unavailable: " + why)
    cfg, w = R.load_gguf(path)
    return path, cfg, as64(w), gguf_hf_tokenizer(path)


def chat_prompt_text(path, messages):
    import gguf
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.chat_template"]
    template = bytes(f.parts[f.data[0]]).decode()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, bos_token="<|im_start|>",
                                            eos_token="<|im_end|>", add_generation_prompt=True)


def test_example_greedy_chat(example):
    path, cfg, w64, tok = example
    # one thread: results do not depend on the count, and a busy 2-core machine runs an
    # OpenMP team of two up to 10x slower than one thread
    got, err = ftune_generate(path, "--prompt", EXAMPLE_PROMPT, "--max-new-tokens", N_NEW,
                              "--threads", 1)
    assert got["template"] == "chatml"
    text = chat_prompt_text(path, [{"role": "user", "content": EXAMPLE_PROMPT}])
    assert text.endswith("<|im_start|>assistant\n")
    want_prompt = tok.encode(text, add_special_tokens=False).ids
    assert got["prompt_ids"] == want_prompt
    stop = {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")} - {None}
    greedy_check("SmolLM2-135M Q4_1 chatml", cfg, w64, want_prompt, got, N_NEW, stop)
    assert got["text"] == tok.decode(got["ids"], skip_special_tokens=True)
    assert "Paris" in got["text"] and got["stop"] == "length"  # a real answer, 24 tokens
    print(f"[SmolLM2-135M] text: {got['text']!r}\n{err.strip()}")


def test_example_system_prompt(example):
    """--system replaces SmolLM2's default system turn, as the Jinja template does."""
    path, cfg, w64, tok = example
    sys_msg = "You are a pirate. Answer like one."
    got, _ = ftune_generate(path, "--system", sys_msg, "--prompt", "Where is the treasure?",
                            "--max-new-tokens", 1, "--threads", 1)
    text = chat_prompt_text(path, [{"role": "system", "content": sys_msg},
                                   {"role": "user", "content": "Where is the treasure?"}])
    assert "SmolLM" not in text
    assert got["prompt_ids"] == tok.encode(text, add_special_tokens=False).ids
