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
from gen_helpers import example_or_skip  # noqa: E402
from tok_helpers import PROMPT_NO_INPUT as ALPACA_NO_INPUT  # noqa: E402

TINY = os.path.join(REPO, "tests", "fixtures", "tiny-llama")
DATA = os.path.join(REPO, "examples", "data", "alpaca-seed-tasks", "alpaca_seed_175.jsonl")
N_NEW = 24
EXAMPLE_PROMPT = "Describe the city of Paris in a few sentences."
TINY_PROMPT = "Once upon a time, in a quiet village by the sea,"


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
    # a large seed comes back as the JSON integer it is (cJSON's %.15g wrote this one as
    # 1.79577021929528e+15, which json reads as a float and --seed refuses), and reruns
    big = 1795770219295280
    d, _ = ftune_generate(TINY, *args, "--seed", big)
    assert type(d["seed"]) is int and d["seed"] == big, d["seed"]
    e, _ = ftune_generate(TINY, *args, "--seed", d["seed"])
    assert e["ids"] == d["ids"]
    for bad in (["--top-p", "0"], ["--temperature", "-1"], ["--max-new-tokens", "0"], ["--top-k", "-2"]):
        rc, _, err = ftune_generate(TINY, "--prompt", "x", *bad, json_out=False, check=False)
        assert rc == 2 and err.startswith("ftune:") and len(err.splitlines()) == 1, (bad, err)
    rc, _, err = ftune_generate(TINY, json_out=False, check=False)
    assert rc == 2 and "--prompt" in err
    rc, _, err = ftune_generate(TINY, "--prompt", "x", "--adapter", "/nonexistent/adapter",
                                json_out=False, check=False)
    assert rc == 1 and "/nonexistent/adapter" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("flag", ["--presence-penalty=0.5", "--frequency-penalty", "--logprobs",
                                  "--prompt-logprobs", "--logit-bias", "--n", "--best-of"])
def test_removed_flags(tiny, flag, tmp_path):
    """The flags of the removed OpenAI Batch-API emulation: one usage line naming the flag and
    where a serving API lives (exit 2), before any model is read; a prompts record with one of
    its keys (or a batch request's "body") stops the run naming file, line and key."""
    rc, out, err = ftune_generate(TINY, "--prompt", "x", flag, "1", json_out=False, check=False)
    name = flag.split("=")[0]
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"ftune: generate: {name} was removed") and "vLLM or llama.cpp" in err, err
    p = tmp_path / "p.jsonl"
    for key, rec in (("n", {"prompt": "x", "n": 2}), ("logprobs", {"prompt": "x", "logprobs": 1}),
                     ("body", {"custom_id": "a", "method": "POST", "url": "/v1/completions",
                               "body": {"prompt": "x"}})):
        p.write_text(json.dumps("ok") + "\n" + json.dumps(rec) + "\n")
        rc, out, err = ftune_generate(TINY, "--prompts", p, json_out=False, check=False)
        assert rc == 1 and out == "" and f"{p}: line 2: '{key}' was removed" in err, err


def test_no_think_prompt(tiny):
    """--no-think is qwen3's enable_thinking=False: the prompt gains the template's empty
    thinking block after the assistant header (tokenized here as the same text encoded by the
    reference tokenizer); other templates have no such switch (a warning, the same ids); with
    --raw there is no template (exit 2)."""
    base = ["--prompt", "Hi", "--max-new-tokens", 1]
    q, _ = ftune_generate(TINY, *base, "--chat-template", "qwen3")
    nt, err = ftune_generate(TINY, *base, "--chat-template", "qwen3", "--no-think")
    assert "warning" not in err
    tok = tiny[2]
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert q["prompt_ids"] == tok.encode(text, add_special_tokens=False).ids
    want = tok.encode(text + "<think>\n\n</think>\n\n", add_special_tokens=False).ids
    assert nt["prompt_ids"] == want and len(want) > len(q["prompt_ids"])
    c, _ = ftune_generate(TINY, *base, "--chat-template", "chatml")
    cn, err = ftune_generate(TINY, *base, "--chat-template", "chatml", "--no-think")
    assert cn["prompt_ids"] == c["prompt_ids"] and "--no-think has no effect" in err, err
    rc, _, err = ftune_generate(TINY, "--raw", "--no-think", "--prompt", "x", json_out=False,
                                check=False)
    assert rc == 2 and "--raw" in err and len(err.splitlines()) == 1, err


# ---------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (the example model)

@pytest.fixture(scope="module")
def example():
    from tok_helpers import gguf_hf_tokenizer
    path = example_or_skip(local_cache=True)
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


# ---------------------------------------------------------------------------------------
# --prompts FILE: many prompts in one run, one JSON line each

THREE = [  # (record, the equivalent --prompt flags, reference)
    ("Name three colors.", ["--prompt", "Name three colors."], None),
    ({"prompt": "Say hi.", "system": "Be brief."}, ["--prompt", "Say hi.", "--system", "Be brief."], None),
    ({"messages": [{"role": "user", "content": "Count to three."},
                   {"role": "assistant", "content": "1 2 3"}]}, ["--prompt", "Count to three."], "1 2 3"),
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def ftune_prompts(model, path, *extra, check=True):
    cmd = [ftune_bin(), "generate", "--model", str(model), "--prompts", str(path), *map(str, extra)]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=600)
    err = p.stderr.decode(errors="replace")
    if check:
        assert p.returncode == 0, f"{' '.join(cmd)}\n{err}"
    lines = [json.loads(s) for s in p.stdout.decode("utf-8").splitlines()]
    return p.returncode, lines, err


def check_same_as_prompt(model, path, records, extra, seed_of=None, batch=()):
    """Each JSON line of a --prompts run (with the flags `batch`, e.g. ["--batch", 1]) equals a
    separate --prompt --json run of that record (the same prompt ids: same count, and same
    draws when sampling; same reply)."""
    _, lines, err = ftune_prompts(model, path, *extra, *batch)
    assert [x["index"] for x in lines] == list(range(len(records))), lines
    for (rec, flags, ref), x in zip(records, lines):
        seed = [] if seed_of is None else ["--seed", seed_of(x)]
        one, _ = ftune_generate(model, *flags, *extra, *seed)
        assert x["prompt_tokens"] == len(one["prompt_ids"]), (rec, x, one)
        assert (x["reply"], x["new_tokens"], x["stop"]) == (one["text"], len(one["ids"]), one["stop"]), (rec, x, one)
        assert x["prompt"] == flags[1]
        assert x.get("reference") == ref, x
        assert ("reference" in x) == (ref is not None)
        assert x["seconds"] > 0
    return lines, err


def test_tiny_prompts_file_greedy(tmp_path):
    """A string, a prompt + system and a messages record ending with an assistant turn (taken
    as the reference): one run gives each reply of a separate --prompt run."""
    path = write_jsonl(tmp_path / "p.jsonl", [r for r, _, _ in THREE])
    lines, err = check_same_as_prompt(TINY, path, THREE, ["--max-new-tokens", 6])
    assert "seed" not in lines[0]
    assert re.search(r"\[3/3\] \d+ prompt \+ 6 new tokens", err), err
    # the three decoded together (--batch, default 8): one forward per token step for all, the
    # lines those of one record at a time (--batch 1), in record order either way
    steps = lambda e: int(re.search(r"\((?:[0-9.]+) tok/s; (\d+) decode steps\)", e).group(1))
    assert "3 at a time" in err and steps(err) == 5, err
    _, one_by_one, err1 = ftune_prompts(TINY, path, "--max-new-tokens", 6, "--batch", 1)
    assert "1 at a time" in err1 and steps(err1) == 15, err1
    drop = lambda xs: [{k: v for k, v in x.items() if k != "seconds"} for x in xs]
    assert drop(one_by_one) == drop(lines)
    # a JSON array with an alpaca record (output: the reference) and the --chat-template path
    arr = tmp_path / "p.json"
    recs = [({"instruction": "Add.", "input": "2 and 3", "output": "5"}, None, "5"), THREE[1]]
    arr.write_text(json.dumps([r for r, _, _ in recs]))
    _, got, _ = ftune_prompts(TINY, arr, "--max-new-tokens", 4, "--chat-template", "chatml")
    assert got[0]["prompt"] == "Add.\n\n2 and 3" and got[0]["reference"] == "5"
    one, _ = ftune_generate(TINY, *THREE[1][1], "--max-new-tokens", 4, "--chat-template", "chatml")
    assert got[1]["reply"] == one["text"] and got[1]["prompt_tokens"] == len(one["prompt_ids"])


def test_tiny_prompts_file_one_new_token(tmp_path):
    """--max-new-tokens 1: every record finishes at the token its prefill samples, so its sequence
    takes the next record at once and the finished lines wait to be written in order; each
    keeps its own token (they shared the sequence's token buffer: every line had the last
    record's token, at any --batch)."""
    path = write_jsonl(tmp_path / "p.jsonl", [r for r, _, _ in THREE])
    extra = ["--max-new-tokens", 1, "--temperature", 1.0, "--seed", 7]
    steps = lambda e: int(re.search(r"\((?:[0-9.]+) tok/s; (\d+) decode steps\)", e).group(1))
    for batch in (8, 1):
        lines, err = check_same_as_prompt(TINY, path, THREE, extra, seed_of=lambda x: x["seed"],
                                          batch=["--batch", batch])
        assert steps(err) == 0 and all(x["new_tokens"] == 1 for x in lines), err
        assert len({x["reply"] for x in lines}) == 3, lines


def test_tiny_prompts_file_sampled_seeds(tmp_path):
    """Sampling: record i draws with the seed the line reports (record 0 with --seed itself),
    and a separate --prompt run with that seed gives the same tokens. The tiny random model's
    distribution is nearly flat over 32000 tokens, so the draws would change with any change
    of the prompt ids or logits."""
    path = write_jsonl(tmp_path / "p.jsonl", [r for r, _, _ in THREE])
    extra = ["--max-new-tokens", 8, "--temperature", 1.0]
    lines, err = check_same_as_prompt(TINY, path, THREE, extra + ["--seed", 7],
                                      seed_of=lambda x: x["seed"])
    seeds = [x["seed"] for x in lines]
    assert seeds[0] == 7 and len(set(seeds)) == 3 and all(0 <= s < 2 ** 53 for s in seeds), seeds
    assert len({x["reply"] for x in lines}) == 3, lines
    # the seed of a record depends on (seed, index) only: the same record at index 1 of
    # another file draws the same tokens as record 1 above
    other = write_jsonl(tmp_path / "q.jsonl", ["x", THREE[1][0]])
    _, got, _ = ftune_prompts(TINY, other, *extra, "--seed", 7)
    assert got[1]["seed"] == seeds[1] and got[1]["reply"] == lines[1]["reply"]


def test_prompts_out_atomic(tmp_path):
    """--out: the lines of stdout, written under a temporary name and renamed at the end; a
    killed run leaves only the temporary, and a failed one leaves an old FILE untouched."""
    path = write_jsonl(tmp_path / "p.jsonl", [r for r, _, _ in THREE])
    out = tmp_path / "replies.jsonl"
    _, lines, _ = ftune_prompts(TINY, path, "--max-new-tokens", 4)
    rc, none, err = ftune_prompts(TINY, path, "--max-new-tokens", 4, "--out", out)
    assert rc == 0 and none == [] and str(out) in err
    got = [json.loads(s) for s in out.read_text().splitlines()]
    strip = lambda xs: [{k: v for k, v in x.items() if k != "seconds"} for x in xs]  # noqa: E731
    assert strip(got) == strip(lines)
    assert sorted(os.listdir(tmp_path)) == ["p.jsonl", "replies.jsonl"]
    # killed after its first line: FILE is still the old one, the partial output is FILE.tmp.PID
    import time
    out.write_text("old\n")
    # 2000 records: the run is killed after its first line, so the count costs nothing, and
    # with 40 it could end (2-3 s) before a loaded machine's poll saw that line
    long = write_jsonl(tmp_path / "long.jsonl", ["Tell a long story."] * 2000)
    p = subprocess.Popen([ftune_bin(), "generate", "--model", TINY, "--prompts", str(long),
                          "--max-new-tokens", "100", "--out", str(out)], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = tmp_path / f"replies.jsonl.tmp.{p.pid}"
    t0 = time.time()
    while time.time() - t0 < 120 and p.poll() is None:
        if tmp.exists() and tmp.read_text().count("\n") >= 1:
            break
        time.sleep(0.02)
    running = p.poll() is None
    p.kill()
    p.wait()
    assert running, "the run ended before it could be interrupted"
    assert out.read_text() == "old\n"
    partial = tmp.read_text().splitlines()
    assert 1 <= len(partial) < 2000 and json.loads(partial[0])["index"] == 0
    tmp.unlink()
    # a run that fails after opening the temporary (llama2 cannot render a system turn after
    # the first one) removes it and leaves the old FILE
    bad = write_jsonl(tmp_path / "bad.jsonl", ["ok", {"messages": [
        {"role": "user", "content": "a"}, {"role": "system", "content": "b"},
        {"role": "user", "content": "c"}]}])
    rc, _, err = ftune_prompts(TINY, bad, "--out", out, "--chat-template", "llama2", check=False)
    assert rc == 1 and f"{bad}: line 2:" in err and out.read_text() == "old\n", err
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]


def test_prompts_bad_records(tmp_path):
    """Every record is checked before anything is generated; the error names the file and the
    line (JSONL) or record (array)."""
    good = [r for r, _, _ in THREE]
    cases = [
        ("a.jsonl", good[:2] + [{"messages": [{"role": "assistant", "content": "x"}]}], "line 3",
         "must end with a user turn"),
        ("b.jsonl", good + [{"text": "no prompt here"}], "line 4", "not a conversation"),
        ("c.jsonl", [good[0], {"messages": [{"role": "robot", "content": "x"}]}], "line 2", "unknown role"),
        ("d.json", None, "record 2", "found a number"),
    ]
    for name, recs, where, what in cases:
        path = tmp_path / name
        if recs is None:
            path.write_text(json.dumps([good[0], 42, good[1]]))
        else:
            write_jsonl(path, recs)
        rc, lines, err = ftune_prompts(TINY, path, "--max-new-tokens", 2, check=False)
        assert rc == 1 and lines == [], (name, rc, lines)
        assert f"{path}: {where}:" in err and what in err and "[1/" not in err, (name, err)
    # a malformed line, with blank lines before it (JSONL line numbers count them)
    path = tmp_path / "e.jsonl"
    path.write_text('"one"\n\n{"prompt": \n')
    rc, _, err = ftune_prompts(TINY, path, check=False)
    assert rc == 1 and f"{path}: line 3:" in err, err
    # --raw takes strings and {"prompt"} only
    path = write_jsonl(tmp_path / "f.jsonl", [good[0], good[2]])
    rc, _, err = ftune_prompts(TINY, path, "--raw", check=False)
    assert rc == 1 and f"{path}: line 2:" in err and "--raw" in err, err
    # an empty file, a missing one
    (tmp_path / "empty.jsonl").write_text("\n\n")
    rc, _, err = ftune_prompts(TINY, tmp_path / "empty.jsonl", check=False)
    assert rc == 1 and "empty.jsonl: no records" in err, err
    rc, _, err = ftune_prompts(TINY, tmp_path / "missing.jsonl", check=False)
    assert rc == 1 and "missing.jsonl" in err, err
    # flags that do not go together
    for bad in (["--prompt", "x"], ["--json"]):
        rc, _, err = ftune_prompts(TINY, path, *bad, check=False)
        assert rc == 2 and err.startswith("ftune:") and len(err.splitlines()) == 1, (bad, err)
    rc, _, err = ftune_generate(TINY, "--prompt", "x", "--out", tmp_path / "o", json_out=False,
                                check=False)
    assert rc == 2 and "--out" in err


QWEN25_TEMPLATE = os.path.join(REPO, "tests", "fixtures", "jinja", "templates",
                               "qwen2.5-instruct-chujiezheng.jinja")


def test_tiny_prompts_tools(tmp_path, tiny):
    """Function calling in a --prompts record (LLaMA-Factory's sharegpt form: tools as JSON
    text, a function_call turn, an observation) on tiny-llama given Qwen2.5's chat_template:
    the prompt is the template's render by jinja2 of the same conversation in OpenAI form
    (transformers' apply_chat_template, tools=..., add_generation_prompt=True), tokenized by
    `tokenizers` without special tokens (the template writes them), as training renders it."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    _, _, tok = tiny
    model = tmp_path / "m"
    model.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        os.symlink(os.path.join(TINY, f), model / f)
    with open(os.path.join(TINY, "tokenizer_config.json")) as f:
        tc = json.load(f)
    with open(QWEN25_TEMPLATE) as f:
        tc["chat_template"] = template = f.read()
    (model / "tokenizer_config.json").write_text(json.dumps(tc))
    schema = {"name": "mul", "description": "Multiply two integers.",
              "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                              "b": {"type": "integer"}}}}
    call = {"name": "mul", "arguments": {"a": 17, "b": 19}}
    rec = {"conversations": [{"from": "human", "value": "What is 17 * 19?"},
                             {"from": "function_call", "value": json.dumps(call)},
                             {"from": "observation", "value": "323"},
                             {"from": "gpt", "value": "It is 323."}],
           "system": "You are exact.", "tools": json.dumps([schema])}
    path = write_jsonl(tmp_path / "p.jsonl", [rec])
    _, lines, err = ftune_prompts(model, path, "--max-new-tokens", 2)
    assert "template jinja" in err, err
    assert len(lines) == 1 and lines[0]["reference"] == "It is 323.", lines

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, \
        sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                    separators=separators, sort_keys=sort_keys)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    messages = [{"role": "system", "content": "You are exact."},
                {"role": "user", "content": "What is 17 * 19?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": call}]},
                {"role": "tool", "content": "323"}]
    text = env.from_string(template).render(messages=messages, tools=[{"type": "function",
                                            "function": schema}], documents=None,
                                            bos_token="<s>", eos_token="</s>",
                                            add_generation_prompt=True)
    assert "<tools>" in text and "<tool_call>\n" + json.dumps(call) in text, text
    want = tok.encode(text, add_special_tokens=False).ids
    assert lines[0]["prompt_tokens"] == len(want), (lines[0], len(want), text)


def test_example_prompts_file(tmp_path, example):
    """The example model answers differently per prompt: one --prompts run equals three
    --prompt runs on real replies (ChatML, the default SmolLM2 system turn or --system's)."""
    path, _, _, _ = example
    recs = [("What is the capital of France?", ["--prompt", "What is the capital of France?"], None),
            ({"prompt": "Name a color.", "system": "You are a pirate."},
             ["--prompt", "Name a color.", "--system", "You are a pirate."], None),
            ({"messages": [{"role": "user", "content": "What is 2 + 2?"},
                           {"role": "assistant", "content": "4"}]}, ["--prompt", "What is 2 + 2?"], "4")]
    p = write_jsonl(tmp_path / "p.jsonl", [r for r, _, _ in recs])
    lines, _ = check_same_as_prompt(path, p, recs, ["--max-new-tokens", 8, "--threads", 1])
    assert len({x["reply"] for x in lines}) == 3 and "Paris" in lines[0]["reply"], lines
