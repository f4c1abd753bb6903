"""Adapter folders any PEFT user can load (adapters/peft.c, adapters/model_card.c):

- base_model_name_or_path is the Hugging Face id: from --base-model-id, and inferred from a
  GGUF whose metadata names its repository (a GGUF fixture made with the gguf package: the
  tiny model merged to GGUF by ftune, then its metadata rewritten by gguf-py's
  gguf_new_metadata, as a user's converted file would carry it), and read back by PEFT's
  PeftConfig.from_pretrained when peft is installed;
- floats in adapter_config.json are the numbers the user gave ("lora_dropout": 0.05);
- the folder's README.md is a model card the Hugging Face Hub's parser reads (base_model,
  library_name peft), naming the data, the settings and the final eval loss, with the
  PEFT, vLLM and llama.cpp ways to load it;
- a bad --base-model-id is one clear error line.
"""
import json
import re
from pathlib import Path

import pytest

from cli_helpers import SEED_DATA, TINY, assert_clean_error, run_ftune

gguf = pytest.importorskip("gguf")
new_metadata = pytest.importorskip("gguf.scripts.gguf_new_metadata")

ARGS = ["--seq-len", "64", "--max-steps", "3", "--threads", "2", "--eval-fraction", "0.2",
        "--eval-max", "8", "--lora-dropout", "0.05", "--lora-alpha", "16", "--lora-r", "8"]
REPO_ID = "ftune-test/tiny-llama-gguf"


def train(model, out, *extra, ok=True):
    r = run_ftune(["train", "--model", model, "--data", SEED_DATA, "--out", out] + ARGS + list(extra))
    if ok:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def gguf_base(tmp_path_factory):
    """The tiny model as a GGUF with its tokenizer (ftune merge of an adapter trained at lr
    1e-12, i.e. the base's weights)."""
    d = tmp_path_factory.mktemp("gguf_base")
    ad = d / "ad"
    r = run_ftune(["train", "--model", TINY, "--data", SEED_DATA, "--out", ad, "--max-steps", 1,
                   "--lr", "1e-12", "--seq-len", 64, "--threads", 2, "--quiet"])
    assert r.returncode == 0, r.stderr
    out = d / "tiny.gguf"
    r = run_ftune(["merge", "--model", TINY, "--adapter", ad, "--out", out, "--format", "gguf"])
    assert r.returncode == 0, r.stderr
    return out


def with_metadata(src, dst, kv):
    """src rewritten to dst with string metadata kv added (gguf-py's gguf_new_metadata)."""
    reader = gguf.GGUFReader(str(src), "r")
    arch = reader.fields["general.architecture"]
    arch = bytes(arch.parts[arch.data[0]]).decode()
    writer = gguf.GGUFWriter(str(dst), arch=arch, endianess=reader.endianess)
    md = {k: new_metadata.MetadataDetails(gguf.GGUFValueType.STRING, v) for k, v in kv.items()}
    new_metadata.copy_with_new_metadata(reader, writer, md, [])
    return dst


def config(out):
    return json.loads((Path(out) / "adapter_config.json").read_text())


def peft_config(out):
    """PEFT's own reading of the folder, when peft is installed (it needs torch)."""
    try:
        from peft import PeftConfig
    except ImportError:
        return None
    return PeftConfig.from_pretrained(str(out))


@pytest.mark.parametrize("key,value", [
    ("general.source.repo_url", f"https://huggingface.co/{REPO_ID}"),
    ("general.source.huggingface.repository", REPO_ID),
    ("general.base_model.0.repo_url", f"https://huggingface.co/{REPO_ID}"),
])
def test_base_id_from_gguf_metadata(gguf_base, tmp_path, key, value):
    src = with_metadata(gguf_base, tmp_path / "named.gguf", {key: value})
    out = tmp_path / "out"
    r = train(src, out)
    assert config(out)["base_model_name_or_path"] == REPO_ID
    assert f"base model id {REPO_ID}, from the GGUF's {key}" in r.stderr
    pc = peft_config(out)
    if pc is not None:
        assert pc.base_model_name_or_path == REPO_ID
    # the same file without the key: the path, as before
    out2 = tmp_path / "plain"
    train(gguf_base, out2)
    assert config(out2)["base_model_name_or_path"] == str(gguf_base)
    # --base-model-id wins over the metadata
    out3 = tmp_path / "explicit"
    train(src, out3, "--base-model-id", "someone/other-model")
    assert config(out3)["base_model_name_or_path"] == "someone/other-model"


def test_base_model_id_floats_and_card(tmp_path):
    out = tmp_path / "run"
    train(TINY, out, "--base-model-id", "HuggingFaceTB/SmolLM2-135M-Instruct")
    text = (out / "adapter_config.json").read_text()
    assert re.search(r'"lora_dropout":\s*0.05,', text), text
    assert re.search(r'"lora_alpha":\s*16,', text), text
    c = config(out)
    assert c["lora_dropout"] == 0.05 and c["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert c["revision"] is None
    pc = peft_config(out)
    if pc is not None:
        assert pc.base_model_name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert pc.lora_dropout == 0.05 and pc.r == 8 and pc.lora_alpha == 16
    else:
        print("peft not installed: PeftConfig.from_pretrained not run")
    # a revision: "org/name@REV" is PEFT's revision
    out2 = tmp_path / "rev"
    train(TINY, out2, "--base-model-id", "HuggingFaceTB/SmolLM2-135M-Instruct@v1.0")
    c2 = config(out2)
    assert c2["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and c2["revision"] == "v1.0"

    # the model card
    card = (out / "README.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    front = card.split("---\n")[1]
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct\n" in front and "library_name: peft\n" in front
    assert f"| final eval loss | {summary['final_eval_loss']:.4f} |" in card
    assert f"`{SEED_DATA}`" in card or f"`{summary['data']}`" in card
    assert "| lora_dropout | 0.05 |" in card and "| r | 8 |" in card
    for how in ("AutoPeftModelForCausalLM.from_pretrained", "vllm serve HuggingFaceTB/SmolLM2-135M-Instruct",
                "--enable-lora", "llama-cli", "--lora adapter.gguf"):
        assert how in card, how
    try:
        from huggingface_hub import ModelCard
    except ImportError:
        return
    mc = ModelCard.load(str(out / "README.md"))
    assert mc.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert mc.data.library_name == "peft"
    assert "base_model:adapter:HuggingFaceTB/SmolLM2-135M-Instruct" in mc.data.tags


def test_bad_base_model_id(tmp_path):
    out = tmp_path / "bad"
    r = train(TINY, out, "--base-model-id", "not a repo", ok=False)
    assert_clean_error(r, out, "not a repo", "Hugging Face repository id")
