"""`ftune generate --chat`: a conversation on standard input, the KV cache reused across turns
(cli/gen_chat.c).

The reference for each turn is `ftune generate --prompts` given the record {"messages": [the
history so far, the new user turn]} (the chat renders the conversation through that same path):
with greedy decoding, reply k of the chat must be that record's reply, and its prompt the
record's prompt_tokens. The comparison is exact (the whole stdout, the token counts), and
so far it always held: the chat prefills only the tokens after the prefix its cache already
holds, so its logits can differ from a whole-prompt prefill in the last fp32 bits (attention
summed in another order: test_gen_truncate.c measures 1e-7..4e-7 of max |logit| and bounds it
at 1e-5), and a greedy token could only change at a near tie of its two best logits. Should
one ever differ, check that it is such a tie (`ftune logits` over the record's prompt + the
reply so far, the top-2 gap at the first differing token against 1e-4 of max |logit|) before
accepting it; do not loosen the comparison to something that cannot fail. The tiny model's
replies hardly depend on the context (its output follows the last token), so the example
model's conversation, with a /reset that cuts the cache back to the system turn, is the check
that a wrong cache would fail (it does when the cut is skipped).

Models: the tiny-llama fixture (its template-less tokenizer gets the Alpaca prompt; a
--chat-template chatml run too), --device cpu-device (the CPU as a device: the executor path),
and the example SmolLM2-135M-Instruct Q4_1 GGUF (skipped when scripts/fetch_example.sh cannot
provide it).
"""
import json
import os
import re
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cli_helpers import ROOT, TINY, drain, ftune_bin, read_until, wait_output  # noqa: E402
from gen_helpers import example_or_skip  # noqa: E402

THREADS = ["--threads", "1"]  # results do not depend on it; a 2-core machine is faster with 1
TURN_RE = re.compile(r"turn (\d+): (\d+) prompt tokens \((\d+) from the cache, (\d+) prefilled "
                     r"in [0-9.]+ s\); (\d+) reply tokens in [0-9.]+ s \([0-9.]+ tok/s\); stop: (.*)")


def chat(model, lines, *extra, timeout=300, raw_input=None):
    """Runs `generate --chat` with the lines on stdin; returns (rc, stdout, stderr)."""
    text = raw_input if raw_input is not None else "".join(l + "\n" for l in lines)
    cmd = [ftune_bin(), "generate", "--model", str(model), "--chat", *THREADS, *map(str, extra)]
    p = subprocess.run(cmd, input=text.encode(), capture_output=True, timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode(errors="replace")


def turns(err):
    """The per-turn statistics: (turn, prompt, cached, prefilled, reply tokens, stop) each."""
    out = []
    for l in err.splitlines():
        m = TURN_RE.search(l)
        if m:
            out.append(tuple(int(x) for x in m.groups()[:5]) + (m.group(6),))
    return out


def shown(reply):
    """What the chat prints for a reply: the text, then a newline unless it ended one (an
    empty reply is an empty line)."""
    return reply if reply.endswith("\n") else reply + "\n"


def record_reply(tmp_path, model, messages, *extra):
    """The --prompts line of the record {"messages": messages}."""
    f = tmp_path / f"rec{len(messages)}.jsonl"
    f.write_text(json.dumps({"messages": messages}) + "\n")
    cmd = [ftune_bin(), "generate", "--model", str(model), "--prompts", str(f), *THREADS,
           *map(str, extra)]
    p = subprocess.run(cmd, capture_output=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return json.loads(p.stdout.decode("utf-8").splitlines()[0])


def replay(tmp_path, model, users, extra, chat_extra=(), system=None):
    """Chats `users` (one line each; "/reset" starts over) and checks each reply and prompt
    size against the records of the growing conversation. Returns (replies, per-turn
    statistics, stderr)."""
    sys_args = ["--system", system] if system is not None else []
    rc, out, err = chat(model, users, *extra, *sys_args, *chat_extra)
    assert rc == 0, err
    st = turns(err)
    numbers, k = [], 0
    for u in users:
        k = 0 if u == "/reset" else k + 1
        if u != "/reset":
            numbers.append(k)
    assert [t[0] for t in st] == numbers, err
    history, replies, expect_out = [], [], ""
    for u in users:
        if u == "/reset":
            history = []
            continue
        k = len(replies)
        history.append({"role": "user", "content": u})
        rec = record_reply(tmp_path, model, history, *extra, *sys_args)
        replies.append(rec["reply"])
        expect_out += shown(rec["reply"])
        assert st[k][1] == rec["prompt_tokens"], (k, st[k], rec)
        assert st[k][4] == rec["new_tokens"], (k, st[k], rec)
        assert st[k][2] + st[k][3] == st[k][1]
        history.append({"role": "assistant", "content": rec["reply"]})
    print(f"\nreplies {replies!r}\n{err.strip()}")
    # stdout: each reply in turn (an assertion names the first turn that differs)
    rest = out
    for k, r in enumerate(replies):
        assert rest.startswith(shown(r)), f"turn {k + 1}: chat printed {rest[:200]!r}, record {r!r}"
        rest = rest[len(shown(r)):]
    assert rest == "" and out == expect_out, rest
    return replies, st, err


# ---------------------------------------------------------------------------------------
# tiny-llama

CASES = {  # name: generation flags (the chat's and the records')
    "alpaca-penalty": ["--max-new-tokens", 8, "--repetition-penalty", 1.5],
    "chatml": ["--max-new-tokens", 6, "--chat-template", "chatml"],
    # "::" cuts every reply of this model to "": empty assistant turns in the history
    "alpaca-stop": ["--max-new-tokens", 6, "--stop", "::"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiny_three_turns_equal_records(tmp_path, name):
    """Reply k (greedy) is the reply of the --prompts record of the conversation so far; turn 2
    and 3 take their common prefix from the cache; after /reset a new question is answered as
    its own record (the cache cut back to the common start). EOF ends the chat with 0."""
    extra = CASES[name]
    _, st, err = replay(tmp_path, TINY, ["Hello there", "How are you?", "Tell me a story.", "/reset",
                                         "Count to ten."], extra,
                        system="Be brief." if name == "chatml" else None)
    assert 0 < st[3][2] < st[0][1], st  # after /reset: the common start only
    st = st[:3]
    assert st[0][2] == 0
    assert all(t[2] > 0 for t in st[1:]), st  # the cache was reused
    # at least the previous prompt where it ends in a special token (ChatML's header); the
    # Alpaca prompt ends in "Response:", whose last token may merge with a reply that starts
    # with ':' when the conversation is retokenized
    least = (lambda p: p[1]) if name == "chatml" else (lambda p: p[1] - 1)
    assert all(t[2] >= least(p) for p, t in zip(st, st[1:])), st


def test_tiny_escapes_and_continuation(tmp_path):
    """'//x' sends '/x'; a line ending in a backslash goes on with the next one (a newline
    in between); blank lines send nothing."""
    extra = ["--max-new-tokens", 4]
    rc, out, err = chat(TINY, ["//slash first", "", "two\\", "lines"], *extra)
    assert rc == 0, err
    assert len(turns(err)) == 2, err
    history, want = [], ""
    for u in ["/slash first", "two\nlines"]:
        history.append({"role": "user", "content": u})
        rec = record_reply(tmp_path, TINY, history, *extra)
        want += shown(rec["reply"])
        history.append({"role": "assistant", "content": rec["reply"]})
    assert out == want


def test_tiny_commands_reset_exit(tmp_path):
    """/reset gives turn 1's reply again for the same line (its prompt, the first in the cache,
    reused but for its last token); /help lists the commands, an unknown /word says so; /exit
    ends with 0 and what follows is not read."""
    lines = ["Hi", "How are you?", "/reset", "Hi", "/help", "/nope", "/exit", "never answered"]
    rc, out, err = chat(TINY, lines, "--max-new-tokens", 5)
    assert rc == 0, err
    st = turns(err)
    assert [t[0] for t in st] == [1, 2, 1], err
    assert st[2][1] == st[0][1] and st[2][2] == st[0][1] - 1, st
    h = [{"role": "user", "content": "Hi"}]
    r1 = record_reply(tmp_path, TINY, h, "--max-new-tokens", 5)["reply"]
    h += [{"role": "assistant", "content": r1}, {"role": "user", "content": "How are you?"}]
    r2 = record_reply(tmp_path, TINY, h, "--max-new-tokens", 5)["reply"]
    assert out == shown(r1) + shown(r2) + shown(r1), out
    assert "new conversation" in err
    assert "/reset" in err and "/exit" in err and "//" in err  # the /help list
    assert "unknown command '/nope'" in err
    assert "never answered" not in out


def test_tiny_eof_and_empty_input():
    rc, out, err = chat(TINY, [], "--max-new-tokens", 3, raw_input="")
    assert rc == 0 and out == "" and not turns(err), err
    # the last line without its newline is still a turn
    rc, out, err = chat(TINY, [], "--max-new-tokens", 3, raw_input="Hi")
    assert rc == 0 and len(turns(err)) == 1, err


def test_tiny_context_drops_oldest(tmp_path):
    """With a small --ctx-size the oldest exchanges are dropped (said on stderr) and the reply
    is the record's of the conversation that remains."""
    extra = ["--max-new-tokens", 8, "--repetition-penalty", 1.5]
    users = ["Hi", "How are you?", "Tell me more.", "Bye"]
    rc, out, err = chat(TINY, users, *extra, "--ctx-size", 100)
    assert rc == 0, err
    st = turns(err)
    assert len(st) == 4 and all(t[1] + 8 <= 100 for t in st), st
    drops = [l for l in err.splitlines() if "dropped the oldest" in l]
    assert drops and "--ctx-size 100" in drops[0], err
    # replay, dropping as the chat does: the oldest pair while prompt + new > ctx
    history, want = [], ""
    for u in users:
        history.append({"role": "user", "content": u})
        while True:
            rec = record_reply(tmp_path, TINY, history, *extra)
            if rec["prompt_tokens"] + 8 <= 100 or len(history) < 3:
                break
            history = history[2:]
        want += shown(rec["reply"])
        history.append({"role": "assistant", "content": rec["reply"]})
    assert out == want
    assert len(history) < 2 * len(users)  # something was dropped


def test_tiny_too_long_turn_refused(tmp_path):
    """A message that alone does not fit is refused, the chat goes on, and the refused turn is
    not in the conversation, while the exchanges before it still are (the refusal drops none of
    them: turn 2's prompt is the record's of turn 1 + reply + the next message)."""
    extra = ["--max-new-tokens", 8]
    long = " ".join(["word"] * 120)
    rc, out, err = chat(TINY, ["Hi", long, "Bye"], *extra, "--ctx-size", 100)
    assert rc == 0, err
    assert "too long" in err and "--ctx-size 100" in err, err
    st = turns(err)
    assert [t[0] for t in st] == [1, 2], err
    history = [{"role": "user", "content": "Hi"}]
    r1 = record_reply(tmp_path, TINY, history, *extra)
    history += [{"role": "assistant", "content": r1["reply"]}, {"role": "user", "content": "Bye"}]
    r2 = record_reply(tmp_path, TINY, history, *extra)
    assert r2["prompt_tokens"] + 8 <= 100  # no drop needed: the refused turn is gone
    assert st[1][1] == r2["prompt_tokens"], (st, r2)  # the history kept through the refusal
    assert "dropped the oldest" not in err, err
    assert out == shown(r1["reply"]) + shown(r2["reply"])


def test_tiny_sampled_first_turn_is_prompt_seed(tmp_path):
    """One sampler for the chat: turn 1 with --seed S is --prompt's reply with --seed S; the
    clock's seed is printed once when none is given."""
    extra = ["--max-new-tokens", 6, "--temperature", 1.0, "--seed", 7]
    rc, out, err = chat(TINY, ["Hi"], *extra)
    assert rc == 0, err
    p = subprocess.run([ftune_bin(), "generate", "--model", str(TINY), "--prompt", "Hi", "--json",
                        *THREADS, *map(str, extra)], capture_output=True, timeout=300)
    assert p.returncode == 0
    assert out == shown(json.loads(p.stdout)["text"])
    rc, _, err = chat(TINY, ["Hi", "Again"], "--max-new-tokens", 3, "--temperature", 1.0)
    assert rc == 0 and len(re.findall(r"ftune: seed \d+", err)) == 1, err


@pytest.mark.parametrize("flags", [["--prompt", "x"], ["--prompts", "p.jsonl"], ["--raw"],
                                   ["--json"], ["--out", "o.jsonl"], ["--batch", "2"]])
def test_refused_combinations(flags):
    p = subprocess.run([ftune_bin(), "generate", "--model", str(TINY), "--chat", *flags],
                       capture_output=True, text=True, timeout=60, input="")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--chat" in lines[0] and flags[0] in lines[0], lines


@pytest.mark.parametrize("flags,needle", [(["--prompt", "x", "--ctx-size", "64"], "--ctx-size"),
                                          (["--prompt", "x", "--quiet"], "--quiet"),
                                          (["--chat", "--ctx-size", "8", "--max-new-tokens", "8"],
                                           "--ctx-size")])
def test_refused_ctx_flags(flags, needle):
    p = subprocess.run([ftune_bin(), "generate", "--model", str(TINY), *flags],
                       capture_output=True, text=True, timeout=60, input="")
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_tiny_sigint_stops_reply_then_exits():
    """SIGINT while a reply streams ends that reply (kept as the assistant turn) and the chat
    answers the next line; SIGINT at the prompt exits with 130."""
    # replies of up to 30000 tokens (the tiny model's 2048 positions are exceeded with a
    # warning): many seconds of streaming, so a SIGINT sent at a reply's first bytes finds it
    # running even on a loaded machine (1900 tokens took ~1 s, a window a stall could miss);
    # both turns are interrupted, so neither runs to its end. The context holds turn 1's whole
    # reply and turn 2's 30000 (no exchange dropped, however late the SIGINT lands)
    cmd = [ftune_bin(), "generate", "--model", str(TINY), "--chat", *THREADS,
           "--max-new-tokens", 30000, "--ctx-size", 65536]
    p = subprocess.Popen(list(map(str, cmd)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT)
    try:
        p.stdin.write(b"Write a very long story.\n")
        p.stdin.flush()
        assert wait_output(p.stdout, 120), "no reply streamed"
        p.send_signal(signal.SIGINT)
        err1 = read_until(p.stderr, b"ftune: turn 1:", 120)  # the reply ended
        drain(p.stdout)  # the rest of its text: what stdout holds next is turn 2's
        p.stdin.write(b"Hi\n")
        p.stdin.flush()
        assert wait_output(p.stdout, 120), "no second reply streamed"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=300)  # stdin closed: end of input, exit 0
    finally:
        if p.poll() is None:
            p.kill()
    err = (err1 + err).decode(errors="replace")
    assert p.returncode == 0, err
    st = turns(err)
    assert [t[0] for t in st] == [1, 2], err
    assert st[0][5] == "interrupted" and 0 < st[0][4] < 30000, st
    assert st[1][5] == "interrupted" and 0 < st[1][4] < 30000, st
    assert "reply interrupted after" in err and "kept in the conversation" in err
    assert "dropped the oldest" not in err, err
    # turn 2 reuses turn 1's prompt (but its last token, "Response:" retokenized with the
    # reply after it: see test_tiny_three_turns_equal_records)
    assert st[1][2] >= st[0][1] - 1, st

    p = subprocess.Popen(list(map(str, cmd)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT)
    try:
        read_until(p.stderr, b"chat (", 120)  # the banner: the handler is installed
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert out == b""


def test_cpu_device_short_chat(tmp_path):
    """--device cpu-device (the CPU posing as a GPU: the executor serves the weights, bf16
    products): a short chat whose replies are the records' on the same device."""
    extra = ["--max-new-tokens", 5, "--device", "cpu-device", "--cache-dir", tmp_path / "cache"]
    _, st, _ = replay(tmp_path, TINY, ["Hello there", "How are you?"], extra)
    assert st[1][2] > 0


# ---------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (the example model): a real conversation

@pytest.fixture(scope="module")
def example():
    return example_or_skip(local_cache=True)


def test_example_three_turns(tmp_path, example):
    """Three turns, then /reset and another question: after the reset the cache keeps only
    the common start (the default system turn), the rows beyond it are cut, and the reply is
    still the record's."""
    users = ["What is the capital of France?", "And of Germany?", "Which of the two cities is larger?",
             "/reset", "Name a primary color."]
    replies, st, err = replay(tmp_path, example, users, ["--max-new-tokens", 32])
    assert "Paris" in replies[0] and "Berlin" in replies[1], replies
    # ChatML keeps earlier turns as they were: every turn reuses the whole previous prompt
    # and its reply (the reply's text retokenized as generated)
    assert all(t[2] >= p[1] + p[4] - 1 for p, t in zip(st[:3], st[1:3])), st
    assert 0 < st[3][2] < st[0][1], st  # after /reset: the system turn only
    assert "template chatml" in err
