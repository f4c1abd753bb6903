"""A key given twice in one object of a data record (src/core/json.c ft_json_dup_key, read by
src/data/dataset.c): cJSON would see the first value and Python's json, which Hugging Face
datasets reads the file with, the last, so the record is refused with FILE: line N and the key
(at any depth: a message's "content" too), for SFT and DPO data, in train and tokenize; with
--skip-bad-records it is skipped and counted like any bad record."""
import json

from cli_helpers import SEED_DATA, TINY, assert_clean_error, ftune_bin
import subprocess

TRAIN = ["--seq-len", "256", "--batch-size", "2", "--max-steps", "1", "--threads", "1",
         "--eval-fraction", "0", "--seed", "5"]


def run(args):
    r = subprocess.run([ftune_bin()] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL)
    return r


def seed_lines(n):
    return SEED_DATA.read_text().splitlines()[:n]


def test_sft_record_key_twice(tmp_path):
    d = tmp_path / "d.jsonl"
    d.write_text("\n".join(seed_lines(4) + ['{"instruction": "a", "output": "b", "instruction": "c"}']) + "\n")
    # the record as Python reads it is well formed (the last "instruction" counts)
    assert json.loads(d.read_text().splitlines()[4])["instruction"] == "c"
    out = tmp_path / "o"
    r = run(["train", "--model", TINY, "--data", d, "--out", out, *TRAIN, "--quiet"])
    assert_clean_error(r, out, "d.jsonl: line 5", "key 'instruction' appears twice")
    r = run(["train", "--model", TINY, "--data", d, "--out", out, *TRAIN, "--skip-bad-records"])
    assert r.returncode == 0, r.stderr
    assert "5 records" in r.stderr and "1 skipped" in r.stderr, r.stderr
    assert (out / "adapter_model.safetensors").exists()


def test_nested_key_twice(tmp_path):
    m = tmp_path / "m.json"  # a JSON array: the location is the record's position
    recs = ['{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}',
            '{"messages": [{"role": "user", "content": "x", "content": "y"}, '
            '{"role": "assistant", "content": "z"}]}']
    m.write_text("[" + ",\n".join(recs) + "]\n")
    r = run(["tokenize", "--model", TINY, "--data", m])
    assert_clean_error(r, tmp_path / "none", "m.json: record 2", "key 'content' appears twice")
    # the same records without the repeat tokenize
    m.write_text("[" + ",\n".join([recs[0], recs[0]]) + "]\n")
    r = run(["tokenize", "--model", TINY, "--data", m])
    assert r.returncode == 0, r.stderr


def test_preference_record_key_twice(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}\n'
                 '{"prompt": "The sea is", "chosen": " blue.", "rejected": " red.", "chosen": " wet."}\n')
    out = tmp_path / "o"
    r = run(["train", "--model", TINY, "--data", p, "--method", "dpo", "--out", out, *TRAIN, "--quiet"])
    assert_clean_error(r, out, "p.jsonl: line 2", "key 'chosen' appears twice")
