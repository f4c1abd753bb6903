"""`ftune generate` log-probabilities (--logprobs N, a record's "logprobs", an OpenAI batch
request's logprobs / top_logprobs) against numpy, and their JSON shapes.

Reference: `ftune logits` over prompt + reply (one forward over the whole sequence, no KV
cache), log_softmax in float64 over each row: row P-1+t holds the distribution that reply token
t was chosen from. ftune reports the raw distribution (vLLM's default logprobs_mode
"raw_logprobs": before penalties, temperature and top-k/top-p), so the values are the same
for a greedy and a sampled reply. Checked here:
  - each reply token's log-probability and its alternatives' equal the reference within
    TOL_LOGPROB (decode through the KV cache vs one forward: float32 rounding), the
    alternatives in descending order (the set equal to the reference's top k, but for near
    ties at the k-th place); with greedy decoding the reply token is the first alternative;
  - --batch 3 gives the values of --batch 1 within TOL_BATCH (the same tokens; the values
    differ as the forward's logits do: GEMMs round the rows of a batch differently);
  - the shapes: plain lines {"logprobs": [{"id", "token", "logprob", "top": [[id, lp]...]}]},
    chat choices' {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}],
    "refusal": null}, completions' {"tokens", "token_logprobs", "top_logprobs",
    "text_offset"}; one entry per reply token (completion_tokens minus the stop token);
    "bytes" decode to "token" (U+FFFD for a piece of a character), and all of them joined
    are the reply's text;
  - asking for log-probabilities changes no token (a seeded sampled reply included), and
    without them the lines carry none ("logprobs": null for the API shapes);
  - refusals: --logprobs 21 / -1 / without --json or with --chat (exit 2); in records
    top_logprobs 21, top_logprobs without logprobs: true, logprobs -1, completions logprobs
    true or 21 (exit 1, one "ftune: FILE: line N: ..." line).
Models: the tiny-llama fixture (SentencePiece-style tokenizer with byte fallback; always)
and the example SmolLM2-135M-Instruct Q4_1 GGUF (byte-level BPE, ChatML; skipped when it is
not in the cache, scripts/fetch_example.sh).
"""
import json
import subprocess

import numpy as np
import pytest

from cli_helpers import ROOT as REPO, TINY, ftune_bin
from gen_helpers import CACHED_EXAMPLE as EXAMPLE

PROMPT = "Once upon a time, in a quiet village by the sea,"
QUESTIONS = ["Name three colors.", "What is two plus two?", "Write a haiku about rain."]
# ftune's decode (float32, KV cache) against `ftune logits` of the whole sequence: test_generate_ref
# sees logit errors of about 2e-5 of max |logit| on SmolLM2; a log-probability adds the
# log-sum-exp's error of the same order
TOL_LOGPROB = 1e-4
# --batch 3 vs --batch 1: the log-probabilities are computed from each row alone, so they differ
# only as the forward's logits do (GEMMs over 3 rows vs 1 round differently in the last bits;
# log_softmax moves by at most twice the largest logit change). On the tiny fixture that
# stays within 1e-5; on SmolLM2-135M (30 layers, logits up to ~25) the logits themselves differ
# by up to ~2e-5 between batch sizes (measured: log-probabilities 5e-6 typical, 4e-5 largest),
# the prompts' prefill rows included
TOL_BATCH = {"tiny": 1e-5, "example": 1e-4}
K = 5


def ftune(*args, check=True):
    r = subprocess.run([ftune_bin(), *map(str, args)], cwd=REPO, capture_output=True, text=True,
                       encoding="utf-8", timeout=600)
    if check:
        assert r.returncode == 0, f"{args}\n{r.stderr}"
    return r


def generate(model, *args, check=True):
    return ftune("generate", "--model", model, "--threads", 2, *args, check=check)


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def lines(r):
    return [json.loads(s) for s in r.stdout.splitlines()]


def log_softmax_rows(tmp_path, model, ids):
    """float64 log_softmax of `ftune logits` over ids: (len(ids), V)."""
    out = tmp_path / "logits.f32"
    r = ftune("logits", "--model", model, "--threads", 2, "--ids", ",".join(map(str, ids)),
              "--out", out)
    j = json.loads(r.stdout)
    z = np.fromfile(out, dtype="<f4").reshape(j["n_tokens"], j["vocab"]).astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    return z - (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))


def check_against_reference(label, ref_rows, ids, lps, k, greedy):
    """lps: the plain "logprobs" list of reply ids; ref_rows[t]: the reference row of token t."""
    assert len(lps) == len(ids) and len(ref_rows) == len(ids)
    worst = 0.0
    for t, (e, want) in enumerate(zip(lps, ref_rows)):
        assert e["id"] == ids[t]
        assert set(e) == {"id", "token", "logprob", "top"}
        err = abs(e["logprob"] - want[ids[t]])
        worst = max(worst, err)
        assert err <= TOL_LOGPROB, (label, t, e["logprob"], want[ids[t]])
        top = e["top"]
        assert len(top) == k and all(isinstance(i, int) and isinstance(v, float) for i, v in top)
        vals = [v for _, v in top]
        assert vals == sorted(vals, reverse=True), (label, t, top)
        for i, v in top:
            worst = max(worst, abs(v - want[i]))
            assert abs(v - want[i]) <= TOL_LOGPROB, (label, t, i, v, want[i])
        # the reference's top k, ties to the lower id (a stable sort of -lp)
        order = np.argsort(-want, kind="stable")
        if k:
            kth, nxt = want[order[k - 1]], want[order[k]]
            if kth - nxt > 2 * TOL_LOGPROB:  # no near tie at the cut: the same set
                assert {i for i, _ in top} == set(order[:k].tolist()), (label, t, top, order[:k])
        if greedy and k:
            assert top[0][0] == ids[t] and top[0][1] == e["logprob"], (label, t, top)
    print(f"[{label}] {len(ids)} tokens, top {k}: largest |logprob - reference| {worst:.2e}")


# ---------------------------------------------------------------------------------------
# values against numpy

def test_tiny_greedy_and_sampled_match_logits(tmp_path):
    got = json.loads(generate(TINY, "--raw", "--prompt", PROMPT, "--max-new-tokens", 16,
                              "--json", "--logprobs", K).stdout)
    P, ids = got["prompt_ids"], got["ids"]
    ref = log_softmax_rows(tmp_path, TINY, P + ids)[len(P) - 1:len(P) - 1 + len(ids)]
    check_against_reference("tiny greedy", ref, ids, got["logprobs"], K, greedy=True)
    # sampled with penalties: the values are still those of the raw logits, and asking for
    # them changes no token
    args = ["--raw", "--prompt", PROMPT, "--max-new-tokens", 12, "--temperature", 0.8,
            "--top-k", 40, "--repetition-penalty", 1.3, "--presence-penalty", 0.5, "--seed", 11,
            "--json"]
    s = json.loads(generate(TINY, *args, "--logprobs", 20).stdout)
    plain = json.loads(generate(TINY, *args).stdout)
    assert s["ids"] == plain["ids"] and s["text"] == plain["text"] and "logprobs" not in plain
    ids = s["ids"]
    ref = log_softmax_rows(tmp_path, TINY, P + ids)[len(P) - 1:len(P) - 1 + len(ids)]
    check_against_reference("tiny sampled", ref, ids, s["logprobs"], 20, greedy=False)
    # --logprobs 0: the token's own value, no alternatives
    z = json.loads(generate(TINY, "--raw", "--prompt", PROMPT, "--max-new-tokens", 4, "--json",
                            "--logprobs", 0).stdout)
    assert [e["top"] for e in z["logprobs"]] == [[]] * len(z["ids"])
    assert [e["logprob"] for e in z["logprobs"]] == [e["logprob"] for e in got["logprobs"][:len(z["ids"])]]


def test_example_greedy_matches_logits(tmp_path):
    if not EXAMPLE.is_file():
        pytest.skip(f"example model not in the cache ({EXAMPLE}; scripts/fetch_example.sh)")
    got = json.loads(generate(EXAMPLE, "--prompt", "Describe the city of Paris in a few sentences.",
                              "--max-new-tokens", 24, "--json", "--logprobs", K).stdout)
    P, ids = got["prompt_ids"], got["ids"]
    ref = log_softmax_rows(tmp_path, EXAMPLE, P + ids)[len(P) - 1:len(P) - 1 + len(ids)]
    check_against_reference("SmolLM2 greedy", ref, ids, got["logprobs"], K, greedy=True)
    # byte-level BPE: each token's bytes are its piece of the text
    joined = b"".join(bytes(e["token"], "utf-8") for e in got["logprobs"])
    assert joined.decode("utf-8", "replace") == got["text"]


@pytest.mark.parametrize("model", ["tiny", "example"])
def test_batch_equals_single(tmp_path, model):
    m = TINY if model == "tiny" else EXAMPLE
    if model == "example" and not EXAMPLE.is_file():
        pytest.skip(f"example model not in the cache ({EXAMPLE})")
    recs = [{"prompt": q, "max_tokens": 10, "logprobs": 3} for q in QUESTIONS]
    recs.append({"prompt": QUESTIONS[0], "max_tokens": 6})  # the --logprobs default
    recs.append({"prompt": QUESTIONS[1], "max_tokens": 6, "logprobs": False})
    f = write_jsonl(tmp_path / "p.jsonl", recs)
    one = lines(generate(m, "--prompts", f, "--batch", 1, "--logprobs", 2))
    three = lines(generate(m, "--prompts", f, "--batch", 3, "--logprobs", 2))
    worst = 0.0
    for a, b, rec in zip(one, three, recs):
        assert a["reply"] == b["reply"] and a["new_tokens"] == b["new_tokens"]
        if rec.get("logprobs") is False:
            assert "logprobs" not in a and "logprobs" not in b
            continue
        k = rec.get("logprobs", 2)
        assert len(a["logprobs"]) == a["new_tokens"] == len(b["logprobs"])
        for x, y in zip(a["logprobs"], b["logprobs"]):
            assert x["id"] == y["id"] and x["token"] == y["token"] and len(x["top"]) == k
            assert [i for i, _ in x["top"]] == [i for i, _ in y["top"]]
            d = max([abs(x["logprob"] - y["logprob"])] +
                    [abs(u - v) for (_, u), (_, v) in zip(x["top"], y["top"])])
            worst = max(worst, d)
            assert d <= TOL_BATCH[model], (x, y)
    print(f"[{model}] --batch 3 vs --batch 1: largest |difference| {worst:.2e} "
          f"(tolerance {TOL_BATCH[model]:.0e})")


# ---------------------------------------------------------------------------------------
# the OpenAI shapes

def chat_req(cid, content, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": content}], **body}}


def completion_req(cid, prompt, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"model": "m", "prompt": prompt, **body}}


def generated(choice, usage):
    """Reply tokens: completion_tokens less the stop token (no stop strings here)."""
    return usage["completion_tokens"] - (choice["finish_reason"] == "stop")


def check_token_bytes(token, raw):
    assert isinstance(token, str) and all(isinstance(b, int) and 0 <= b < 256 for b in raw)
    assert bytes(raw).decode("utf-8", "replace") == token
    if all(b < 128 for b in raw):
        assert bytes(raw).decode("ascii") == token


def check_chat(c, u, k, text, spm):
    lp = c["logprobs"]
    assert set(lp) == {"content", "refusal"} and lp["refusal"] is None
    n = generated(c, u)
    assert len(lp["content"]) == n
    for e in lp["content"]:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
        assert isinstance(e["logprob"], float) and e["logprob"] <= 0
        check_token_bytes(e["token"], e["bytes"])
        assert len(e["top_logprobs"]) == k
        vals = [a["logprob"] for a in e["top_logprobs"]]
        assert vals == sorted(vals, reverse=True)
        for a in e["top_logprobs"]:
            assert set(a) == {"token", "logprob", "bytes"}
            check_token_bytes(a["token"], a["bytes"])
        if k:  # greedy: the token is the most likely one
            assert e["top_logprobs"][0]["bytes"] == e["bytes"]
            assert e["top_logprobs"][0]["logprob"] == e["logprob"]
    joined = b"".join(bytes(e["bytes"]) for e in lp["content"]).decode("utf-8", "replace")
    # a SentencePiece tokenizer's Strip decoder drops the text's first space
    assert joined == text or (spm and joined == " " + text), (joined, text)


def check_completions(c, u, k, text, spm):
    lp = c["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    n = generated(c, u)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
    assert len(lp["text_offset"]) == n
    off = 0
    for tok, v, top, o in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                              lp["text_offset"]):
        assert isinstance(tok, str) and isinstance(v, float) and o == off
        off += len(tok)
        # the token itself, then the alternatives other than it: up to k + 1 entries
        assert isinstance(top, dict) and 1 <= len(top) <= k + 1
        assert next(iter(top)) == tok and top[tok] == v
        if k:  # greedy: the token is one of the k most likely
            assert len(top) == k
    joined = "".join(lp["tokens"])
    assert joined == text or (spm and joined == " " + text), (joined, text)


@pytest.mark.parametrize("model", ["tiny", "example"])
def test_openai_shapes(tmp_path, model):
    m = TINY if model == "tiny" else EXAMPLE
    if model == "example" and not EXAMPLE.is_file():
        pytest.skip(f"example model not in the cache ({EXAMPLE})")
    reqs = [chat_req("c5", QUESTIONS[0], max_tokens=12, logprobs=True, top_logprobs=5),
            chat_req("c0", QUESTIONS[1], max_tokens=8, logprobs=True),
            chat_req("cn", QUESTIONS[2], max_tokens=6),
            # SmolLM2 answers in pieces of characters: "bytes" joined rebuild the text
            chat_req("cj", "Write the Japanese word for Japan (\u65e5\u672c) three times, in "
                     "Japanese script only.", max_tokens=16, logprobs=True, top_logprobs=1),
            completion_req("p3", PROMPT, max_tokens=10, logprobs=3),
            completion_req("p0", PROMPT, max_tokens=5, logprobs=0),
            completion_req("pn", PROMPT, max_tokens=5, logprobs=None)]
    f = write_jsonl(tmp_path / "b.jsonl", reqs)
    out = lines(generate(m, "--prompts", f, "--batch", 3))
    plain = lines(generate(m, "--prompts", f, "--batch", 3, "--logprobs", 0))
    spm = model == "tiny"
    for x, y, req in zip(out, plain, reqs):
        b = x["response"]["body"]
        c, u = b["choices"][0], b["usage"]
        chat = b["object"] == "chat.completion"
        text = c["message"]["content"] if chat else c["text"]
        body = req["body"]
        yc = y["response"]["body"]["choices"][0]
        assert (yc["message"]["content"] if chat else yc["text"]) == text
        if body.get("logprobs") is None or body.get("logprobs") is False:  # (0 == False)
            assert c["logprobs"] is None, req["custom_id"]
            # the flag is the default of a request that leaves logprobs out
            (check_chat if chat else check_completions)(yc, u, 0, text, spm)
            continue
        assert set(c) == {"index", "message" if chat else "text", "logprobs", "finish_reason",
                          "stop_reason"}
        if chat:
            check_chat(c, u, body.get("top_logprobs", 0), text, spm)
        else:
            check_completions(c, u, body["logprobs"], text, spm)
    print(json.dumps(out[0]["response"]["body"]["choices"][0]["logprobs"]["content"][0]))


# ---------------------------------------------------------------------------------------
# refusals

@pytest.mark.parametrize("args,needle", [
    (["--logprobs", 21, "--json"], "--logprobs 21: expected 0..20"),
    (["--logprobs", -1, "--json"], "--logprobs -1: expected 0..20"),
    (["--logprobs", 2], "--logprobs goes with --json"),
])
def test_flag_refusals(args, needle):
    r = generate(TINY, "--prompt", "x", *args, check=False)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.startswith("ftune: ") and needle in r.stderr and len(r.stderr.splitlines()) == 1
    r = generate(TINY, "--chat", "--logprobs", 1, check=False)
    assert r.returncode == 2 and "does not go with --logprobs" in r.stderr, r.stderr


@pytest.mark.parametrize("rec,needle", [
    (chat_req("a", "x", logprobs=True, top_logprobs=21), "'top_logprobs' 21: expected an integer 0..20"),
    (chat_req("a", "x", top_logprobs=2), "'top_logprobs' needs 'logprobs': true"),
    (chat_req("a", "x", logprobs=False, top_logprobs=0), "'top_logprobs' needs 'logprobs': true"),
    (chat_req("a", "x", logprobs=3), "'logprobs' must be true or false"),
    (completion_req("a", "x", logprobs=True), "'logprobs' must be an integer, found a boolean"),
    (completion_req("a", "x", logprobs=21), "'logprobs' 21: expected an integer 0..20"),
    ({"prompt": "x", "logprobs": -1}, "'logprobs' -1: expected an integer 0..20"),
    ({"prompt": "x", "logprobs": 2.5}, "'logprobs' 2.5: expected an integer 0..20"),
])
def test_record_refusals(tmp_path, rec, needle):
    f = write_jsonl(tmp_path / "bad.jsonl", [rec])
    r = generate(TINY, "--prompts", f, check=False)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    err = r.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith(f"ftune: {f}: line 1: ") and needle in err[0], err
