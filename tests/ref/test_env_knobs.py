"""The environment reaches the library only through the program (cli/env.c): the library reads
no variable itself (tests/lint/check_layers.py), so each knob is checked end to end, through
the binary, on `--device cpu-device` (the CPU posing as a GPU):

  - FTUNE_CKPT_HOST=1 puts the layer-input checkpoints in pinned host memory in the plan of a
    packed base that fits the GPU (kernels.h ft_backend_tune.ckpt_host, offload/place.c);
    unset, or another value, keeps them on the GPU; `auto` chooses by the predicted step;
  - the default pack cache folder is $XDG_CACHE_HOME/ftune/packs, else
    $HOME/.cache/ftune/packs (cli/env.c ft_env_pack_cache_dir), and with neither set a run
    that needs a pack is refused naming --cache-dir.
"""
import os
import subprocess

from cli_helpers import SEED_DATA, TINY, ftune_bin

DEV = ["--device", "cpu-device", "--threads", "2"]
PLAN = ["plan", "--model", str(TINY), "--data", str(SEED_DATA), "--seq-len", "64", "--quant", "nf4"]


def plan(tmp_path, env_over, cache=True):
    env = dict(os.environ)
    for k in ("FTUNE_CKPT_HOST", "XDG_CACHE_HOME"):
        env.pop(k, None)
    env.update({k: v for k, v in env_over.items() if v is not None})
    for k, v in env_over.items():
        if v is None:
            env.pop(k, None)
    args = [ftune_bin()] + PLAN + DEV + ["--out", str(tmp_path / "out")]
    if cache:
        args += ["--cache-dir", str(tmp_path / "cache")]
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)


def ckpt_line(p):
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.startswith("ftune: plan: checkpoints")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_ckpt_host(tmp_path):
    assert "checkpoints on the GPU" in ckpt_line(plan(tmp_path, {}))
    assert "checkpoints on the GPU" in ckpt_line(plan(tmp_path, {"FTUNE_CKPT_HOST": "0"}))
    assert "checkpoints in pinned host memory" in ckpt_line(plan(tmp_path, {"FTUNE_CKPT_HOST": "1"}))
    ckpt_line(plan(tmp_path, {"FTUNE_CKPT_HOST": "auto"}))  # either, by the predicted step


def test_default_cache_dir(tmp_path):
    xdg = tmp_path / "xdg"
    p = plan(tmp_path, {"XDG_CACHE_HOME": str(xdg)}, cache=False)
    assert p.returncode == 0, p.stderr
    assert str(xdg / "ftune" / "packs") in p.stderr  # the plan names the pack it would write
    home = tmp_path / "home"
    p = plan(tmp_path, {"HOME": str(home)}, cache=False)
    assert p.returncode == 0, p.stderr
    assert str(home / ".cache" / "ftune" / "packs") in p.stderr
    p = plan(tmp_path, {"HOME": None}, cache=False)
    assert p.returncode == 1, p.stderr
    assert "neither XDG_CACHE_HOME nor HOME is set: pass --cache-dir" in p.stderr


def test_default_cache_dir_kept_by_the_session(tmp_path):
    """eval and generate without --cache-dir on cpu-device: every pack the session builds, also
    at a later placement than the session's opening (generate places again for its prompt), is
    under $XDG_CACHE_HOME/ftune/packs, and nothing is written in the working folder. (The
    session keeps the default path for those placements: cli/session.c held it in a stack
    buffer that was gone by then, which once sent a pack to ./d/; that read of dead memory is
    not reproduced here at will, this checks where the packs land.)"""
    from gen_helpers import streamed_budget, streamed_nf4_model
    model = streamed_nf4_model(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    xdg = tmp_path / "xdg"
    env = dict(os.environ, XDG_CACHE_HOME=str(xdg))
    one = tmp_path / "one.jsonl"
    one.write_text('{"instruction": "Name a colour.", "output": "Blue."}\n')
    ev = ["eval", "--model", model, "--data", one, "--seq-len", "128"]
    gen = ["generate", "--model", model, "--raw", "--prompt", "Once upon a time", "--max-new-tokens", "2"]

    def run(args, ok=True):
        p = subprocess.run([ftune_bin()] + [str(a) for a in args] + DEV, cwd=work, env=env,
                           capture_output=True, text=True, timeout=600)
        assert (p.returncode == 0) == ok, p.stderr
        return p
    budget = streamed_budget(run(ev + ["--gpu-mem", "1M"], ok=False), 0.04)
    for extra in ([], ["--gpu-mem", budget]):  # every layer resident, then some streamed
        run(ev + extra)
        run(gen + extra)
    assert list(work.iterdir()) == []
    packs = list(xdg.rglob("*.ftpack"))
    assert all(p.parent == xdg / "ftune" / "packs" for p in packs), packs
