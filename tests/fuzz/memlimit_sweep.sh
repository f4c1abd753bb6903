#!/usr/bin/env bash
# memlimit_sweep.sh - issue 31 class 9's acceptance run: trains a model (MODEL, default
# tests/fixtures/tiny-llama; the example model: MODEL=~/.cache/ftune/examples/SmolLM2-135M-Instruct.Q4_1.gguf,
# `make demo` fetches it) for 2 steps under `ulimit -v` from 50 MB to 1 GB in 50 MB steps and
# prints one Markdown table row per limit: the exit status, the wall time and the last stderr
# line. Each run must end within 30 s (it is killed at 30 s and reported as a HANG) with exit 1
# and an out-of-memory line, or exit 0. Exits 1 if any run broke that.
#   [MODEL=M] tests/fuzz/memlimit_sweep.sh [FTUNE_BIN]   (default build-cpu/ftune, then build/ftune)
# MB here are 1,000,000 bytes; `ulimit -v` takes KiB.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-}
[ -z "$BIN" ] && for b in build-cpu/ftune build/ftune; do [ -x "$b" ] && BIN=$b && break; done
[ -x "${BIN:-}" ] || { echo "memlimit_sweep: no ftune binary (give its path)" >&2; exit 2; }
MODEL=${MODEL:-tests/fixtures/tiny-llama}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
bad=0
echo "| ulimit -v | exit | seconds | last stderr line |"
echo "|---|---|---|---|"
for mb in $(seq 50 50 1000); do
    kib=$((mb * 1000000 / 1024))
    rm -rf "$TMP/out"
    t0=$(date +%s.%N)
    ( ulimit -v "$kib"; exec timeout -s KILL 30 "$BIN" train --model "$MODEL" \
        --data examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl --out "$TMP/out" \
        --seq-len 64 --max-steps 2 --eval-fraction 0 --quiet ) >/dev/null 2>"$TMP/err"
    rc=$?
    t1=$(date +%s.%N)
    s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    line=$(grep -v '^\s*$' "$TMP/err" | tail -1 | sed "s|$PWD/||g; s|$HOME/|~/|g; s|/tmp/ftcache/|.../|g; s/|/\\\\|/g")
    verdict=""
    if [ "$rc" -eq 137 ]; then verdict=" HANG (killed at 30 s)"; bad=1
    elif [ "$rc" -ne 0 ] && { [ "$rc" -ne 1 ] || ! grep -qiE 'out of memory|cannot allocate memory' "$TMP/err"; }; then
        verdict=" NOT AN OUT-OF-MEMORY END"; bad=1
    fi
    echo "| $mb MB | $rc$verdict | $s | ${line:-(none)} |"
done
exit $bad
