"""`ftune train --eval-prompts FILE` (src/train/eval_samples.c): greedy sample replies at
every evaluation, on the training session's base, into OUT/samples.jsonl, TensorBoard's text
plugin and the report.

- the adapter (final and checkpoints) is byte-identical with and without --eval-prompts
  (CPU; the example model, and the tiny one with --lora-dropout and NEFTune on), on every
  placement of the base: in host memory, an NF4 pack, a device backend (cpu-device) resident
  and streamed beyond --gpu-mem, where generation reads the training executor's weights;
- samples.jsonl holds one {"step", "prompt", "reply"} line per prompt per evaluation (the
  step-0 one, each --eval-every, the final one), in file order;
- each reply equals `ftune generate --json` (greedy) with the adapter saved at that step
  (a checkpoint, or the final adapter) on the same placement;
- the event file holds one text-plugin table (prompt, reply) per evaluation step, read back
  with TensorBoard's EventAccumulator, equal to samples.jsonl;
- report.html shows the samples;
- a run resumed from a mid-run checkpoint ends with the samples.jsonl of an uninterrupted run;
- bad files (missing, empty, too many prompts, a malformed line, a record that is no prompt)
  and a run without evaluations are refused with one line naming the file (and the line).
"""
import json
import re
import subprocess
from pathlib import Path

import pytest

from cli_helpers import SEED_DATA, TINY, assert_clean_error, ftune_bin
from gen_helpers import example_or_skip

TIMEOUT = 600
TINY_ARGS = ["--seq-len", "64", "--threads", "2", "--seed", "7", "--eval-fraction", "0.2",
             "--eval-max", "8", "--warmup-steps", "2"]
PROMPTS = ['"Give three tips for staying healthy."',
           json.dumps({"prompt": "What is 2+2?", "system": "Answer briefly."}),
           json.dumps({"messages": [{"role": "user", "content": "Name a color."},
                                    {"role": "assistant", "content": "Blue."}]}),
           json.dumps({"instruction": "Translate to French", "input": "good morning"})]
# the text each record reports as its prompt (generate.h ft_gen_req: the last user turn)
PROMPT_TEXT = ["Give three tips for staying healthy.", "What is 2+2?", "Name a color.",
               "Translate to French\n\ngood morning"]


def train(model, out, *extra, ok=True, args=TINY_ARGS):
    r = subprocess.run([ftune_bin(), "train", "--model", str(model), "--data", str(SEED_DATA),
                        "--out", str(out)] + args + [str(a) for a in extra],
                       capture_output=True, text=True, timeout=TIMEOUT)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def prompts_file(tmp_path, lines=PROMPTS, name="prompts.jsonl"):
    p = Path(tmp_path) / name
    p.write_text("".join(l + "\n" for l in lines))
    return p


def samples(out):
    txt = (Path(out) / "samples.jsonl").read_text()
    assert txt.endswith("\n")
    rows = [json.loads(l) for l in txt.splitlines()]
    for r in rows:
        assert set(r) == {"step", "prompt", "reply"}, r
        assert isinstance(r["step"], int) and isinstance(r["reply"], str)
    return rows


def adapters(out):
    """{relative path: bytes} of every adapter_model.safetensors under out."""
    return {str(p.relative_to(out)): p.read_bytes()
            for p in sorted(Path(out).rglob("adapter_model.safetensors"))}


def check_layout(rows, steps, texts):
    """rows: for each step in order, one line per prompt in file order."""
    assert [r["step"] for r in rows] == [s for s in steps for _ in texts]
    assert [r["prompt"] for r in rows] == texts * len(steps)


def text_tab_check(tb_dir, rows):
    """What TensorBoard's Text tab serves for tag "samples" (its TextPlugin over the event
    multiplexer, as `tensorboard --logdir` runs it): per step an HTML table, a row per prompt."""
    pem = pytest.importorskip("tensorboard.backend.event_processing.plugin_event_multiplexer")
    dp = pytest.importorskip("tensorboard.backend.event_processing.data_provider")
    base_plugin = pytest.importorskip("tensorboard.plugins.base_plugin")
    text_plugin = pytest.importorskip("tensorboard.plugins.text.text_plugin")
    context = pytest.importorskip("tensorboard.context")
    mux = pem.EventMultiplexer({"run": str(tb_dir)})
    mux.Reload()
    ctx = base_plugin.TBContext(data_provider=dp.MultiplexerDataProvider(mux, str(tb_dir)),
                                logdir=str(tb_dir), multiplexer=mux)
    plugin = text_plugin.TextPlugin(ctx)
    assert plugin.index_impl(context.RequestContext(), experiment="") == {"run": ["samples"]}
    got = plugin.text_impl(context.RequestContext(), "run", "samples", experiment="",
                           enable_markdown=True)
    steps = sorted({r["step"] for r in rows})
    assert [g["step"] for g in got] == steps
    for g in got:
        mine = [r for r in rows if r["step"] == g["step"]]
        assert g["text"].count("<tr>") == len(mine)
        assert all(r["prompt"].split("\n")[0] in g["text"] for r in mine)


def test_tiny_identical_counts_tensorboard_report(tmp_path):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    tensor_util = pytest.importorskip("tensorboard.util.tensor_util")
    p = prompts_file(tmp_path)
    common = ["--max-steps", "7", "--eval-every", "3", "--save-every", "3", "--keep", "0",
              "--neftune-noise-alpha", "5", "--lora-dropout", "0.1"]
    plain, with_s = tmp_path / "plain", tmp_path / "samples"
    train(TINY, plain, *common)
    train(TINY, with_s, *common, "--eval-prompts", p, "--eval-max-new-tokens", "5",
          "--tensorboard")
    a, b = adapters(plain), adapters(with_s)
    assert set(a) == {"adapter_model.safetensors", "checkpoint-3/adapter_model.safetensors",
                      "checkpoint-6/adapter_model.safetensors",
                      "checkpoint-7/adapter_model.safetensors"}, set(a)
    assert a == b  # bit for bit
    assert not (plain / "samples.jsonl").exists()
    rows = samples(with_s)
    check_layout(rows, [0, 3, 6, 7], PROMPT_TEXT)  # start, every 3, the final eval
    # TensorBoard's text plugin: one (prompts x 2) table per evaluation step
    acc = ea.EventAccumulator(str(with_s / "tb"), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    assert "samples" in acc.PluginTagToContent("text")
    events = acc.Tensors("samples")
    assert [e.step for e in events] == [0, 3, 6, 7]
    for e in events:
        arr = tensor_util.make_ndarray(e.tensor_proto)
        assert arr.shape == (len(PROMPTS), 2)
        got = [[c.decode() for c in row] for row in arr]
        assert got == [[r["prompt"], r["reply"]] for r in rows if r["step"] == e.step]
    text_tab_check(with_s / "tb", rows)
    html = (with_s / "report.html").read_text()
    assert "<h2>Samples</h2>" in html and html.count("<summary>step ") == 4
    assert "Translate to French" in html


def test_resume_keeps_samples(tmp_path):
    p = prompts_file(tmp_path, PROMPTS[:2])
    common = ["--max-steps", "8", "--eval-every", "2", "--save-every", "4", "--keep", "0",
              "--eval-prompts", p, "--eval-max-new-tokens", "3"]
    full, res = tmp_path / "full", tmp_path / "resumed"
    train(TINY, full, *common)
    train(TINY, res, *common)
    # a torn line after the checkpoint's step, as a crash could leave
    with open(res / "samples.jsonl", "a") as f:
        f.write('{"step": 9, "prompt": "x", "re')
    train(TINY, res, *common, "--resume", res / "checkpoint-4")
    assert samples(res) == samples(full)
    check_layout(samples(res), [0, 2, 4, 6, 8], PROMPT_TEXT[:2])


@pytest.mark.parametrize("placement", [[], ["--quant", "nf4"], ["--device", "cpu-device"],
                                       ["--device", "cpu-device", "--quant", "nf4"]],
                         ids=["cpu", "cpu-nf4", "cpu-device", "cpu-device-nf4"])
def test_placements_identical_and_generate(tmp_path, placement):
    """The base in the host's memory (read in place), an NF4 pack on the host, a device
    backend (the executor's weights: ft_exec_gen_source, the KV cache reserved before the
    placement): the same adapters, and each reply is `ftune generate`'s on that placement with
    the adapter of that step (a learning rate high enough that the tiny model's replies
    change)."""
    place = placement + ["--cache-dir", tmp_path / "packs"]
    p = prompts_file(tmp_path, PROMPTS[:2])
    common = ["--max-steps", "8", "--eval-every", "4", "--save-every", "4", "--keep", "0",
              "--lr", "3e-2"] + place
    plain, out = tmp_path / "plain", tmp_path / "samples"
    train(TINY, plain, *common)
    train(TINY, out, *common, "--eval-prompts", p, "--eval-max-new-tokens", "6")
    assert adapters(plain) == adapters(out)
    rows = samples(out)
    check_layout(rows, [0, 4, 8], PROMPT_TEXT[:2])
    assert len({r["reply"] for r in rows}) > 1
    for r in rows:
        adapter = ["--adapter", out / f"checkpoint-{r['step']}"] if r["step"] else []
        g = subprocess.run([ftune_bin(), "generate", "--model", str(TINY), "--prompt",
                            r["prompt"], "--max-new-tokens", "6", "--threads", "2", "--json"]
                           + [str(a) for a in adapter + place]
                           + (["--system", "Answer briefly."] if r["prompt"] == "What is 2+2?" else []),
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert g.returncode == 0, g.stderr
        assert json.loads(g.stdout)["text"] == r["reply"], r


def test_streamed_base_identical_and_generate(tmp_path):
    """A base streamed on a device (cpu-device, NF4 layers beyond --gpu-mem in pinned host
    memory): generation reads the layers through the training executor's tiers; the adapter is
    the one of the run without --eval-prompts, the final reply `ftune generate`'s on the same
    budget."""
    from gen_helpers import streamed_budget, streamed_nf4_model
    model = streamed_nf4_model(tmp_path)
    p = prompts_file(tmp_path, PROMPTS[:2])
    common = ["--max-steps", "2", "--eval-every", "2", "--save-every", "0", "--lora-r", "2",
              "--eval-max", "2", "--lr", "3e-2", "--device", "cpu-device"]
    samp = ["--eval-prompts", p, "--eval-max-new-tokens", "3"]
    r = train(model, tmp_path / "refused", *common, *samp, "--gpu-mem", "1M", ok=False)
    budget = ["--gpu-mem", streamed_budget(r, 0.04)]
    plain, out = tmp_path / "plain", tmp_path / "samples"
    train(model, plain, *common, *budget)
    r = train(model, out, *common, *samp, *budget)
    assert re.search(r"plan: 16 layers: .* [1-9][0-9]* in pinned host memory", r.stderr), r.stderr
    assert adapters(plain) == adapters(out)
    rows = samples(out)
    check_layout(rows, [0, 2], PROMPT_TEXT[:2])
    last = rows[-1]
    g = subprocess.run([ftune_bin(), "generate", "--model", str(model), "--adapter", str(out),
                        "--prompt", last["prompt"], "--system", "Answer briefly.",
                        "--max-new-tokens", "3", "--threads", "2", "--json", "--device",
                        "cpu-device"] + budget, capture_output=True, text=True, timeout=TIMEOUT)
    assert g.returncode == 0, g.stderr
    assert json.loads(g.stdout)["text"] == last["reply"]


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """The example model trained 4 steps with and without --eval-prompts (lr high enough
    that the replies change)."""
    model = example_or_skip()
    tmp = tmp_path_factory.mktemp("example")
    p = prompts_file(tmp, [PROMPTS[0], json.dumps({"prompt": "Write a haiku about rain."})])
    args = ["--seq-len", "64", "--threads", "2", "--seed", "7", "--eval-fraction", "0.05",
            "--eval-max", "2", "--max-steps", "4", "--eval-every", "2", "--save-every", "2",
            "--keep", "0", "--lr", "1e-2"]
    plain, with_s = tmp / "plain", tmp / "samples"
    train(model, plain, args=args)
    train(model, with_s, "--eval-prompts", p, "--eval-max-new-tokens", "16", args=args)
    return model, plain, with_s


def test_example_identical(example_runs):
    _, plain, with_s = example_runs
    a, b = adapters(plain), adapters(with_s)
    assert len(a) == 3 and a == b


def test_example_replies_equal_generate(example_runs):
    model, _, out = example_runs
    rows = samples(out)
    check_layout(rows, [0, 2, 4], [PROMPT_TEXT[0], "Write a haiku about rain."])
    assert len({r["reply"] for r in rows}) > 2  # the adapter changes what it answers
    for r in rows:
        if r["step"] == 0:
            adapter = []  # the fresh adapter's B is zero: the base model's reply
        else:
            adapter = ["--adapter", out / "checkpoint-2" if r["step"] == 2 else out]
        g = subprocess.run([ftune_bin(), "generate", "--model", str(model), "--prompt",
                            r["prompt"], "--max-new-tokens", "16", "--threads", "2", "--json"]
                           + [str(a) for a in adapter],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert g.returncode == 0, g.stderr
        assert json.loads(g.stdout)["text"] == r["reply"], r


@pytest.mark.parametrize("case", ["missing", "empty", "too_many", "malformed", "no_prompt",
                                  "no_eval"])
def test_bad_prompts_file(tmp_path, case):
    name = "prompts.jsonl"
    extra = []
    if case == "missing":
        p, needles = tmp_path / name, [name, "No such file"]
    elif case == "empty":
        p, needles = prompts_file(tmp_path, []), [name, "no prompts"]
    elif case == "too_many":
        p, needles = prompts_file(tmp_path, ['"hi"'] * 65), [name + ": line 65", "more than 64"]
    elif case == "malformed":
        p, needles = prompts_file(tmp_path, ['"hi"', '{"prompt": ']), [name + ": line 2", "malformed JSON"]
    elif case == "no_prompt":
        p, needles = prompts_file(tmp_path, ['"hi"', '{"foo": 1}']), [name + ": line 2"]
    else:
        p, needles = prompts_file(tmp_path, ['"hi"']), ["--eval-prompts", name, "--eval-fraction 0"]
        extra = ["--eval-fraction", "0"]
    out = tmp_path / "out"
    r = train(TINY, out, "--max-steps", "2", "--eval-prompts", p, *extra, ok=False)
    assert r.returncode == 1
    assert_clean_error(r, out, *needles)
    assert not (out / "samples.jsonl").exists()
