#!/usr/bin/env bash
# Runs the GPU tests: every tests/gpu C test binary (cmocka; each skips without a GPU) and
# the pytest files of tests/gpu (parity with transformers + PEFT; skip without torch.cuda),
# then prints "N passed, N failed, N skipped". Usage: tests/run_gpu_tests.sh [BUILD_DIR]
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.."
export FTUNE_BIN="$PWD/$BUILD/ftune"
pass=0 fail=0 skip=0
for t in "$BUILD"/tests/gpu/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    out=$(CMOCKA_MESSAGE_OUTPUT=stdout timeout 900 "$t" 2>&1); rc=$?
    echo "$out" | grep -vE '^\[ (RUN|      OK) ' | sed "s|^|  $name: |"
    p=$(echo "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    f=$(echo "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    s=$(echo "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -1)
    p=${p:-0}; f=${f:-0}; s=${s:-0}
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1 && echo "  $name: exited with status $rc"
    echo "$name: $p passed, $f failed, $s skipped"
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
if ls tests/gpu/*.py >/dev/null 2>&1 && command -v python3 >/dev/null; then
    out=$(timeout 1800 python3 -m pytest -q -rs tests/gpu 2>&1); rc=$?
    echo "$out" | tail -40
    summary=$(echo "$out" | tail -1)
    p=$(echo "$summary" | grep -o '[0-9]* passed' | grep -o '[0-9]*'); p=${p:-0}
    f=$(echo "$summary" | grep -o '[0-9]* failed' | grep -o '[0-9]*'); f=${f:-0}
    e=$(echo "$summary" | grep -o '[0-9]* error' | grep -o '[0-9]*'); e=${e:-0}
    s=$(echo "$summary" | grep -o '[0-9]* skipped' | grep -o '[0-9]*'); s=${s:-0}
    f=$((f + e))
    [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$f" -eq 0 ] && f=1
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
