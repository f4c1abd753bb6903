# Minimal transformers + PEFT peer (lead's ad-hoc copy until bench/peer_hf.py lands):
# Llama-3-8B shape, random bf16 weights on the GPU, LoRA r16 alpha32 dropout0 on all 7
# linear modules, AdamW lr 2e-4, seq 2048; grad checkpointing off/on x batch 1/2/4.
import json, sys, time, torch, gc
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model
cfg = LlamaConfig(**json.load(open(sys.argv[1])))
seq = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
steps = 5
res = []
for ckpt in (False, True):
    for bs in (1, 2, 4):
        gc.collect(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        r = {"grad_ckpt": ckpt, "batch": bs, "seq": seq}
        m = opt = None
        try:
            with torch.device("cuda"):
                torch.manual_seed(0)
                try:
                    m = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
                except TypeError:
                    m = LlamaForCausalLM._from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
            if ckpt:
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                m.enable_input_require_grads()
            m = get_peft_model(m, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                             target_modules=["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj"]))
            opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=2e-4)
            ids = torch.randint(0, cfg.vocab_size, (bs, seq), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
            def step():
                out = m(input_ids=ids, labels=ids)
                out.loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
            for _ in range(2): step()
            torch.cuda.synchronize(); t0 = time.time()
            for _ in range(steps): step()
            torch.cuda.synchronize(); dt = (time.time() - t0) / steps
            r.update(tokens_per_s=bs * seq / dt, step_s=dt, peak_gib=torch.cuda.max_memory_allocated() / 2**30)
        except torch.OutOfMemoryError:
            r.update(oom=True)
        print(json.dumps(r), flush=True)
        res.append(r)
        del m, opt
