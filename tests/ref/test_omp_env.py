"""ftune's OpenMP spin count (cli/omp_env.c): with none of libgomp's wait or binding variables
set, ftune runs with GOMP_SPINCOUNT=1000 (it sets it and execs itself once, before any library
loads, libgomp reading it only when it loads); a wait policy, spin count or thread binding set
by the user is kept as given. OPENBLAS_NUM_THREADS=1 is set the same way unless the user set it
(issue 31: no OpenBLAS worker thread, which could fail to start under `ulimit -v`). libgomp prints the settings it loaded when OMP_DISPLAY_ENV=verbose,
once per load."""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from cli_helpers import TINY, ftune_bin, read_until  # noqa: E402


def clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_PROC_BIND", "OMP_PLACES",
                                 "GOMP_CPU_AFFINITY"))}


def loaded(extra):
    """(stdout, the GOMP_SPINCOUNT and OMP_WAIT_POLICY values of each libgomp load)."""
    env = clean_env()
    env.update(extra, OMP_DISPLAY_ENV="verbose")
    r = subprocess.run([ftune_bin(), "--version"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    spins = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", r.stderr)
    policies = re.findall(r"OMP_WAIT_POLICY = '(\w+)'", r.stderr)
    return r.stdout, spins, policies


def test_default_spin_count_is_1000():
    out, spins, _ = loaded({})
    assert out.strip().startswith("ftune ") and len(out.splitlines()) == 1, out
    assert spins[-1] == "1000", spins  # the load that runs the command
    # one load: the exec happens in the executable's .preinit_array, before libgomp loads
    assert len(spins) == 1, spins


def test_user_settings_are_kept():
    _, spins, _ = loaded({"GOMP_SPINCOUNT": "5"})
    assert spins == ["5"], spins
    _, spins, policies = loaded({"OMP_WAIT_POLICY": "active"})
    assert policies == ["ACTIVE"] and len(spins) == 1 and spins[0] != "1000", (policies, spins)


def test_thread_binding_is_kept():
    # libgomp binds the main thread when it loads; a re-exec would inherit that one-CPU mask
    _, spins, _ = loaded({"OMP_PROC_BIND": "true"})
    assert len(spins) == 1 and spins[0] != "1000", spins
    _, spins, _ = loaded({"OMP_PLACES": "cores"})
    assert len(spins) == 1, spins


def test_process_keeps_its_name():
    # the re-exec runs the file's own path, not /proc/self/exe (whose name would be "exe")
    p = subprocess.Popen([ftune_bin(), "generate", "--model", TINY, "--chat", "--threads", "1"],
                         env=clean_env(), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        read_until(p.stderr, b"chat (", 60)  # the banner: running, after the re-exec
        with open(f"/proc/{p.pid}/comm") as f:
            assert f.read().strip() == os.path.basename(ftune_bin())[:15]
    finally:
        p.stdin.close()
        p.wait(timeout=60)


def test_openblas_single_threaded_from_the_start():
    """OPENBLAS_NUM_THREADS=1 in ftune's own environment (set before OpenBLAS loads); the
    user's value kept."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for extra, want in (({}, "1"), ({"OPENBLAS_NUM_THREADS": "3"}, "3")):
            env = clean_env()
            env.pop("OPENBLAS_NUM_THREADS", None)
            env.update(extra)
            p = subprocess.Popen([ftune_bin(), "tokenize", "--model", str(TINY), "--texts", "-"],
                                 env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, cwd=d)
            try:  # it waits on stdin; its environment is final once the exec is done
                t0 = time.monotonic()
                while True:
                    penv = open(f"/proc/{p.pid}/environ", "rb").read().split(b"\0")
                    if any(v.startswith(b"OPENBLAS_NUM_THREADS=") for v in penv) or \
                            time.monotonic() - t0 > 20:
                        break
                    time.sleep(0.05)
            finally:
                p.kill()
                p.wait(timeout=60)
            assert f"OPENBLAS_NUM_THREADS={want}".encode() in penv, penv
