"""`ftune generate --prompts` prompt log-probabilities (vLLM's prompt_logprobs; OpenAI's legacy
completions echo with logprobs and max_tokens 0, as lm-evaluation-harness scores loglikelihood
tasks) against numpy, and their JSON shapes.

Reference: `ftune logits --ids <prompt ids>` (one teacher-forced forward over the whole
prompt, no KV cache), log_softmax in float64 over each row: row q-1 holds the distribution of
prompt token q. The prompt is the one ftune feeds the model (the chat template applied, BOS
included): its ids come from `generate --prompt S --json` ("prompt_ids"), which a record
{"prompt": S} renders the same way. Checked here:
  - every prompt token's log-probability and its k alternatives' within TOL_LOGPROB of the
    reference (generate prefills in forwards of up to 256 rows, the later ones through the KV
    cache: float32 rounding), the alternatives those of numpy's stable argsort (ties within the
    tolerance aside), vLLM's ranks (the token's: the count of logits >= its own; the
    alternatives': 1..k), the token first in each dict, k entries when it is one of the
    alternatives, else k + 1; null for the first token;
  - a prompt longer than the 256-row forward (several forwards, the cache between them) gives
    the reference's numbers too;
  - a completions request with "echo": true, "logprobs": k, "max_tokens": 0 answers the prompt
    text itself, finish_reason "length", no completion tokens, and its logprobs cover the prompt
    tokens (token_logprobs[0] and top_logprobs[0] null) with the same numbers; with max_tokens 4
    the text is the prompt followed by the reply of the same request without echo, and the
    logprobs the prompt's then that reply's (text_offset running on);
  - --batch 4 gives the values of --batch 1 exactly (a record with prompt log-probabilities is
    prefilled alone, in the same forwards); the choices of an "n": 2 request carry the same
    prompt_logprobs, those of the same request with n 1; chat carries them once, at the top of
    the body, and chat's "echo": true asks for them with 0 alternatives (vLLM's top_logprobs
    default), its text unchanged;
  - --prompt-logprobs K as the default for records that do not set "prompt_logprobs" (false:
    none); refusals of the flag (exit 2) and of bad values in records (exit 1, the line named).
  - on --device cpu-device (the executor's weights, bf16 GEMM inputs) the values of
    `ftune logits --device cpu-device` for a prompt of one forward.
Also OpenAI's and vLLM's "logit_bias" and vLLM's "ignore_eos" (records and bodies): a bias of
+100 makes the greedy reply that token, -100 keeps the greedy token out (the runner-up of the
raw row instead), the reported log-probabilities stay the raw ones; with ignore_eos an EOS
forced by logit_bias no longer ends the reply (finish "length"), a stop_token_ids entry still
does; bad values refused.
Models: the tiny-llama fixture (always) and the example SmolLM2-135M-Instruct Q4_1 GGUF
(gen_helpers.example_or_skip: skipped when it cannot be had).
"""
import json

import numpy as np
import pytest

from cli_helpers import TINY, run_ftune
from gen_helpers import example_or_skip, generate, write_jsonl

# generate's prefill (float32, forwards of up to 256 rows through the KV cache) against one
# teacher-forced forward: test_logprobs.py measures logit errors of about 2e-5 of max |logit| on
# SmolLM2 for cached decoding; a log-probability adds the log-sum-exp's error of the same order
TOL_LOGPROB = 1e-4
# the same logits row from forwards over other row counts (GEMMs round the rows differently):
# test_logprobs.py's TOL_BATCH for the example model (the tiny one stays within 1e-5)
TOL_ROWS = 1e-4
# rows of logits per prompt forward (cli/gen_env.h GEN_PLP_ROWS)
PLP_ROWS = 256
K = 3
PROMPT = "Once upon a time, in a quiet village by the sea,"
QUESTIONS = ["Name three colors.", "What is two plus two?", "Write a haiku about rain."]


def model_of(name):
    return TINY if name == "tiny" else example_or_skip()


def gen(model, *args, check=True):
    return generate("--threads", 2, *args, model=model, check=check)


def lines(r):
    return [json.loads(s) for s in r.stdout.splitlines()]


def prompt_ids(model, prompt, raw):
    """The ids generate feeds for prompt (the template applied unless raw; BOS included)."""
    r = gen(model, "--prompt", prompt, "--max-new-tokens", 1, "--json", *(["--raw"] if raw else []))
    return json.loads(r.stdout)["prompt_ids"]


def log_softmax_rows(tmp_path, model, ids, device=None):
    """float64 log_softmax of `ftune logits` over ids, one forward: (len(ids), V)."""
    out = tmp_path / "logits.f32"
    r = run_ftune(["logits", "--model", model, "--threads", 2, "--ids", ",".join(map(str, ids)),
                   "--out", out, *(["--device", device] if device else [])], timeout=600)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    z = np.fromfile(out, dtype="<f4").reshape(j["n_tokens"], j["vocab"]).astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    return z - (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))


def check_position(label, d, tok, row, k, tol):
    """One position's dict d (vLLM's {id: {logprob, rank, decoded_token}}) for prompt token tok
    against the reference row; returns the largest |difference|."""
    keys = list(d)
    assert keys[0] == str(tok), (label, keys)
    assert all(set(e) == {"logprob", "rank", "decoded_token"} for e in d.values())
    assert all(isinstance(e["decoded_token"], str) and isinstance(e["rank"], int) for e in d.values())
    worst = 0.0
    for key, e in d.items():
        worst = max(worst, abs(e["logprob"] - row[int(key)]))
        assert abs(e["logprob"] - row[int(key)]) <= tol, (label, key, e, row[int(key)])
    # the token itself: vLLM's rank, the count of tokens at least as likely (ties aside)
    lo, hi = int((row > row[tok] + tol).sum()), int((row >= row[tok] - tol).sum())
    in_top = len(d) == k  # the token is one of the alternatives: listed once, its rank theirs
    assert len(d) in (k, k + 1) and (in_top or lo <= d[keys[0]]["rank"] <= hi), (label, d, lo, hi)
    alts = sorted(((e["rank"], int(key)) for key, e in d.items() if key != keys[0] or in_top))
    assert [r for r, _ in alts] == list(range(1, k + 1)), (label, d)
    if k and k < len(row):  # the reference's top k, ties to the lower id, unless a near tie
        order = np.argsort(-row, kind="stable")
        if row[order[k - 1]] - row[order[k]] > 2 * tol:
            assert {i for _, i in alts} == set(order[:k].tolist()), (label, alts, order[:k])
    return worst


def check_prompt_logprobs(label, plp, ids, ref, k, tol=TOL_LOGPROB):
    assert len(plp) == len(ids) and plp[0] is None, (label, len(plp), len(ids))
    worst = max([0.0] + [check_position(f"{label} @{q}", plp[q], ids[q], ref[q - 1], k, tol)
                         for q in range(1, len(ids))])
    print(f"[{label}] {len(ids)} prompt tokens, top {k}: largest |logprob - reference| {worst:.2e}")
    return worst


def completion_req(cid, prompt, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"model": "m", "prompt": prompt, **body}}


def chat_req(cid, content, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": content}], **body}}


def bodies(r):
    return [json.loads(s)["response"]["body"] for s in r.stdout.splitlines()]


# ---------------------------------------------------------------------------------------
# values against numpy

@pytest.mark.parametrize("name", ["tiny", "example"])
def test_plain_records_match_logits(tmp_path, name):
    model = model_of(name)
    recs = [{"prompt": q, "max_tokens": 3, "prompt_logprobs": k} for q, k in zip(QUESTIONS, (K, 0, 20))]
    out = lines(gen(model, "--prompts", write_jsonl(tmp_path / "p.jsonl", recs)))
    for rec, line in zip(recs, out):
        ids = prompt_ids(model, rec["prompt"], raw=False)
        assert line["prompt_tokens"] == len(ids)
        ref = log_softmax_rows(tmp_path, model, ids)
        check_prompt_logprobs(f"{name} {rec['prompt']!r}", line["prompt_logprobs"], ids, ref,
                              rec["prompt_logprobs"])


def test_long_prompt_in_several_forwards(tmp_path):
    """A raw prompt of more than twice the 256-row forward: three forwards, the later two
    through the KV cache, against one teacher-forced forward."""
    text = " ".join(f"Item {i} costs {i * 7 % 13} coins." for i in range(70))
    ids = prompt_ids(TINY, text, raw=True)
    assert len(ids) > 2 * PLP_ROWS, len(ids)
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": text, "max_tokens": 2, "prompt_logprobs": 2}])
    r = gen(TINY, "--raw", "--prompts", f)
    line = lines(r)[0]
    check_prompt_logprobs("tiny long", line["prompt_logprobs"], ids,
                          log_softmax_rows(tmp_path, TINY, ids), 2)
    forwards = -(-len(ids) // PLP_ROWS)
    assert f"{forwards} prefill forwards" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------
# echo

@pytest.mark.parametrize("name", ["tiny", "example"])
def test_echo_without_generation(tmp_path, name):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs k, max_tokens 0."""
    model = model_of(name)
    f = write_jsonl(tmp_path / "e.jsonl", [completion_req("e", PROMPT, echo=True, logprobs=K, max_tokens=0)])
    body = bodies(gen(model, "--prompts", f))[0]
    ch = body["choices"][0]
    assert ch["text"] == PROMPT and ch["finish_reason"] == "length" and ch["stop_reason"] is None
    ids = prompt_ids(model, PROMPT, raw=True)
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    lp = ch["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert all(len(v) == len(ids) for v in lp.values())
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref = log_softmax_rows(tmp_path, model, ids)
    worst = 0.0
    for q in range(1, len(ids)):
        d = abs(lp["token_logprobs"][q] - ref[q - 1][ids[q]])
        worst = max(worst, d)
        assert d <= TOL_LOGPROB, (q, lp["token_logprobs"][q], ref[q - 1][ids[q]])
        top = lp["top_logprobs"][q]  # the token first, then its alternatives: k or k + 1
        assert list(top)[0] == lp["tokens"][q] and len(top) in (K, K + 1)
        assert top[lp["tokens"][q]] == lp["token_logprobs"][q]
    # the same numbers as vLLM's prompt_logprobs of the choice (echo asks for them with k)
    plp = ch["prompt_logprobs"]
    check_prompt_logprobs(f"{name} echo", plp, ids, ref, K)
    assert [plp[q][str(ids[q])]["logprob"] for q in range(1, len(ids))] == lp["token_logprobs"][1:]
    assert [plp[q][str(ids[q])]["decoded_token"] for q in range(1, len(ids))] == lp["tokens"][1:]
    # text_offset: the running sum of the token texts' lengths, from 0
    assert lp["text_offset"] == list(np.cumsum([0] + [len(t) for t in lp["tokens"][:-1]]))
    print(f"[{name}] echo, max_tokens 0: {len(ids)} tokens, largest |difference| {worst:.2e}")


@pytest.mark.parametrize("name", ["tiny", "example"])
def test_echo_with_reply(tmp_path, name):
    model = model_of(name)
    recs = [completion_req("a", PROMPT, echo=True, logprobs=2, max_tokens=4),
            completion_req("b", PROMPT, logprobs=2, max_tokens=4),
            completion_req("c", PROMPT, echo=True, max_tokens=4)]
    echo, plain, no_lp = (b["choices"][0] for b in bodies(gen(model, "--prompts",
                                                              write_jsonl(tmp_path / "r.jsonl", recs))))
    assert echo["text"] == PROMPT + plain["text"] and no_lp["text"] == echo["text"]
    assert no_lp["logprobs"] is None and "prompt_logprobs" not in no_lp
    assert "prompt_logprobs" not in plain and "prompt_logprobs" in echo
    n = len(prompt_ids(model, PROMPT, raw=True))
    e, p = echo["logprobs"], plain["logprobs"]
    # the reply's values: the echoed request's first reply row comes from a forward over all the
    # prompt's rows, the other's from a prefill of its last row: the GEMMs round differently
    assert e["tokens"][n:] == p["tokens"]
    assert np.allclose(e["token_logprobs"][n:], p["token_logprobs"], rtol=0, atol=TOL_ROWS)
    for x, y in zip(e["top_logprobs"][n:], p["top_logprobs"]):
        assert list(x) == list(y) and np.allclose(list(x.values()), list(y.values()), rtol=0, atol=TOL_ROWS)
    shift = sum(len(t) for t in e["tokens"][:n])
    assert e["text_offset"][n:] == [o + shift for o in p["text_offset"]]
    assert echo["finish_reason"] == plain["finish_reason"]


# ---------------------------------------------------------------------------------------
# batches, choices, chat

@pytest.mark.parametrize("name", ["tiny", "example"])
def test_batch_and_choices(tmp_path, name):
    model = model_of(name)
    recs = [{"prompt": QUESTIONS[0], "max_tokens": 5, "prompt_logprobs": 2},
            {"prompt": QUESTIONS[1], "max_tokens": 5},
            {"prompt": QUESTIONS[2], "max_tokens": 5, "prompt_logprobs": 5},
            {"prompt": PROMPT, "max_tokens": 5, "prompt_logprobs": False},
            {"prompt": QUESTIONS[1], "max_tokens": 5, "prompt_logprobs": 1}]
    f = write_jsonl(tmp_path / "p.jsonl", recs)
    one = lines(gen(model, "--prompts", f, "--batch", 1, "--prompt-logprobs", 0))
    four = lines(gen(model, "--prompts", f, "--batch", 4, "--prompt-logprobs", 0))
    for a, b, rec in zip(one, four, recs):
        assert a["reply"] == b["reply"]
        if rec.get("prompt_logprobs") is False:
            assert "prompt_logprobs" not in a and "prompt_logprobs" not in b
            continue
        assert a["prompt_logprobs"] == b["prompt_logprobs"]  # the same forwards: bit for bit
        k = rec.get("prompt_logprobs", 0)  # --prompt-logprobs 0: the token alone
        assert all(len(d) in (k, k + 1) for d in a["prompt_logprobs"][1:])
    # n = 2 (sampled): the same prompt log-probabilities in both choices, those of n = 1
    reqs = [completion_req("n2", PROMPT, n=2, temperature=0.9, seed=4, max_tokens=4, prompt_logprobs=K),
            completion_req("n1", PROMPT, temperature=0.9, seed=4, max_tokens=4, prompt_logprobs=K)]
    n2, n1 = bodies(gen(model, "--prompts", write_jsonl(tmp_path / "n.jsonl", reqs), "--batch", 3))
    assert len(n2["choices"]) == 2
    assert n2["choices"][0]["prompt_logprobs"] == n2["choices"][1]["prompt_logprobs"] \
        == n1["choices"][0]["prompt_logprobs"]
    assert n2["usage"]["prompt_tokens"] == len(n2["choices"][0]["prompt_logprobs"])


def test_chat_prompt_logprobs(tmp_path):
    recs = [chat_req("a", QUESTIONS[0], max_tokens=4, prompt_logprobs=2),
            chat_req("b", QUESTIONS[0], max_tokens=4, echo=True),
            chat_req("c", QUESTIONS[0], max_tokens=4)]
    a, b, c = bodies(gen(TINY, "--prompts", write_jsonl(tmp_path / "c.jsonl", recs)))
    ids = prompt_ids(TINY, QUESTIONS[0], raw=False)
    assert list(a)[-1] == "prompt_logprobs" and "prompt_logprobs" not in c
    assert all("prompt_logprobs" not in ch for body in (a, b, c) for ch in body["choices"])
    ref = log_softmax_rows(tmp_path, TINY, ids)
    check_prompt_logprobs("tiny chat", a["prompt_logprobs"], ids, ref, 2)
    # echo: vLLM takes top_logprobs (0) for prompt_logprobs; the reply's text is unchanged
    check_prompt_logprobs("tiny chat echo", b["prompt_logprobs"], ids, ref, 0)
    assert all(len(d) == 1 for d in b["prompt_logprobs"][1:])
    assert b["choices"][0]["message"] == c["choices"][0]["message"]


# ---------------------------------------------------------------------------------------
# the flag, lines fed back, refusals

def test_flag_default_and_refusals(tmp_path):
    recs = [{"prompt": QUESTIONS[0], "max_tokens": 2}, {"prompt": QUESTIONS[1], "max_tokens": 2,
                                                          "prompt_logprobs": False}]
    out = lines(gen(TINY, "--prompts", write_jsonl(tmp_path / "p.jsonl", recs), "--prompt-logprobs", 4))
    assert all(len(d) in (4, 5) for d in out[0]["prompt_logprobs"][1:])
    assert "prompt_logprobs" not in out[1]
    # a line generate wrote, fed back: its values are no setting
    again = lines(gen(TINY, "--prompts", write_jsonl(tmp_path / "again.jsonl", out),
                      "--max-new-tokens", 2))
    assert [x["reply"] for x in again] == [x["reply"] for x in out]
    assert all("prompt_logprobs" not in x for x in again)
    for args, why in ((["--prompt-logprobs", 21], "--prompt-logprobs 21: expected 0..20"),
                      (["--prompt-logprobs", -1], "--prompt-logprobs -1"),
                      (["--prompt", "x", "--prompt-logprobs", 1], "goes with --prompts"),
                      (["--chat", "--prompt-logprobs", 1], "does not go with --prompt-logprobs")):
        if "--prompt" not in args and "--chat" not in args:
            args = ["--prompts", tmp_path / "p.jsonl", *args]
        r = gen(TINY, *args, check=False)
        assert r.returncode == 2 and why in r.stderr, (args, r.stderr)
    for rec, why in (({"prompt": "a", "prompt_logprobs": 21}, "'prompt_logprobs' 21: expected an integer 0..20"),
                     (completion_req("x", "a", prompt_logprobs=-1), "body: 'prompt_logprobs' -1"),
                     (completion_req("x", "a", max_tokens=0), "body: 'max_tokens' 0: expected 1..1000000"),
                     (chat_req("x", "a", echo=True, max_tokens=0), "body: 'max_tokens' 0"),
                     (completion_req("x", "a", echo="yes"), "body: 'echo' must be true or false")):
        f = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"} if "custom_id" not in rec else
                                                 completion_req("ok", "ok"), rec])
        r = gen(TINY, "--prompts", f, check=False)
        assert r.returncode == 1 and f"bad.jsonl: line 2: " in r.stderr and why in r.stderr, r.stderr
        assert r.stdout == ""


# ---------------------------------------------------------------------------------------
# the executor path (device backends)

def test_cpu_device_matches_its_logits(tmp_path):
    ids = prompt_ids(TINY, PROMPT, raw=True)
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": K}])
    line = lines(gen(TINY, "--raw", "--prompts", f, "--device", "cpu-device"))[0]
    ref = log_softmax_rows(tmp_path, TINY, ids, device="cpu-device")
    check_prompt_logprobs("tiny cpu-device", line["prompt_logprobs"], ids, ref, K)


# ---------------------------------------------------------------------------------------
# logit_bias and ignore_eos

def test_logit_bias(tmp_path):
    ids = prompt_ids(TINY, PROMPT, raw=True)
    row = log_softmax_rows(tmp_path, TINY, ids)[-1]  # the raw distribution of the first token
    order = np.argsort(-row, kind="stable")
    forced = int(order[1000])  # a token greedy decoding would not pick
    base = {"prompt": PROMPT, "max_tokens": 4, "logprobs": 0}
    recs = [base, dict(base, logit_bias={str(forced): 100}),
            dict(base, logit_bias={str(int(order[0])): -100}), dict(base, logit_bias={})]
    plain, up, down, empty = lines(gen(TINY, "--raw", "--prompts", write_jsonl(tmp_path / "b.jsonl", recs)))
    assert [e["id"] for e in up["logprobs"]] == [forced] * 4
    # the log-probabilities are the raw distribution's, before the bias
    assert abs(up["logprobs"][0]["logprob"] - row[forced]) <= TOL_LOGPROB
    assert plain["logprobs"][0]["id"] == int(order[0]) and down["logprobs"][0]["id"] == int(order[1])
    assert empty["reply"] == plain["reply"]
    # a completions request's body: the same reply
    body = bodies(gen(TINY, "--prompts", write_jsonl(tmp_path / "c.jsonl", [
        completion_req("b", PROMPT, max_tokens=4, logit_bias={str(forced): 100})])))[0]
    assert body["choices"][0]["text"] == up["reply"]
    bad = write_jsonl(tmp_path / "bad.jsonl", [dict(base, logit_bias={"32000": 1})])
    r = gen(TINY, "--raw", "--prompts", bad, check=False)
    assert r.returncode == 1 and "'logit_bias' item 1: 32000 is no token id of the model" in r.stderr, r.stderr


def test_ignore_eos(tmp_path):
    eos = 2  # tiny-llama's </s>, forced by logit_bias
    base = {"prompt": PROMPT, "max_tokens": 3, "logprobs": 0, "logit_bias": {str(eos): 100}}
    recs = [base, dict(base, ignore_eos=True), dict(base, ignore_eos=True, stop_token_ids=[eos]),
            dict(base, ignore_eos=False)]
    stop, ignored, listed, off = lines(gen(TINY, "--raw", "--prompts", write_jsonl(tmp_path / "e.jsonl", recs)))
    assert stop["stop"] == "stop_token" and stop["new_tokens"] == 0
    assert ignored["stop"] == "length" and ignored["new_tokens"] == 3
    assert [e["id"] for e in ignored["logprobs"]] == [eos] * 3 and ignored["reply"] == ""
    assert listed["stop"] == "stop_token" and listed["new_tokens"] == 0
    assert off == stop | {"seconds": off["seconds"], "index": 3}
    body = bodies(gen(TINY, "--prompts", write_jsonl(tmp_path / "c.jsonl", [
        completion_req("i", PROMPT, max_tokens=3, logit_bias={str(eos): 100}, ignore_eos=True)])))[0]
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 3


# ---------------------------------------------------------------------------------------
# review fixes (helper-75): a vocabulary below k, echo before --prompt-logprobs, ignore_eos
# with the EOS listed in stop_token_ids

def small_vocab_model(tmp_path):
    """tiny-llama's shape with a vocabulary of 16 tokens (random weights, ftune init-model)
    and a 16-token BPE tokenizer."""
    cfg = json.loads((TINY / "config.json").read_text())
    cfg["vocab_size"] = 16
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    m = tmp_path / "m16"
    r = run_ftune(["init-model", "--config", tmp_path / "cfg.json", "--out", m])
    assert r.returncode == 0, r.stderr
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: 3 + i for i, c in enumerate("abcdefgh")},
             " ": 11, "ab": 12, "cd": 13, "x14": 14, "x15": 15}
    special = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i, s in enumerate(["<unk>", "<s>", "</s>"])]
    tok = {"version": "1.0", "added_tokens": special, "normalizer": None, "pre_tokenizer": None,
           "post_processor": {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                         {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1],
                                                                     "tokens": ["<s>"]}}},
           "decoder": None,
           "model": {"type": "BPE", "unk_token": "<unk>", "vocab": vocab, "merges": ["a b", "c d"]}}
    (m / "tokenizer.json").write_text(json.dumps(tok))
    (m / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return m


def test_logprobs_of_a_vocabulary_below_k(tmp_path):
    m = small_vocab_model(tmp_path)
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "abcd efgh", "max_new_tokens": 3, "logprobs": 20,
                                           "prompt_logprobs": 20}])
    out = lines(gen(m, "--raw", "--prompts", f))[0]
    for e in out["logprobs"]:
        ids = [t[0] for t in e["top"]]
        assert len(ids) == 16 and sorted(ids) == list(range(16)), e["top"]
    assert all(len(d) == 16 for d in out["prompt_logprobs"][1:])
    f = write_jsonl(tmp_path / "c.jsonl", [completion_req("a", "abcd efgh", max_tokens=2, logprobs=20,
                                                          echo=True)])
    body = bodies(gen(m, "--raw", "--prompts", f))[0]
    tops = body["choices"][0]["logprobs"]["top_logprobs"]
    assert tops[0] is None and all(len(t) == 16 for t in tops[1:]), tops


def test_echo_logprobs_come_before_the_flag(tmp_path):
    f = write_jsonl(tmp_path / "e.jsonl", [completion_req("a", PROMPT, max_tokens=0, echo=True, logprobs=3)])
    a = bodies(gen(TINY, "--raw", "--prompts", f))[0]["choices"][0]
    b = bodies(gen(TINY, "--raw", "--prompts", f, "--prompt-logprobs", 0))[0]["choices"][0]
    assert a == b
    assert all(len(t) in (3, 4) for t in a["logprobs"]["top_logprobs"][1:])


def test_ignore_eos_with_the_eos_as_a_stop_id(tmp_path):
    eos = 2  # tiny-llama's </s>
    f = write_jsonl(tmp_path / "s.jsonl", [
        completion_req("a", PROMPT, max_tokens=4, logit_bias={str(eos): 100}, ignore_eos=True,
                       stop_token_ids=[eos]),
        completion_req("b", PROMPT, max_tokens=4, logit_bias={str(eos): 100}, stop_token_ids=[eos])])
    a, b = [x["choices"][0] for x in bodies(gen(TINY, "--raw", "--prompts", f))]
    # vLLM's check_stop: with ignore_eos the EOS is a stop_token_ids entry (its id the reason);
    # without it, the EOS check comes first (no reason)
    assert (a["finish_reason"], a["stop_reason"]) == ("stop", eos), a
    assert (b["finish_reason"], b["stop_reason"]) == ("stop", None), b
