"""ftune's OpenMP spin count (cli/omp_env.c): with neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT
set, ftune runs with GOMP_SPINCOUNT=1000 (it sets it and execs itself once, before libgomp's
reading could matter); either variable set by the user is kept as given, with no re-exec.
libgomp prints the settings it loaded when OMP_DISPLAY_ENV=verbose, once per load."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from cli_helpers import ftune_bin  # noqa: E402


def loaded(extra):
    """(stdout, the GOMP_SPINCOUNT and OMP_WAIT_POLICY values of each libgomp load)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
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
    assert len(spins) == 2, spins      # libgomp's default first, then the re-exec's


def test_user_settings_are_kept():
    _, spins, _ = loaded({"GOMP_SPINCOUNT": "5"})
    assert spins == ["5"], spins
    _, spins, policies = loaded({"OMP_WAIT_POLICY": "active"})
    assert policies == ["ACTIVE"] and len(spins) == 1 and spins[0] != "1000", (policies, spins)
