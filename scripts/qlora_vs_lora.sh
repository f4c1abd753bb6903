#!/usr/bin/env bash
# qlora_vs_lora.sh - the QLoRA acceptance check of issue 5 on the CPU: trains a LoRA adapter
# on the bf16 base (--quant bf16) and a QLoRA adapter on the NF4 base (--quant nf4) with
# identical settings and seed, then prints both eval-loss curves, the two final eval losses
# and the relative gap (QLoRA / LoRA - 1) against the issue's 5% bound.
#
# Usage: scripts/qlora_vs_lora.sh [extra ftune train flags, given to both arms]
#   e.g. scripts/qlora_vs_lora.sh                          # the `make demo` settings, 1 epoch (20 steps)
#        scripts/qlora_vs_lora.sh --epochs 5 --eval-every 20   # 100 steps
# Environment: FTUNE (binary, default build/ftune), MODEL (default: the example model from
# scripts/fetch_example.sh), DATA (default: the 175 Alpaca seed tasks), OUT (default
# runs/qlora_vs_lora; OUT/lora and OUT/qlora are replaced), THREADS (default: all cores),
# PARALLEL=1 (both arms at once, THREADS each: on a small shared machine two 1-thread runs
# waste no time in OpenMP barriers; the thread count may change the last bits of the losses).
# The base settings are the demo's (scripts/demo.sh): seq 256, batch 2, grad-accum 2, lr 1e-3,
# 10% held out, seed 42. Flags given later override them (ftune takes the last value).
# Exit status: 0 when both runs finished (whatever the gap), 1 otherwise. Results and the
# measured numbers: bench/results/qlora.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FTUNE=${FTUNE:-build/ftune}
MODEL=${MODEL:-$(bash scripts/fetch_example.sh)}
DATA=${DATA:-examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl}
OUT=${OUT:-runs/qlora_vs_lora}
THREADS=${THREADS:-$(nproc)}
COMMON=(--model "$MODEL" --data "$DATA" --seq-len 256 --batch-size 2 --grad-accum 2 --lr 1e-3
        --eval-fraction 0.1 --seed 42 --save-every 0 --threads "$THREADS" --cache-dir "$OUT/cache")

# field NAME FILE: the number after "NAME": in a one-object JSON file (summary.json).
field() { tr -d ' \t\n' <"$2" | sed -n "s/.*\"$1\":\([-0-9.eE+naif]*\).*/\1/p"; }

run_arm() {
    local arm=$1 q=bf16 t0
    [ "$arm" = qlora ] && q=nf4
    echo "[qlora_vs_lora] $arm: $FTUNE train --quant $q ${COMMON[*]} --out $OUT/$arm ${EXTRA[*]}" >&2
    t0=$(date +%s)
    "$FTUNE" train --quant "$q" "${COMMON[@]}" --out "$OUT/$arm" "${EXTRA[@]}" 2>"$OUT/$arm.log" ||
        { echo "[qlora_vs_lora] $arm failed:" >&2; tail -n 3 "$OUT/$arm.log" >&2; return 1; }
    echo "[qlora_vs_lora] $arm: done in $(( $(date +%s) - t0 )) s" >&2
}
EXTRA=("$@")
mkdir -p "$OUT"
rm -rf "${OUT:?}/lora" "${OUT:?}/qlora"
if [ "${PARALLEL:-0}" = 1 ]; then
    run_arm lora & a=$!
    run_arm qlora & b=$!
    wait $a || exit 1
    wait $b || exit 1
else
    run_arm lora || exit 1
    run_arm qlora || exit 1
fi

# eval curves side by side: step, LoRA eval loss, QLoRA eval loss, gap
evals() { sed -n 's/.*"step": *\([0-9]*\), *"eval_loss": *\([-0-9.eE+naif]*\).*/\1 \2/p' "$1"; }
echo "step  lora_eval  qlora_eval  gap"
join <(evals "$OUT/lora/metrics.jsonl" | sort -k1,1) <(evals "$OUT/qlora/metrics.jsonl" | sort -k1,1) |
    sort -n | awk '{ printf "%4d  %9.4f  %10.4f  %+6.2f%%\n", $1, $2, $3, 100 * ($3 / $2 - 1) }'

lo0=$(field initial_eval_loss "$OUT/lora/summary.json"); lo=$(field final_eval_loss "$OUT/lora/summary.json")
ql0=$(field initial_eval_loss "$OUT/qlora/summary.json"); ql=$(field final_eval_loss "$OUT/qlora/summary.json")
steps=$(field steps "$OUT/lora/summary.json")
awk -v lo0="$lo0" -v lo="$lo" -v ql0="$ql0" -v ql="$ql" -v s="$steps" 'BEGIN {
    g0 = ql0 / lo0 - 1; g = ql / lo - 1
    printf "base (step 0): LoRA %.4f  QLoRA %.4f  gap %+.2f%%\n", lo0, ql0, 100 * g0
    printf "final (step %d): LoRA %.4f  QLoRA %.4f  gap %+.2f%%  (bound 5%%: %s)\n", s, lo, ql,
           100 * g, g <= 0.05 ? "met" : "NOT met"
}'
