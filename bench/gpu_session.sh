#!/bin/bash
# gpu_session.sh - every open GPU check of issues 4, 5 and 6 in ONE device call that fits the
# 15-minute device lease (a machine start of 1-2 minutes plus one command under 600 s).
#
# Here first:  UNIT="test_dpo test_neftune test_loraplus" bash scripts/gpu_bundle.sh
#              (.gpu/ must be in .git/info/exclude; carry .gpu/bundle.tar.xz, under 64 MiB)
# There:       mkdir -p $OUT && bash bench/gpu_session.sh          (run's timeout_s: 600)
#
# Sections, in ORDER (default "tests smoke 8b 70b bench unit devtests"), each skipped when the DEADLINE
# (default 560 s from the start) is too near, so the results are always packed into
# $OUT/results.tgz (the tool brings back 8 files at most):
#   tests  the GPU tests: tensor-core attention (the default) and the NF4 dequant-fused GEMM
#          against their CPU twins, the ops, NF4, the streamed tiers
#   smoke  seconds each, through the trainer on the tiny model (tied embeddings): QLoRA on
#          CUDA (the model handed to its pack, the tied table read from the pack into device
#          memory), `ftune eval --quant nf4` of that adapter against the run's final eval,
#          `ftune generate` of it with --quant nf4 and bf16, and 2 steps of DPO
#   8b     the Llama-3-8B shape (random weights), seq 2048, batch 1, 4 steps each: bf16 LoRA
#          with the cuBLAS-tile attention (FTUNE_ATTN=gemm) and the tensor-core one (the default); QLoRA
#          with a bf16 copy per layer visit (default), FTUNE_NF4_GEMM=fused (with --profile),
#          and auto (issue 5's deliverable 5)
#   70b    the Llama-3-70B shape, random NF4 pack: `bench io`, all resident, --gpu-mem 24G
#          --host-mem 48G (pinned host tier), --gpu-mem 24G --host-mem 8G (NVMe tier), with
#          the planner's prediction, peak GPU memory and RSS (issue 6)
#   bench  attn_bench and nf4_gemm: per-kernel TFLOP/s (the closing note's kernel table)
#   unit   device-agnostic unit tests bundled with UNIT=..., run with FTUNE_DEVICE=cuda
#   peer   bench/run --quick within what is left of the deadline: ftune and transformers + PEFT on
#          the 8B shape in this call (issue 4's ratio; needs ~330 s: torch, transformers, peft
#          are on the GPU machine); its README, results.json and raw outputs go into results.tgz
#   devtests  tests/ref/test_cpu_device.py with --device cuda: a bf16 base streamed within
#          --gpu-mem vs resident (adapters), NF4 eval/generate streamed vs resident, QLoRA of
#          the tied model with eval --quant nf4 and generate vs logits
#   ORDER=issue34 (the GPU speed issue's one call; sections "tests speed host70 extra34"):
#   tests  test_cuda_fused (the fused kernels vs their CPU twins), test_cuda_ops, test_cuda_attn
#          (TEST_CAP 60 s each)
#   speed  bench/run in full mode, budgeted: ftune batch 1/2/4 and transformers + PEFT
#          (bench/peer_hf.py, the best of checkpointing off/on x batch 1/2/4) on the Llama-3-8B
#          shape at seq 2048 in this call (its table: tok/s, MFU by bench/flops.py, peak memory,
#          the ratio); results in $OUT/bench-<gpu>-<date>/ (copy into bench/results/), within
#          what is left less RESERVE70 (200 s) for host70; then one --profile run on the same
#          model: the per-op table of the steps after the first
#   host70 the Llama-3-70B shape, random NF4 pack: --gpu-mem 24G --host-mem 48G, then all
#          resident at the same schedule when the time is left
#   extra34  what is left, on 8B: LoRA+ with the adamw loop and with --cuda-fused adamw (both with
#          --profile), QLoRA (nf4), and seq 4096 (NeMo's setting: SEQ doubled)
#   sweep  (not in the default ORDER: ORDER=sweep, issue 32) `ftune sweep` against one adapter:
#          the Llama-3-70B shape QLoRA at --gpu-mem 24G --host-mem 8G (NVMe tier), 8 adapters
#          per pass (an 8-trial grid lr x lora_r, --adapters-per-pass 8) vs `ftune train` of one,
#          at SWEEP_SEQ tokens (default 512: 8 layer-input checkpoints of 2048 tokens per layer
#          do not fit 24 GB beside the resident layers; the plan lines say what the planner took);
#          the Llama-3-8B shape resident: 4 adapters at batch 1 vs one at batch 4. The aggregate
#          tok/s of the sweep's done line against train's done line
# Usage there: [ORDER="8b 70b"] [DEADLINE=560] [STEPS8=4] bash bench/gpu_session.sh
# Dry run here, on the CPU (bench/offload/dryrun.md): DRY=1|bundle OUT=/tmp/dryout bash bench/gpu_session.sh
DEFAULT_TESTS="test_cuda_attn test_cuda_nf4_gemm test_cuda_ops test_cuda_nf4 test_cuda_stream test_cuda_fused"
LOG_LINES=10
ORDER=${ORDER:-tests smoke 8b 70b bench unit devtests}
[ "$ORDER" = issue34 ] && ORDER="tests speed host70 extra34" && TEST_CAP=${TEST_CAP:-60} &&
  DEFAULT_TESTS="test_cuda_fused test_cuda_ops test_cuda_attn"
case " $ORDER " in *" tests "*) ;; *) TESTS=none;; esac
. "$(dirname "$0")/offload/common.sh"
grep -hE "self-check|mma max err|max err|FAILED|Failure" $OUT/test_cuda_attn.log $OUT/test_cuda_nf4_gemm.log 2>/dev/null | tail -12
S8=${STEPS8:-$([ -n "$DRY" ] && echo 2 || echo 4)}

sec_smoke() {
  [ "$(left)" -lt 60 ] && { echo "smoke: skipped ($(left) s left)"; return; }
  local D=examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl TL=tests/fixtures/tiny-llama
  timeout $(cap 60) $F train --model $TL --data $D --eval-data $D --quant nf4 --device $DEV --max-steps 2 \
    --seq-len 128 --cache-dir $TMPW/smokecache --save-every 0 --out $TMPW/o_smoke 2>&1 | tail -4 > $OUT/smoke.log
  echo "train rc=${PIPESTATUS[0]}; final_eval_loss $(grep -o '"final_eval_loss":[^,]*' $TMPW/o_smoke/summary.json)" >> $OUT/smoke.log
  timeout $(cap 60) $F eval --model $TL --adapter $TMPW/o_smoke --data $D --quant nf4 --device $DEV --seq-len 128 \
    --cache-dir $TMPW/smokecache >> $OUT/smoke.log 2>&1; echo "eval --quant nf4 rc=$?" >> $OUT/smoke.log
  for q in nf4 bf16; do  # generation through the executor: the NF4 pack's tiers, the bf16 copies
    timeout $(cap 30) $F generate --model $TL --adapter $TMPW/o_smoke --raw --prompt "Once upon a time" --json \
      --max-new-tokens 8 --device $DEV --quant $q $([ $q = nf4 ] && echo --cache-dir $TMPW/smokecache) \
      2>&1 | tail -2 >> $OUT/smoke.log; echo "generate --quant $q rc=${PIPESTATUS[0]}" >> $OUT/smoke.log
  done
  # batched decoding on the device (ft_gen_decode: per-row attention, k/v rows copied into each
  # sequence's cache): --batch 3 gives --batch 1's replies
  printf '"Once upon a time"\n"The capital of France is"\n"One, two, three,"\n' > $TMPW/p3.jsonl
  for bt in 1 3; do
    timeout $(cap 30) $F generate --model $TL --adapter $TMPW/o_smoke --raw --prompts $TMPW/p3.jsonl \
      --max-new-tokens 8 --device $DEV --quant nf4 --cache-dir $TMPW/smokecache --batch $bt \
      --out $TMPW/gb$bt.jsonl 2>&1 | tail -1 >> $OUT/smoke.log; echo "generate --prompts --batch $bt rc=${PIPESTATUS[0]}" >> $OUT/smoke.log
  done
  python3 -c "import json,sys; r=[[{k: v for k, v in json.loads(l).items() if k != 'seconds'} for l in open(f)] for f in sys.argv[1:]]; print('generate --batch 3 vs 1:', 'same replies' if r[0] == r[1] else 'DIFFER')" \
    $TMPW/gb1.jsonl $TMPW/gb3.jsonl >> $OUT/smoke.log 2>&1
  # per-example eval losses on the device (ft_exec_eval_spans) against the CPU's
  for d in $DEV cpu; do
    timeout $(cap 60) $F eval --model $TL --adapter $TMPW/o_smoke --data $D --quant nf4 --device $d --seq-len 128 \
      --cache-dir $TMPW/smokecache --per-example $TMPW/pe_$d.jsonl 2>&1 | tail -1 >> $OUT/smoke.log
    echo "eval --per-example --device $d rc=${PIPESTATUS[0]}" >> $OUT/smoke.log
  done
  python3 -c "import json,sys; a,b=[[json.loads(l)['loss'] for l in open(f)] for f in sys.argv[1:]]; print('per-example losses device vs cpu: %d examples, max |diff| %.3g' % (len(a), max(abs(x-y) for x,y in zip(a,b))))" \
    $TMPW/pe_$DEV.jsonl $TMPW/pe_cpu.jsonl >> $OUT/smoke.log 2>&1
  # --chat on the device: turn 2 prefills only what follows the cached prefix (ft_gen_truncate_slot)
  printf 'Hello there\nTell me more\n' | timeout $(cap 30) $F generate --model $TL --adapter $TMPW/o_smoke --chat \
    --max-new-tokens 8 --device $DEV --quant nf4 --cache-dir $TMPW/smokecache 2>&1 | grep -E 'turn [0-9]|error' >> $OUT/smoke.log
  echo "generate --chat rc=${PIPESTATUS[1]}" >> $OUT/smoke.log
  timeout $(cap 60) $F train --model $TL --data examples/data/alpaca-seed-tasks/alpaca_seed_pref.jsonl --method dpo \
    --device $DEV --max-steps 2 --seq-len 128 --save-every 0 --out $TMPW/o_smoke_dpo 2>&1 | tail -3 >> $OUT/smoke.log
  echo "dpo rc=${PIPESTATUS[0]}" >> $OUT/smoke.log
  cat $OUT/smoke.log
  stamp smoke
}

sec_8b() {
  M=$TMPW/m8b
  [ "$(left)" -lt 120 ] && { echo "8b: skipped ($(left) s left)"; return; }
  timeout $(cap 150) $F init-model --config $CFG8 --out $M --pack --safetensors \
    --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | grep -E "safetensors|pack" | tail -2
  stamp init-model-8b
  FTUNE_ATTN=gemm run lora_gemm 90 --quant bf16 --max-steps $S8
  run lora_mma 90 --quant bf16 --max-steps $S8
  run qlora 90 --quant nf4 --max-steps $S8
  FTUNE_NF4_GEMM=fused run qlora_fused 90 --quant nf4 --max-steps $S8 --profile
  FTUNE_NF4_GEMM=auto run qlora_auto 90 --quant nf4 --max-steps 3
  rm -rf $M $TMPW/o_*
}

sec_70b() {
  M=$TMPW/m70
  [ "$(left)" -lt 200 ] && { echo "70b: skipped ($(left) s left)"; return; }
  timeout $(cap 120) $F init-model --config $CFG70 --out $M --pack \
    --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | tail -2
  stamp init-model-70b
  timeout $(cap 40) $F bench io --path $M/model-nf4.ftpack --bytes 8G --device $DEV 2>&1 | tail -8 | tee $OUT/bench_io.txt
  stamp bench-io
  run host 110 --gpu-mem $GPU24 --host-mem $HOST48 --grad-accum auto --max-steps 3 --timeline $OUT/host.svg
  # RES_MEM (e.g. 75G, an H100's memory): all 80 layers resident but activations recomputed as
  # under --gpu-mem 24G, the same schedule; without it an H200 keeps the activations (no recompute)
  run resident 100 ${RES_MEM:+--gpu-mem $RES_MEM} --grad-accum auto --max-steps 3
  run disk 150 --gpu-mem $GPU24 --host-mem $HOST8 --grad-accum auto --max-steps 2 --timeline $OUT/disk.svg
  rm -rf $M $TMPW/o_*  # the 40 GB pack: the 8B files after it would not fit a 64 GB disk beside it
}

# One `ftune sweep` (name, seconds, args...) on $M like run's trains: its plan lines and done
# line (trials, adapters per pass, aggregate tok/s) into $OUT/NAME.log
sweep_run() {
  local name=$1 lim rc; lim=$(cap $2); shift 2
  [ "$lim" -lt 25 ] && { echo "$name: skipped ($(left) s left before the deadline)"; return 0; }
  timeout $lim $F sweep --model $M --data $TMPW/d.jsonl --data-format text --device $DEV \
     --lora-dropout 0 --save-every 0 --out $TMPW/o_$name --eval-fraction 0 "$@" > $TMPW/full_$name.log 2>&1
  rc=$?
  grep -E "plan:|sweep: [0-9]+ trials|passes over|timeline:|sweep done" $TMPW/full_$name.log | head -12 > $OUT/$name.log
  echo "$name: ftune sweep rc=$rc" | tee -a $OUT/$name.log; tail -2 $OUT/$name.log
  stamp $name
}

sec_sweep() {  # issue 32: K adapters per pass vs one adapter
  [ "$(left)" -lt 240 ] && { echo "sweep: skipped ($(left) s left)"; return; }
  local SS=${SWEEP_SEQ:-$([ -n "$DRY" ] && echo 64 || echo 512)}
  # rank 8 for all: a 70B adapter's LoRA state (parameters, gradients, AdamW moments in fp32) is
  # 1.65 GB at r 8 and 3.3 GB at r 16, eight of them beside the resident layers in 24 GB
  local G8="--grid lr=1e-4,2e-4,3e-4,5e-4 --grid lora_alpha=16,32 --lora-r 8"
  local SG=${SWEEP_GPU:-$([ -n "$DRY" ] && echo 2600M || echo $GPU24)}  # DRY: 8 adapters' state
  M=$TMPW/m70
  timeout $(cap 120) $F init-model --config $CFG70 --out $M --pack \
    --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | tail -1
  stamp init-model-70b
  sweep_run sweep70_k8 200 $G8 --adapters-per-pass 8 --quant nf4 --gpu-mem $SG --host-mem $HOST8 \
    --seq-len $SS --max-steps 2 --grad-accum 1 --timeline $OUT/sweep70_k8.svg
  SEQ=$SS run sweep70_one 120 --quant nf4 --gpu-mem $SG --host-mem $HOST8 --max-steps 2 --grad-accum 1 \
    --lora-r 8 --timeline $OUT/sweep70_one.svg
  rm -rf $M $TMPW/o_*
  M=$TMPW/m8b
  timeout $(cap 150) $F init-model --config $CFG8 --out $M --pack --safetensors \
    --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | tail -1
  stamp init-model-8b
  sweep_run sweep8_k4_b1 120 --grid lr=1e-4,2e-4,3e-4,5e-4 --adapters-per-pass 4 --quant bf16 \
    --seq-len $SEQ --batch-size 1 --max-steps 3
  run sweep8_one_b4 120 --quant bf16 --batch-size 4 --max-steps 3
  rm -rf $M $TMPW/o_*
}

sec_bench() {
  [ -n "$DRY" ] && { for b in attn_bench nf4_gemm; do [ -x $G/bin/$b ] && echo "$b: in the bundle, skipped (DRY)" ||
    echo "$b: skipped (DRY$([ "$DRY" = bundle ] && echo ': not in the bundle'))"; done; return; }
  [ "$(left)" -lt 60 ] && { echo "bench: skipped ($(left) s left)"; return; }
  timeout $(cap 60) $G/bin/attn_bench > $OUT/attn_bench.txt 2>&1; echo "attn_bench rc=$?"; tail -12 $OUT/attn_bench.txt
  timeout $(cap 60) $G/bin/nf4_gemm --8b > $OUT/nf4_gemm.txt 2>&1; echo "nf4_gemm rc=$?"; tail -16 $OUT/nf4_gemm.txt
  stamp bench
}

sec_peer() {  # bench/run --quick: ftune vs transformers + PEFT in this call (its own deadline)
  [ -n "$DRY" ] && { echo "peer: skipped (DRY: bench/run --cpu-check checks it on a CPU)"; return; }
  [ "$(left)" -lt 240 ] && { echo "peer: skipped ($(left) s left; bench/run --quick needs ~330 s)"; return; }
  FTUNE_BIN=$F FTUNE_BENCH_DEADLINE=$(( $(left) - 15 )) OUT=$OUT timeout $(cap 600) bench/run --quick \
    > $OUT/peer.txt 2>&1; echo "bench/run --quick rc=$?"; tail -14 $OUT/peer.txt
  stamp peer
}

sec_devtests() {  # the cpu-device end-to-end checks on the GPU: streamed vs resident bases
  [ "$(left)" -lt 90 ] && { echo "devtests: skipped ($(left) s left)"; return; }
  FTUNE_BIN=$F FTUNE_TEST_DEVICE=$DEV timeout $(cap 150) python3 tests/ref/test_cpu_device.py \
    > $OUT/devtests.txt 2>&1; echo "devtests rc=$?"; grep -E "^(PASS|FAIL) |passed" $OUT/devtests.txt
  stamp devtests
}

sec_unit() {
  local bins=$G/bin/test_*  # DRY=1: the host builds of the bundled unit tests
  [ "$DRY" = 1 ] && bins=$(for t in ${UNIT:-test_dpo test_neftune test_loraplus}; do echo ${DRY_BUILD:-build}/tests/$t; done)
  for t in $bins; do
    case $(basename $t) in test_cuda_*) continue;; esac
    [ -x $t ] || { echo "unit: no $t"; continue; }
    [ "$(left)" -lt 40 ] && { echo "unit: $(basename $t) skipped"; continue; }
    FTUNE_DEVICE=$DEV CMOCKA_MESSAGE_OUTPUT=stdout timeout $(cap 90) $t > $OUT/$(basename $t).log 2>&1
    echo "$(basename $t) (FTUNE_DEVICE=$DEV) rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/$(basename $t).log | tr '\n' ' ')"
  done
  stamp unit
}

# Issue 34: bench/run (ftune and the peer in this call), the per-op profile of the 8B step.
# bench/run keeps its model at /tmp/ftune-bench/<config> (DRY: its own --cpu-check model).
sec_speed() {
  [ "$(left)" -lt 200 ] && { echo "speed: skipped ($(left) s left)"; return; }
  local mode=full reserve=$(( ${RESERVE70:-200} * TSCALE ))
  [ -n "$DRY" ] && mode=cpu-check reserve=0
  FTUNE_BIN=$F FTUNE_BENCH_DEADLINE=$(( $(left) - reserve - 60 )) FTUNE_BENCH_SKIP_GEMM=1 \
    FTUNE_BENCH_STEPS=${STEPS34:-6} FTUNE_BENCH_PEER_STEPS=${PSTEPS34:-3} OUT=$OUT \
    timeout $(cap 480) bench/run --$mode > $OUT/speed.txt 2>&1; echo "bench/run --$mode rc=$?"
  tail -16 $OUT/speed.txt
  stamp speed-bench-run
  M=${FTUNE_BENCH_MODEL:-/tmp/ftune-bench/llama-3-8b}
  if [ -n "$DRY" ]; then  # bench/run --cpu-check deleted its model: the small 8B-shaped one
    M=$TMPW/m8b
    timeout $(cap 150) $F init-model --config $CFG8 --out $M --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | tail -1
  fi
  [ -f $M/config.json ] || { echo "speed: no model at $M: profile skipped"; return; }
  run lora_profile 90 --quant bf16 --max-steps 3 --profile
}

sec_host70() {
  M=$TMPW/m70
  [ "$(left)" -lt 150 ] && { echo "host70: skipped ($(left) s left)"; return; }
  timeout $(cap 120) $F init-model --config $CFG70 --out $M --pack \
    --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | tail -2
  stamp init-model-70b
  run host 110 --gpu-mem $GPU24 --host-mem $HOST48 --grad-accum auto --max-steps 3
  # all resident at the host run's schedule (its grad-accum: the planner's choice above)
  local ga=$(grep -oE 'grad-accum [0-9]+' $TMPW/full_host.log 2>/dev/null | head -1 | grep -oE '[0-9]+')
  [ "$(left)" -gt $(( 110 * TSCALE )) ] && run resident 100 ${RES_MEM:+--gpu-mem $RES_MEM} --grad-accum ${ga:-auto} --max-steps 3
  rm -rf $M $TMPW/o_*
}

sec_extra34() {
  M=${FTUNE_BENCH_MODEL:-/tmp/ftune-bench/llama-3-8b}
  [ -n "$DRY" ] && M=$TMPW/m8b
  [ -f $M/config.json ] || { echo "extra34: no model at $M"; return; }
  # LoRA+ steps the 448 A/B tensors of the 8B adapter as separate segments: adamw_multi's row of
  # the per-op table, the loop over adamw (448 launches) against the fused kernel (one)
  run loraplus_loop 60 --quant bf16 --max-steps 4 --loraplus-lr-ratio 16 --profile
  run loraplus_fused 60 --quant bf16 --max-steps 4 --loraplus-lr-ratio 16 --profile --cuda-fused adamw
  run qlora 80 --quant nf4 --max-steps 4
  SEQ=$(( SEQ * 2 )) run lora_s2x 80 --quant bf16 --max-steps 4
}

for s in $ORDER; do
  case $s in
    tests) ;;
    smoke) sec_smoke ;;
    8b) sec_8b ;;
    70b) sec_70b ;;
    bench) sec_bench ;;
    unit) sec_unit ;;
    devtests) sec_devtests ;;
    peer) sec_peer ;;
    speed) sec_speed ;;
    host70) sec_host70 ;;
    extra34) sec_extra34 ;;
    sweep) sec_sweep ;;
    *) echo "unknown section $s" ;;
  esac
done

# The table the reply's tail shows: the exit codes, tok/s of the last two logged steps, peak GPU
# memory, the plan line's prediction, the done line (RSS) and the planner's tiers of every run.
echo "==== summary ($(left) s before the deadline) ===="
for f in $OUT/*.log; do
  n=$(basename $f .log)
  case $n in test_*) echo "$n: $(grep -E '^\[  (PASSED|FAILED) ' $f | tr '\n' ' ')"; continue;; esac
  m=$OUT/$n.metrics.jsonl
  tps=$( [ -f $m ] && python3 -c "import json,sys; r=[json.loads(l) for l in open('$m') if '\"tokens_per_s\"' in l]; print(' '.join('%.0f' % x['tokens_per_s'] for x in r[-2:]))" 2>/dev/null)
  echo "$n: rc $(grep -oE 'rc=[0-9]+' $f | cut -d= -f2 | tr '\n' ' ')tok/s [$tps] $(grep -oE 'peak GPU memory used \(nvidia-smi\) [0-9]+ MiB' $f) $(grep -oE 'predicted [0-9.e+-]+ s/step' $f | head -1) $(grep -oE 'peak host RSS [0-9.]+ GiB' $f | head -1) $(sed -nE 's|.*plan: [0-9]+ layers: ([0-9]+) on the GPU.*, ([0-9]+) in pinned host memory.*, ([0-9]+) on NVMe.*|layers GPU/host/NVMe \1/\2/\3|p' $f | head -1)"
done
