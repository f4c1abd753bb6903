"""`ftune bench io --path PACK --stream` (offload/stream_bench.h) end to end on a small random NF4
pack of 5 layers (ftune init-model --pack): the JSON line counts the blocks of tiers.c's visit
lists (2L-1 in step 1, 2L-2 in each later step), each read once and none dropped during the
steps, with positive rates; the table names the rate against the raw probe. Bad input is
refused with one "ftune: " line: stream options without --stream, values out of range, a file
that is not a pack, a missing file. No rates are compared (no timing assertions).
"""
import json

import pytest

from cli_helpers import assert_clean_error, run_ftune

LAYERS = 5
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "num_hidden_layers": LAYERS, "vocab_size": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    cfg = d / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    r = run_ftune(["init-model", "--config", cfg, "--out", d / "m", "--pack", "--threads", "2"])
    assert r.returncode == 0, r.stderr
    p = d / "m" / "model-nf4.ftpack"
    assert p.exists()
    return p


def test_stream_json_counts(pack):
    steps = 3
    r = run_ftune(["bench", "io", "--path", pack, "--stream", "--steps", steps, "--json"])
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout.strip().splitlines()[-1])
    print(o)
    L = LAYERS
    assert o["stream"] is True and o["layers"] == L and o["steps"] == steps
    assert o["n_stage"] == 3 and o["n_slots"] == 2  # the planner's defaults for an all-disk base
    assert o["all"]["blocks"] == (2 * L - 1) + (steps - 1) * (2 * L - 2)
    assert o["steady"]["blocks"] == (steps - 1) * (2 * L - 2)
    assert o["reads"] == o["all"]["blocks"]
    assert o["dropped_in_run"] == 0
    assert 0 <= o["dropped_at_end"] <= o["n_stage"]
    assert o["all"]["bytes"] > o["steady"]["bytes"] > 0
    assert o["all"]["gb_per_s"] > 0 and o["raw_gb_per_s"] > 0 and o["all"]["ratio_to_raw"] > 0
    assert o["raw_before"]["gb_per_s"] > 0 and o["raw_after"]["gb_per_s"] > 0
    assert 0 < o["all"]["busy_share"] <= 1
    assert o["compute_ms"] == 0 and o["device"] in ("cpu", "cuda")


def test_stream_table_with_compute(pack):
    r = run_ftune(["bench", "io", "--path", pack, "--stream", "--steps", 1, "--stage", 2,
                   "--slots", 3, "--compute-ms", 1, "--device", "cpu"])
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    assert "2 x " in r.stdout and "3 device slots" in r.stdout and "1 ms of compute" in r.stdout
    assert f"{2 * LAYERS - 1} blocks" in r.stdout and "% of raw" in r.stdout
    assert "steps 2-" not in r.stdout  # one step: no steady-state line


@pytest.mark.parametrize("args, needle", [
    (["--steps", "2"], "--steps needs --stream"),
    (["--compute-ms", "3"], "--compute-ms needs --stream"),
    (["--stream", "--steps", "0"], "--steps 0"),
    (["--stream", "--stage", "9"], "--stage 9"),
    (["--stream", "--slots", "1"], "--slots 1"),
    (["--stream", "--compute-ms", "-1"], "--compute-ms -1"),
])
def test_stream_bad_options(pack, tmp_path, args, needle):
    r = run_ftune(["bench", "io", "--path", pack] + args)
    assert r.returncode == 2
    assert_clean_error(r, tmp_path, needle)


def test_stream_not_a_pack(tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(b"\x01" * 65536)
    r = run_ftune(["bench", "io", "--path", f, "--stream"])
    assert r.returncode == 1
    assert_clean_error(r, tmp_path, "needs a pack file", str(f))
    r = run_ftune(["bench", "io", "--path", tmp_path / "missing.ftpack", "--stream"])
    assert r.returncode == 1
    assert_clean_error(r, tmp_path, "missing.ftpack")
