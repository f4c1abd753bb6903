#!/usr/bin/env bash
# Runs every C unit test binary (cmocka), the fuzz corpus replays, the CPU emulations of the
# CUDA kernels (tests/emu), the layer check (tests/lint) and the Python reference tests
# (pytest), then prints one closing
# line: "N passed, N failed, N skipped". Exit 0 only if nothing failed.
# Usage: tests/run_tests.sh [BUILD_DIR]
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.."
export FTUNE_BIN="$PWD/$BUILD/ftune"
# The suite checks the CPU backend against its references; the GPU tests (make test-gpu)
# choose their device themselves.
export FTUNE_DEVICE=cpu
pass=0 fail=0 skip=0
failed_list=()
TIMEOUT=${FTUNE_TEST_TIMEOUT:-900}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    out=$(CMOCKA_MESSAGE_OUTPUT=stdout timeout "$TIMEOUT" "$t" 2>&1); rc=$?
    echo "$out" | grep -E '^\[  (FAILED|  SKIPPED|SKIPPED |ERROR)|^\[ *(FAILED|SKIPPED)|max (rel|abs)' | sed "s|^|  $name: |"
    p=$(echo "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    f=$(echo "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    s=$(echo "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -1)
    p=${p:-0}; f=${f:-0}; s=${s:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1; echo "$out" | tail -20 | sed "s|^|  $name: |"; echo "  $name: exited with status $rc"
    fi
    [ "$f" -gt 0 ] && failed_list+=("$name")
    echo "$name: $p passed, $f failed, $s skipped"
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
# Fuzz seed corpora (tests/fuzz/corpus/NAME) replayed through each libFuzzer target built
# with the normal compiler (tests/fuzz/replay.c): one pass or fail per corpus.
for r in "$BUILD"/tests/fuzz/replay_*; do
    [ -x "$r" ] || continue
    name=${r##*/replay_}
    out=$(timeout "$TIMEOUT" "$r" "tests/fuzz/corpus/$name" 2>&1); rc=$?
    if [ "$rc" -eq 0 ]; then
        pass=$((pass + 1))
        echo "fuzz replay $name: $(echo "$out" | tail -1 | sed 's/^replay: //')"
    else
        fail=$((fail + 1)); failed_list+=("replay_$name")
        echo "$out" | tail -25 | sed "s|^|  replay_$name: |"
        echo "fuzz replay $name: FAILED (exit status $rc; the last 'running' line names the input)"
    fi
done
# CPU emulations of the tensor-core kernels (tests/emu, built when CUDA=1): each binary runs a
# kernel file's device code on the CPU against a reference; one pass or fail per binary.
for e in "$BUILD"/tests/emu_*; do
    [ -x "$e" ] || continue
    name=$(basename "$e")
    out=$(timeout "$TIMEOUT" "$e" 2>&1); rc=$?
    if [ "$rc" -eq 0 ]; then
        pass=$((pass + 1))
        echo "$name: $(echo "$out" | tail -1)"
    else
        fail=$((fail + 1)); failed_list+=("$name")
        echo "$out" | tail -25 | sed "s|^|  $name: |"
        echo "$name: FAILED (exit status $rc)"
    fi
done
# The layer rules of docs/architecture.md (tests/lint/check_layers.py: no include of a folder
# of the same or a higher layer, no getenv outside cli/) and the checker's own test (planted
# violations in a temp tree make it fail): one pass or fail each.
if command -v python3 >/dev/null; then
    for l in tests/lint/check_layers.py tests/lint/test_check_layers.py; do
        name=$(basename "$l" .py)
        out=$(timeout "$TIMEOUT" python3 "$l" 2>&1); rc=$?
        if [ "$rc" -eq 0 ]; then
            pass=$((pass + 1))
            echo "lint $name: $(echo "$out" | tail -1)"
        else
            fail=$((fail + 1)); failed_list+=("lint_$name")
            echo "$out" | tail -40 | sed "s|^|  lint_$name: |"
            echo "lint $name: FAILED (exit status $rc)"
        fi
    done
else
    skip=$((skip + 2)); echo "lint: skipped (no python3)"
fi
# FTUNE_TEST_PYTEST=0: C tests and replays only (the sanitizer step of .ci/run).
if [ "${FTUNE_TEST_PYTEST:-1}" != 0 ] && command -v python3 >/dev/null && [ -d tests/ref ]; then
    # the whole reference suite under one guard against a hang (each test has its own
    # timeouts); FTUNE_PYTEST_TIMEOUT overrides it; the 15 slowest tests are listed, to keep
    # the suite within CI's time
    PYTEST_TIMEOUT=${FTUNE_PYTEST_TIMEOUT:-1800}
    out=$(timeout "$PYTEST_TIMEOUT" python3 -m pytest -q -rfEs --durations=15 tests/ref 2>&1); rc=$?
    echo "$out" | tail -40
    # a failure's own report (the traceback and the captured output), which the tail leaves out
    echo "$out" | sed -n '/^=* FAILURES =*$/,/^=* short test summary/p' | head -200
    [ "$rc" -eq 124 ] && echo "pytest tests/ref: stopped after ${PYTEST_TIMEOUT} s (FTUNE_PYTEST_TIMEOUT)"
    summary=$(echo "$out" | tail -1)
    p=$(echo "$summary" | grep -o '[0-9]* passed' | grep -o '[0-9]*'); p=${p:-0}
    f=$(echo "$summary" | grep -o '[0-9]* failed' | grep -o '[0-9]*'); f=${f:-0}
    e=$(echo "$summary" | grep -o '[0-9]* error' | grep -o '[0-9]*'); e=${e:-0}
    s=$(echo "$summary" | grep -o '[0-9]* skipped' | grep -o '[0-9]*'); s=${s:-0}
    f=$((f + e))
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$f" -eq 0 ]; then f=1; fi
    [ "$f" -gt 0 ] && failed_list+=("pytest tests/ref")
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
fi
[ ${#failed_list[@]} -gt 0 ] && echo "failed: ${failed_list[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
