"""The PEFT adapter folder `ftune train` writes, checked against formats.md section 3 with
the `safetensors` package (and `peft` itself when it is installed):

- adapter_model.safetensors: keys exactly base_model.model.model.layers.{i}.self_attn.
  {q,k,v,o}_proj.lora_{A,B}.weight and ...mlp.{gate,up,down}_proj.lora_{A,B}.weight for every
  layer and targeted module; A [r, in], B [out, r] with in/out from config.json; F32;
  __metadata__ == {"format": "pt"} (3.3, 1.1);
- adapter_config.json: peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, target_modules,
  lora_dropout, bias "none", use_rslora, fan_in_fan_out false, base_model_name_or_path (3.2);
- the initialization PEFT uses (3.4): A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0, seen after one
  step at a negligible learning rate.
"""
import json
import math
import os
import subprocess

import numpy as np
import pytest

safetensors = pytest.importorskip("safetensors")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
TINY = os.path.join(REPO, "tests", "fixtures", "tiny-llama")
DATA = os.path.join(REPO, "examples", "data", "alpaca-seed-tasks", "alpaca_seed_175.jsonl")

ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOL_FLOAT_CFG = 1e-6     # relative: float options written to JSON (lora_dropout, lora_alpha)
TOL_INIT_STD_REL = 0.1   # sample std of A vs the U(-b, b) std b/sqrt(3); >= 1024 samples per group
TOL_INIT_DRIFT = 1e-9    # one AdamW step at lr 1e-12 moves a weight by about 1e-12


def ftune_bin():
    b = os.environ.get("FTUNE_BIN", os.path.join(REPO, "build", "ftune"))
    b = b if os.path.isabs(b) else os.path.join(REPO, b)
    assert os.access(b, os.X_OK), f"ftune binary not found at {b} (make build/ftune or set FTUNE_BIN)"
    return b


def train(out, *extra):
    cmd = [ftune_bin(), "train", "--model", TINY, "--data", DATA, "--out", str(out),
           "--max-steps", "1", "--seq-len", "128", "--quiet", *extra]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stderr}"
    return out


def model_dims():
    with open(os.path.join(TINY, "config.json")) as f:
        c = json.load(f)
    C, F, H = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    Hkv = c.get("num_key_value_heads", H)
    D = c.get("head_dim") or C // H
    io = {"q_proj": (C, H * D), "k_proj": (C, Hkv * D), "v_proj": (C, Hkv * D),
          "o_proj": (H * D, C), "gate_proj": (C, F), "up_proj": (C, F), "down_proj": (F, C)}
    return c["num_hidden_layers"], io


def expected_keys(n_layers, targets):
    keys = set()
    for i in range(n_layers):
        for m in targets:
            parent = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            for ab in "AB":
                keys.add(f"base_model.model.model.layers.{i}.{parent}.{m}.lora_{ab}.weight")
    return keys


def read_adapter(d):
    """({key: (dtype string, shape, array)}, metadata) via safetensors.safe_open."""
    out = {}
    with safetensors.safe_open(os.path.join(d, "adapter_model.safetensors"), framework="numpy") as f:
        meta = f.metadata()
        for k in f.keys():
            s = f.get_slice(k)
            out[k] = (s.get_dtype(), list(s.get_shape()), f.get_tensor(k))
    return out, meta


def check_layout(d, targets, r):
    n_layers, io = model_dims()
    t, meta = read_adapter(d)
    assert meta == {"format": "pt"}, meta
    want = expected_keys(n_layers, targets)
    assert set(t) == want, (sorted(set(t) - want), sorted(want - set(t)))
    for k, (dt, shape, a) in t.items():
        m = k.split(".")[-3]
        fan_in, fan_out = io[m]
        assert dt == "F32" and a.dtype == np.float32, (k, dt, a.dtype)
        exp = [r, fan_in] if ".lora_A." in k else [fan_out, r]
        assert shape == exp and list(a.shape) == exp, (k, shape, exp)
        assert np.all(np.isfinite(a)), k
    print(f"\n[{os.path.basename(d)}] {len(t)} tensors, {n_layers} layers x {len(targets)} modules, r={r}")
    return t


def check_config(d, targets, r, alpha, dropout, rslora):
    with open(os.path.join(d, "adapter_config.json")) as f:
        c = json.load(f)
    assert c["peft_type"] == "LORA"
    assert c["task_type"] == "CAUSAL_LM"
    assert c["r"] == r and isinstance(c["r"], int)
    assert math.isclose(c["lora_alpha"], alpha, rel_tol=TOL_FLOAT_CFG), c["lora_alpha"]
    assert isinstance(c["target_modules"], list) and len(c["target_modules"]) == len(set(c["target_modules"]))
    assert set(c["target_modules"]) == set(targets), c["target_modules"]
    assert math.isclose(c["lora_dropout"], dropout, rel_tol=TOL_FLOAT_CFG), c["lora_dropout"]
    assert c["bias"] == "none"
    assert c["use_rslora"] is rslora
    assert c["fan_in_fan_out"] is False
    assert c.get("use_dora", False) is False
    b = c["base_model_name_or_path"]
    assert isinstance(b, str) and b, b
    assert os.path.samefile(b if os.path.isabs(b) else os.path.join(REPO, b), TINY), b
    print(f"[{os.path.basename(d)}] adapter_config: r={c['r']} lora_alpha={c['lora_alpha']} "
          f"lora_dropout={c['lora_dropout']!r} use_rslora={c['use_rslora']} targets={c['target_modules']}")
    try:
        import peft
    except ImportError:
        return c
    pc = peft.LoraConfig.from_pretrained(str(d))
    assert pc.r == r and math.isclose(pc.lora_alpha, alpha, rel_tol=TOL_FLOAT_CFG)
    assert set(pc.target_modules) == set(targets) and pc.use_rslora is rslora
    assert pc.peft_type == "LORA" or str(pc.peft_type).endswith("LORA"), pc.peft_type
    assert pc.task_type == "CAUSAL_LM" or str(pc.task_type).endswith("CAUSAL_LM"), pc.task_type
    return c


def test_default_adapter(tmp_path):
    d = train(tmp_path / "default")
    check_layout(d, ALL7, 16)
    check_config(d, ALL7, 16, 32.0, 0.05, False)


def test_options_adapter(tmp_path):
    targets = ["q_proj", "v_proj", "down_proj"]
    d = train(tmp_path / "options", "--lora-r", "4", "--lora-alpha", "8", "--lora-dropout", "0.1",
              "--use-rslora", "--lora-target", ",".join(targets))
    check_layout(d, targets, 4)
    check_config(d, targets, 4, 8.0, 0.1, True)


def test_init_matches_peft(tmp_path):
    """kaiming_uniform_(a=sqrt(5)) on A [r, in] gives U(-1/sqrt(in), 1/sqrt(in)); B = 0."""
    d = train(tmp_path / "init", "--lr", "1e-12")
    t = check_layout(d, ALL7, 16)
    _, io = model_dims()
    groups = {}
    for k, (_, _, a) in t.items():
        m = k.split(".")[-3]
        if ".lora_B." in k:
            assert float(np.abs(a).max()) <= TOL_INIT_DRIFT, k
            continue
        bound = 1.0 / math.sqrt(io[m][0])
        assert float(np.abs(a).max()) <= bound + TOL_INIT_DRIFT, (k, float(np.abs(a).max()), bound)
        groups.setdefault(io[m][0], []).append(a.ravel())
    a0 = t["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"][2]
    a1 = t["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"][2]
    assert not np.array_equal(a0, a1), "every A starts from the same random numbers"
    for fan_in, parts in sorted(groups.items()):
        x = np.concatenate(parts)
        want = 1.0 / math.sqrt(fan_in) / math.sqrt(3.0)
        rel = abs(float(x.std()) - want) / want
        print(f"[init] in={fan_in}: {x.size} values, std {x.std():.5f} vs U bound/sqrt(3) "
              f"{want:.5f} (rel {rel:.3f}), mean {x.mean():+.5f}")
        assert rel <= TOL_INIT_STD_REL, (fan_in, x.std(), want)
        assert abs(float(x.mean())) <= 4 * want / math.sqrt(x.size), (fan_in, x.mean())
