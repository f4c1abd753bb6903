#!/bin/bash
# Llama-3-8B shape, seq 2048: ftune (CUDA) at batch 1/2/4 and the transformers+PEFT peer (lead's ad-hoc run)
set -u
python3 -c "import tarfile; tarfile.open('.gpu/bundle.tar.xz').extractall('/tmp/g')"
export LD_LIBRARY_PATH=/tmp/g/lib:/usr/local/cuda/lib64
F=/tmp/g/bin/ftune
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; date -u
python3 - <<'PY'
import json, random
random.seed(0)
words = open('tests/fixtures/tokenizers/llama2/tokenizer.json').read().split('"')[1::2][:20000]
words = [w for w in words if w.isalpha() and len(w) > 2][:5000]
with open('/tmp/d.jsonl', 'w') as f:
    for i in range(96):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(2600))}) + "\n")
PY
$F init-model --config examples/configs/llama-3-8b.json --out /tmp/m8b --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | tail -2 | head -1
for B in 1 2 4; do
  (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> /tmp/mem$B.txt; sleep 0.2; done) & MP=$!
  $F train --model /tmp/m8b --data /tmp/d.jsonl --data-format text --device cuda --seq-len 2048 --batch-size $B --max-steps 8 --lora-dropout 0 --save-every 0 --out /tmp/o8_$B --eval-fraction 0 --log-every 1 --profile 2>&1 | grep -E "plan|step [5-8]/|profile|done|error|ftune: [a-z]+:" | grep -v "^ftune: model"
  kill $MP; echo "batch $B: peak GPU memory used (nvidia-smi) $(sort -n /tmp/mem$B.txt | tail -1) MiB"
  cp /tmp/o8_$B/metrics.jsonl $OUT/ftune_b$B.metrics.jsonl 2>/dev/null
done
PYTHONUNBUFFERED=1 timeout 300 python3 .gpu/peer_min.py examples/configs/llama-3-8b.json 2048 2>&1 | grep -v Warning | tee $OUT/peer.jsonl | tail -8
