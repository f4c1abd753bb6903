# common.sh - sourced by bench/offload/run_*.sh on the lent GPU machine: unpacks the carried
# bundle (.gpu/bundle.tar.xz from scripts/gpu_bundle.sh), prints the machine, runs the GPU test
# binaries named in $TESTS (default: the caller's DEFAULT_TESTS; "none" for none), writes
# /tmp/d.jsonl (64 rows of ~2600 random words), and defines run NAME SECONDS ARGS... (one
# `ftune train` on $M with nvidia-smi sampled for the peak; logs and metrics to $OUT).
# The device tool brings back at most 8 files from $OUT: everything is written under a staging
# folder and packed into $OUT/results.tgz when the script exits. DEADLINE (seconds from the
# start, default 560) bounds the whole call: `cap N` is N or what is left before the deadline,
# and `run` skips a run when under 25 s are left, so the packing always happens.
set -u
T0=$(date +%s)
DEADLINE=${DEADLINE:-560}
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
cap() { local l; l=$(( $(left) - 10 )); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
FINAL_OUT=$OUT
OUT=/tmp/res
mkdir -p $OUT
trap 'tar czf "$FINAL_OUT/results.tgz" -C /tmp res 2>/dev/null; ls -la "$FINAL_OUT"' EXIT
python3 -c "import tarfile; tarfile.open('.gpu/bundle.tar.xz').extractall('/tmp/g')"
export LD_LIBRARY_PATH=/tmp/g/lib:/usr/local/cuda/lib64
F=/tmp/g/bin/ftune
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u
free -g | head -2; df -h /tmp | tail -1; nproc
for t in ${TESTS:-$DEFAULT_TESTS}; do
  [ -x /tmp/g/bin/$t ] || continue
  [ "$(left)" -lt 60 ] && { echo "$t: skipped (deadline)"; continue; }
  CMOCKA_MESSAGE_OUTPUT=stdout timeout $(cap 120) /tmp/g/bin/$t > $OUT/$t.log 2>&1; echo "$t rc=$?"
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
run() { # name, seconds, args...  (uses $M, $LOG_LINES)
  local name=$1 lim; lim=$(cap $2); shift 2
  [ "$lim" -lt 25 ] && { echo "$name: skipped ($(left) s left before the deadline)"; return 0; }
  (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> /tmp/mem_$name.txt; sleep 0.2; done) & local MP=$!
  timeout $lim $F train --model $M --data /tmp/d.jsonl --data-format text --device cuda --seq-len 2048 \
     --lora-dropout 0 --save-every 0 --out /tmp/o_$name --eval-fraction 0 --log-every 1 "$@" 2>&1 \
     | grep -vE "^ftune: (model|data) " | tee /tmp/full_$name.log | tail -${LOG_LINES:-22} | tee $OUT/$name.log
  grep -E "probe|plan:" /tmp/full_$name.log | head -6 >> $OUT/$name.log
  kill $MP 2>/dev/null; echo "$name: peak GPU memory used (nvidia-smi) $(sort -n /tmp/mem_$name.txt | tail -1) MiB" | tee -a $OUT/$name.log
  cp /tmp/o_$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null
  stamp $name
}
