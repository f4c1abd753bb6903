#!/bin/bash
# sweep_cpu.sh - issue 32's CPU speed figures, written to bench/results/<machine>-<date>/sweep.md:
#  1. an 8-trial grid (lr x lora_r x lora_alpha) on the example model (tests/fixtures/tiny-llama)
#     with `ftune sweep --prune halving`, against the same 8 configurations run one after another
#     with `ftune train` for the same steps: wall times, ratio, the sweep's best trial against
#     the sequential grid's best (by best eval loss);
#  2. on cpu-device with the NF4 base streamed from its pack file (a 16-layer widened model,
#     --host-mem below its size, small --seq-len): one 4-adapter pass against one adapter,
#     aggregate tok/s and the disk time per step from the timeline.
# Usage: [FTUNE=build-cpu/ftune] [THREADS=2] [MACHINE=cpu] [ETA=2] [REPEAT=3] bash bench/sweep_cpu.sh
set -eu
cd "$(dirname "$0")/.."
F=${FTUNE:-build-cpu/ftune}
TH=${THREADS:-2}
M=tests/fixtures/tiny-llama
D=examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl
W=$(mktemp -d /tmp/sweepbench.XXXXXX)
RES=bench/results/${MACHINE:-cpu}-$(date -u +%F)
mkdir -p "$RES"
OUT=$RES/sweep.md
now() { date +%s.%N; }
COMMON="--data $D --seq-len 128 --batch-size 2 --threads $TH --seed 5 --eval-fraction 0.2 --eval-max 4 --max-steps 48 --eval-every 4"
LRS="1e-3 2e-3" RS="8 16" ALPHAS="16 32"

ETA=${ETA:-2}     # --prune-eta (2: ftune's default)
REPEAT=${REPEAT:-3}
# REPEAT rounds, the sweep and the sequential grid alternating, so that a change in the machine's
# load (a shared VM) lands on both sides; each round's wall times go to $W/times
: > $W/times
for i in $(seq 1 "$REPEAT"); do
  rm -rf $W/sweep $W/seq
  t0=$(now)
  $F sweep --model $M --out $W/sweep $COMMON --grid lr=1e-3,2e-3 --grid lora_r=8,16 --grid lora_alpha=16,32 \
    --prune halving --prune-eta $ETA > $W/sweep.log 2>&1
  t1=$(now)
  for lr in $LRS; do for r in $RS; do for a in $ALPHAS; do
    $F train --model $M --out $W/seq/lr${lr}_r${r}_alpha${a} $COMMON --lr $lr --lora-r $r --lora-alpha $a \
      > $W/seq_${lr}_${r}_${a}.log 2>&1
  done; done; done
  t2=$(now)
  echo "$t0 $t1 $t2" >> $W/times
done

# 2. cpu-device, the base streamed from the pack file
python3 -c "
import json; c = json.load(open('$M/config.json'))
c.update(hidden_size=512, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=8,
         num_key_value_heads=4, head_dim=64); json.dump(c, open('$W/wide.json', 'w'))"
$F init-model --config $W/wide.json --out $W/wide --pack --tokenizer $M --seed 3 > $W/init.log 2>&1
DEV="--data $D --seq-len 64 --threads $TH --device cpu-device --quant nf4 --host-mem 12M --eval-fraction 0 --max-steps 3 --save-every 0"
# the smallest --gpu-mem a plan accepts, in GiB, from its refusal at 1M
floor_of() { grep -o 'needs at least --gpu-mem [0-9.]*G' | grep -o '[0-9.]*G$' | tr -d G; }
floor=$($F sweep --plan --model $W/wide --out $W/floor $DEV --grid lr=1e-3,2e-3,3e-3,5e-3 --adapters-per-pass 4 \
        --gpu-mem 1M 2>&1 | floor_of)
GPU=$(python3 -c "print(f'{int($floor * 1024) + 24}M')")
$F sweep --model $W/wide --out $W/dev4 $DEV --grid lr=1e-3,2e-3,3e-3,5e-3 --adapters-per-pass 4 --gpu-mem $GPU \
  --timeline $W/dev4.svg > $W/dev4.log 2>&1
# the one adapter streams the base as the 4-adapter pass does: the largest --gpu-mem (in 8M steps
# up from its own floor) at which its plan still reads at least as many layers from the pack file
# (with the 4-adapter budget every layer would fit and nothing would be read from disk)
nvme() { grep -o '[0-9]* on NVMe' | grep -o '^[0-9]*'; }
n4=$(nvme < $W/dev4.log) # the 4-adapter pass's own plan line
floor1=$($F plan --model $W/wide $DEV --lr 1e-3 --gpu-mem 1M 2>&1 | floor_of)
g=$(python3 -c "print(int($floor1 * 1024) - 64)") GPU1=
for _ in $(seq 1 64); do
  n=$($F plan --model $W/wide $DEV --lr 1e-3 --gpu-mem ${g}M 2>&1 | nvme || true)
  if [ -n "$n" ]; then [ "$n" -ge "$n4" ] && GPU1=${g}M || break; fi
  g=$((g + 8))
done
[ -n "$GPU1" ] || { echo "sweep_cpu.sh: no --gpu-mem streams $n4 layers of one adapter" >&2; exit 1; }
$F train --model $W/wide --out $W/dev1 $DEV --lr 1e-3 --gpu-mem $GPU1 --timeline $W/dev1.svg > $W/dev1.log 2>&1

python3 - "$W" "$ETA" "$GPU" "$GPU1" > $OUT <<'PY'
import json, re, sys, pathlib, platform, os, datetime
W, eta, gpu, gpu1 = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
rounds = [tuple(map(float, l.split())) for l in (W / "times").read_text().splitlines()]
sw = json.loads((W / "sweep" / "sweep.json").read_text())
seq = {d.name: json.loads((d / "summary.json").read_text()) for d in (W / "seq").iterdir()}
sbest = min(seq, key=lambda n: seq[n]["best_eval_loss"])
best = sw["best"]
bl = next(t["best_eval_loss"] for t in sw["trials"] if t["name"] == best)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# ftune sweep on the CPU ({datetime.date.today()}, {platform.node()})\n")
print(f"Machine: {cpu}, {os.cpu_count()} cores, shared with other jobs while it ran (the ratios are "
      "what counts). Command: `bash bench/sweep_cpu.sh` (THREADS=2).\n")
print("## 8-trial grid: `ftune sweep --prune halving` vs 8 `ftune train` runs\n")
print("tests/fixtures/tiny-llama, alpaca_seed_175, --seq-len 128 --batch-size 2 --max-steps 48 "
      "--eval-every 4 --eval-max 4, grid lr 1e-3,2e-3 x lora_r 8,16 x lora_alpha 16,32; the sweep with "
      f"--prune halving --prune-eta {eta} and the planner's adapters per pass.\n")
print("| round | ftune sweep --prune halving (s) | 8 x ftune train, one after another (s) | ratio |\n|---|---|---|---|")
ratios = []
for i, (t0, t1, t2) in enumerate(rounds, 1):
    ratios.append((t2 - t1) / (t1 - t0))
    print(f"| {i} | {t1 - t0:.2f} | {t2 - t1:.2f} | {ratios[-1]:.2f}x |")
med = sorted(ratios)[len(ratios) // 2]
print(f"\nRatio: median **{med:.2f}x** (min {min(ratios):.2f}x, max {max(ratios):.2f}x over {len(ratios)} rounds). "
      "Sweep statuses (every round the same): " +
      ", ".join(f"{t['name']} {t['status']} ({t['steps']} steps)" for t in sw["trials"]) + ".\n")
print(f"Best trial of the sweep: {best}, best eval loss {bl:.6f}; best of the sequential grid: "
      f"{sbest}, {seq[sbest]['best_eval_loss']:.6f} (difference {100 * (bl - seq[sbest]['best_eval_loss']) / seq[sbest]['best_eval_loss']:+.4f}%).\n")
line = lambda f, p: next((l for l in (W / f).read_text().splitlines() if p in l), "")
print("## cpu-device, NF4 base streamed from the pack file: 4 adapters per pass vs 1\n")
print(f"16 layers of hidden 512 (NF4 pack 91 MB), --seq-len 64 --host-mem 12M, 3 steps, no eval; "
      f"--gpu-mem {gpu} for the 4-adapter pass and {gpu1} for the one adapter (the 4-adapter "
      "pass's planner floor + 24M; for the one adapter the largest budget at which it still reads at least as "
      "many layers from the pack file, so that both stream the base; the plan lines say where each layer was).\n")
for f in ("dev4.log", "dev1.log"):
    for p in ("plan: 16 layers", "timeline:", "done:"):
        l = line(f, p)
        if l:
            print(f"- {f}: `{l.strip()}`")
def tps(f, pat):
    m = re.search(pat, (W / f).read_text())
    return float(m.group(1)) if m else float("nan")
a = tps("dev4.log", r"sweep done: .*?([0-9.]+) tok/s")
b = tps("dev1.log", r"done: .*?\(([0-9.]+) tok/s\)")
print(f"\nAggregate tok/s (the done lines: set-up included): 4 adapters {a:.1f}, one adapter {b:.1f}: "
      f"**{a / b:.2f}x**.")
def per_step(f):
    t = (W / f).read_text()
    n = re.search(r"micro-batch(?:es)? of ([0-9]+) tokens per step", t)
    st = re.search(r"timeline: .*?: step ([0-9.]+) s", t)
    return int(n.group(1)) / float(st.group(1)) if n and st else float("nan")
a2, b2 = per_step("dev4.log"), per_step("dev1.log")
print(f"Per step (the timeline's second step: tokens of the step over its wall time): 4 adapters {a2:.1f} "
      f"tok/s, one adapter {b2:.1f} tok/s: **{a2 / b2:.2f}x**.")
PY
cat $OUT
rm -rf "$W"
