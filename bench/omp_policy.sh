#!/usr/bin/env bash
# OpenMP wait policy on the CPU backend: training tokens/s of the example model (as
# bench/cpu_train.sh: seq 256, batch 2) under libgomp's spinning default (spin:
# GOMP_SPINCOUNT=300000, what libgomp uses when neither variable is set), shorter spins (spinN:
# GOMP_SPINCOUNT=N; ftune sets 1000 when neither is set, cli/omp_env.c) and the passive policy;
# alone on the machine (ROUNDS rounds, the policies interleaved, since a VM's speed drifts by
# 10-20% between minutes) and as one of two identical runs side by side (a two-run sweep).
# Writes bench/results/cpu-omp-<date>.md.
# Usage: [POLICIES="spin spin1000 passive"] [ROUNDS=3] bench/omp_policy.sh [STEPS]
#        (default 10 steps; tokens/s: the median of the steps after the first two)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-10}
POLICIES=${POLICIES:-spin spin1000 passive}
ROUNDS=${ROUNDS:-3}
make --no-print-directory all >/dev/null
GGUF=$(bash scripts/fetch_example.sh)
DATA=examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
OUT=bench/results/cpu-omp-$(date -u +%Y-%m-%d).md
CMD="build/ftune train --model $GGUF --data $DATA --seq-len 256 --batch-size 2 --grad-accum 1 --max-steps $STEPS --eval-fraction 0 --save-every 0 --quiet"
tps() { python3 bench/median_tps.py "$1"; }  # metrics.jsonl -> median tokens/s, steps 3..
policy() { # name -> the environment
  case $1 in
    spin) echo "GOMP_SPINCOUNT=300000";;
    spin[0-9]*) echo "GOMP_SPINCOUNT=${1#spin}";;
    passive) echo "OMP_WAIT_POLICY=passive";;
    *) echo "omp_policy.sh: unknown policy '$1' (spin, spinN, passive)" >&2; exit 2;;
  esac
}
[ "$ROUNDS" -ge 1 ] 2>/dev/null || { echo "omp_policy.sh: ROUNDS must be >= 1" >&2; exit 2; }
for p in $POLICIES; do policy $p >/dev/null; done
declare -A alone
for r in $(seq $ROUNDS); do
  for p in $POLICIES; do
    env $(policy $p) $CMD --out $TMP/a_${p}_${r}
    alone[$p]="${alone[$p]:-}$(tps $TMP/a_${p}_${r}/metrics.jsonl) "
    rm -rf $TMP/a_${p}_${r}
    echo "round $r, $p alone: ${alone[$p]}"
  done
done
rows=""
for p in $POLICIES; do
  env $(policy $p) $CMD --out $TMP/b1_$p & P1=$!
  env $(policy $p) $CMD --out $TMP/b2_$p & P2=$!
  wait $P1 $P2
  b1=$(tps $TMP/b1_$p/metrics.jsonl) b2=$(tps $TMP/b2_$p/metrics.jsonl)
  mean=$(echo ${alone[$p]} | python3 -c 'import sys; v=[float(x) for x in sys.stdin.read().split()]; print("%.1f" % (sum(v)/len(v)))')
  rows="$rows| $p (\`$(policy $p)\`) | ${alone[$p]% } (mean $mean) | $b1 + $b2 = $(python3 -c "print('%.1f' % ($b1 + $b2))") |
"
  echo "$p: alone ${alone[$p]}(mean $mean); two side by side $b1 + $b2"
done
{
  echo "# OpenMP wait policy, CPU backend, $(date -u +%Y-%m-%d)"
  echo
  echo "Machine: $(hostname), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), $(free -g | awk '/Mem:/{print $2}') GiB."
  echo "Command (\`bench/omp_policy.sh $STEPS\`, ROUNDS=$ROUNDS; the sweep column runs it twice at once): \`$CMD\`"
  echo "Build: $(git rev-parse --short HEAD). tokens/s: median over steps 3-$STEPS of metrics.jsonl."
  echo
  echo "| policy | alone, tok/s per round | two runs side by side, tok/s each (sum) |"
  echo "|---|---|---|"
  printf "%s" "$rows"
} > $OUT
echo "wrote $OUT"
