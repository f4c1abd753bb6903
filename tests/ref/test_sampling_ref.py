"""`ftune generate --repetition-penalty / --min-p / --stop` against independent references.

--repetition-penalty: transformers' RepetitionPenaltyLogitsProcessor (CTRL, Keskar et al.
2019) as generate() applies it, for greedy decoding too: every id of the sequence so far
(prompt and reply; each once) gets logit < 0 ? logit * X : logit / X in float32, then the
argmax. The reference here runs its own greedy loop in numpy over `ftune logits` (the raw
logits of the whole prefix, recomputed without a KV cache at every step), feeding its own
choices, and must emit the ids of `ftune generate --json`. Each test prints the smallest
top-1/top-2 margin of the penalised logits, to tell a real mismatch from a near tie.

--stop: vLLM's SamplingParams.stop: the reply ends when its decoded text (the `tokenizers`
package's decode, skip_special_tokens) contains a stop string; the text stops before it,
"stop": "stop_string", "stop_reason": the string; the ids are those of the run without
--stop up to the token that completed the string. Streamed stdout equals the --json text;
--prompts lines are the same at --batch 3 and --batch 1 and equal --prompt runs.

--min-p: 1 keeps only the most likely token, so sampling with it is greedy decoding.

Model: the tiny-llama fixture (random weights: it repeats itself, which the penalty and the
stop strings need).
"""
import json
import os
import subprocess

import numpy as np
import pytest

from gen_helpers import record_seed, reference_greedy

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
TINY = os.path.join(REPO, "tests", "fixtures", "tiny-llama")
PROMPT = "Once upon a time, in a quiet village by the sea,"
RAW_PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3, 4,", "Hello world",
               "def main():"]


def ftune_bin():
    b = os.environ.get("FTUNE_BIN", os.path.join(REPO, "build", "ftune"))
    b = b if os.path.isabs(b) else os.path.join(REPO, b)
    assert os.access(b, os.X_OK), f"ftune binary not found at {b} (make build/ftune or set FTUNE_BIN)"
    return b


def run(*args):
    p = subprocess.run([ftune_bin(), *map(str, args)], cwd=REPO, capture_output=True, timeout=600)
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode(errors="replace")


def generate(*args, stream=False):
    """--json (one object) or, stream=True, the streamed stdout."""
    rc, out, err = run("generate", "--model", TINY, *args, *([] if stream else ["--json"]))
    assert rc == 0, f"{args}\n{err}"
    return out if stream else json.loads(out)


def prompts_run(path, *args):
    rc, out, err = run("generate", "--model", TINY, "--prompts", path, *args)
    assert rc == 0, f"{args}\n{err}"
    return [json.loads(s) for s in out.splitlines()], err


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(TINY, "tokenizer.json"))


@pytest.fixture(scope="module")
def stop_ids():
    with open(os.path.join(TINY, "config.json")) as f:
        e = json.load(f)["eos_token_id"]
    return set(e if isinstance(e, list) else [e])


# ---------------------------------------------------------------------------------------
# --repetition-penalty: greedy against a numpy loop over `ftune logits`
# (gen_helpers.reference_greedy)

@pytest.mark.parametrize("penalty,template", [(1.3, "raw"), (0.7, "raw"), (1.5, "alpaca")])
def test_repetition_penalty_greedy(tmp_path, stop_ids, penalty, template):
    n_new = 16
    args = ["--raw", "--prompt", PROMPT] if template == "raw" else ["--prompt", "Name three colors."]
    got = generate(*args, "--max-new-tokens", n_new, "--repetition-penalty", penalty)
    plain = generate(*args, "--max-new-tokens", n_new)
    assert got["template"] == template and got["prompt_ids"] == plain["prompt_ids"]
    ref, stopped, margin = reference_greedy(tmp_path, TINY, got["prompt_ids"], n_new, stop_ids,
                                            repetition=penalty)
    print(f"\n[penalty {penalty}, {template}] ftune {got['ids']}\n  plain greedy {plain['ids']}\n"
          f"  smallest top-2 margin of the penalised reference logits {margin:.3e}")
    assert got["ids"] == ref, f"reference {ref}"
    assert (got["stop"] == "stop_token") == stopped
    assert got["ids"] != plain["ids"], "the penalty changes nothing"
    if template == "raw" and penalty > 1:
        # the prompt's ids count: at the first step the reply is empty, so only a penalty on
        # the prompt's ids (here the "," ending it) can move the choice off plain greedy's
        assert got["ids"][0] != plain["ids"][0] and plain["ids"][0] in got["prompt_ids"]


def test_repetition_penalty_prompts_batch(tmp_path):
    """--prompts with the penalty: each record's seen ids are its own (the same lines at
    --batch 3 and --batch 1, and as --prompt runs)."""
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in RAW_PROMPTS))
    extra = ["--raw", "--max-new-tokens", 10, "--repetition-penalty", 1.4]
    a, err = prompts_run(path, *extra, "--batch", 3)
    b, _ = prompts_run(path, *extra, "--batch", 1)
    assert "3 at a time" in err
    drop = lambda xs: [{k: v for k, v in x.items() if k != "seconds"} for x in xs]
    assert drop(a) == drop(b)
    for p, x in zip(RAW_PROMPTS, a):
        one = generate("--raw", "--prompt", p, "--max-new-tokens", 10, "--repetition-penalty", 1.4)
        assert (x["reply"], x["new_tokens"], x["stop"]) == (one["text"], len(one["ids"]), one["stop"])
    # sampled, with every control at once: the same lines at any --batch (per-record seeds,
    # seen ids and stop state), and record i equals --prompt with its seed
    extra = ["--raw", "--max-new-tokens", 10, "--repetition-penalty", 1.2, "--temperature", 0.9,
             "--top-k", 200, "--top-p", 0.95, "--min-p", 0.3, "--stop", "ing", "--stop", "s "]
    a, _ = prompts_run(path, *extra, "--seed", 4, "--batch", 3)
    b, _ = prompts_run(path, *extra, "--seed", 4, "--batch", 1)
    assert drop(a) == drop(b)
    print("\n" + "\n".join(f"{x['new_tokens']:2d} {x['stop']:11s} {x['reply']!r}" for x in a))
    for p, x in zip(RAW_PROMPTS, a):
        one = generate("--prompt", p, *extra, "--seed", x["seed"])
        assert (x["reply"], x["new_tokens"], x["stop"], x.get("stop_reason")) == \
            (one["text"], len(one["ids"]), one["stop"], one.get("stop_reason"))
    assert any(x["stop"] == "stop_string" for x in a) and any(x["stop"] == "length" for x in a), a


def all_logits(tmp_path, ids):
    out = tmp_path / "logits.f32"
    rc, o, err = run("logits", "--model", TINY, "--ids", ",".join(map(str, ids)), "--out", out)
    assert rc == 0, err
    j = json.loads(o)
    return np.fromfile(out, dtype="<f4").reshape(j["n_tokens"], j["vocab"]).astype(np.float64)


# ftune generate's cached decode vs `ftune logits`' full forward: fp32 reassociation only
# (test_generate.c: 1e-5 of max |logit|; the tiny model's logits are below 1)
TOL_LOGITS_ABS = 1e-4


def test_min_p(tmp_path):
    """Every token sampled with --min-p X has softmax(z / T) >= X * its maximum, i.e.
    z >= max z + T ln X, on the reference logits of its step (and sampling without min-p does
    draw tokens below that: the filter is what keeps them out); --min-p 1 keeps the most
    likely token alone, so it samples the greedy tokens; with --temperature 0 --min-p has no
    effect (as top-k and top-p)."""
    base = ["--raw", "--prompt", PROMPT, "--max-new-tokens", 12]
    greedy = generate(*base)
    assert generate(*base, "--temperature", 1.0, "--min-p", 1, "--seed", 5)["ids"] == greedy["ids"]
    assert generate(*base, "--min-p", 0.5)["ids"] == greedy["ids"]
    T, mp = 0.8, 0.75

    def worst(got):
        """Smallest z - (max z + T ln X) over the steps (>= 0: every token passes)."""
        P, ids = len(got["prompt_ids"]), got["ids"]
        z = all_logits(tmp_path, got["prompt_ids"] + ids)[P - 1:P - 1 + len(ids)]
        return min(float(z[i, t] - (z[i].max() + T * np.log(mp))) for i, t in enumerate(ids))

    for seed in (9, 10, 11):
        a = generate(*base, "--temperature", T, "--min-p", mp, "--seed", seed)
        assert generate(*base, "--temperature", T, "--min-p", mp, "--seed", seed)["ids"] == a["ids"]
        w = worst(a)
        assert w >= -TOL_LOGITS_ABS, f"seed {seed}: a token below the min-p cut by {-w:.3g}"
    free = generate(*base, "--temperature", T, "--seed", 9)
    assert worst(free) < 0, "sampling without min-p never goes below the cut: the test shows nothing"


# ---------------------------------------------------------------------------------------
# --stop

def first_stop(tok, ids, stops):
    """vLLM's rule, one token at a time: the first k whose decoded text contains a stop
    string (the one ending first, then the first listed); returns (k, cut, stop) or None."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k], skip_special_tokens=True)
        hits = [(text.find(s) + len(s), i, s) for i, s in enumerate(stops) if s in text]
        if hits:
            end, _, s = min(hits)
            return k, end - len(s), s
    return None


@pytest.mark.parametrize("stops,spans", [([", b"], 1), (["ied bur"], 1), ([",X", "ied bur"], 1),
                                         (["buried buried", ", b"], 1), (["ied", "buried"], 0),
                                         (["buried", "ied"], 0)])
def test_stop_strings(tok, stops, spans):
    """The reply of the run without --stop, cut as vLLM cuts it; a stop string that spans two
    tokens (spans = 1); two that one token completes together (the one ending first wins, then
    the first listed: "ied" and "buried" end together)."""
    base = ["--raw", "--prompt", PROMPT, "--max-new-tokens", 24]
    plain = generate(*base)
    flags = [a for s in stops for a in ("--stop", s)]
    got = generate(*base, *flags)
    k, cut, s = first_stop(tok, plain["ids"], stops)
    text = tok.decode(plain["ids"][:k], skip_special_tokens=True)
    assert got["ids"] == plain["ids"][:k] and len(got["ids"]) == k
    assert got["text"] == text[:cut] and s not in got["text"]
    assert got["stop"] == "stop_string" and got["stop_reason"] == s
    # the stop string spans tokens: it starts before the text of the token that completes it
    before = tok.decode(plain["ids"][:k - 1], skip_special_tokens=True)
    assert s not in before and (cut < len(before)) == bool(spans), (before, s)
    # streamed: the same text; nothing that the stop string later cut was printed
    out = generate(*base, *flags, stream=True)
    assert out == got["text"] + ("" if got["text"].endswith("\n") else "\n")
    print(f"\n{stops}: {k} tokens, text {got['text']!r}, stop_reason {s!r}")


def test_stop_not_matched_and_template(tok):
    """A stop string whose start ends the text at times (held back, then released) but never
    completes: the whole reply, "length"; streamed the same. With the chat template too."""
    base = ["--raw", "--prompt", PROMPT, "--max-new-tokens", 12]
    plain = generate(*base)
    got = generate(*base, "--stop", ",X", "--stop", "buried!")
    assert got["ids"] == plain["ids"] and got["text"] == plain["text"] and got["stop"] == "length"
    assert "stop_reason" not in got
    assert generate(*base, "--stop", ",X", stream=True) == plain["text"] + "\n"
    chat = generate("--prompt", "Name three colors.", "--max-new-tokens", 8)
    assert chat["template"] == "alpaca" and chat["text"].startswith("::::")
    cut = generate("--prompt", "Name three colors.", "--max-new-tokens", 8, "--stop", ":::")
    assert (cut["text"], cut["ids"], cut["stop_reason"]) == ("", chat["ids"][:3], ":::")
    # an empty reply streams nothing (not even the held-back "::")
    out = generate("--prompt", "Name three colors.", "--max-new-tokens", 8, "--stop", ":::", stream=True)
    assert out == "", repr(out)
    # only the reply's text counts: a stop string of the prompt ("village"), one across the
    # prompt's end and the reply's start (the prompt ends with "sea,", the reply begins ",")
    assert PROMPT.endswith("sea,") and plain["text"].startswith(",") and "village" in PROMPT
    got = generate(*base, "--stop", "village", "--stop", "sea,,")
    assert (got["ids"], got["text"], got["stop"]) == (plain["ids"], plain["text"], "length")
    # a stop string longer than the whole reply, which the reply begins: held back while
    # streaming, then all of it printed
    long = plain["text"] + "x" * 200
    assert generate(*base, "--stop", long, stream=True) == plain["text"] + "\n"
    # --max-new-tokens 1, its token completing a stop string: an empty text, "stop_string"
    one = generate("--raw", "--prompt", PROMPT, "--max-new-tokens", 1, "--stop", ",")
    assert (one["ids"], one["text"], one["stop"]) == (plain["ids"][:1], "", "stop_string")


def test_stop_prompts_batch(tmp_path, tok):
    """--prompts: each record stops on its own; --batch 3 equals --batch 1; each line is the
    --prompt run's reply; lines stay in record order."""
    stops = ["meoun", "is is is", "'\" '", "altered"]
    flags = [a for s in stops for a in ("--stop", s)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in RAW_PROMPTS))
    a, err = prompts_run(path, "--raw", "--max-new-tokens", 12, *flags, "--batch", 3)
    b, _ = prompts_run(path, "--raw", "--max-new-tokens", 12, *flags, "--batch", 1)
    drop = lambda xs: [{k: v for k, v in x.items() if k != "seconds"} for x in xs]
    assert drop(a) == drop(b) and [x["index"] for x in a] == list(range(len(RAW_PROMPTS)))
    reasons = [x.get("stop_reason") for x in a]
    assert sum(r is not None for r in reasons) >= 3, reasons
    assert len({x["new_tokens"] for x in a}) >= 3, "the records should stop at different steps"
    for p, x in zip(RAW_PROMPTS, a):
        one = generate("--raw", "--prompt", p, "--max-new-tokens", 12, *flags)
        assert (x["reply"], x["new_tokens"], x["stop"], x.get("stop_reason")) == \
            (one["text"], len(one["ids"]), one["stop"], one.get("stop_reason"))
        assert ("stop_reason" in x) == (x["stop"] == "stop_string")
        plain = generate("--raw", "--prompt", p, "--max-new-tokens", 12)
        hit = first_stop(tok, plain["ids"], stops)
        if hit:
            k, cut, s = hit
            assert (x["new_tokens"], x["reply"], x["stop_reason"]) == \
                (k, tok.decode(plain["ids"][:k], skip_special_tokens=True)[:cut], s)
        else:
            assert x["reply"] == plain["text"] and x["stop"] == plain["stop"]
    print("\n" + "\n".join(f"{x['new_tokens']:2d} {x['stop']:11s} {x['reply']!r}" for x in a))


def test_config_and_bad_flags(tmp_path):
    """--config: "stop" as a string or a list, "repetition_penalty", "min_p"; bad values exit 2
    with one line."""
    base = ["--raw", "--prompt", PROMPT, "--max-new-tokens", 12]
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"stop": [",X", "ied bur"], "repetition_penalty": 1.0}))
    a = generate("--config", cfg, *base)
    assert a["stop_reason"] == "ied bur"
    cfg.write_text(json.dumps({"stop": ", b"}))
    assert generate("--config", cfg, *base)["stop_reason"] == ", b"
    # flags on the command line replace the config's list
    assert generate("--config", cfg, *base, "--stop", "ied bur")["stop_reason"] == "ied bur"
    bad = [["--repetition-penalty", "0"], ["--repetition-penalty", "-1"], ["--repetition-penalty", "nan"],
           ["--repetition-penalty", "inf"], ["--min-p", "1.5"], ["--min-p", "-0.1"], ["--min-p", "nan"],
           ["--stop", ""], [a for i in range(17) for a in ("--stop", f"s{i}")]]
    for b in bad:
        rc, _, err = run("generate", "--model", TINY, "--prompt", "x", *b)
        assert rc == 2 and err.startswith("ftune:") and len(err.splitlines()) == 1, (b, err)
    cfg.write_text(json.dumps({"stop": ""}))
    rc, _, err = run("generate", "--model", TINY, "--prompt", "x", "--config", cfg)
    assert rc == 2 and str(cfg) in err and len(err.splitlines()) == 1, err


# ---------------------------------------------------------------------------------------
# per-record settings in a --prompts file (vLLM's one SamplingParams per prompt)

# record key -> the flag it replaces
FLAG_OF = {"max_new_tokens": "--max-new-tokens", "max_tokens": "--max-new-tokens",
           "max_completion_tokens": "--max-new-tokens", "temperature": "--temperature",
           "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p",
           "repetition_penalty": "--repetition-penalty", "seed": "--seed"}


def flags_of(base, rec):
    """The command line `base` (flag -> value, "--stop" -> list) with the record's settings."""
    f = dict(base)
    for k, v in rec.items():
        if v is None:  # null: the command line's
            continue
        if k in FLAG_OF:
            f[FLAG_OF[k]] = v
        elif k == "stop":
            f["--stop"] = [v] if isinstance(v, str) else v
    args = []
    for k, v in f.items():
        args += [a for s in v for a in ("--stop", s)] if k == "--stop" else [k, v]
    return args, f


def test_prompts_per_record_settings(tmp_path):
    """Records that set their own max_new_tokens / max_tokens, temperature + seed, top_k,
    top_p, min_p, stop (a string, a list, [] for none) and repetition_penalty: each line is the
    --prompt run with the command line's flags so replaced (the record's seed, else its derived
    one, reported as "seed" when it samples); --batch 3 equals --batch 1; the KV caches hold the
    longest prompt plus the new tokens its own record asks; a penalty asked by one record only
    (none on the command line) applies to that record."""
    base = {"--max-new-tokens": 10, "--temperature": 0.8, "--seed": 4, "--stop": ["ing"]}
    recs = [
        {"prompt": RAW_PROMPTS[0], "max_new_tokens": 3, "temperature": 0},
        {"prompt": RAW_PROMPTS[1], "temperature": 0.9, "seed": 5, "top_k": 200, "max_tokens": 7},
        {"prompt": RAW_PROMPTS[2], "stop": "'\" '", "temperature": 0, "top_p": None},
        {"prompt": RAW_PROMPTS[3], "repetition_penalty": 1.4, "stop": [], "temperature": 0},
        {"prompt": RAW_PROMPTS[4], "min_p": 0.3, "top_p": 0.95, "temperature": 1.0,
         "max_new_tokens": 12, "max_tokens": 12},
        PROMPT,
        {"prompt": PROMPT, "max_new_tokens": 1, "stop": [","], "temperature": 0},  # token 1 is ","
    ]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    cl, _ = flags_of(base, {})
    a, err = prompts_run(path, "--raw", *cl, "--batch", 3)
    b, _ = prompts_run(path, "--raw", *cl, "--batch", 1)
    drop = lambda xs: [{k: v for k, v in x.items() if k != "seconds"} for x in xs]
    assert drop(a) == drop(b)
    print("\n" + "\n".join(f"{x['new_tokens']:2d} {x['stop']:11s} {x.get('seed')} {x['reply']!r}" for x in a))
    news = []
    for i, (rec, x) in enumerate(zip(recs, a)):
        rec = rec if isinstance(rec, dict) else {}
        # the record's own seed, else the one derived from --seed and its index
        args, f = flags_of({**base, "--seed": record_seed(4, i)}, rec)
        if float(f["--temperature"]) > 0:
            assert x["seed"] == f["--seed"], (i, x)
        else:
            assert "seed" not in x, (i, x)
        one = generate("--raw", "--prompt", x["prompt"], *args)
        assert (x["reply"], x["new_tokens"], x["stop"], x.get("stop_reason"), x["prompt_tokens"]) == \
            (one["text"], len(one["ids"]), one["stop"], one.get("stop_reason"), len(one["prompt_ids"])), (i, x, one)
        news.append(int(f["--max-new-tokens"]))
    assert [x["new_tokens"] for x in a][:2] == [3, 7]
    assert a[2]["stop_reason"] == "'\" '" and "stop_reason" not in a[3], a
    assert (a[6]["new_tokens"], a[6]["reply"], a[6]["stop_reason"]) == (1, "", ","), a[6]
    # without the record's penalty the reply is another (the seen ids exist for its slot)
    plain = generate("--raw", "--prompt", RAW_PROMPTS[3], "--max-new-tokens", 10)
    assert plain["text"] != a[3]["reply"]
    ctx = max(x["prompt_tokens"] + n for x, n in zip(a, news))
    assert f"KV cache of {ctx} tokens each" in err, err
    assert ctx < max(x["prompt_tokens"] for x in a) + max(news)  # the tighter bound
    # with the chat template: a messages record and an alpaca one carry settings too
    recs = [{"messages": [{"role": "user", "content": "Name three colors."}], "max_completion_tokens": 5,
             "stop": ":::"},
            {"instruction": "Name three colors.", "temperature": 0.7, "seed": 11, "max_tokens": 6}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    a, _ = prompts_run(path, "--max-new-tokens", 3)
    one = generate("--prompt", "Name three colors.", "--max-new-tokens", 5, "--stop", ":::")
    assert (a[0]["reply"], a[0]["new_tokens"], a[0]["stop"]) == (one["text"], len(one["ids"]), "stop_string")
    one = generate("--prompt", "Name three colors.", "--max-new-tokens", 6, "--temperature", 0.7, "--seed", 11)
    assert (a[1]["reply"], a[1]["new_tokens"], a[1]["seed"]) == (one["text"], len(one["ids"]), 11)


@pytest.mark.parametrize("rec,what", [
    ({"temperature": -1}, "'temperature' -1"), ({"temperature": "0.5"}, "'temperature' must be a number"),
    ({"top_p": 0}, "'top_p' 0"), ({"top_p": 1.5}, "'top_p' 1.5"), ({"top_k": -1}, "'top_k' -1"),
    ({"top_k": 2.5}, "'top_k' 2.5"), ({"min_p": 1.5}, "'min_p' 1.5"),
    ({"repetition_penalty": 0}, "'repetition_penalty' 0"), ({"max_new_tokens": 0}, "'max_new_tokens' 0"),
    ({"max_tokens": 1000001}, "'max_tokens' 1000001"), ({"max_tokens": 3, "max_new_tokens": 4}, "'max_new_tokens' 4 and 'max_tokens' 3"),
    ({"stop": ""}, "'stop': expected a non-empty"), ({"stop": ["a", 1]}, "'stop' item 2"),
    ({"stop": [f"s{i}" for i in range(17)]}, "'stop': 17 strings"), ({"seed": -3}, "'seed' -3"),
    ({"seed": 2 ** 53}, "'seed' 9007199254740992"), ({"seed": True}, "'seed' must be an integer"),
])
def test_prompts_bad_record_settings(tmp_path, rec, what):
    """A bad setting stops the run before anything is generated, naming the file, line and key."""
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps("ok") + "\n" + json.dumps({"prompt": "x", **rec}) + "\n")
    rc, out, err = run("generate", "--model", TINY, "--prompts", path, "--raw", "--max-new-tokens", 2)
    assert rc == 1 and out == "" and f"{path}: line 2: {what}" in err and "[1/" not in err, err


def test_prompts_output_fed_back(tmp_path):
    """A --prompts output file fed back as a prompts file: each line's "stop" ("length", ...)
    is why that reply ended, not a stop string, and its "seed" is the record's seed, so the
    same lines come out again."""
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in RAW_PROMPTS[:3]))
    a, _ = prompts_run(path, "--raw", "--max-new-tokens", 6, "--temperature", 0.9, "--seed", 7)
    assert all(x["stop"] == "length" for x in a), a
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps(x) + "\n" for x in a))
    # (test_generate.c test_gen_req_params checks that such a "stop" sets no stop string)
    b, _ = prompts_run(out, "--raw", "--max-new-tokens", 6, "--temperature", 0.9, "--seed", 1)
    drop = lambda xs: [{k: v for k, v in x.items() if k != "seconds"} for x in xs]
    assert drop(a) == drop(b)
