"""`--model ORG/NAME` through the local Hugging Face cache (src/formats/hub_cache.h): a model a
user downloaded once with huggingface_hub is found by its id, the adapter names the base by
that id (base_model_name_or_path, as PEFT and vLLM load it), `ftune export` finds the base
from it, and an id that is not cached is refused with one line naming the cache and how to
download. The cache is a fake one (huggingface.co/docs/hub/local-cache: refs/main holds the
commit, snapshots/<commit>/ links into blobs/) around the tiny test model."""
import json
import os
import shutil

from cli_helpers import SEED_DATA, TINY, run_ftune, stderr_lines

COMMIT = "3f1c0ffee0ddba11c0de5eed0123456789abcdef"


def fake_cache(tmp):
    cache = tmp / "hf" / "hub"
    repo = cache / "models--acme--tiny-llama"
    snap = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for f in TINY.iterdir():  # each file a blob, linked from the snapshot
        if f.is_file():
            blob = repo / "blobs" / f"blob-{f.name}"
            shutil.copyfile(f.resolve(), blob)
            os.symlink(os.path.relpath(blob, snap), snap / f.name)
    return cache, snap


def env_with(cache):
    return dict(os.environ, HF_HUB_CACHE=str(cache))


def run_env(args, env, cwd):
    import subprocess
    from cli_helpers import ftune_bin
    return subprocess.run([ftune_bin()] + [str(a) for a in args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def test_train_eval_export_by_id(tmp_path):
    cache, snap = fake_cache(tmp_path)
    env = env_with(cache)
    out = tmp_path / "out"
    r = run_env(["train", "--model", "acme/tiny-llama", "--data", SEED_DATA, "--out", out,
                 "--max-steps", "1", "--seq-len", "64", "--threads", "1", "--eval-fraction", "0"],
                env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"ftune: model acme/tiny-llama: {snap} (Hugging Face cache)" in r.stderr
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "acme/tiny-llama"
    # eval by id, and by the snapshot path (the same model, the same loss)
    few = tmp_path / "few.jsonl"
    few.write_text("".join(SEED_DATA.read_text().splitlines(keepends=True)[:4]))
    losses = []
    for m in ("acme/tiny-llama", snap):
        e = run_env(["eval", "--model", m, "--adapter", out, "--data", few, "--seq-len", "256",
                     "--threads", "1"], env, tmp_path)
        assert e.returncode == 0, e.stderr
        losses.append(json.loads(e.stdout)["loss"])
    assert losses[0] == losses[1]
    # the adapter by id too (a PEFT adapter repository in the cache: adapter_config.json)
    arepo = cache / "models--acme--tiny-lora"
    (arepo / "refs").mkdir(parents=True)
    (arepo / "refs" / "main").write_text(COMMIT)
    shutil.copytree(out, arepo / "snapshots" / COMMIT,
                    ignore=shutil.ignore_patterns("checkpoint-*", "*.jsonl", "summary.json"))
    e = run_env(["eval", "--model", "acme/tiny-llama", "--adapter", "acme/tiny-lora", "--data", few,
                 "--seq-len", "256", "--threads", "1"], env, tmp_path)
    assert e.returncode == 0, e.stderr
    assert "ftune: adapter acme/tiny-lora: " in e.stderr
    assert json.loads(e.stdout)["loss"] == losses[0]
    e = run_env(["eval", "--model", "acme/tiny-llama", "--adapter", "acme/no-lora", "--data", few],
                env, tmp_path)
    assert e.returncode == 1 and "--adapter: acme/no-lora: no such file or folder" in e.stderr, e.stderr
    # export finds the base through the id the adapter names
    x = run_env(["export", "--adapter", out, "--format", "gguf", "--out", tmp_path / "a.gguf"],
                env, tmp_path)
    assert x.returncode == 0, x.stderr
    assert (tmp_path / "a.gguf").stat().st_size > 0
    # without the cache the id is not found: one clean line, exit 1, for export and train
    empty = env_with(tmp_path / "no-cache")
    x2 = run_env(["export", "--adapter", out, "--format", "gguf", "--out", tmp_path / "b.gguf"],
                 empty, tmp_path)
    assert x2.returncode == 1 and "hf download acme/tiny-llama" in x2.stderr, x2.stderr
    assert not (tmp_path / "b.gguf").exists()
    t = run_env(["train", "--model", "acme/tiny-llama", "--data", SEED_DATA, "--out",
                 tmp_path / "out2", "--max-steps", "1"], empty, tmp_path)
    lines = stderr_lines(t)
    assert t.returncode == 1 and len(lines) == 1, t.stderr
    assert "not in the Hugging Face cache" in lines[0] and "no-cache" in lines[0]
    assert not (tmp_path / "out2" / "adapter_config.json").exists()


def test_revision_and_missing_ref(tmp_path):
    cache, snap = fake_cache(tmp_path)
    env = env_with(cache)
    args = ["tokenize", "--text", "Hello world", "--model"]
    a = run_env(args + ["acme/tiny-llama"], env, tmp_path)
    b = run_env(args + [f"acme/tiny-llama@{COMMIT}"], env, tmp_path)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and json.loads(a.stdout.splitlines()[0])["ids"]
    c = run_env(args + ["acme/tiny-llama@v2"], env, tmp_path)
    assert c.returncode == 1 and "no revision 'v2'" in c.stderr and "main" in c.stderr, c.stderr


def test_revision_written_for_peft(tmp_path):
    """`--model org/name@v2` (a tag naming another commit than main): the adapter names the
    base by its id and pins the commit in PEFT's "revision" (AutoPeftModel loads the base at
    it); export reads both and finds that snapshot; main's snapshot leaves revision null."""
    cache, snap = fake_cache(tmp_path)
    env = env_with(cache)
    repo = cache / "models--acme--tiny-llama"
    other = "0ddc0ffee0ddba11c0de5eed0123456789abcdef"
    shutil.copytree(snap, repo / "snapshots" / other, symlinks=True)
    (repo / "refs" / "v2").write_text(other + "\n")
    common = ["--data", SEED_DATA, "--max-steps", "1", "--seq-len", "64", "--threads", "1",
              "--eval-fraction", "0"]
    for model, want in (("acme/tiny-llama@v2", other), (f"acme/tiny-llama@{other}", other),
                        ("acme/tiny-llama", None), (f"acme/tiny-llama@{COMMIT}", None)):
        out = tmp_path / ("out-" + model.replace("/", "_"))
        r = run_env(["train", "--model", model, "--out", out] + common, env, tmp_path)
        assert r.returncode == 0, r.stderr
        cfg = json.loads((out / "adapter_config.json").read_text())
        assert cfg["base_model_name_or_path"] == "acme/tiny-llama", cfg
        assert cfg["revision"] == want, (model, cfg["revision"])
    # export resolves id + revision: with v2's snapshot gone the pinned adapter is refused
    # (naming the commit), main's still exports
    pinned, plain = tmp_path / "out-acme_tiny-llama@v2", tmp_path / "out-acme_tiny-llama"
    x = run_env(["export", "--adapter", pinned, "--format", "gguf", "--out", tmp_path / "a.gguf"],
                env, tmp_path)
    assert x.returncode == 0, x.stderr
    shutil.rmtree(repo / "snapshots" / other)
    x = run_env(["export", "--adapter", pinned, "--format", "gguf", "--out", tmp_path / "b.gguf"],
                env, tmp_path)
    assert x.returncode == 1 and other in x.stderr, x.stderr
    assert not (tmp_path / "b.gguf").exists()
    x = run_env(["export", "--adapter", plain, "--format", "gguf", "--out", tmp_path / "c.gguf"],
                env, tmp_path)
    assert x.returncode == 0, x.stderr


def test_local_path_with_at_is_not_a_revision(tmp_path):
    """A local model folder named like an id with a revision ("mdl/tiny@v2") is a path: the
    adapter names it whole, with revision null (it had been split into "mdl/tiny" at
    revision "v2"). And an adapter whose base is a local folder keeps that folder when
    adapter_config.json also has a revision: export finds the folder (transformers ignores a
    local path's revision), where it had looked for "mdl/tiny@v2" in the hub cache."""
    cache, _ = fake_cache(tmp_path)
    env = env_with(cache)
    shutil.copytree(TINY, tmp_path / "mdl" / "tiny@v2")
    shutil.copytree(TINY, tmp_path / "local" / "tiny")
    out = tmp_path / "out"
    r = run_env(["train", "--model", "mdl/tiny@v2", "--out", out, "--data", SEED_DATA,
                 "--max-steps", "1", "--seq-len", "64", "--threads", "1", "--eval-fraction", "0"],
                env, tmp_path)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "mdl/tiny@v2" and cfg["revision"] is None, cfg
    x = run_env(["export", "--adapter", out, "--format", "gguf", "--out", tmp_path / "a.gguf"],
                env, tmp_path)
    assert x.returncode == 0, x.stderr
    cfg.update(base_model_name_or_path="local/tiny", revision="v2")
    (out / "adapter_config.json").write_text(json.dumps(cfg))
    x = run_env(["export", "--adapter", out, "--format", "gguf", "--out", tmp_path / "b.gguf"],
                env, tmp_path)
    assert x.returncode == 0, x.stderr
    assert (tmp_path / "b.gguf").exists()
    # an adapter of "mdl/tiny@v2" as the split had written it still finds that folder
    cfg.update(base_model_name_or_path="mdl/tiny", revision="v2")
    (out / "adapter_config.json").write_text(json.dumps(cfg))
    x = run_env(["export", "--adapter", out, "--format", "gguf", "--out", tmp_path / "c.gguf"],
                env, tmp_path)
    assert x.returncode == 0 and "mdl/tiny@v2" in x.stderr, x.stderr
