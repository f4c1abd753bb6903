#!/bin/bash
# Final H100 call of session 3: GPU tests, then Llama-3-8B shape: ftune bf16 LoRA, ftune QLoRA (NF4), peer.
set -u
T0=$(date +%s)
python3 -c "import tarfile; tarfile.open('.gpu/bundle.tar.xz').extractall('/tmp/g')"
export LD_LIBRARY_PATH=/tmp/g/lib:/usr/local/cuda/lib64
F=/tmp/g/bin/ftune
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for t in test_cuda_ops test_cuda_attn; do
  CMOCKA_MESSAGE_OUTPUT=stdout timeout 120 /tmp/g/bin/$t > $OUT/$t.log 2>&1; echo "$t rc=$?"
  grep -E "nf4|train step|PASSED|FAILED|ERROR|Failure" $OUT/$t.log | head -14
done
python3 - <<'PY'
import json, random
random.seed(0)
words = open('tests/fixtures/tokenizers/llama2/tokenizer.json').read().split('"')[1::2][:20000]
words = [w for w in words if w.isalpha() and len(w) > 2][:5000]
with open('/tmp/d.jsonl', 'w') as f:
    for i in range(96):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(2600))}) + "\n")
PY
timeout 200 $F init-model --config examples/configs/llama-3-8b.json --out /tmp/m8b --pack --safetensors --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | grep -E "safetensors|pack"
echo "[$(( $(date +%s) - T0 )) s]"
run() { # name, args...
  local name=$1; shift
  (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> /tmp/mem_$name.txt; sleep 0.2; done) & local MP=$!
  timeout 150 $F train --model /tmp/m8b --data /tmp/d.jsonl --data-format text --device cuda --seq-len 2048 --max-steps 8 --lora-dropout 0 --save-every 0 --out /tmp/o_$name --eval-fraction 0 --log-every 1 "$@" 2>&1 | grep -E "plan|pack|step [5-8]/|profile|done|ftune: [a-z]+:" | grep -v "^ftune: model"
  kill $MP; echo "$name: peak GPU memory used (nvidia-smi) $(sort -n /tmp/mem_$name.txt | tail -1) MiB"
  cp /tmp/o_$name/metrics.jsonl $OUT/ftune_$name.metrics.jsonl 2>/dev/null
  echo "[$(( $(date +%s) - T0 )) s]"
}
run lora_b1 --batch-size 1 --quant bf16 --profile
run qlora_b1 --batch-size 1 --quant nf4 --profile
PYTHONUNBUFFERED=1 timeout 150 python3 .gpu/peer_min.py examples/configs/llama-3-8b.json 2048 2>&1 | grep -v Warning | tee $OUT/peer.jsonl | grep "{"
echo "[$(( $(date +%s) - T0 )) s]"
run lora_b2 --batch-size 2 --quant bf16
run qlora_b2 --batch-size 2 --quant nf4
