#!/usr/bin/env bash
# bench/distributed.sh - tokens/s of data-parallel training on the CPU backend: one process of
# one thread with --grad-accum 2*GA against 2 MPI ranks of one thread each with --grad-accum GA
# (the same global batch, the same steps; with GA 1 the same adapter bytes), REPEAT times each,
# alternating.
# The figure is ftune's own "done" line: the tokens of the steps over the step loop's wall
# time (rank 0's; set-up and the final eval are outside it). The model is a random-weight
# Llama of a small real-ish shape (ftune init-model), large enough that a step's compute
# dominates the all-reduce of its LoRA gradients.
#
# GA: micro-batches per rank per step (default 1). A step ends at the all-reduce, so it lasts
# as long as its slower rank: with one micro-batch per rank the step pays each micro-batch's
# variation in time (its loss-target count, the machine's noise) in full, with GA of them
# about 1/sqrt(GA) of it. With GA > 1 the two runs sum the step's gradients in another order
# (one process: g1 + ... + g2GA in turn; 2 ranks: each rank's GA, then the two sums), so the
# last column is the largest relative difference of an adapter tensor instead of equality.
#
# The last column is the hypervisor's steal during each run (/proc/stat): on a VM the host may
# run other guests on the physical cores, and 2 busy vCPUs can lose more of their time than 1;
# 2 - (2 ranks' stolen CPUs) over 1 - (1 rank's) is the ratio of CPU the two runs really had.
#
# EXTRA: more train flags for both runs, e.g. EXTRA=--train-on-prompt (every token a loss target,
# so that every micro-batch costs the same: with the prompt tokens masked the LM head runs on the
# answer tokens only, and a step waits for its rank with the most of them)
#
#   FTUNE=build/ftune REPEAT=3 STEPS=16 [GA=1] [EXTRA=...] bash bench/distributed.sh > result.md
set -euo pipefail
FTUNE=${FTUNE:-build/ftune}
REPEAT=${REPEAT:-3}
STEPS=${STEPS:-16}
GA=${GA:-1}
SEQ=${SEQ:-256}
WORK=${WORK:-/tmp/ftune-dist-bench}
DATA=${DATA:-examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl}
ROOT_FLAG=; [ "$(id -u)" -eq 0 ] && ROOT_FLAG=--allow-run-as-root
# --bind-to core: one rank per core; mpi_yield_when_idle: a rank waiting in the all-reduce
# yields its core (Open MPI polls by default), which matters where other work shares the cores
MPI_OPTS=${MPI_OPTS:---bind-to core --mca mpi_yield_when_idle 1}
# RANK_WRAP="setsid -w": each process (the single one too) in a session of its own. With the
# kernel's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled = 1) CPU time is shared
# per session, so on a machine that other work shares, the 2 ranks of one mpirun session get
# together what the single process gets alone; in their own sessions each gets a process's share
# (on an idle machine it makes no difference)
RANK_WRAP=${RANK_WRAP:-}
mkdir -p "$WORK"
if [ ! -f "$WORK/model/config.json" ]; then
    cat > "$WORK/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
 "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
 "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false, "hidden_act": "silu",
 "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
JSON
    OMP_NUM_THREADS=1 "$FTUNE" init-model --config "$WORK/config.json" --out "$WORK/model" \
        --tokenizer tests/fixtures/tiny-llama --threads 1 >/dev/null
fi
ARGS=(train --model "$WORK/model" --data "$DATA" --seq-len "$SEQ" --max-steps "$STEPS" --threads 1
      --seed 7 --eval-fraction 0 --save-every 0 --lr 1e-4 ${EXTRA:-})
toks() { sed -n 's/.*(\([0-9]*\) tok\/s).*/\1/p' "$1" | tail -1; }
# the largest ||a - b|| / ||a|| over the two adapters' tensors (fp32 or bf16 safetensors)
maxrel() {
    python3 - "$1" "$2" <<'PY'
import json, struct, sys
import numpy as np
def load(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n]); out = {}
    for k, v in head.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]; buf = raw[8 + n + a:8 + n + b]
        if v["dtype"] == "F32": x = np.frombuffer(buf, np.float32)
        elif v["dtype"] == "BF16": x = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else: raise SystemExit("dtype " + v["dtype"])
        out[k] = x.astype(np.float64)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
m = max(float(np.linalg.norm(a[k] - b[k]) / max(np.linalg.norm(a[k]), 1e-30)) for k in a)
print("%.1e" % m)
PY
}
# the hypervisor's steal while a command ran: CPU-seconds the VM's vCPUs were runnable but not
# run (/proc/stat field 8, in USER_HZ), over the command's wall seconds
HZ=$(getconf CLK_TCK)
steal_now() { awk '/^cpu / { print $9 }' /proc/stat; }
timed() { # timed VAR cmd...: runs cmd, VAR gets "steal_cpus wall_s"
    local var=$1 s0 t0 s1 t1; shift
    s0=$(steal_now); t0=$(date +%s.%N)
    "$@"
    s1=$(steal_now); t1=$(date +%s.%N)
    printf -v "$var" '%s' "$(awk -v a="$s0" -v b="$s1" -v t0="$t0" -v t1="$t1" -v hz="$HZ" \
        'BEGIN { printf "%.2f", (b - a) / hz / (t1 - t0) }')"
}
last="adapters equal"; [ "$GA" -gt 1 ] && last="max tensor ||a-b||/||a||"
echo "| repeat | 1 rank x 1 thread, grad-accum $((2 * GA)) (tok/s) | 2 ranks x 1 thread, grad-accum $GA (tok/s) | ratio | $last | stolen CPUs (1 rank / 2 ranks) |"
echo "|---|---|---|---|---|---|"
for i in $(seq 1 "$REPEAT"); do
    rm -rf "$WORK/one" "$WORK/two"
    timed st1 env OMP_NUM_THREADS=1 $RANK_WRAP "$FTUNE" "${ARGS[@]}" --grad-accum $((2 * GA)) \
        --out "$WORK/one" 2> "$WORK/one.log"
    timed st2 env OMP_NUM_THREADS=1 mpirun $ROOT_FLAG -np 2 $MPI_OPTS -x OMP_NUM_THREADS \
        $RANK_WRAP "$FTUNE" "${ARGS[@]}" --grad-accum "$GA" --out "$WORK/two" 2> "$WORK/two.log"
    a=$(toks "$WORK/one.log"); b=$(toks "$WORK/two.log")
    if [ "$GA" -gt 1 ]; then
        same=$(maxrel "$WORK/one/adapter_model.safetensors" "$WORK/two/adapter_model.safetensors")
    else
        same=no; cmp -s "$WORK/one/adapter_model.safetensors" "$WORK/two/adapter_model.safetensors" && same=yes
    fi
    echo "| $i | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }') | $same | $st1 / $st2 |"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); GA=$GA; MPI_OPTS=$MPI_OPTS; RANK_WRAP=${RANK_WRAP:-none}; EXTRA=${EXTRA:-none}"
grep -h "ftune: plan: backend" "$WORK/one.log" | head -1 | sed 's/^/one rank: /'
