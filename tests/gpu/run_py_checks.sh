#!/usr/bin/env bash
# Runs the Python acceptance checks against transformers + PEFT (tests/gpu/peft_parity.py,
# plain runner, no pytest needed) and prints one summary table:
#   (a) issue 4: the loss of one batch with the same initial adapter (ftune eval vs PEFT fp32
#       and bf16), and 50 full-batch steps of each from that adapter (same lr, warmup, cosine
#       schedule, AdamW, clipping, no dropout): final eval losses within 2%;
#   (b) issue 7: transformers loads `ftune merge` output and gives the logits of transformers +
#       PEFT (fp32 compute), and `ftune generate` gives transformers' greedy tokens for the
#       same chat-templated prompt (base, adapter, merged folder).
# Model: .gpu/smollm2-small/model.gguf (SmolLM2-135M-Instruct's first layers with its real
# embeddings, written by tests/gpu/make_small_example.py; see peft_parity.py's header).
#
# Usage: tests/gpu/run_py_checks.sh [--device cuda|cpu] [--steps N] [--only a,b]
#   default device: cuda when nvidia-smi sees a GPU, else cpu (a dry run of the whole path);
#   --steps: training steps of (a) (default 50; a CPU dry run uses 3 unless given);
#   --only: substrings of test names (hf_model, adapter_loss, training, merge, generate).
# Environment: FTUNE_BIN (default build/ftune, else /tmp/g/bin/ftune unpacked from
# .gpu/ftune.tar.xz or .gpu/bundle.tar.xz: scripts/gpu_bundle.sh's bin/ + lib/),
# PYTHON (python3), FTUNE_SMALL_EXAMPLE (the GGUF). With $OUT set (the lent GPU machine's
# return folder) the log and the JSON of every check go to $OUT/py_checks/.
# Exit status 0 when every check passed, 1 otherwise (2: usage).
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEV= STEPS= ONLY=
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEV=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run_py_checks.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
if [ -z "$DEV" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEV=cuda; else DEV=cpu; fi
fi
[ -z "$STEPS" ] && { [ "$DEV" = cpu ] && STEPS=3 || STEPS=50; }

if [ -z "${FTUNE_BIN:-}" ]; then
    if [ -x build/ftune ]; then
        FTUNE_BIN=$PWD/build/ftune
    elif [ -f .gpu/ftune.tar.xz ] || [ -f .gpu/bundle.tar.xz ]; then
        BUNDLE=$(ls .gpu/ftune.tar.xz .gpu/bundle.tar.xz 2>/dev/null | head -1)
        [ -x /tmp/g/bin/ftune ] || $PY -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('/tmp/g')" "$BUNDLE"
        FTUNE_BIN=/tmp/g/bin/ftune
        export LD_LIBRARY_PATH=/tmp/g/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    else
        FTUNE_BIN=$PWD/build/ftune
    fi
fi
export FTUNE_BIN
[ -x "$FTUNE_BIN" ] || { echo "run_py_checks.sh: no ftune binary at $FTUNE_BIN (make -j, or set FTUNE_BIN)" >&2; exit 1; }
MODEL=${FTUNE_SMALL_EXAMPLE:-.gpu/smollm2-small/model.gguf}
if [ ! -f "$MODEL" ]; then
    if $PY -c "import gguf" 2>/dev/null; then
        echo "run_py_checks.sh: $MODEL missing: writing it (tests/gpu/make_small_example.py)" >&2
        $PY tests/gpu/make_small_example.py --out "$(dirname "$MODEL")" >&2 || exit 1
    else
        echo "run_py_checks.sh: $MODEL missing; write it where gguf-py is installed:" \
             "python3 tests/gpu/make_small_example.py (and carry .gpu/smollm2-small)" >&2
        exit 1
    fi
fi

# results straight into $OUT/py_checks when set (kept even if this script is killed)
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] && mkdir -p "$OUT/py_checks"; then
    WORK=$OUT/py_checks
else
    WORK=$(mktemp -d /tmp/ftune-py-checks.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
fi
T0=$(date +%s)
echo "[py_checks] device $DEV, $STEPS steps, ftune $FTUNE_BIN ($("$FTUNE_BIN" --version 2>/dev/null | head -1)), model $MODEL"
PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false FTUNE_PARITY_DEVICE=$DEV FTUNE_PARITY_STEPS=$STEPS \
    FTUNE_PARITY_ONLY=$ONLY FTUNE_PARITY_RESULTS=$WORK/py_checks.json FTUNE_SMALL_EXAMPLE=$MODEL \
    $PY tests/gpu/peft_parity.py 2>&1 | grep -v -E 'Loading weights|FutureWarning|warnings.warn' | tee "$WORK/py_checks.log"
rc=${PIPESTATUS[0]}
$PY - "$WORK/py_checks.json" "$rc" "$(( $(date +%s) - T0 ))" <<'PY' | tee -a "$WORK/py_checks.log"
import json, sys
path, rc, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    doc = json.load(open(path))
except (OSError, ValueError):
    doc = {"checks": []}
checks = doc["checks"]
print(f"\n== ftune vs transformers + PEFT: {doc.get('model', '?')}, device {doc.get('device', '?')}, "
      f"{doc.get('steps', '?')} steps, {secs} s; {json.dumps(doc.get('versions', {}))}")
if doc.get("skipped"):
    print(f"SKIPPED: {doc['skipped']}")
hdr = ["point", "check", "value", "bound", "result"]
rows = [[c["point"], c["check"], str(c["value"]), str(c["bound"]), "PASS" if c["ok"] else "FAIL"] for c in checks]
w = [max([len(h)] + [min(len(r[i]), 90) for r in rows]) for i, h in enumerate(hdr)]
cut = lambda s, n: s if len(s) <= n else s[:n - 3] + "..."  # noqa: E731
print(" | ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
print("-+-".join("-" * x for x in w))
for r in rows:
    print(" | ".join(cut(x, 90).ljust(w[i]) for i, x in enumerate(r)))
groups = [("model", "the HF model is the GGUF model (precondition)", ["model"]),
          ("a", f"issue 4: same initial adapter -> same loss; {doc.get('steps', '?')} steps -> eval losses within 2%", ["a.i", "a.ii"]),
          ("b", "issue 7: merged folder in transformers = PEFT logits; greedy generation = transformers'", ["b.merge", "b.generate"])]
print()
for key, what, pts in groups:
    cs = [c for c in checks if c["point"] in pts]
    if not cs:
        print(f"NOT RUN ({key}) {what}")
        continue
    bad = [c for c in cs if not c["ok"]]
    print(f"{'PASS' if not bad else 'FAIL'} ({key}) {what}: {len(cs) - len(bad)}/{len(cs)} checks pass"
          + ("".join(f"\n     failed: [{c['point']}] {c['check']}: {c['value']} (bound {c['bound']})" for c in bad)))
for c in checks:
    if c["point"] == "error":
        print(f"ERROR {c['check']}: {c['value']}")
n_fail = sum(1 for c in checks if not c["ok"])
print(f"{sum(1 for c in checks if c['ok'])} passed, {n_fail} failed" + (", 0 skipped" if not doc.get("skipped") else f", {len(checks) or 1} skipped"))
sys.exit(1 if n_fail or rc or not checks else 0)
PY
exit "${PIPESTATUS[0]}"
