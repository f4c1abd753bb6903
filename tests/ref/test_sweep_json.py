"""sweep.json against its schema (tests/ref/sweep_schema.json): the files that
src/train/sweep_state.c writes for the sweeps of tests/unit/test_sweep_state.c (a halving
sweep in progress and finished, one without pruning and options of every type, one not
started), written by that test binary's --write-examples mode, validate; and the schema
refuses documents that break it, so that the validation is not vacuous."""
import copy
import json
import subprocess
from pathlib import Path

import jsonschema
import pytest

from cli_helpers import ftune_path

SCHEMA = json.loads((Path(__file__).parent / "sweep_schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
EXAMPLES = ("sweep_halving_running.json", "sweep_halving_done.json", "sweep_none.json", "sweep_pending.json")


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """The example sweep.json files, as {file name: parsed document}."""
    writer = Path(ftune_path()).parent / "tests" / "test_sweep_state"
    assert writer.exists(), f"{writer} not built (make tests)"
    out = tmp_path_factory.mktemp("sweep")
    r = subprocess.run([str(writer), "--write-examples", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {name: json.loads((out / name).read_text()) for name in EXAMPLES}


def test_schema_is_valid():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("name", EXAMPLES)
def test_written_files_validate(examples, name):
    doc = examples[name]
    errors = sorted(VALIDATOR.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    # what the schema cannot say: names are unique, best is a completed trial of the lowest
    # best_eval_loss (or null when no completed trial has one)
    names = [t["name"] for t in doc["trials"]]
    assert len(set(names)) == len(names)
    done = [t for t in doc["trials"] if t["status"] == "completed" and t["best_eval_loss"] is not None]
    want = min(done, key=lambda t: t["best_eval_loss"])["name"] if done else None
    assert doc["best"] == want
    for t in doc["trials"]:
        assert len(t["rung_losses"]) <= len(doc["prune"]["rung_steps"])


def test_examples_cover_the_format(examples):
    """Every status, null losses, a seed above 2^53 as a string, booleans and both prune methods
    occur in the examples, so the schema is checked against each."""
    trials = [t for d in examples.values() for t in d["trials"]]
    assert {t["status"] for t in trials} == {"pending", "running", "pruned", "completed", "failed"}
    assert any(t["best_eval_loss"] is None for t in trials)
    assert any(t["params"].get("seed") == "18446744073709551615" for t in trials)
    assert any(isinstance(v, bool) for t in trials for v in t["params"].values())
    assert {d["prune"]["method"] for d in examples.values()} == {"none", "halving"}
    assert any(d["best"] is None for d in examples.values())
    done = examples["sweep_halving_done.json"]
    assert done["best"] == "lr2e-4_r16"
    assert done["trials"][1]["params"] == {"lr": 1e-4, "lora_r": 16}
    assert done["trials"][2]["error"].startswith("trial lr2e-4_r8: ")


def _broken(doc, path, value):
    """doc with the item at path (keys and indexes) set to value, or removed when value is
    the _DELETE marker."""
    d = copy.deepcopy(doc)
    o = d
    for k in path[:-1]:
        o = o[k]
    if value is _DELETE:
        del o[path[-1]]
    else:
        o[path[-1]] = value
    return d


_DELETE = object()

BREAKS = [
    (("version",), 2),
    (("version",), _DELETE),
    (("extra",), 1),
    (("best",), 3),
    (("prune", "method"), "asha"),
    (("prune", "eta"), 1),
    (("prune", "adapters_per_pass"), 0),
    (("prune", "rung_steps"), [0]),
    (("prune", "rung_steps"), [1.5]),
    (("trials",), {}),
    (("trials", 0, "status"), "done"),
    (("trials", 0, "name"), "lr 1e-4"),
    (("trials", 0, "name"), "../escape"),
    (("trials", 0, "name"), "x" * 128),
    (("trials", 0, "name"), _DELETE),
    (("trials", 0, "params"), {}),
    (("trials", 0, "params"), {"Learning-Rate": 1e-4}),
    (("trials", 0, "params", "lr"), [1e-4]),
    (("trials", 0, "best_eval_loss"), "1.9"),
    (("trials", 0, "best_eval_step"), -1),
    (("trials", 0, "steps"), 2.5),
    (("trials", 0, "tokens"), _DELETE),
    (("trials", 0, "rung_losses"), []),          # pruned without the rung it was pruned at
    (("trials", 0, "rung_losses"), ["1.9"]),
    (("trials", 0, "comment"), "x"),
    (("trials", 2, "error"), _DELETE),           # failed without its error
    (("trials", 2, "error"), 5),
]


@pytest.mark.parametrize("path,value", BREAKS, ids=[".".join(map(str, p)) + "=" + repr(v)[:20] for p, v in BREAKS])
def test_schema_refuses_broken_documents(examples, path, value):
    doc = examples["sweep_halving_done.json"]
    assert VALIDATOR.is_valid(doc)
    assert not VALIDATOR.is_valid(_broken(doc, path, value))


def test_schema_refuses_rung_losses_of_a_pending_trial(examples):
    doc = copy.deepcopy(examples["sweep_pending.json"])
    assert VALIDATOR.is_valid(doc)
    doc["trials"][0]["rung_losses"] = [1.0]
    assert not VALIDATOR.is_valid(doc)
