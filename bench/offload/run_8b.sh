#!/bin/bash
# First GPU call of session 4: the device tiers on the Llama-3-8B shape before the 70B run.
# GPU tests (tiers bit-identical, ops), then ftune on random 8B weights: bf16 LoRA, QLoRA with
# every layer resident, QLoRA with --gpu-mem low enough that the planner streams layers from
# pinned host memory, and with --host-mem low enough that layers are read from the pack file.
set -u
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -c "import tarfile; tarfile.open('.gpu/bundle.tar.xz').extractall('/tmp/g')"
export LD_LIBRARY_PATH=/tmp/g/lib:/usr/local/cuda/lib64
F=/tmp/g/bin/ftune
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u
free -g | head -2; df -h /tmp | tail -1; nproc
for t in ${TESTS:-test_cuda_stream test_cuda_ops test_cuda_nf4}; do
  [ -x /tmp/g/bin/$t ] || continue
  CMOCKA_MESSAGE_OUTPUT=stdout timeout 120 /tmp/g/bin/$t > $OUT/$t.log 2>&1; echo "$t rc=$?"
  grep -E "loss gpu|GB/s|PASSED|FAILED|ERROR|Failure|error" $OUT/$t.log | head -8
done
stamp tests
python3 - <<'PY'
import json, random
random.seed(0)
words = open('tests/fixtures/tokenizers/llama2/tokenizer.json').read().split('"')[1::2][:20000]
words = [w for w in words if w.isalpha() and len(w) > 2][:5000]
with open('/tmp/d.jsonl', 'w') as f:
    for i in range(64):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(2600))}) + "\n")
PY
M=/tmp/m8b
timeout 200 $F init-model --config examples/configs/llama-3-8b.json --out $M --pack --safetensors --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | grep -E "safetensors|pack"
stamp init-model
timeout 60 $F bench io --path $M/model-nf4.ftpack --bytes 4G --device cuda 2>&1 | tail -6 | tee $OUT/bench_io.txt
stamp bench-io
run() { # name, seconds, args...
  local name=$1 lim=$2; shift 2
  (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> /tmp/mem_$name.txt; sleep 0.2; done) & local MP=$!
  timeout $lim $F train --model $M --data /tmp/d.jsonl --data-format text --device cuda --seq-len 2048 \
     --lora-dropout 0 --save-every 0 --out /tmp/o_$name --eval-fraction 0 --log-every 1 "$@" 2>&1 \
     | grep -vE "^ftune: (model|data) " | tail -16 | tee $OUT/$name.log
  kill $MP 2>/dev/null; echo "$name: peak GPU memory used (nvidia-smi) $(sort -n /tmp/mem_$name.txt | tail -1) MiB" | tee -a $OUT/$name.log
  cp /tmp/o_$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null
  stamp $name
}
run lora 120 --quant bf16 --max-steps 6
run qlora 120 --quant nf4 --max-steps 6
run qlora_host 150 --quant nf4 --gpu-mem ${GPU_HOST:-14G} --host-mem 16G --grad-accum auto --max-steps 4 --timeline $OUT/host8b.svg
run qlora_disk 150 --quant nf4 --gpu-mem ${GPU_HOST:-14G} --host-mem 1G --grad-accum auto --max-steps 3 --timeline $OUT/disk8b.svg
