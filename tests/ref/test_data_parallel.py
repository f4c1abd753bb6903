"""Data sets are encoded in chunks of records by every OpenMP thread (src/data/dataset.c
read_file), each thread with its own word cache (src/tokenizer/tok_cache.c). The result must be that
of one thread reading one record at a time: the same examples in the same order, the same
counts (truncated, dropped, skipped), the same first error. Checked by `ftune tokenize --data`
with OMP_NUM_THREADS=1 against 3 threads, on generated files of several schemas, of more
records than one chunk (512), with bad records placed across chunk boundaries."""
import json
import os
import random

from cli_helpers import SEED_DATA, TINY, TOKENIZERS, ftune_bin, run_argv

LLAMA3 = TOKENIZERS / "llama3"


def records(n, seed, bad=()):
    """n JSONL lines of the messages schema built from the seed tasks (1-4 turns, some with a
    system message); line numbers (1-based) in `bad` get a fault each, by turns: malformed
    JSON, a key twice, nothing to train on, an unknown role."""
    rnd = random.Random(seed)
    seed_rows = [json.loads(l) for l in SEED_DATA.read_text().splitlines()]
    faults = [lambda s: s[:-3],
              lambda s: '{"messages": [], "messages": []}',
              lambda s: '{"messages": [{"role": "user", "content": "only a question"}]}',
              lambda s: '{"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}']
    out = []
    for i in range(1, n + 1):
        msgs = [{"role": "system", "content": "Be brief."}] if rnd.random() < 0.3 else []
        for _ in range(rnd.randint(1, 4)):
            r = rnd.choice(seed_rows)
            msgs.append({"role": "user", "content": (r["instruction"] + " " + r.get("input", "")).strip()})
            msgs.append({"role": "assistant", "content": r["output"]})
        line = json.dumps({"messages": msgs}, ensure_ascii=False)
        if i in bad:
            line = faults[sorted(bad).index(i) % len(faults)](line)
        out.append(line)
    return "\n".join(out) + "\n"


def run(cmd, path, threads, extra=()):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    model = LLAMA3 if cmd == "tokenize" else TINY
    argv = [ftune_bin(), cmd, "--model", str(model), "--data", str(path), *extra]
    return run_argv(argv, env=env, ok=False, timeout=600)


def data_line(r):
    """What the data set's reading says: `ftune plan`'s data line, or its error."""
    keep = [l for l in r.stderr.splitlines() if l.startswith("ftune: data ") or "error" in l
            or "line " in l]
    assert keep, r.stderr
    return keep


def same_tokens(path, extra=()):
    """`ftune tokenize --data` (every example's ids and labels) with 1 and 3 threads."""
    a, b = run("tokenize", path, 1, extra), run("tokenize", path, 3, extra)
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout
    return a


def same_counts(path, extra=()):
    """`ftune plan`'s reading of the data (counts, or the error) with 1 and 3 threads."""
    a, b = run("plan", path, 1, extra), run("plan", path, 3, extra)
    assert a.returncode == b.returncode
    assert data_line(a) == data_line(b)
    return a


def test_clean_file_same_examples(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(records(1300, 1))
    r = same_tokens(p, ["--chat-template", "llama3"])
    assert len(r.stdout.splitlines()) == 1300
    r = same_counts(p, ["--seq-len", "96", "--eval-fraction", "0"])
    assert r.returncode == 0, r.stderr
    assert "truncated to 96 tokens" in r.stderr and "dropped" in r.stderr


def test_bad_records_skipped_and_first_error(tmp_path):
    bad = (3, 511, 512, 513, 1024, 1025, 1290)  # around the 512-record chunks
    p = tmp_path / "d.jsonl"
    p.write_text(records(1300, 2, bad))
    r = same_counts(p, ["--skip-bad-records", "--seq-len", "256"])
    assert r.returncode == 0, r.stderr
    assert f"{len(bad)} skipped" in r.stderr, r.stderr
    # without skipping, the first fault in file order is the error, whichever thread met it
    r = same_counts(p, ["--seq-len", "256"])
    assert r.returncode != 0
    assert "line 3" in r.stderr, r.stderr


def test_json_array_and_preference(tmp_path):
    rows = [json.loads(l) for l in records(700, 3).splitlines()]
    p = tmp_path / "a.json"
    p.write_text(json.dumps(rows))
    assert len(same_tokens(p, ["--chat-template", "llama3"]).stdout.splitlines()) == 700
    pairs = [{"prompt": r["messages"][-2]["content"], "chosen": r["messages"][-1]["content"],
              "rejected": rows[(i + 1) % len(rows)]["messages"][-1]["content"]}
             for i, r in enumerate(rows)]
    q = tmp_path / "p.jsonl"
    q.write_text("\n".join(json.dumps(x) for x in pairs) + "\n")
    assert len(same_tokens(q, ["--preference", "--chat-template", "llama3"]).stdout.splitlines()) == 700
    r = same_counts(q, ["--method", "dpo", "--seq-len", "200"])
    assert r.returncode == 0, r.stderr
