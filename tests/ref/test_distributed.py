"""Data-parallel training over MPI ranks (issue 35; src/comm/comm.h, src/train/dist.h) on
tests/fixtures/tiny-llama, CPU backend, one thread per rank, Open MPI's mpirun --oversubscribe:

- 2 ranks of grad-accum 1 give the bytes of the adapter of 1 process of grad-accum 2 (and the
  same per-step losses), and 4 ranks of grad-accum 1 that of grad-accum 4 (with LoRA dropout
  and NEFTune noise on: their masks follow the micro-batch's index in the step, not the rank;
  across an epoch's short last step, where one rank has no micro-batch);
- with --balance-steps (each step's micro-batches grouped by cost) 2 ranks still give the
  adapter of grad-accum 2, and a resume without the flag is refused by name;
- QLoRA with 2 ranks sharing a pack cache builds one pack (the other rank waits on its lock)
  and gives the adapter of one process;
- SIGKILL of one rank (the FTUNE_TEST_KILL_AT_STEP hook) ends the job on every rank within 60 s
  with a line naming the dead rank, and a rank that hangs (SIGSTOP) is ended by the other's
  all-reduce watchdog (FTUNE_COMM_TIMEOUT); --resume with 2 ranks then ends with the bytes of the
  uninterrupted run; a resume with 4 ranks (another global batch) is refused naming the ranks,
  and one process of grad-accum 2 (the same global batch) resumes it bit for bit;
- the 2-rank equivalence through srun on a single-node Slurm started by the test (slurmctld,
  slurmd, munged on localhost), skipped with the reason where the daemons cannot start.

Skips, saying why, where mpirun is missing or ftune was built without MPI (mpi=NO in the
Makefile's [ftune] line)."""
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cli_helpers import SEED_DATA, TINY, ftune_path, metrics, mpi_skip_reason

FTUNE = ftune_path()
TIMEOUT = 240  # seconds for one job (2 shared cores)
BASE = ["--model", str(TINY), "--data", str(SEED_DATA), "--seq-len", "64", "--threads", "1",
        "--seed", "5", "--lr", "1e-3", "--eval-fraction", "0.1"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


REASON = mpi_skip_reason(FTUNE)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def mpirun(n, *env_names):
    argv = ["mpirun", "--oversubscribe", "-np", str(n), "-x", "OMP_NUM_THREADS"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    for e in env_names:
        argv += ["-x", e]
    return argv


def train(out, *extra, launcher=(), env=None, ok=True):
    argv = list(launcher) + [FTUNE, "train"] + BASE + ["--out", str(out)] + [str(x) for x in extra]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=env or ENV)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def adapter(out):
    return (Path(out) / "adapter_model.safetensors").read_bytes()


def losses(out):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in metrics(out)[0]]


def test_two_ranks_equal_grad_accum_two(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    train(one, "--max-steps", 6, "--grad-accum", 2, "--eval-every", 3, "--save-every", 2)
    r = train(two, "--max-steps", 6, "--grad-accum", 1, "--eval-every", 3, "--save-every", 2,
              launcher=mpirun(2))
    assert adapter(one) == adapter(two)
    assert losses(one) == losses(two)
    assert metrics(one)[1] and [e["eval_loss"] for e in metrics(one)[1]] == \
        [e["eval_loss"] for e in metrics(two)[1]]
    # only rank 0 prints progress: one plan line, one done line
    assert r.stderr.count("ftune: plan: ") == 1 and r.stderr.count("ftune: done: ") == 1, r.stderr


def test_four_ranks_equal_grad_accum_four(tmp_path):
    # batch 2: 27 micro-batches, 7 steps an epoch, the 7th of 3 micro-batches (rank 3 has none
    # and adds zeros); 9 steps cross into the second epoch (re-packed with a new seed)
    extra = ["--max-steps", 9, "--batch-size", 2, "--lora-dropout", 0.1, "--neftune-noise-alpha", 5]
    one, four = tmp_path / "one", tmp_path / "four"
    train(one, *extra, "--grad-accum", 4)
    train(four, *extra, "--grad-accum", 1, launcher=mpirun(4))
    assert adapter(one) == adapter(four)
    assert losses(one) == losses(four)


def test_balance_steps_two_ranks_equal_grad_accum_two(tmp_path):
    # --balance-steps groups each step's micro-batches by cost in groups of grad-accum x ranks,
    # so 2 ranks of grad-accum 1 and 1 process of grad-accum 2 see the same order; the order is
    # not the packer's (another adapter than without the flag); and a resume without the flag
    # is refused by name
    extra = ["--max-steps", 6, "--save-every", 3, "--eval-fraction", 0, "--balance-steps"]
    one, two, plain = tmp_path / "one", tmp_path / "two", tmp_path / "plain"
    train(one, *extra, "--grad-accum", 2)
    train(two, *extra, "--grad-accum", 1, launcher=mpirun(2))
    train(plain, *extra[:-1], "--grad-accum", 2)
    assert adapter(one) == adapter(two)
    assert losses(one) == losses(two)
    assert adapter(one) != adapter(plain)
    r = train(one, *extra[:-1], "--grad-accum", 2, "--resume", ok=False)
    assert r.returncode != 0 and "balance_steps: true -> (absent)" in r.stderr, r.stderr


def test_qlora_two_ranks_one_pack_build(tmp_path):
    """QLoRA (an NF4 pack built from the model) with 2 ranks sharing one cache folder: one
    rank builds the pack, the other waits on its lock and reuses it; the adapter is that of one
    process of grad-accum 2."""
    one, two = tmp_path / "one", tmp_path / "two"
    extra = ["--max-steps", 3, "--quant", "nf4"]
    train(one, *extra, "--grad-accum", 2, "--cache-dir", tmp_path / "c1")
    r = train(two, *extra, "--grad-accum", 1, "--cache-dir", tmp_path / "c2", launcher=mpirun(2))
    assert len(list((tmp_path / "c2").glob("*.ftpack"))) == 1
    # rank 0 prints its pack line ("built", or "reusing" when rank 1 built it: rank 1's own
    # lines are quiet); never two builds
    assert r.stderr.count("pack: built ") <= 1, r.stderr
    assert r.stderr.count("pack: built ") + r.stderr.count("pack: reusing ") == 1, r.stderr
    assert adapter(one) == adapter(two)


def test_rank_killed_ends_job_then_resume(tmp_path):
    out, ref = tmp_path / "out", tmp_path / "ref"
    args = ["--max-steps", 8, "--save-every", 1, "--keep", 0]
    env = dict(ENV, FTUNE_TEST_KILL_AT_STEP="4", FTUNE_TEST_KILL_RANK="1")
    t0 = time.monotonic()
    r = train(out, *args, "--grad-accum", 1, launcher=mpirun(2, "FTUNE_TEST_KILL_AT_STEP", "FTUNE_TEST_KILL_RANK"),
              env=env, ok=False)
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert took < 60, f"the job took {took:.1f} s to end after a rank died"
    text = r.stdout + r.stderr
    assert "rank 1" in text and ("signal 9" in text or "Killed" in text), text
    assert not (out / "adapter_model.safetensors").exists()
    assert (out / "checkpoint-3").is_dir() and not (out / "checkpoint-4").exists()
    # a resume with 4 ranks changes the global batch: refused, naming both
    bad = train(out, *args, "--grad-accum", 1, "--resume", launcher=mpirun(4), ok=False)
    assert bad.returncode == 1
    assert "trained by 2 rank(s) with 2 micro-batches per optimizer step; this run has 4 rank(s)" in bad.stderr, bad.stderr
    # one process of grad-accum 2 is the same global batch; it resumes into a copy
    single = tmp_path / "single"
    shutil.copytree(out, single)
    train(single, *args, "--grad-accum", 2, "--resume")
    train(out, *args, "--grad-accum", 1, "--resume", launcher=mpirun(2))
    train(ref, *args, "--grad-accum", 2)
    assert adapter(out) == adapter(ref)
    assert adapter(single) == adapter(ref)
    assert losses(out) == losses(ref)


def test_rank_hangs_watchdog_ends_job(tmp_path):
    """A rank that stops (SIGSTOP) without dying: the launcher sees nothing, the other rank's
    all-reduce watchdog (FTUNE_COMM_TIMEOUT) ends the job with one line naming the wait."""
    out = tmp_path / "out"
    env = dict(ENV, FTUNE_TEST_KILL_AT_STEP="3", FTUNE_TEST_KILL_RANK="1", FTUNE_TEST_KILL_SIGNAL="19",
               FTUNE_COMM_TIMEOUT="5")
    t0 = time.monotonic()
    r = train(out, "--max-steps", 6, "--grad-accum", 1, env=env, ok=False,
              launcher=mpirun(2, "FTUNE_TEST_KILL_AT_STEP", "FTUNE_TEST_KILL_RANK", "FTUNE_TEST_KILL_SIGNAL",
                              "FTUNE_COMM_TIMEOUT"))
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert took < 60, f"the job took {took:.1f} s to end after a rank hung"
    assert "ftune: rank 0 of 2: an all-reduce has waited 5 s for the other ranks (a rank died or hangs): ending the job" \
        in r.stderr, r.stderr


# ---- Slurm: a single-node cluster on localhost -------------------------------------------------

SLURM_CONF = """ClusterName=ftunetest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={cport}
SlurmdPort={dport}
AuthType=auth/munge
AuthAltTypes=
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
MpiDefault=pmix
ReturnToService=2
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


def _start_slurm(d):
    """Starts munged, slurmctld and slurmd under d; returns (env for srun, [Popen]) or a reason
    string."""
    for b in ("munged", "slurmctld", "slurmd", "srun"):
        if not shutil.which(b) and not Path("/usr/sbin/" + b).exists():
            return f"{b} not found (Debian: slurm-wlm, munge)"
    if os.geteuid() != 0:
        return "the single-node Slurm is started as root (slurmd runs jobs as their user)"
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    for sub in ("state", "spool", "munge"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    os.chmod(d / "munge", 0o700)
    sock = d / "munge" / "munge.socket"
    procs = []
    m = subprocess.run(["munged", "-f", "--key-file", str(key), "--socket", str(sock),
                        "--pid-file", str(d / "munge" / "munged.pid"), "--log-file", str(d / "munge" / "munged.log"),
                        "--seed-file", str(d / "munge" / "seed")],
                       capture_output=True, text=True)
    if m.returncode != 0:
        return f"munged did not start: {m.stderr.strip()[:200]}"
    conf = d / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=host, d=d, cport=17817, dport=17818, cpus=os.cpu_count() or 2))
    env = dict(ENV, SLURM_CONF=str(conf))
    # slurm's munge plugin finds the socket in its AuthInfo; the daemons read the conf
    conf.write_text(conf.read_text().replace("AuthAltTypes=\n", f"AuthInfo=socket={sock}\n"))
    for cmd in (["slurmctld", "-D", "-i", "-f", str(conf)], ["slurmd", "-D", "-f", str(conf)]):
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for _ in range(60):
        s = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        if s.returncode == 0 and s.stdout.strip().startswith("idle"):
            return env, procs
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.5)
    logs = " ".join((d / f).read_text()[-300:] for f in ("slurmctld.log", "slurmd.log") if (d / f).exists())
    _stop(procs, d)
    return f"slurmctld/slurmd did not come up on this machine: {logs.strip()[-300:]}"


def _stop(procs, d):
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    pid = d / "munge" / "munged.pid"
    if pid.exists():
        try:
            os.kill(int(pid.read_text().strip()), 15)
        except (ValueError, ProcessLookupError):
            pass


def test_slurm_srun_two_ranks(tmp_path):
    d = tmp_path / "slurm"
    got = _start_slurm(d)
    if isinstance(got, str):
        pytest.skip(got)
    env, procs = got
    try:
        one, two = tmp_path / "one", tmp_path / "two"
        train(one, "--max-steps", 4, "--grad-accum", 2)
        r = train(two, "--max-steps", 4, "--grad-accum", 1, env=env, ok=False,
                  launcher=["srun", "--mpi=pmix", "-n", "2", "-N", "1", "--overlap"])
        if r.returncode != 0 and "pmix" in (r.stderr + r.stdout).lower() and "ftune:" not in r.stderr:
            pytest.skip("srun --mpi=pmix is not available with this Slurm: " + r.stderr.strip()[-300:])
        assert r.returncode == 0, r.stdout + r.stderr
        assert adapter(one) == adapter(two)
        assert r.stderr.count("ftune: plan: ") == 1, r.stderr  # two ranks of one job, not two jobs
    finally:
        _stop(procs, d)


def test_plan_two_ranks(tmp_path):
    """ftune plan under mpirun: one placement line per rank, then the all-reduce's bytes (the
    adapter's parameters in fp32) and its time at the stated --bus-gbps."""
    argv = mpirun(2) + [FTUNE, "plan"] + BASE + ["--bus-gbps", "10"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "plan: rank 0 (node rank 0): backend cpu" in r.stderr, r.stderr
    assert "plan: rank 1 (node rank 1): backend cpu" in r.stderr, r.stderr
    # tiny-llama, r 16 on 7 modules: 32768 LoRA parameters -> 131072 bytes; ring: 2 (N-1)/N = 1
    assert "over 2 ranks: 0.1 MB per step (32768 fp32)" in r.stderr, r.stderr
    assert "0.0000 s at the stated bus bandwidth 10.0 GB/s" in r.stderr, r.stderr
