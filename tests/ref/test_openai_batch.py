"""`ftune generate --prompts` with OpenAI batch request files (the Batch API's input, and the
input of vLLM's `python -m vllm.entrypoints.openai.run_batch`), the unknown-key warning, and
OpenAI's presence / frequency penalties.

Formats (see cli/gen_batch.c's header and ft_gen_req_parse in src/infer/generate.h): an input
line is {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
"body"} (OpenAI openapi.yaml BatchRequestInput; vLLM run_batch.py); an output line is
{"id", "custom_id", "response": {"status_code": 200, "request_id", "body": a chat.completion or
text_completion object}, "error": null} (BatchRequestOutput). Checked here:
  - a chat request's reply equals that of the equivalent plain {"messages": ...} record with
    the same settings; a completions request's equals `--raw --prompt`'s;
  - every output line parses as the Batch API's object, with usage (prompt_tokens = the
    prompt's ids, completion_tokens = the generated tokens, a stop token included as vLLM
    counts it), finish_reason and vLLM's stop_reason; --batch 3 equals --batch 1; two runs
    with the same seed differ only in "created";
  - each refusal exits 1 with one "ftune: FILE: line N: ..." line naming the field;
  - unknown keys of plain records are warned about once per key, with "did you mean";
  - presence_penalty / frequency_penalty (OpenAI's definition, vLLM's order: after the
    repetition penalty, over the generated tokens only) against a greedy numpy loop over
    `ftune logits`, as test_sampling_ref.py checks the repetition penalty.
Model: the tiny-llama fixture (random weights: it repeats itself, which the penalties and
the stop strings need); one check on the example SmolLM2-135M-Instruct Q4_1 GGUF (skipped
when it is not in the cache).
"""
import json

import pytest

from cli_helpers import TINY, assert_clean_error, run_ftune
from gen_helpers import CACHED_EXAMPLE as EXAMPLE, generate as ftune, reference_greedy, write_jsonl

PROMPT = "Once upon a time, in a quiet village by the sea,"
QUESTIONS = ["Name three colors.", "What is two plus two?", "Write a haiku about rain.",
             "Say hello.", "List the days of the week."]
RAW = ["Once upon a time", "The capital of France is", "1, 2, 3, 4,", "Hello world"]
# the settings a request may give, by OpenAI's names, one set per request (seeds given so
# that the plain records and the batch requests sample the same draws whatever their index)
SETTINGS = [
    {"max_tokens": 12},
    {"max_completion_tokens": 10, "temperature": 0.9, "top_k": 50, "seed": 3},
    {"max_tokens": 10, "temperature": 0.8, "top_p": 0.9, "min_p": 0.1, "seed": 4},
    {"max_tokens": 12, "repetition_penalty": 1.3, "stop": ["ing", "::"]},
    {"max_tokens": 9, "presence_penalty": 0.8, "frequency_penalty": 0.5},
]


def chat_req(cid, messages, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": messages, **body}}


def completion_req(cid, prompt, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"model": "gpt-3.5-turbo-instruct", "prompt": prompt, **body}}


def lines(r):
    return [json.loads(s) for s in r.stdout.splitlines()]


def check_line(x, req, model=str(TINY)):
    """x is a Batch API output line for request req; returns (text, choice, usage)."""
    assert set(x) == {"id", "custom_id", "response", "error"}, x
    assert x["custom_id"] == req["custom_id"] and x["error"] is None
    assert x["id"].startswith("batch_req_")
    resp = x["response"]
    assert set(resp) == {"status_code", "request_id", "body"} and resp["status_code"] == 200
    assert resp["request_id"].startswith("req_")
    b = resp["body"]
    chat = req["url"] == "/v1/chat/completions"
    assert set(b) == {"id", "object", "created", "model", "choices", "usage"}, b
    assert b["object"] == ("chat.completion" if chat else "text_completion")
    assert b["id"].startswith("chatcmpl-" if chat else "cmpl-")
    assert b["model"] == model and isinstance(b["created"], int)
    assert len(b["choices"]) == 1
    c = b["choices"][0]
    assert c["index"] == 0 and c["logprobs"] is None
    assert c["finish_reason"] in ("stop", "length")
    if chat:
        assert set(c) == {"index", "message", "logprobs", "finish_reason", "stop_reason"}
        assert c["message"]["role"] == "assistant"
        text = c["message"]["content"]
    else:
        assert set(c) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
        text = c["text"]
    u = b["usage"]
    assert set(u) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    return text, c, u


def expect_same(x, plain, req, model=str(TINY)):
    """Batch output line x answers as the plain --prompts line does: the same text, the
    tokens (completion_tokens counts the stop token, as vLLM does), the end."""
    text, c, u = check_line(x, req, model)
    assert text == plain["reply"]
    assert u["prompt_tokens"] == plain["prompt_tokens"]
    assert u["completion_tokens"] == plain["new_tokens"] + (plain["stop"] == "stop_token")
    assert c["finish_reason"] == ("length" if plain["stop"] == "length" else "stop")
    if plain["stop"] == "stop_string":
        assert c["stop_reason"] == plain["stop_reason"]
    elif plain["stop"] == "length":
        assert c["stop_reason"] is None
    else:  # the tokenizer's EOS: null; another stop token: its id
        assert c["stop_reason"] is None or isinstance(c["stop_reason"], int)


def drop_created(xs):
    xs = json.loads(json.dumps(xs))
    for x in xs:
        del x["response"]["body"]["created"]
    return xs


def test_chat_requests_equal_messages_records(tmp_path):
    reqs, plain = [], []
    for i, (q, st) in enumerate(zip(QUESTIONS, SETTINGS)):
        msgs = [{"role": "user", "content": q}]
        if i == 2:
            msgs = [{"role": "system", "content": "Be brief."}, *msgs]
        if i == 4:  # content parts, joined as training joins them
            msgs = [{"role": "user", "content": [{"type": "text", "text": q[:5]},
                                                  {"type": "text", "text": q[5:]}]}]
        reqs.append(chat_req(f"q-{i}", msgs, **st))
        plain.append({"messages": [{"role": "user", "content": q}] if i == 4 else msgs, **st})
    bf = write_jsonl(tmp_path / "batch.jsonl", reqs)
    pf = write_jsonl(tmp_path / "plain.jsonl", plain)
    a = ftune("--prompts", bf, "--batch", 3, "--seed", 11)
    p = lines(ftune("--prompts", pf, "--batch", 3, "--seed", 11))
    got = lines(a)
    assert [x["custom_id"] for x in got] == [r["custom_id"] for r in reqs]
    for x, y, r in zip(got, p, reqs):
        expect_same(x, y, r)
    print("\n" + "\n".join(f"{y['new_tokens']:2d} {y['stop']:11s} {y['reply']!r}" for y in p))
    assert {y["stop"] for y in p} >= {"length", "stop_string"}, p
    # --batch 1 and a second run with the same seed: the same lines but for "created";
    # the ids are derived from custom_id, so distinct and stable
    b = lines(ftune("--prompts", bf, "--batch", 1, "--seed", 11))
    assert drop_created(got) == drop_created(b)
    ids = [x["id"] for x in got] + [x["response"]["request_id"] for x in got]
    assert len(set(ids)) == len(ids)
    # --out writes the same lines
    out = tmp_path / "out.jsonl"
    ftune("--prompts", bf, "--seed", 11, "--out", out)
    assert drop_created([json.loads(s) for s in out.read_text().splitlines()]) == drop_created(got)


def test_unset_settings_take_the_flags(tmp_path):
    """A request without settings takes the command line's (greedy by default, not OpenAI's
    temperature 1): the reply of --prompt with the same flags."""
    bf = write_jsonl(tmp_path / "b.jsonl", [chat_req("x", [{"role": "user", "content": QUESTIONS[0]}])])
    x = lines(ftune("--prompts", bf, "--max-new-tokens", 7, "--repetition-penalty", 1.2))[0]
    one = json.loads(ftune("--prompt", QUESTIONS[0], "--max-new-tokens", 7,
                           "--repetition-penalty", 1.2, "--json").stdout)
    text, c, u = check_line(x, {"custom_id": "x", "url": "/v1/chat/completions"})
    assert text == one["text"] and u["prompt_tokens"] == len(one["prompt_ids"])
    assert u["completion_tokens"] == len(one["ids"]) + (one["stop"] == "stop_token")


def test_completions_equal_raw(tmp_path):
    sets = [{"max_tokens": 8}, {"max_tokens": 6, "temperature": 0.7, "seed": 21},
            {"max_tokens": 10, "stop": ", "}, {"max_tokens": 8, "frequency_penalty": 1.0}]
    reqs = [completion_req(f"c{i}", p, **s) for i, (p, s) in enumerate(zip(RAW, sets))]
    got = lines(ftune("--prompts", write_jsonl(tmp_path / "c.jsonl", reqs), "--batch", 2))
    for x, r, p, s in zip(got, reqs, RAW, sets):
        flags = ["--max-new-tokens", s["max_tokens"]]
        if "temperature" in s:
            flags += ["--temperature", s["temperature"], "--seed", s["seed"]]
        if "stop" in s:
            flags += ["--stop", s["stop"]]
        if "frequency_penalty" in s:  # no flag yet: the same settings as a plain --raw record
            y = lines(ftune("--prompts", write_jsonl(tmp_path / "p.jsonl", [{"prompt": p, **s}]),
                            "--raw"))[0]
            expect_same(x, y, r)
            continue
        one = json.loads(ftune("--raw", "--prompt", p, *flags, "--json").stdout)
        text, c, u = check_line(x, r)
        assert text == one["text"] and u["prompt_tokens"] == len(one["prompt_ids"])
        assert u["completion_tokens"] == len(one["ids"]) + (one["stop"] == "stop_token")
        assert c["finish_reason"] == ("length" if one["stop"] == "length" else "stop")
        if one["stop"] == "stop_string":
            assert c["stop_reason"] == s["stop"]
    # a chat and a completions request in one file (vLLM's run_batch takes either per line)
    mixed = [completion_req("r", RAW[0], max_tokens=5),
             chat_req("c", [{"role": "user", "content": QUESTIONS[0]}], max_tokens=5)]
    m = lines(ftune("--prompts", write_jsonl(tmp_path / "m.jsonl", mixed)))
    assert [x["response"]["body"]["object"] for x in m] == ["text_completion", "chat.completion"]
    one = json.loads(ftune("--raw", "--prompt", RAW[0], "--max-new-tokens", 5, "--json").stdout)
    assert m[0]["response"]["body"]["choices"][0]["text"] == one["text"]


GOOD = chat_req("a", [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("name,recs,needles", [
    ("n=17", [GOOD, chat_req("b", [{"role": "user", "content": "x"}], n=17)],
     ["line 2", "body: 'n' 17", "an integer 1..16"]),
    ("top_logprobs without logprobs", [chat_req("b", [{"role": "user", "content": "x"}], top_logprobs=2)],
     ["line 1", "'top_logprobs' needs 'logprobs': true"]),
    ("response_format", [chat_req("b", [{"role": "user", "content": "x"}],
                                  response_format={"type": "json_schema"})],
     ["line 1", "'body.response_format'"]),
    ("penalty range", [chat_req("b", [{"role": "user", "content": "x"}], presence_penalty=3)],
     ["line 1", "'presence_penalty' 3"]),
    ("mixed: plain first", ["plain", GOOD], ["line 2", "OpenAI batch request", "line 1 is one"]),
    ("mixed: batch first", [GOOD, {"prompt": "p"}], ["line 2", "a plain record", "line 1 is one"]),
    ("duplicate custom_id", [GOOD, completion_req("z", "x"), completion_req("a", "y")],
     ["line 3", "custom_id \"a\" is also that of line 1", "unique"]),
    ("bad url", [GOOD, {**GOOD, "custom_id": "e", "url": "/v1/embeddings"}],
     ["line 2", "'url' \"/v1/embeddings\""]),
    ("bad method", [{**GOOD, "method": "GET"}], ["line 1", "'method' \"GET\"", "POST"]),
    ("custom_id not a string", [{**GOOD, "custom_id": 12}], ["line 1", "'custom_id'", "a number"]),
    ("prompt list", [completion_req("c", ["a", "b"])], ["line 1", "'body.prompt' must be a string"]),
    ("final assistant", [chat_req("f", [{"role": "user", "content": "x"},
                                        {"role": "assistant", "content": "y"}])],
     ["line 1", "ends with an assistant message"]),
])
def test_refusals(tmp_path, name, recs, needles):
    f = write_jsonl(tmp_path / "bad.jsonl", recs)
    r = ftune("--prompts", f, check=False)
    assert r.stdout == ""
    line = assert_clean_error(r, None, f"{f}: ", *needles)
    print(f"[{name}] {line}")


def test_refusals_json_array_and_raw(tmp_path):
    """A JSON array file names the record; --raw refuses chat requests (no template)."""
    f = tmp_path / "bad.json"
    f.write_text(json.dumps([GOOD, {**GOOD, "custom_id": "b", "body": {**GOOD["body"], "n": 0}}]))
    assert_clean_error(ftune("--prompts", f, check=False), None, f"{f}: record 2", "body: 'n' 0")
    g = write_jsonl(tmp_path / "chat.jsonl", [GOOD])
    assert_clean_error(ftune("--prompts", g, "--raw", check=False), None, f"{g}: line 1", "--raw")


def test_unknown_keys_warned_once(tmp_path):
    recs = [{"prompt": "a", "id": 1, "max_tokens": 2},
            {"prompt": "b", "id": 2, "top_kk": 3, "max_tokens": 2},
            {"prompt": "c", "top_kk": 1, "tempreature": 0.5, "max_tokens": 2, "reply": "r",
             "seconds": 1, "index": 2}]
    f = write_jsonl(tmp_path / "p.jsonl", recs)
    r = ftune("--prompts", f)
    warn = [l for l in r.stderr.splitlines() if "is not a record field" in l]
    print("\n".join(warn))
    assert warn == [
        f'ftune: warning: {f}: key "id" (first on line 1) is not a record field or setting ftune reads: ignored',
        f'ftune: warning: {f}: key "top_kk" (first on line 2) is not a record field or setting ftune reads: '
        f'ignored; did you mean "top_k"?',
        f'ftune: warning: {f}: key "tempreature" (first on line 3) is not a record field or setting ftune '
        f'reads: ignored; did you mean "temperature"?']
    assert len(lines(r)) == 3
    # at most 8 keys named, the rest counted; in batch files the body's keys as "body.KEY"
    many = [{"prompt": "x", "max_tokens": 1, **{f"k{j}": j for j in range(11)}}]
    r = ftune("--prompts", write_jsonl(tmp_path / "m.jsonl", many))
    warn = [l for l in r.stderr.splitlines() if "warning" in l]
    assert len(warn) == 9 and warn[-1].endswith("3 more keys that ftune does not read: ignored"), warn
    b = write_jsonl(tmp_path / "b.jsonl", [chat_req("a", [{"role": "user", "content": "x"}],
                                                    max_tokens=1, top_kk=3, max_new_tokens=4),
                                           {**chat_req("b", [{"role": "user", "content": "y"}],
                                                       max_tokens=1), "metadata": 1}])
    r = ftune("--prompts", b)
    warn = [l for l in r.stderr.splitlines() if "warning" in l]
    assert warn == [
        f'ftune: warning: {b}: key "body.top_kk" (first on line 1) is not a record field or setting '
        f'ftune reads: ignored; did you mean "body.top_k"?',
        f'ftune: warning: {b}: key "body.max_new_tokens" (first on line 1) is not a record field or '
        f'setting ftune reads: ignored',
        f'ftune: warning: {b}: key "metadata" (first on line 2) is not a record field or setting ftune '
        f'reads: ignored'], warn


# ---------------------------------------------------------------------------------------
# presence / frequency penalties: a greedy numpy loop over `ftune logits`
# (gen_helpers.reference_greedy)

@pytest.mark.parametrize("presence,frequency,repetition", [(0.0, 0.7, 1.0), (1.5, 0.0, 1.0),
                                                           (0.4, 0.3, 1.2), (-0.5, 0.0, 1.0)])
def test_presence_frequency_greedy(tmp_path, presence, frequency, repetition):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    with open(TINY / "config.json") as f:
        e = json.load(f)["eos_token_id"]
    stop_ids = set(e if isinstance(e, list) else [e])
    n_new = 14
    plain = json.loads(ftune("--raw", "--prompt", PROMPT, "--max-new-tokens", n_new, "--json").stdout)
    s = {"max_tokens": n_new, "presence_penalty": presence, "frequency_penalty": frequency,
         "repetition_penalty": repetition}
    rec = lines(ftune("--prompts", write_jsonl(tmp_path / "p.jsonl", [{"prompt": PROMPT, **s}]),
                      "--raw"))[0]
    req = completion_req("pen", PROMPT, **s)
    x = lines(ftune("--prompts", write_jsonl(tmp_path / "b.jsonl", [req])))[0]
    ref, stopped, margin = reference_greedy(tmp_path, TINY, plain["prompt_ids"], n_new, stop_ids,
                                            presence, frequency, repetition)
    want = tok.decode(ref, skip_special_tokens=True)
    print(f"\n[presence {presence}, frequency {frequency}, repetition {repetition}] reference "
          f"{ref}\n  plain greedy {plain['ids']}\n  {want!r}\n  smallest top-2 margin {margin:.3e}")
    assert rec["reply"] == want and rec["new_tokens"] == len(ref)
    assert (rec["stop"] == "stop_token") == stopped
    expect_same(x, rec, req)
    # the flags on one --prompt: the same reply (gen_reply's counts, not gen_batch's)
    flags = json.loads(ftune("--raw", "--prompt", PROMPT, "--max-new-tokens", n_new, "--json",
                             "--presence-penalty", presence, "--frequency-penalty", frequency,
                             "--repetition-penalty", repetition).stdout)
    assert flags["ids"] == ref, (flags["ids"], ref)
    if presence > 0 or frequency > 0:
        assert ref != plain["ids"], "the penalties change nothing"


# ---------------------------------------------------------------------------------------
# the example model: a chat template, replies that end with the end-of-turn token

def test_example_model_chat(tmp_path):
    if not EXAMPLE.is_file():
        pytest.skip(f"example model not in the cache ({EXAMPLE}; scripts/fetch_example.sh)")
    qs = ["What is the capital of France? Answer in one word.", "Say hello."]
    reqs = [chat_req(f"e{i}", [{"role": "user", "content": q}], max_tokens=24)
            for i, q in enumerate(qs)]
    plain = [{"messages": [{"role": "user", "content": q}], "max_tokens": 24} for q in qs]
    got = lines(ftune("--prompts", write_jsonl(tmp_path / "b.jsonl", reqs), "--batch", 2,
                      model=EXAMPLE))
    p = lines(ftune("--prompts", write_jsonl(tmp_path / "p.jsonl", plain), "--batch", 2,
                    model=EXAMPLE))
    for x, y, r in zip(got, p, reqs):
        text, c, u = check_line(x, r, model=str(EXAMPLE))
        expect_same(x, y, r, model=str(EXAMPLE))
        print(f"{c['finish_reason']} {c['stop_reason']} {u} {text!r}")
    assert any(y["stop"] == "stop_token" for y in p), p


@pytest.mark.parametrize("flag,value", [("--presence-penalty", "2.5"), ("--frequency-penalty", "-3"),
                                        ("--presence-penalty", "nan")])
def test_penalty_flags_out_of_range(flag, value):
    r = ftune("--prompt", PROMPT, flag, value, check=False)
    assert r.returncode == 2 and "-2..2" in r.stderr, (r.returncode, r.stderr)
