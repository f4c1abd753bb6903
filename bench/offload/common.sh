# common.sh - sourced by bench/offload/run_*.sh on the lent GPU machine: unpacks the carried
# bundle (.gpu/bundle.tar.xz from scripts/gpu_bundle.sh), prints the machine, runs the GPU test
# binaries named in $TESTS (default: the caller's DEFAULT_TESTS; "none" for none), writes
# $TMPW/d.jsonl (64 rows of ~2600 random words), and defines run NAME SECONDS ARGS... (one
# `ftune train` on $M with nvidia-smi sampled for the peak; logs and metrics to $OUT).
# The device tool brings back at most 8 files from $OUT: everything is written under a staging
# folder and packed into $OUT/results.tgz when the script exits. DEADLINE (seconds from the
# start, default 560) bounds the whole call: `cap N` is N (times TSCALE) or what is left before
# the deadline, and `run` skips a run when under 25 s are left, so the packing always happens.
#
# DRY=1: a dry run on a CPU machine (bench/offload/dryrun.md): the ftune and unit tests of
# $DRY_BUILD (default build: `make -j2 BUILD=build build/ftune`); DRY=bundle: those
# of .gpu/bundle.tar.xz, unpacked into $G=$TMPW/g (the GPU machine's is /tmp/g). Either way: no
# nvidia-smi, GPU binaries listed as skipped, DEV=cpu-device for cuda, small configs CFG8/CFG70
# written to $TMPW, budgets GPU24/HOST48/HOST8 scaled so the planner takes the same tiers,
# SEQ 128, TSCALE 4, DEADLINE 3000, work folder $TMPW a fresh /tmp/dry.XXXXXX (else /tmp).
set -u
T0=$(date +%s)
DRY=${DRY:-}
[ -n "$DRY" -a "$DRY" != bundle ] && DRY=1
if [ -n "$DRY" ]; then
  DEADLINE=${DEADLINE:-3000} TSCALE=${TSCALE:-4} DEV=${DEV:-cpu-device} SEQ=${SEQ:-128}
  TMPW=${TMPW:-$(mktemp -d /tmp/dry.XXXXXX)} OUT=${OUT:-$TMPW}
  # the planner's GPU memory holds a 1 GiB spare and the V x C tables, so the tier windows of the
  # small 24-layer model are narrow: 1500M keeps ~4 of its layers on the device (the rest in host
  # memory), and 40M of host memory sends ~half of the others to the pack file (NVMe tier)
  GPU24=${GPU24:-1500M} HOST48=${HOST48:-48G} HOST8=${HOST8:-40M} G=$TMPW/g
else
  DEADLINE=${DEADLINE:-560} TSCALE=${TSCALE:-1} DEV=${DEV:-cuda} SEQ=${SEQ:-2048} TMPW=${TMPW:-/tmp}
  GPU24=${GPU24:-24G} HOST48=${HOST48:-48G} HOST8=${HOST8:-8G} G=/tmp/g
fi
CFG8=${CFG8:-examples/configs/llama-3-8b.json}
CFG70=${CFG70:-examples/configs/llama-3-70b.json}
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
cap() { local l n=$(( $1 * TSCALE )); l=$(( $(left) - 10 )); [ "$n" -lt "$l" ] && echo "$n" || echo "$l"; }
FINAL_OUT=$OUT
mkdir -p "$FINAL_OUT"  # the results.tgz of the EXIT trap lands there
OUT=$TMPW/res
mkdir -p $OUT
trap 'tar czf "$FINAL_OUT/results.tgz" -C "$TMPW" res 2>/dev/null; ls -la "$FINAL_OUT"
  [ -n "$DRY" ] && rm -rf "$TMPW"/m8b "$TMPW"/m70 "$TMPW"/g "$TMPW"/smokecache' EXIT  # DRY: keep the logs
if [ "$DRY" = 1 ]; then
  F=${DRY_BUILD:-build}/ftune
  [ -x "$F" ] || { echo "DRY: no $F (make -j2 BUILD=${DRY_BUILD:-build} $F)"; exit 1; }
else
  python3 -c "import tarfile; tarfile.open('.gpu/bundle.tar.xz').extractall('$G')"
  export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64
  F=$G/bin/ftune
fi
if [ -n "$DRY" ]; then
  [ "$DRY" = bundle ] && [ "$(stat -c %Y .gpu/bundle.tar.xz)" -lt "$(git log -1 --format=%ct)" ] &&
    echo "DRY: the bundle is older than the last commit (scripts/gpu_bundle.sh)"
  echo "DRY run: $F, --device $DEV, work folder $TMPW, SEQ $SEQ, GPU24 $GPU24 HOST48 $HOST48 HOST8 $HOST8"
  # the shapes of the Llama-3 configs at a size the CPU trains in seconds (llama3 vocabulary)
  python3 - "$CFG8" "$CFG70" "$TMPW" <<'PY'
import json, sys
for src, name, upd in ((sys.argv[1], "cfg8.json", dict(num_hidden_layers=4, hidden_size=256,
                        intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2)),
                       (sys.argv[2], "cfg70.json", dict(num_hidden_layers=24, hidden_size=512,
                        intermediate_size=4096, num_attention_heads=8, num_key_value_heads=2))):
    c = json.load(open(src))
    c.update(upd, max_position_embeddings=2048)
    json.dump(c, open(f"{sys.argv[3]}/{name}", "w"), indent=1)
PY
  CFG8=$TMPW/cfg8.json CFG70=$TMPW/cfg70.json
  nvidia-smi() { :; }  # the peak memory sampler reads nothing
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u
free -g | head -2; df -h $TMPW | tail -1; nproc
for t in ${TESTS:-$DEFAULT_TESTS}; do
  [ "$t" = none ] && continue
  [ "$DRY" = 1 ] && { echo "$t: skipped (DRY: a GPU test binary)"; continue; }
  [ -x $G/bin/$t ] || { echo "$t: not in the bundle"; continue; }
  [ -n "$DRY" ] && { echo "$t: in the bundle, skipped (DRY: needs a GPU)"; continue; }
  [ "$(left)" -lt 60 ] && { echo "$t: skipped (deadline)"; continue; }
  CMOCKA_MESSAGE_OUTPUT=stdout timeout $(cap ${TEST_CAP:-120}) $G/bin/$t > $OUT/$t.log 2>&1; echo "$t rc=$?"
  grep -E "loss gpu|GB/s|PASSED|FAILED|ERROR|Failure|error" $OUT/$t.log | head -8
done
stamp tests
python3 - "$TMPW" <<'PY'
import json, random, sys
random.seed(0)
words = open('tests/fixtures/tokenizers/llama2/tokenizer.json').read().split('"')[1::2][:20000]
words = [w for w in words if w.isalpha() and len(w) > 2][:5000]
with open(sys.argv[1] + '/d.jsonl', 'w') as f:
    for i in range(64):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(2600))}) + "\n")
PY
# One line from nvidia-smi samples "MiB, MHz, W, C": the SM clock's spread over the samples
# taken under load (power above half its peak), the peak power and temperature.
smi_summary() {
  python3 - "$1" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]) if __import__("os").path.exists(sys.argv[1]) else []:
    try:
        rows.append([float(x) for x in line.split(",")])
    except ValueError:
        pass
rows = [r for r in rows if len(r) == 4]
peak_w = max((r[2] for r in rows), default=0)
busy = sorted(r[1] for r in rows if r[2] > 0.5 * peak_w)
if busy:
    q = lambda f: busy[min(len(busy) - 1, int(f * len(busy)))]
    print(f"nvidia-smi under load ({len(busy)} samples): SM clock min {busy[0]:.0f} / median {q(0.5):.0f}"
          f" / max {busy[-1]:.0f} MHz; peak power {peak_w:.0f} W, "
          f"peak temperature {max(r[3] for r in rows):.0f} C")
PY
}
run() { # name, seconds, args...  (uses $M, $LOG_LINES)
  local name=$1 lim rc; lim=$(cap $2); shift 2
  [ "$lim" -lt 25 ] && { echo "$name: skipped ($(left) s left before the deadline)"; return 0; }
  # memory (MiB), SM clock (MHz), power (W), temperature (C) every 0.2 s: the peak memory, and
  # whether the clocks fell under sustained load (the planner's probe runs one layer, cold)
  (while true; do nvidia-smi --query-gpu=memory.used,clocks.sm,power.draw,temperature.gpu \
     --format=csv,noheader,nounits >> $TMPW/smi_$name.txt 2>/dev/null; sleep 0.2; done) & local MP=$!
  timeout $lim $F train --model $M --data $TMPW/d.jsonl --data-format text --device $DEV --seq-len $SEQ \
     --lora-dropout 0 --save-every 0 --out $TMPW/o_$name --eval-fraction 0 --log-every 1 "$@" 2>&1 \
     | grep -vE "^ftune: (model|data) " | tee $TMPW/full_$name.log | tail -${LOG_LINES:-22} | tee $OUT/$name.log
  rc=${PIPESTATUS[0]}
  grep -E "probe|plan:" $TMPW/full_$name.log | head -6 >> $OUT/$name.log
  grep -E "^ftune: profile: " $TMPW/full_$name.log | head -40 >> $OUT/$name.log  # --profile's table
  kill $MP 2>/dev/null
  echo "$name: ftune train rc=$rc; peak GPU memory used (nvidia-smi) $(cut -d, -f1 $TMPW/smi_$name.txt 2>/dev/null | sort -n | tail -1) MiB" | tee -a $OUT/$name.log
  smi_summary $TMPW/smi_$name.txt | tee -a $OUT/$name.log
  cp $TMPW/o_$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null
  stamp $name
}
