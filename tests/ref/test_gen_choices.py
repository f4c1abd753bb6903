"""`ftune generate --prompts` with several choices per OpenAI batch request ("n"), stop token
ids ("stop_token_ids", --stop-token-ids) and "min_tokens", as vLLM's SamplingParams has them.

Formats: cli/gen_batch.c's header (the output line), ft_gen_req_parse in src/infer/generate.h
(the settings). Checked here:
  - n = 3 with temperature 0: three identical choices, "index" 0..2, each the n = 1 reply;
    usage counts the prompt once and sums the choices' completion tokens (vLLM's serving_chat /
    serving_completion);
  - n = 3 with temperature 1 and a seed: choice 0 is the n = 1 reply with that seed, choice c
    the n = 1 reply with seed gen_choice_seed(seed, c) (the documented derivation, computed
    here); the file is the same when run twice and with --batch 4 as with --batch 1 (but for
    "created"); each choice carries its own log-probabilities; other requests keep their
    replies and the input order;
  - chat and completions shapes of the choices;
  - stop_token_ids: the id of the token the greedy reply produces at position j (the first
    not seen before it) ends the reply there: its text is that of the first j tokens (the stop
    token's text left out, as vLLM's detokenizer leaves it out), finish_reason "stop",
    stop_reason the id, completion_tokens j + 1; the plain record's key and --stop-token-ids
    give the same reply; a record's [] replaces the flag;
  - min_tokens: the stop tokens cannot end the reply before it (a greedy loop over `ftune
    logits` with their logits masked is the reference) and stop strings are not searched in
    the text of the first min_tokens tokens;
  - refusals: an id outside the vocabulary (record and flag), min_tokens above max_tokens,
    --stop-token-ids without --prompts, n / stop_token_ids / min_tokens of the wrong type.
Models: the tiny-llama fixture (random weights, completions requests: raw text), and the
example SmolLM2-135M-Instruct Q4_1 GGUF with chat requests (skipped when it is not cached).
"""
import json
import re

import numpy as np
import pytest

from cli_helpers import TINY, assert_clean_error, run_ftune
from gen_helpers import example_or_skip, generate as ftune, mix64, record_seed, write_jsonl

PROMPT = "Once upon a time, in a quiet village by the sea,"
RAW = ["Once upon a time", "The capital of France is", "Hello world"]
QUESTION = "Write one sentence about the sea."


def chat_req(cid, content, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": content}], **body}}


def completion_req(cid, prompt, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"prompt": prompt, **body}}


def run_lines(tmp_path, recs, *flags, model=TINY, name="b.jsonl"):
    r = ftune("--prompts", write_jsonl(tmp_path / name, recs), *flags, model=model)
    return [json.loads(s) for s in r.stdout.splitlines()]


def body(x):
    return x["response"]["body"]


def text(c):
    return c["message"]["content"] if "message" in c else c["text"]


def drop_created(xs):
    xs = json.loads(json.dumps(xs))
    for x in xs:
        del x["response"]["body"]["created"]
    return xs


# log-probabilities of one reply computed with other sequences in the forward vs alone (the
# choices of a request are prefilled together; --batch 4 vs --batch 1): the GEMMs round the rows
# of a batch differently in the last bits; on the tiny fixture within 1e-5 (test_logprobs.py
# TOL_BATCH, measured there)
TOL_BATCH = 1e-5


def assert_close(a, b, tol=TOL_BATCH, at="$"):
    """a == b as JSON values, but floats (log-probabilities) within tol."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), (at, a.keys(), b.keys())
        for k in a:
            assert_close(a[k], b[k], tol, f"{at}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), (at, a, b)
        for i, (u, v) in enumerate(zip(a, b)):
            assert_close(u, v, tol, f"{at}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert abs(a - b) <= tol, (at, a, b)
    else:
        assert a == b, (at, a, b)


def no_index(c):
    return {k: v for k, v in c.items() if k != "index"}


def check_choices(x, req, n):
    """The choices of output line x for request req: n of them, index 0..n-1, the endpoint's
    keys; usage's total is its sum. Returns the choices."""
    b = body(x)
    chat = req["url"] == "/v1/chat/completions"
    assert x["custom_id"] == req["custom_id"] and x["error"] is None
    assert b["object"] == ("chat.completion" if chat else "text_completion")
    cs = b["choices"]
    assert [c["index"] for c in cs] == list(range(n))
    keys = {"index", "message" if chat else "text", "logprobs", "finish_reason", "stop_reason"}
    for c in cs:
        assert set(c) == keys, c
        assert c["finish_reason"] in ("stop", "length")
        if chat:
            assert c["message"]["role"] == "assistant"
    u = b["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    return cs


def choice_seed(seed, c):
    """gen_choice_seed (cli/gen_choices.h): seed for choice 0, else record_seed(h(seed), c),
    h splitmix64's finalizer of seed ^ 0x63686f696365 kept to 53 bits."""
    if c == 0:
        return seed
    return record_seed(mix64(seed ^ 0x63686f696365) & ((1 << 53) - 1), c)


def completion_tokens(c):
    """A choice's completion tokens from its log-probabilities: its reply tokens, plus the stop
    token when one ended it (not a stop string)."""
    n = len(c["logprobs"]["content"] if "content" in c["logprobs"] else c["logprobs"]["tokens"])
    return n + (c["finish_reason"] == "stop" and not isinstance(c["stop_reason"], str))


# ---------------------------------------------------------------------------------------
# n choices


@pytest.mark.parametrize("which", ["tiny", "example"])
def test_greedy_choices_are_the_one_reply(tmp_path, which):
    model = TINY if which == "tiny" else example_or_skip()
    req = (completion_req("g", PROMPT, max_tokens=10) if which == "tiny"
           else chat_req("g", QUESTION, max_tokens=16))
    one = run_lines(tmp_path, [req], model=model, name="one.jsonl")[0]
    r3 = json.loads(json.dumps(req))
    r3["body"]["n"] = 3
    got = run_lines(tmp_path, [r3], model=model, name="three.jsonl")[0]
    c1 = check_choices(one, req, 1)[0]
    cs = check_choices(got, r3, 3)
    for c in cs:
        assert no_index(c) == no_index(c1)
    u1, u3 = body(one)["usage"], body(got)["usage"]
    assert u3["prompt_tokens"] == u1["prompt_tokens"]
    assert u3["completion_tokens"] == 3 * u1["completion_tokens"]
    # n = 1 written out is today's line: the same as leaving n out
    r1 = json.loads(json.dumps(req))
    r1["body"]["n"] = 1
    assert drop_created(run_lines(tmp_path, [r1], model=model, name="n1.jsonl")) == drop_created([one])
    print(f"\n[{which}] {c1['finish_reason']} {c1['stop_reason']} {u3} {text(c1)!r}")


def test_sampled_choices(tmp_path):
    seed = 7
    reqs = [completion_req("a", RAW[0], max_tokens=6),
            completion_req("s", PROMPT, n=3, max_tokens=8, temperature=1.0, seed=seed, logprobs=2),
            completion_req("b", RAW[1], max_tokens=5, n=2),
            completion_req("c", RAW[2], max_tokens=4)]
    got = run_lines(tmp_path, reqs, "--batch", 4)
    assert [x["custom_id"] for x in got] == ["a", "s", "b", "c"]
    cs = check_choices(got[1], reqs[1], 3)
    assert len({text(c) for c in cs}) > 1, "three samples at temperature 1 all alike"
    # choice c is the one-choice reply with seed gen_choice_seed(seed, c): choice 0 with the
    # seed itself
    singles = [completion_req("s", PROMPT, max_tokens=8, temperature=1.0,
                              seed=choice_seed(seed, c), logprobs=2) for c in range(3)]
    for c, req in enumerate(singles):
        one = run_lines(tmp_path, [req], name=f"s{c}.jsonl")[0]
        c1 = check_choices(one, req, 1)[0]
        assert_close(no_index(cs[c]), no_index(c1))
        assert completion_tokens(cs[c]) == body(one)["usage"]["completion_tokens"]
    u = body(got[1])["usage"]
    assert u["completion_tokens"] == sum(completion_tokens(c) for c in cs)
    # the other requests keep their replies (alone, one choice each)
    for x, req in zip(got[::2], reqs[::2]):
        alone = run_lines(tmp_path, [req], name="alone.jsonl")
        assert drop_created([x]) == drop_created(alone)
    b_cs = check_choices(got[2], reqs[2], 2)
    assert text(b_cs[0]) == text(b_cs[1])  # greedy (the flags' temperature 0)
    # twice, and with --batch 1: the same file but for "created"
    assert drop_created(run_lines(tmp_path, reqs, "--batch", 4)) == drop_created(got)
    assert_close(drop_created(run_lines(tmp_path, reqs, "--batch", 1)), drop_created(got))
    print("\n" + "\n".join(f"{c['index']} {c['finish_reason']} {text(c)!r}" for c in cs))
    # with --batch 4 the three choices of "s" start together: one prefill, its cache copied to
    # the other two (ft_gen_copy_slot), which the comparisons above hold to the single replies
    r = ftune("--prompts", write_jsonl(tmp_path / "k.jsonl", reqs), "--batch", 4)
    m = re.search(r"(\d+) choices' caches copied", r.stderr)
    assert m and int(m.group(1)) >= 2, r.stderr


def test_choices_of_equal_requests_differ(tmp_path):
    """Two requests with the same body and no seed of their own (their seeds derived from
    --seed and their index): their choices are not each other's (they were, swapped, when
    choice c's seed was derived as record c's is)."""
    req = completion_req("r0", PROMPT, n=2, max_tokens=8, temperature=1.0)
    got = run_lines(tmp_path, [req, {**req, "custom_id": "r1"}], "--seed", 7, "--batch", 4)
    a = [text(c) for c in body(got[0])["choices"]]
    b = [text(c) for c in body(got[1])["choices"]]
    assert len(set(a + b)) == 4, (a, b)


def test_chat_choices_shape(tmp_path):
    req = chat_req("c", "Hello", n=2, max_tokens=5, temperature=0.8, seed=3, logprobs=True,
                   top_logprobs=1)
    x = run_lines(tmp_path, [req], "--batch", 2)[0]
    cs = check_choices(x, req, 2)
    for c in cs:  # each choice its own entries: its tokens' text is its reply's
        content = c["logprobs"]["content"]
        assert "".join(e["token"] for e in content).strip() == text(c).strip()
        assert all(len(e["top_logprobs"]) == 1 for e in content)
    assert text(cs[0]) != text(cs[1])
    assert body(x)["usage"]["completion_tokens"] == sum(completion_tokens(c) for c in cs)


# ---------------------------------------------------------------------------------------
# stop token ids


def greedy_ids(tmp_path, prompt, n, model=TINY, raw=True):
    """(reply, ids) of the greedy reply to prompt (a plain record, --raw or with the template)."""
    rec = {"prompt": prompt, "max_new_tokens": n, "logprobs": 0}
    r = ftune("--prompts", write_jsonl(tmp_path / "g.jsonl", [rec]), *(["--raw"] if raw else []),
              model=model)
    x = json.loads(r.stdout)
    return x["reply"], [e["id"] for e in x["logprobs"]]


def first_new(ids):
    """The first position j >= 1 whose token is not among ids[:j]."""
    for j in range(1, len(ids)):
        if ids[j] not in ids[:j]:
            return j
    pytest.skip(f"the greedy reply repeats one token: {ids}")


@pytest.mark.parametrize("which", ["tiny", "example"])
def test_stop_token_ids(tmp_path, which):
    model = TINY if which == "tiny" else example_or_skip()
    raw = which == "tiny"
    prompt = PROMPT if raw else QUESTION
    n_new = 16
    full, ids = greedy_ids(tmp_path, prompt, n_new, model, raw)
    j = first_new(ids)
    stop = ids[j]
    prefix = run_lines(tmp_path, [{"prompt": prompt, "max_new_tokens": j}], *(["--raw"] if raw else []),
                       model=model, name="prefix.jsonl")[0]["reply"]
    print(f"\n[{which}] greedy {ids} {full!r}\n  stop id {stop} at {j}: {prefix!r}")
    mk = completion_req if raw else chat_req
    req = mk("s", prompt, max_tokens=n_new, stop_token_ids=[stop])
    x = run_lines(tmp_path, [req], model=model)[0]
    c = check_choices(x, req, 1)[0]
    assert text(c) == prefix
    assert c["finish_reason"] == "stop" and c["stop_reason"] == stop
    assert body(x)["usage"]["completion_tokens"] == j + 1
    # the plain record's key and --stop-token-ids: the same reply, "stop_reason" the id
    flags = ["--raw"] if raw else []
    rec = {"prompt": prompt, "max_new_tokens": n_new}
    p = run_lines(tmp_path, [{**rec, "stop_token_ids": [stop]}], *flags, model=model, name="p.jsonl")[0]
    f = run_lines(tmp_path, [rec], *flags, "--stop-token-ids", f"{stop + 1},{stop}", model=model,
                  name="f.jsonl")[0]
    for y in (p, f):
        assert y["reply"] == prefix and y["new_tokens"] == j
        assert y["stop"] == "stop_token" and y["stop_reason"] == stop
    # a record's own list ([]: none) replaces the flag's; the batch request likewise
    none = run_lines(tmp_path, [{**rec, "stop_token_ids": []}], *flags, "--stop-token-ids", stop,
                     model=model, name="n.jsonl")[0]
    assert none["reply"] == full and "stop_reason" not in none
    y = run_lines(tmp_path, [mk("t", prompt, max_tokens=n_new)], "--stop-token-ids", stop,
                  model=model, name="t.jsonl")[0]
    assert text(body(y)["choices"][0]) == prefix
    # one --prompt (--json, and streamed) with --stop-token-ids: the same reply
    one = json.loads(ftune(*flags, "--prompt", prompt, "--max-new-tokens", n_new, "--json",
                           "--stop-token-ids", stop, model=model).stdout)
    assert one["ids"] == ids[:j] and one["text"] == prefix
    assert one["stop"] == "stop_token" and one["stop_reason"] == stop
    streamed = ftune(*flags, "--prompt", prompt, "--max-new-tokens", n_new, "--stop-token-ids", stop,
                     model=model)
    assert streamed.stdout.rstrip("\n") == prefix.rstrip("\n")
    assert "stop: end token" in streamed.stderr, streamed.stderr
    # several choices stop alike
    req3 = mk("s", prompt, max_tokens=n_new, stop_token_ids=[stop], n=3)
    cs = check_choices(run_lines(tmp_path, [req3], model=model, name="s3.jsonl")[0], req3, 3)
    assert all(text(k) == prefix and k["stop_reason"] == stop for k in cs)


def end_ids(which, model):
    """The ids that end a reply besides stop_token_ids: the tiny fixture's config eos_token_id;
    SmolLM2's <|endoftext|> (its EOS) and <|im_end|> (ChatML's end of turn)."""
    if which == "tiny":
        e = json.loads((TINY / "config.json").read_text())["eos_token_id"]
        return e if isinstance(e, list) else [e]
    from tok_helpers import gguf_hf_tokenizer
    tok = gguf_hf_tokenizer(str(model))
    return [tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")]


@pytest.mark.parametrize("which", ["tiny", "example"])
def test_min_tokens_masks_stop_tokens(tmp_path, which):
    """min_tokens: below it the stop tokens (EOS, end of turn, stop_token_ids) are masked;
    against a greedy loop over `ftune logits` that masks their logits at those steps. Tiny: the
    stop id is the greedy reply's first token; example: its first "," with min_tokens one past
    it, so that the reply goes on and (as measured) ends at a later ","."""
    model = TINY if which == "tiny" else example_or_skip()
    raw = which == "tiny"
    prompt = PROMPT if raw else QUESTION
    flags = ["--raw"] if raw else []
    n_new = 12 if raw else 24
    reply, ids = greedy_ids(tmp_path, prompt, n_new, model, raw)
    if raw:
        stop, m = ids[0], 3
    else:
        rec = {"prompt": prompt, "max_new_tokens": n_new, "logprobs": 0}
        toks = [e["token"] for e in run_lines(tmp_path, [rec], model=model, name="t.jsonl")[0]["logprobs"]]
        if "," not in toks:
            pytest.skip(f"no ',' token in the greedy reply {reply!r}")
        stop, m = ids[toks.index(",")], toks.index(",") + 1
    ends = end_ids(which, model)
    rec = {"prompt": prompt, "max_new_tokens": n_new, "stop_token_ids": [stop], "logprobs": 0}
    got = run_lines(tmp_path, [{**rec, "min_tokens": m}], *flags, model=model, name="m.jsonl")[0]
    prompt_ids = json.loads(ftune(*flags, "--prompt", prompt, "--max-new-tokens", 1, "--json",
                                  model=model).stdout)["prompt_ids"]
    # teacher-forced check in one `ftune logits` call over prompt + reply (+ the stop token):
    # each reply token is the argmax of its row with the stop tokens masked below min_tokens,
    # and the last row, after the reply, picks a stop token (or the reply is n_new long)
    ref = [e["id"] for e in got["logprobs"]]
    seq = list(prompt_ids) + ref
    out = tmp_path / "all.f32"
    r = run_ftune(["logits", "--model", model, "--ids", ",".join(map(str, seq)), "--out", out])
    assert r.returncode == 0, r.stderr
    rows = np.fromfile(out, dtype="<f4").reshape(len(seq), -1)
    stopped = None
    for t in range(len(ref) + 1):
        if t == n_new:
            break
        z = rows[len(prompt_ids) - 1 + t].astype(np.float32).copy()
        if t < m:
            z[[stop, *ends]] = -np.inf
        k = int(np.argmax(z))
        if t == len(ref):
            assert k == stop or k in ends, (t, k)
            stopped = k
        else:
            assert k == ref[t] and k != stop and k not in ends, (t, k, ref[t])
    print(f"\n[{which}] min_tokens {m}, stop id {stop}: reply {ref} (stopped on {stopped}), "
          f"{got['reply']!r}")
    assert len(ref) >= m and got["new_tokens"] == len(ref)
    assert got["stop"] == ("length" if stopped is None else "stop_token")
    if stopped == stop:
        assert got["stop_reason"] == stop
    # without min_tokens the stop id ends the reply at its first place
    plain = run_lines(tmp_path, [rec], *flags, model=model, name="z.jsonl")[0]
    assert plain["new_tokens"] == ids.index(stop) < m and plain["stop_reason"] == stop
    # the log-probabilities are those of the unmasked logits (vLLM's raw_logprobs): at the
    # first masked step, against numpy's log_softmax of `ftune logits` (the row of the
    # teacher-forced call above that follows prompt + ref[:j])
    j = m - 1
    z = rows[len(prompt_ids) - 1 + j].astype(np.float64)
    lsm = z - z.max() - np.log(np.exp(z - z.max()).sum())
    assert abs(got["logprobs"][j]["logprob"] - lsm[ref[j]]) < 1e-4
    # the batch request's min_tokens: the same reply
    mk = completion_req if raw else chat_req
    x = run_lines(tmp_path, [mk("m", prompt, max_tokens=n_new, stop_token_ids=[stop], min_tokens=m)],
                  model=model)[0]
    assert text(body(x)["choices"][0]) == got["reply"]


def test_min_tokens_and_stop_strings(tmp_path):
    """Stop strings are not searched in the text of the first min_tokens tokens (vLLM moves the
    detokenizer's stop_check_offset past it): the greedy reply ",,,,..." with stop "," and
    min_tokens 3 ends at the fourth comma, its text the first three."""
    reply, ids = greedy_ids(tmp_path, PROMPT, 8)
    first = reply[0]
    assert reply.startswith(first * 4), reply
    rec = {"prompt": PROMPT, "max_new_tokens": 8, "stop": first}
    a = run_lines(tmp_path, [rec], "--raw", name="a.jsonl")[0]
    b = run_lines(tmp_path, [{**rec, "min_tokens": 3}], "--raw", name="b.jsonl")[0]
    assert a["reply"] == "" and a["stop"] == "stop_string"
    assert b["reply"] == first * 3 and b["stop"] == "stop_string" and b["new_tokens"] == 4


# ---------------------------------------------------------------------------------------
# refusals


@pytest.mark.parametrize("name,recs,needles", [
    ("id beyond the vocabulary", [completion_req("a", "x"), completion_req("b", "y", stop_token_ids=[5, 32000])],
     ["line 2", "body: 'stop_token_ids' item 2: 32000 is no token id of the model", "ids 0..31999"]),
    ("plain record id", [{"prompt": "x", "stop_token_ids": [40000]}],
     ["line 1", "'stop_token_ids' item 1: 40000 is no token id"]),
    ("min_tokens above max_tokens", [completion_req("a", "x", max_tokens=4, min_tokens=5)],
     ["line 1", "'min_tokens' 5 is more than the reply's max new tokens (4)"]),
    ("n 17", [completion_req("a", "x", n=17)], ["line 1", "body: 'n' 17: expected an integer 1..16"]),
    ("n 0", [chat_req("a", "x", n=0)], ["line 1", "body: 'n' 0"]),
    ("n 1.5", [chat_req("a", "x", n=1.5)], ["line 1", "body: 'n' 1.5"]),
    ("stop_token_ids string", [chat_req("a", "x", stop_token_ids="x")],
     ["line 1", "'stop_token_ids' must be a list of token ids"]),
    ("stop_token_ids negative", [chat_req("a", "x", stop_token_ids=[-1])],
     ["line 1", "'stop_token_ids' item 1: -1 is no token id"]),
    ("stop_token_ids 1e12", [chat_req("a", "x", stop_token_ids=[1e12])],
     ["line 1", "'stop_token_ids' item 1: 1000000000000 is no token id"]),
])
def test_refusals(tmp_path, name, recs, needles):
    f = write_jsonl(tmp_path / "bad.jsonl", recs)
    r = ftune("--prompts", f, check=False)
    assert r.stdout == ""
    line = assert_clean_error(r, None, f"{f}: ", *needles)
    print(f"[{name}] {line}")


def test_flag_refusals(tmp_path):
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}])
    r = ftune("--prompts", f, "--stop-token-ids", "3,32000", check=False)
    assert_clean_error(r, None, "--stop-token-ids: item 2: 32000 is no token id of the model")
    for bad in ("3,", "a", "-1", "1,,2", "2147483648"):
        r = ftune("--prompts", f, "--stop-token-ids", bad, check=False)
        assert r.returncode == 2 and "--stop-token-ids" in r.stderr, (bad, r.stderr)
    # --prompt checks the ids against the vocabulary too (after the model is loaded)
    r = ftune("--prompt", "x", "--stop-token-ids", "32000", check=False)
    assert_clean_error(r, None, "--stop-token-ids: item 1: 32000 is no token id of the model")
