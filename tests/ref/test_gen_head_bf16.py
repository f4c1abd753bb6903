"""`ftune generate --quant nf4` on the CPU reads the pack's embeddings and LM head in bf16, as
the pack stores them (kernels.h lm_head_logits_bf16, offload/exec.h globals_lazy), instead of
fp32 copies: every reply must be the one the fp32 tables give.

The comparison is ftune against itself through FTUNE_GEN_HEAD=f32, which keeps the executor's
fp32 tables from the start and the head on lm_head_logits, the path generation took before.
(`ftune logits` is no reference here: it runs the training executor's head, an sgemm over all
rows, not generation's few-rows head.) Greedy and sampled replies, one prompt at a time
(heads of one row) and a --prompts file decoded 3 and 20 at a time (20 rows: more than
FT_LM_HEAD_BF16_ROWS, where the executor reads the fp32 tables from the pack at the first
such step), on tiny models (tied: the fixture; untied: tests/ref/make_tiny_model.py
--untied) and on the example SmolLM2-135M-Instruct Q4_1 GGUF (64 new tokens; skipped if
scripts/fetch_example.sh cannot provide it). The ids, text and stop of each reply are
compared, not the timings.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from gen_helpers import example_or_skip  # noqa: E402

TINY = os.path.join(REPO, "tests", "fixtures", "tiny-llama")


def ftune_bin():
    b = os.environ.get("FTUNE_BIN", os.path.join(REPO, "build", "ftune"))
    b = b if os.path.isabs(b) else os.path.join(REPO, b)
    assert os.access(b, os.X_OK), f"ftune binary not found at {b} (make it or set FTUNE_BIN)"
    return b


LAST_MAXRSS_KIB = [0]  # peak resident set of the last run() (VmHWM of its own address space)


def vm_hwm_kib(pid):
    """VmHWM of /proc/PID/status in KiB, or None once the process is gone. Not the child's
    ru_maxrss: subprocess starts it with vfork, and exec keeps the high-water mark of the
    address space it replaces, the parent's (a pytest process of 500 MB late in `make test`)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def run(args, f32):
    env = dict(os.environ)
    env.pop("FTUNE_GEN_HEAD", None)
    if f32:
        env["FTUNE_GEN_HEAD"] = "f32"
    cmd = [ftune_bin(), "generate", *map(str, args)]
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fo, stderr=fe)
        # VmHWM only grows: its last reading before the exit is the run's peak (up to what the
        # last few ms allocate; the tables compared are allocated at placement, early)
        hwm = 0
        while True:
            h = vm_hwm_kib(p.pid)
            if p.poll() is not None:
                break
            if h is not None:
                hwm = max(hwm, h)
            time.sleep(0.005)
        LAST_MAXRSS_KIB[0] = hwm
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode("utf-8"), fe.read().decode(errors="replace")
    assert p.returncode == 0, f"{' '.join(cmd)}\n{err}"
    return out, err


def same_reply(model, cache, *extra):
    """One --prompt run with --json, bf16 head vs fp32 tables: the same reply. Returns the
    reply, stderr and the two runs' peak resident sets in KiB (bf16, fp32)."""
    args = ["--model", model, "--quant", "nf4", "--cache-dir", cache, "--json", *extra]
    run(args, False)  # builds the pack on the first call: not measured
    new, err = run(args, False)
    rss_new = LAST_MAXRSS_KIB[0]
    old, _ = run(args, True)
    a, b = json.loads(new), json.loads(old)
    for k in ("prompt_ids", "ids", "text", "stop"):
        assert a[k] == b[k], f"{k}: bf16 head {a[k]!r}, fp32 tables {b[k]!r}"
    assert a["ids"], a
    return a, err, (rss_new, LAST_MAXRSS_KIB[0])


def test_tiny_tied_one_prompt(tmp_path):
    cache = tmp_path / "packs"
    got, err, _ = same_reply(TINY, cache, "--raw", "--prompt",
                             "Once upon a time, in a quiet village", "--max-new-tokens", 24,
                             "--threads", 2)
    assert len(got["ids"]) == 24 or got["stop"] != "length", got
    print(f"\n[tiny, tied] greedy: {got['ids']}\n{err.strip()}")
    got, _, _ = same_reply(TINY, cache, "--raw", "--prompt", "The sea", "--max-new-tokens", 24,
                        "--temperature", 0.9, "--top-k", 50, "--seed", 7, "--threads", 2)
    print(f"[tiny, tied] sampled: {got['ids']}")


def prompts_file(path, n):
    with open(path, "w") as f:
        for i in range(n):
            thing = ["cat", "ship", "rain", "hill"][i % 4]
            f.write(json.dumps(f"Story {i}: the {thing} and the") + "\n")
    return path


def same_prompts(model, cache, path, batch):
    args = ["--model", model, "--quant", "nf4", "--cache-dir", cache, "--raw", "--prompts", path,
            "--max-new-tokens", 12, "--batch", batch, "--threads", 2]
    new, err = run(args, False)
    old, _ = run(args, True)
    keys = ("index", "prompt", "reply", "prompt_tokens", "new_tokens", "stop")
    a = [{k: r.get(k) for k in keys} for r in map(json.loads, new.splitlines())]
    b = [{k: r.get(k) for k in keys} for r in map(json.loads, old.splitlines())]
    assert a == b
    return a, err


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    d = tmp_path_factory.mktemp("untied")
    subprocess.run([sys.executable, os.path.join(HERE, "make_tiny_model.py"), str(d),
                    "--untied"], check=True, capture_output=True)
    with open(d / "config.json") as f:
        assert json.load(f)["tie_word_embeddings"] is False
    return str(d)


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_tiny_prompts_batched(tmp_path, untied, which):
    model = TINY if which == "tied" else untied
    path = prompts_file(tmp_path / "p.jsonl", 20)
    for batch in (3, 20):
        got, err = same_prompts(model, tmp_path / "packs", path, batch)
        assert len(got) == 20 and f"{batch} at a time" in err, err
    print(f"\n[tiny, {which}] 20 prompts at 3 and 20 at a time: the same replies")


@pytest.fixture(scope="module")
def example():
    return example_or_skip()


def test_example_nf4(tmp_path, example):
    got, err, (rss, rss_f32) = same_reply(example, tmp_path / "packs", "--prompt",
                                          "Write a poem about the sea.", "--max-new-tokens", 64,
                                          "--threads", 2)
    assert got["stop"] == "length" and "sea" in got["text"].lower(), got
    # the bf16 tables are in use: the fp32 copy of the tied (49152, 576) table, 2 bytes a
    # value more than its bf16 one (55296 KiB; measured 55264 KiB less), never allocated
    saved = rss_f32 - rss
    print(f"\n[SmolLM2-135M Q4_1, nf4] {got['text']!r}\n{err.strip()}\npeak RSS {rss} KiB, "
          f"{rss_f32} KiB with FTUNE_GEN_HEAD=f32 ({saved} KiB more)")
    assert saved > 49152 * 576 * 2 // 1024 // 2, (rss, rss_f32)
