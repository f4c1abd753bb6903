#!/usr/bin/env bash
# CPU benchmark: training tokens/s of the example model at --seq-len 256 next to OpenBLAS's
# sgemm rate, measured in one run on this machine. Writes bench/results/cpu-<host>-<date>.md.
# Usage: bench/cpu_train.sh [STEPS]   (default 12 optimizer steps after 2 warm-up steps)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-12}
make --no-print-directory all build/bench/sgemm_rate >/dev/null
GGUF=$(bash scripts/fetch_example.sh)
DATE=$(date -u +%Y-%m-%d)
HOST=$(hostname)
OUT=bench/results/cpu-$DATE.md
TMP=$(mktemp -d)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
SGEMM=$(build/bench/sgemm_rate)
CMD="build/ftune train --model $GGUF --data examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl --out $TMP/run --seq-len 256 --batch-size 2 --grad-accum 1 --max-steps $((STEPS + 2)) --eval-fraction 0 --quiet"
$CMD
# tokens/s over the steps after the first two (warm caches), from metrics.jsonl
TPS=$(python3 bench/median_tps.py "$TMP/run/metrics.jsonl")
# FLOPs per token, counted explicitly (bench/lora_flops.py), at the mean example length
MEANLEN=$(build/ftune tokenize --model "$GGUF" --data examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl \
    | python3 -c 'import json,sys; n=[min(256,len(json.loads(l)["ids"])) for l in sys.stdin]; print("%.1f" % (sum(n)/len(n)))')
FLOPS=$(python3 bench/lora_flops.py "$GGUF" 16 "$MEANLEN")
GFLOPS=$(python3 -c "print('%.1f' % ($TPS * $FLOPS / 1e9))")
{
  echo "# CPU training benchmark, $DATE"
  echo
  echo "- machine: $HOST, $(nproc) cores, $CPU, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- command: \`$CMD\`"
  echo "- model: SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to fp32), LoRA r16 on all 7 modules"
  echo
  echo "| measure | value |"
  echo "|---|---|"
  echo "| ftune training tokens/s (seq 256, batch 2; median of steps 3..$((STEPS + 2))) | $TPS |"
  echo "| FLOPs per token (bench/lora_flops.py; mean example $MEANLEN tokens) | $FLOPS |"
  echo "| achieved GFLOP/s (tokens/s x FLOPs per token) | $GFLOPS |"
  echo "$SGEMM" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print("| OpenBLAS sgemm %dx%dx%d (%d threads) | %.1f GFLOP/s |" % (r["m"], r["n"], r["k"], r["threads"], r["gflops"]))'
} | tee "$OUT"
rm -rf "$TMP"
