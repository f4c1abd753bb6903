#!/usr/bin/env python3
"""The peer of bench/run: LoRA training throughput of transformers + PEFT.

Model: --model DIR loads the folder ftune trains on (`ftune init-model` output: config.json +
bf16 safetensors, random weights) with transformers' own loader, bf16, straight onto the GPU;
without --model, a LlamaForCausalLM of --config with random bf16 weights created on the device
(same shapes and the same FLOPs; values do not change the speed of dense bf16 GEMMs).
LoRA r 16, alpha 32, dropout 0 on all seven linear modules (q, k, v, o, gate, up, down; PEFT
keeps the adapter in fp32 and the base in bf16), torch.optim.AdamW (lr 2e-4, no weight decay),
rows of --seq random token ids (fixed seed) with labels = ids (the model's own shifted
cross-entropy over every token). For each configuration "ckpt:batch" of --configs (gradient
checkpointing off/on, use_reentrant=False): --warmup untimed steps, then --steps timed steps
between torch.cuda.synchronize() calls; tokens/s = batch x seq x steps / time (input tokens).
Peak GPU memory per configuration: torch.cuda.max_memory_allocated and max_memory_reserved
(reset before each; the CUDA context, ~0.5 GiB, is not included). An out-of-memory
configuration is recorded as such and the run goes on; a batch that runs out of memory without
checkpointing makes the larger batches without checkpointing skipped (they need more).
The base model is built once; configurations change checkpointing, batch and optimizer.
Attention: flash_attention_2 when the flash_attn package is importable, else sdpa (PyTorch's
fused attention: FlashAttention-2 or memory-efficient kernels on the H100).

Prints one JSON line per configuration and rewrites --out (JSON: meta + results) after each,
so a run stopped by its time budget keeps what it measured.

Usage: bench/peer_hf.py [--model DIR | --config FILE | --tiny] [--seq 2048] [--steps 5]
       [--warmup 2] [--configs off:1,off:2,off:4,on:1,on:2,on:4] [--out FILE]
       [--time-budget SECONDS] [--device cuda|cpu]
--tiny: a 2-layer small config (for checking this script on a CPU).
"""
import argparse
import gc
import importlib.util
import json
import os
import platform
import sys
import time

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 2048,
        "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL_CONFIGS = "off:1,off:2,off:4,on:1,on:2,on:4"


def pick_attn(req):
    if req != "auto":
        return req
    try:
        from transformers.utils import is_flash_attn_2_available
        if importlib.util.find_spec("flash_attn") and is_flash_attn_2_available():
            return "flash_attention_2"
    except Exception:
        pass
    return "sdpa"


def _with_dtype(fn, torch, **kw):
    """transformers >= 4.56 names the argument dtype, older ones torch_dtype."""
    try:
        return fn(dtype=torch.bfloat16, **kw)
    except TypeError:
        return fn(torch_dtype=torch.bfloat16, **kw)


def build(a, cfg_dict, dev, attn, torch):
    """(PEFT model, LlamaConfig, how the base was made)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(0)
    if a.model:
        try:  # straight to the device (needs accelerate, a dependency of peft)
            m = _with_dtype(LlamaForCausalLM.from_pretrained, torch, pretrained_model_name_or_path=a.model,
                            attn_implementation=attn, device_map={"": str(dev)})
            how = f"from_pretrained({a.model}), device_map {dev}"
        except (ImportError, ValueError) as e:
            print(f"peer: device_map load failed ({e}); loading on the host", file=sys.stderr)
            m = _with_dtype(LlamaForCausalLM.from_pretrained, torch, pretrained_model_name_or_path=a.model,
                            attn_implementation=attn).to(dev)
            how = f"from_pretrained({a.model}) then .to({dev})"
        cfg = m.config
    else:
        d = {k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type", "torch_dtype",
                                                             "transformers_version")}
        cfg = LlamaConfig(**d)
        with torch.device(dev):
            m = _with_dtype(LlamaForCausalLM._from_config, torch, config=cfg, attn_implementation=attn)
        how = "random bf16 weights created on the device"
    m.config.use_cache = False
    wdt = {str(p.dtype) for n, p in m.named_parameters() if "layers.0.mlp" in n}
    assert wdt == {"torch.bfloat16"}, f"base weights are {wdt}, not bf16"
    lc = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, bias="none",
                    task_type="CAUSAL_LM")
    return get_peft_model(m, lc), cfg, how


def oom_types(torch):
    t = [getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)]
    return tuple(x for x in t if x is not None) or (RuntimeError,)


def is_oom(e):
    return type(e).__name__.endswith("OutOfMemoryError") or "out of memory" in str(e).lower()


def train_step(model, opt, ids):
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.detach()


def parse_configs(s):
    """"off:1,on:4" -> [(False, 1), (True, 4)]."""
    out = []
    for item in s.split(","):
        item = item.strip()
        if not item:
            continue
        ck, _, bs = item.partition(":")
        if ck not in ("off", "on") or not bs.isdigit() or int(bs) < 1:
            raise SystemExit(f"--configs: '{item}' is not off:N or on:N")
        out.append((ck == "on", int(bs)))
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="transformers + PEFT LoRA training throughput")
    ap.add_argument("--model", help="model folder to load (ftune init-model output)")
    ap.add_argument("--config", default=os.path.join(here, "..", "examples", "configs", "llama-3-8b.json"),
                    help="config.json for random weights (without --model)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--configs", default=ALL_CONFIGS, help="grad checkpointing:batch list, in order")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--attn", default="auto", help="auto | sdpa | flash_attention_2 | eager")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--out", default=None, help="JSON file with meta and results")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds; no new configuration starts once it would likely overrun")
    ap.add_argument("--tiny", action="store_true", help="2-layer small config (CPU check)")
    a = ap.parse_args()
    t_start = time.time()
    configs = parse_configs(a.configs)

    import torch
    import transformers
    import peft
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    cfg_dict = None
    if a.tiny:
        cfg_dict, cfg_name, a.model = dict(TINY), "tiny (2 layers)", None
    elif a.model:
        cfg_name = a.model
    else:
        with open(a.config) as f:
            cfg_dict = json.load(f)
        cfg_name = a.config
    attn = pick_attn(a.attn)
    meta = {"system": "transformers + PEFT", "config": cfg_name, "seq": a.seq, "steps": a.steps,
            "warmup": a.warmup, "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "targets": TARGETS},
            "optimizer": f"torch.optim.AdamW lr {a.lr} weight_decay 0", "attn_implementation": attn,
            "dtype": "bf16 base, fp32 LoRA (PEFT's default)", "device": str(dev),
            "gpu": torch.cuda.get_device_name(dev) if cuda else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "python": sys.version.split()[0], "configs": a.configs}
    results = []

    def save():
        if a.out:
            tmp = a.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"meta": meta, "results": results}, f, indent=1)
            os.replace(tmp, a.out)

    def emit(r):
        print(json.dumps(r), flush=True)
        results.append(r)
        save()

    t0 = time.time()
    model, cfg, how = build(a, cfg_dict, dev, attn, torch)
    if cuda:
        torch.cuda.synchronize()
    meta["base"] = how
    meta["build_s"] = round(time.time() - t0, 2)
    meta["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    meta["params"] = sum(p.numel() for p in model.parameters())
    print(f"peer: {how} in {meta['build_s']} s; {meta['params'] / 1e9:.2f}B parameters, "
          f"{meta['trainable_params'] / 1e6:.1f}M trainable; attention {attn}", file=sys.stderr, flush=True)
    save()
    params = [p for p in model.parameters() if p.requires_grad]
    OOM = oom_types(torch)
    oom_off = None  # smallest batch that ran out of memory without checkpointing
    ckpt_now = False
    last_cfg_s = 0.0
    for ckpt, bs in configs:
        r = {"system": "transformers + PEFT", "grad_ckpt": ckpt, "batch": bs, "seq": a.seq, "attn": attn}
        elapsed = time.time() - t_start
        if a.time_budget and elapsed + 1.5 * last_cfg_s > a.time_budget:
            r["skipped"] = f"time budget ({a.time_budget:.0f} s; {elapsed:.0f} s used)"
            emit(r)
            continue
        if not ckpt and oom_off is not None and bs >= oom_off:
            r["skipped"] = f"batch {oom_off} ran out of memory without checkpointing"
            emit(r)
            continue
        if ckpt and not ckpt_now:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        elif not ckpt and ckpt_now:
            model.gradient_checkpointing_disable()
        ckpt_now = ckpt
        model.train()
        tc = time.time()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
        gen = torch.Generator(device=dev).manual_seed(a.seed)
        ids = torch.randint(0, cfg.vocab_size, (bs, a.seq), device=dev, generator=gen)
        oom = False
        try:
            for _ in range(a.warmup):
                loss = train_step(model, opt, ids)
            if cuda:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            for _ in range(a.steps):
                loss = train_step(model, opt, ids)
            if cuda:
                torch.cuda.synchronize()
            dt = (time.perf_counter() - t1) / a.steps
            r.update(tokens_per_s=bs * a.seq / dt, step_s=dt, loss=float(loss))
            if cuda:
                r.update(peak_alloc_gib=torch.cuda.max_memory_allocated(dev) / 2**30,
                         peak_reserved_gib=torch.cuda.max_memory_reserved(dev) / 2**30)
        except OOM as e:
            if not is_oom(e):
                raise
            oom = True
        if oom:  # outside the except block: its traceback no longer pins the activations
            r["oom"] = True
            if not ckpt:
                oom_off = bs if oom_off is None else min(oom_off, bs)
            if cuda:
                r["peak_alloc_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
        for p in params:
            p.grad = None
        del opt, ids
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        last_cfg_s = time.time() - tc
        r["config_s"] = round(last_cfg_s, 2)
        emit(r)
    meta["total_s"] = round(time.time() - t_start, 2)
    save()
    ok = [r for r in results if r.get("tokens_per_s")]
    if ok:
        b = max(ok, key=lambda r: r["tokens_per_s"])
        print(f"peer best: gradient checkpointing {'on' if b['grad_ckpt'] else 'off'}, batch {b['batch']}: "
              f"{b['tokens_per_s']:.0f} tokens/s", file=sys.stderr)


if __name__ == "__main__":
    main()
