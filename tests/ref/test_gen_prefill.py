"""`ftune generate --prompts` prefills the prompts that start together in one forward
(src/infer/generate.h ft_gen_prefill; src/infer/gen_batch.c seqs_prefill): the first --batch
records, then those taking the KV cache rows (sequences) of records that finished in the same
step, as far as the chunk holds them (a prompt longer than the chunk alone, in chunks).

  - the lines are those of --batch 1 and of FTUNE_GEN_PREFILL=each (one prompt per forward,
    as before), greedy and sampled, on the tiny fixture (a prompt longer than the 1024-token
    chunk among them) and on the example SmolLM2-135M-Instruct Q4_1 GGUF, fp32 and
    --quant nf4 (skipped when scripts/fetch_example.sh cannot provide it). The prompts'
    projections run as one GEMM over all their rows, which can round a row's values in the
    last bits differently from the prompt's own GEMM (test_generate.c FT_TOL_PREFILL_REL), so
    this holds as long as no step has a near tie; it held on every run here;
  - on --device cpu-device with a base streamed within --gpu-mem (the offload executor's
    pinned host tier), the lines are the same and the executor visits each layer once per
    prefill forward: L fewer visits for every prompt prefilled with another.

The summary line on stderr gives the counts: "...; N prefill forwards (M prompts prefilled
with others)[, V layer visits]".
"""
import json
import os
import re
import subprocess

import pytest

from cli_helpers import SEED_DATA, TINY, ftune_bin, run_ftune
from gen_helpers import example_or_skip, streamed_budget, streamed_nf4_model

SUMMARY = re.compile(r"(\d+) decode steps\); (\d+) prefill forwards \((\d+) prompts prefilled "
                     r"with others\)(?:, (\d+) layer visits)?(?: \(([0-9.]+) MiB streamed\))?")


def gen(model, prompts, *extra, each=False):
    """Runs generate --prompts; returns (lines without "seconds", decode steps, prefill
    forwards, prompts prefilled with others, (layer visits, MiB streamed) or None, stderr)."""
    env = dict(os.environ)
    env.pop("FTUNE_GEN_PREFILL", None)
    if each:
        env["FTUNE_GEN_PREFILL"] = "each"
    cmd = [ftune_bin(), "generate", "--model", str(model), "--prompts", str(prompts),
           *map(str, extra)]
    p = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", env=env,
                       timeout=900)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stderr}"
    m = SUMMARY.search(p.stderr)
    assert m, p.stderr
    lines = [{k: v for k, v in json.loads(l).items() if k != "seconds"}
             for l in p.stdout.splitlines()]
    visits = (int(m.group(4)), float(m.group(5) or 0)) if m.group(4) else None
    return lines, int(m.group(1)), int(m.group(2)), int(m.group(3)), visits, p.stderr


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_tiny_batched_prefill_same_lines(tmp_path):
    """9 records of 2..1100 tokens, --batch 4: the first four prefilled in one forward, the
    1100-token one (longer than the 1024-token chunk) alone in two; greedy and sampled, the
    lines of --batch 1 and of one prompt per forward."""
    recs = [{"prompt": f"Tell me about the river and the fox, number {i}."} for i in range(5)]
    recs += ["hi", {"prompt": " ".join(["word"] * 1100), "max_new_tokens": 3},
             {"instruction": "Add.", "input": "2 and 3", "output": "5"},
             {"prompt": "What is two plus two?", "max_new_tokens": 2}]
    path = write_jsonl(tmp_path / "p.jsonl", recs)
    for extra in (["--max-new-tokens", 10], ["--max-new-tokens", 10, "--temperature", 1.0,
                                              "--seed", 11]):
        base = ["--threads", 2, *extra]
        four, steps4, fw4, batched4, _, err = gen(TINY, path, *base, "--batch", 4)
        each, steps_e, fw_e, batched_e, _, _ = gen(TINY, path, *base, "--batch", 4, each=True)
        one, _, fw1, batched1, _, _ = gen(TINY, path, *base, "--batch", 1)
        print(f"{extra}: --batch 4: {fw4} prefill forwards ({batched4} prompts batched), "
              f"{steps4} decode steps; one prompt per forward: {fw_e}; --batch 1: {fw1}")
        assert len(four) == len(recs) and [x["index"] for x in four] == list(range(len(recs)))
        assert four == one, (four, one)
        assert four == each
        assert steps4 == steps_e  # the same records finish at the same steps
        # one prompt per forward: 8 + 2 (the long prompt in two chunks); --batch 1 the same
        assert (fw_e, batched_e) == (10, 0) and (fw1, batched1) == (10, 0), (fw_e, fw1)
        # batched: at least the first four in one forward
        assert batched4 >= 4 and fw4 <= fw_e - 3, err
        assert any(x["prompt_tokens"] > 1024 for x in four)


@pytest.fixture(scope="module")
def example():
    return example_or_skip()


@pytest.mark.parametrize("quant", [[], ["--quant", "nf4"]], ids=["fp32", "nf4"])
def test_example_batched_prefill_same_lines(tmp_path, example, quant):
    """SmolLM2-135M-Instruct, 6 Alpaca prompts (ChatML, 39..101 tokens), 12 new tokens,
    --batch 4: the lines of --batch 1."""
    recs = [json.loads(l) for l in SEED_DATA.read_text().splitlines()[:6]]
    path = write_jsonl(tmp_path / "p.jsonl", recs)
    base = ["--threads", 2, "--max-new-tokens", 12, "--cache-dir", tmp_path / "cache", *quant]
    four, _, fw4, batched4, _, _ = gen(example, path, *base, "--batch", 4)
    one, _, fw1, _, _, _ = gen(example, path, *base, "--batch", 1)
    print(f"{quant or 'fp32'}: --batch 4: {fw4} prefill forwards ({batched4} prompts batched); "
          f"--batch 1: {fw1}")
    assert four == one, (four, one)
    assert batched4 >= 4 and fw4 < fw1 == 6


def test_cpu_device_streamed_fewer_visits(tmp_path):
    """--device cpu-device, an NF4 base of 16 layers within a --gpu-mem that streams most of
    it from pinned host memory: --batch 4 over 5 records gives the lines of one prompt per
    forward (FTUNE_GEN_PREFILL=each, as before), with one visit of each layer per forward, so L visits and their
    streamed bytes fewer for every prefill forward saved."""
    model = streamed_nf4_model(tmp_path)
    recs = [{"prompt": f"Once upon a time, number {i}, in a village by the sea"} for i in range(5)]
    path = write_jsonl(tmp_path / "p.jsonl", recs)
    base = ["--raw", "--max-new-tokens", 3, "--device", "cpu-device", "--threads", 2]
    # the fixed part and the slots of the smallest plan, from the refusal of a 1 MiB budget;
    # 20 MiB more holds a few of the 16 layers (3.7 MB each): the rest streamed
    r = run_ftune(["generate", "--model", model, "--prompts", path, *base, "--batch", 4,
                   "--gpu-mem", "1M"])
    budget = streamed_budget(r, 0.02)
    base += ["--gpu-mem", budget]
    four, steps4, fw4, batched4, (v4, mib4), err = gen(model, path, *base, "--batch", 4)
    each, steps_e, fw_e, _, (v_e, mib_e), _ = gen(model, path, *base, "--batch", 4, each=True)
    print(f"budget {budget}: --batch 4: {fw4} prefill forwards, {v4} layer visits, {mib4} MiB "
          f"streamed; one prompt per forward: {fw_e}, {v_e} layer visits, {mib_e} MiB")
    assert four == each
    assert steps4 == steps_e and fw4 < fw_e == 5 and batched4 >= 4
    # one visit of each layer per forward (prefill or decode step), the same layers streamed
    assert v4 == 16 * (fw4 + steps4) and v_e == 16 * (fw_e + steps_e), (v4, v_e)
    assert mib4 > 0 and abs(mib4 / (fw4 + steps4) - mib_e / (fw_e + steps_e)) < 0.2, (mib4, mib_e)
