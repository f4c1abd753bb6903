"""`ftune sweep` under mpirun (issue 35 item 3) on tests/fixtures/tiny-llama, CPU backend, one
thread per rank, Open MPI's mpirun --oversubscribe:

- a 4-trial sweep (lr 1e-3, 2e-3 x lora_r 8, 16) under -np 2 (trial t on rank t % 2, each
  trained by its rank alone, no all-reduce) gives every trial the adapter bytes, per-step
  losses and eval losses of the single-process sweep, and one sweep.json (rank 0's, the
  records of both ranks gathered) with the same 4 trial records and best, best/ and
  report.html;
- --resume of that sweep under -np 2 reads each rank's resume file and ends with the same
  files; a single-process sweep's state resumed under -np 2 is refused with one line (its
  trials were not run with that split);
- --prune halving over 2 ranks: each pass's rung losses all-gathered, so the rungs compare the
  trials of both ranks at the same eval points: the same sweep.json and adapters as the
  single-process sweep; its --resume over 2 ranks is refused (not supported yet);
- one sweep per --out (issue 31 class 7): rank 0, the writing rank, alone takes DIR's lock
  (a 2-rank sweep into a fresh folder is not refused by its own other rank), none is left
  under DIR after the sweep, and a folder another process holds is refused at once under
  -np 2, naming the holder's pid, nothing in it changed.

Skips, saying why, where mpirun is missing or ftune was built without MPI."""
import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cli_helpers import SEED_DATA, TINY, adapter_bytes, ftune_path, metrics, mpi_skip_reason, tree

FTUNE = ftune_path()
TIMEOUT = 400  # seconds for one job (2 shared cores)
BASE = ["--model", str(TINY), "--data", str(SEED_DATA), "--seq-len", "64", "--threads", "1",
        "--seed", "5", "--eval-fraction", "0.2", "--eval-max", "4",
        "--grid", "lr=1e-3,2e-3", "--grid", "lora_r=8,16", "--max-steps", "4", "--eval-every", "2"]
NAMES = ["lr1e-3_r8", "lr1e-3_r16", "lr2e-3_r8", "lr2e-3_r16"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


REASON = mpi_skip_reason(FTUNE)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def mpirun(n):
    argv = ["mpirun", "--oversubscribe", "-np", str(n), "-x", "OMP_NUM_THREADS"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    return argv


def sweep(out, *extra, ranks=0, ok=True):
    argv = (mpirun(ranks) if ranks else []) + [FTUNE, "sweep", "--out", str(out)] + BASE + \
        [str(x) for x in extra]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=ENV)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def records(out):
    """sweep.json's trial records and best (adapters_per_pass is each process's own K)."""
    j = json.loads((Path(out) / "sweep.json").read_text())
    return j["trials"], j["best"]


def trajectory(run):
    st, ev = metrics(run)
    return [(s["step"], s["loss"], s["grad_norm"]) for s in st], [(e["step"], e["eval_loss"]) for e in ev]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweepmpi")
    one, two = d / "one", d / "two"
    sweep(one, "--adapters-per-pass", 4)
    r = sweep(two, "--adapters-per-pass", 2, ranks=2)
    return one, two, r


def test_two_ranks_equal_single_process(sweeps):
    one, two, r = sweeps
    assert "sweep over 2 ranks" in r.stderr, r.stderr
    trials, best = records(two)
    assert [t["name"] for t in trials] == NAMES
    assert all(t["status"] == "completed" and t["steps"] == 4 for t in trials), trials
    assert records(two) == records(one)
    for name in NAMES:
        a, b = one / "trials" / name, two / "trials" / name
        assert adapter_bytes(b) == adapter_bytes(a), name
        assert trajectory(b) == trajectory(a), name
    assert adapter_bytes(two / "best") == adapter_bytes(one / "trials" / best)
    assert (two / "report.html").is_file()
    # rank 0 prints: one done line
    assert r.stderr.count("ftune: sweep done: ") == 1, r.stderr


def test_resume_same_ranks(sweeps, tmp_path):
    _, two, _ = sweeps
    again = tmp_path / "again"
    shutil.copytree(two, again)
    before = {n: adapter_bytes(again / "trials" / n) for n in NAMES}
    assert (again / "sweep.resume.json").is_file() and (again / "sweep.resume.1.json").is_file()
    sweep(again, "--adapters-per-pass", 2, "--resume", ranks=2)
    assert records(again) == records(two)
    assert {n: adapter_bytes(again / "trials" / n) for n in NAMES} == before


def test_resume_other_ranks_refused(sweeps, tmp_path):
    one, _, _ = sweeps
    again = tmp_path / "again"
    shutil.copytree(one, again)
    r = sweep(again, "--adapters-per-pass", 4, "--resume", ranks=2, ok=False)
    assert r.returncode != 0
    assert "resume with the number of ranks the sweep ran with" in r.stderr, r.stderr


def test_halving_across_ranks(tmp_path):
    """--prune halving (eta 2, rungs at steps 2 and 4 of 6) over 2 ranks of 2 adapters per pass:
    each pass's rung losses are all-gathered, so the rungs rank all 4 trials as the
    single-process sweep of 4 adapters per pass does: the same pruned trials, records and
    adapter bytes; a pruned trial of rank 1 may be pruned by rank 0's losses."""
    one, two = tmp_path / "one", tmp_path / "two"
    extra = ["--prune", "halving", "--max-steps", 6]
    sweep(one, *extra, "--adapters-per-pass", 4)
    r = sweep(two, *extra, "--adapters-per-pass", 2, ranks=2)
    trials, best = records(two)
    status = [t["status"] for t in trials]
    assert status.count("pruned") == 3 and status.count("completed") == 1, trials
    assert records(two) == records(one)
    for name in NAMES:
        a, b = one / "trials" / name, two / "trials" / name
        assert adapter_bytes(b) == adapter_bytes(a), name
        assert trajectory(b) == trajectory(a), name
    # rank 0 prints every pruning, its own trials' and rank 1's
    assert r.stderr.count(" pruned at step ") == 3, r.stderr
    r = sweep(two, *extra, "--adapters-per-pass", 2, "--resume", ranks=2, ok=False)
    assert r.returncode != 0
    assert "--resume of a --prune halving sweep over 2 ranks: not supported yet" in r.stderr, r.stderr


def test_lock_rank0_only(tmp_path):
    out = tmp_path / "s"
    r = sweep(out, "--max-steps", "2", ranks=2)  # both ranks: not refused by each other
    assert "in use" not in r.stderr and "took over" not in r.stderr, r.stderr
    assert sorted(Path(out).rglob(".ftune.lock")) == []
    before = tree(out)
    with open(out / ".ftune.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write("4242\n")
        f.flush()
        r = sweep(out, "--max-steps", "2", ranks=2, ok=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"ftune: rank 0 of 2: --out {out} is in use by another ftune run (pid 4242 holds "
            f"{out}/.ftune.lock)") in r.stderr, r.stderr
    after = tree(out)
    assert after.pop(".ftune.lock") == b"4242\n"
    assert after == before
