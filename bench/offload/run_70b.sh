#!/bin/bash
# Issue 6 on the lent GPU machine, one call: GPU tests of the tiers, then the Llama-3-70B shape
# (random NF4 pack written by ftune init-model --pack): all layers resident; --gpu-mem 24G
# (the planner streams layers from pinned host memory); --gpu-mem 24G --host-mem 8G (layers
# read from the pack file on NVMe at each visit). Peak GPU memory sampled with nvidia-smi,
# peak host RSS from getrusage (the "done" line), disk rate from `ftune bench io` in the same
# call. Usage there: [TESTS=...] [RUNS="host resident disk"] bash bench/offload/run_70b.sh
# (expects .gpu/bundle.tar.xz, $OUT)
set -u
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -c "import tarfile; tarfile.open('.gpu/bundle.tar.xz').extractall('/tmp/g')"
export LD_LIBRARY_PATH=/tmp/g/lib:/usr/local/cuda/lib64
F=/tmp/g/bin/ftune
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u
free -g | head -2; df -h /tmp | tail -1; nproc
for t in ${TESTS:-test_cuda_stream test_cuda_ops}; do
  CMOCKA_MESSAGE_OUTPUT=stdout timeout 120 /tmp/g/bin/$t > $OUT/$t.log 2>&1; echo "$t rc=$?"
  grep -E "loss gpu|PASSED|FAILED|ERROR|Failure|error" $OUT/$t.log | head -8
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
M=/tmp/m70
timeout 240 $F init-model --config examples/configs/llama-3-70b.json --out $M --pack --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | tail -3
ls -la $M; df -h /tmp | tail -1
stamp init-model
timeout 60 $F bench io --path $M/model-nf4.ftpack --bytes 8G --device cuda 2>&1 | tail -8 | tee $OUT/bench_io.txt
stamp bench-io
run() { # name, seconds, args...
  local name=$1 lim=$2; shift 2
  (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> /tmp/mem_$name.txt; sleep 0.2; done) & local MP=$!
  timeout $lim $F train --model $M --data /tmp/d.jsonl --data-format text --device cuda --seq-len 2048 \
     --lora-dropout 0 --save-every 0 --out /tmp/o_$name --eval-fraction 0 --log-every 1 "$@" 2>&1 \
     | grep -vE "^ftune: (model|data) " | tail -22 | tee $OUT/$name.log
  kill $MP 2>/dev/null; echo "$name: peak GPU memory used (nvidia-smi) $(sort -n /tmp/mem_$name.txt | tail -1) MiB" | tee -a $OUT/$name.log
  cp /tmp/o_$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null
  stamp $name
}
want() { case " ${RUNS:-host resident disk} " in *" $1 "*) return 0;; esac; return 1; }
want host && run host ${LIM_HOST:-170} --gpu-mem 24G --host-mem 48G --grad-accum auto --max-steps 3 --timeline $OUT/host.svg ${HOST_ARGS:-}
want resident && run resident ${LIM_RES:-150} --grad-accum ${GA_RES:-auto} --max-steps 3 ${RES_ARGS:-}
want disk && run disk ${LIM_DISK:-200} --gpu-mem 24G --host-mem 8G --grad-accum auto --max-steps 2 --timeline $OUT/disk.svg ${DISK_ARGS:-}
