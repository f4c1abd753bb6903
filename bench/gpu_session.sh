#!/bin/bash
# gpu_session.sh - every open GPU check of issues 4, 5 and 6 in ONE device call that fits the
# 15-minute device lease (a machine start of 1-2 minutes plus one command under 600 s).
#
# Here first:  UNIT="test_dpo test_neftune test_loraplus" bash scripts/gpu_bundle.sh
#              (.gpu/ must be in .git/info/exclude; carry .gpu/bundle.tar.xz, under 64 MiB)
# There:       mkdir -p $OUT && bash bench/gpu_session.sh          (run's timeout_s: 600)
#
# Sections, in ORDER (default "tests smoke 8b 70b bench unit"), each skipped when the DEADLINE
# (default 560 s from the start) is too near, so the results are always packed into
# $OUT/results.tgz (the tool brings back 8 files at most):
#   tests  the GPU tests: tensor-core attention (FTUNE_ATTN=mma) and the NF4 dequant-fused GEMM
#          against their CPU twins, the ops, NF4, the streamed tiers
#   smoke  seconds each, through the trainer on the tiny model (tied embeddings): QLoRA on
#          CUDA (the model handed to its pack, the tied table read from the pack into device
#          memory), `ftune eval --quant nf4` of that adapter against the run's final eval,
#          `ftune generate` of it with --quant nf4 and bf16, and 2 steps of DPO
#   8b     the Llama-3-8B shape (random weights), seq 2048, batch 1, 4 steps each: bf16 LoRA
#          with the cuBLAS-tile attention (default) and with FTUNE_ATTN=mma (issue 4); QLoRA
#          with a bf16 copy per layer visit (default), FTUNE_NF4_GEMM=fused (with --profile),
#          and auto (issue 5's deliverable 5)
#   70b    the Llama-3-70B shape, random NF4 pack: `bench io`, all resident, --gpu-mem 24G
#          --host-mem 48G (pinned host tier), --gpu-mem 24G --host-mem 8G (NVMe tier), with
#          the planner's prediction, peak GPU memory and RSS (issue 6)
#   bench  attn_bench and nf4_gemm: per-kernel TFLOP/s (the closing note's kernel table)
#   unit   device-agnostic unit tests bundled with UNIT=..., run with FTUNE_DEVICE=cuda
#   devtests  tests/ref/test_cpu_device.py with --device cuda: a bf16 base streamed within
#          --gpu-mem vs resident (adapters), NF4 eval/generate streamed vs resident, QLoRA of
#          the tied model with eval --quant nf4 and generate vs logits
# Usage there: [ORDER="8b 70b"] [DEADLINE=560] [STEPS8=4] bash bench/gpu_session.sh
DEFAULT_TESTS="test_cuda_attn test_cuda_nf4_gemm test_cuda_ops test_cuda_nf4 test_cuda_stream"
LOG_LINES=10
ORDER=${ORDER:-tests smoke 8b 70b bench unit devtests}
case " $ORDER " in *" tests "*) ;; *) TESTS=none;; esac
. "$(dirname "$0")/offload/common.sh"
grep -hE "self-check|mma max err|max err|FAILED|Failure" $OUT/test_cuda_attn.log $OUT/test_cuda_nf4_gemm.log 2>/dev/null | tail -12
S8=${STEPS8:-4}

sec_smoke() {
  [ "$(left)" -lt 60 ] && { echo "smoke: skipped ($(left) s left)"; return; }
  local D=examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl TL=tests/fixtures/tiny-llama
  timeout $(cap 60) $F train --model $TL --data $D --eval-data $D --quant nf4 --device cuda --max-steps 2 \
    --seq-len 128 --cache-dir /tmp/smokecache --save-every 0 --out /tmp/o_smoke 2>&1 | tail -4 > $OUT/smoke.log
  echo "train rc=${PIPESTATUS[0]}; final_eval_loss $(grep -o '"final_eval_loss":[^,]*' /tmp/o_smoke/summary.json)" >> $OUT/smoke.log
  timeout $(cap 60) $F eval --model $TL --adapter /tmp/o_smoke --data $D --quant nf4 --device cuda --seq-len 128 \
    --cache-dir /tmp/smokecache >> $OUT/smoke.log 2>&1; echo "eval --quant nf4 rc=$?" >> $OUT/smoke.log
  for q in nf4 bf16; do  # generation through the executor: the NF4 pack's tiers, the bf16 copies
    timeout $(cap 30) $F generate --model $TL --adapter /tmp/o_smoke --raw --prompt "Once upon a time" --json \
      --max-new-tokens 8 --device cuda --quant $q $([ $q = nf4 ] && echo --cache-dir /tmp/smokecache) \
      2>&1 | tail -2 >> $OUT/smoke.log; echo "generate --quant $q rc=${PIPESTATUS[0]}" >> $OUT/smoke.log
  done
  timeout $(cap 60) $F train --model $TL --data examples/data/alpaca-seed-tasks/alpaca_seed_pref.jsonl --method dpo \
    --device cuda --max-steps 2 --seq-len 128 --save-every 0 --out /tmp/o_smoke_dpo 2>&1 | tail -3 >> $OUT/smoke.log
  echo "dpo rc=${PIPESTATUS[0]}" >> $OUT/smoke.log
  cat $OUT/smoke.log
  stamp smoke
}

sec_8b() {
  M=/tmp/m8b
  [ "$(left)" -lt 120 ] && { echo "8b: skipped ($(left) s left)"; return; }
  timeout $(cap 150) $F init-model --config examples/configs/llama-3-8b.json --out $M --pack --safetensors \
    --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | grep -E "safetensors|pack" | tail -2
  stamp init-model-8b
  run lora_gemm 90 --quant bf16 --max-steps $S8
  FTUNE_ATTN=mma run lora_mma 90 --quant bf16 --max-steps $S8
  run qlora 90 --quant nf4 --max-steps $S8
  FTUNE_NF4_GEMM=fused run qlora_fused 90 --quant nf4 --max-steps $S8 --profile
  FTUNE_NF4_GEMM=auto run qlora_auto 90 --quant nf4 --max-steps 3
  rm -rf $M /tmp/o_*
}

sec_70b() {
  M=/tmp/m70
  [ "$(left)" -lt 200 ] && { echo "70b: skipped ($(left) s left)"; return; }
  timeout $(cap 120) $F init-model --config examples/configs/llama-3-70b.json --out $M --pack \
    --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | tail -2
  stamp init-model-70b
  timeout $(cap 40) $F bench io --path $M/model-nf4.ftpack --bytes 8G --device cuda 2>&1 | tail -8 | tee $OUT/bench_io.txt
  stamp bench-io
  run host 110 --gpu-mem 24G --host-mem 48G --grad-accum auto --max-steps 3 --timeline $OUT/host.svg
  run resident 100 --grad-accum auto --max-steps 3
  run disk 150 --gpu-mem 24G --host-mem 8G --grad-accum auto --max-steps 2 --timeline $OUT/disk.svg
  rm -rf /tmp/o_*
}

sec_bench() {
  [ "$(left)" -lt 60 ] && { echo "bench: skipped ($(left) s left)"; return; }
  timeout $(cap 60) /tmp/g/bin/attn_bench > $OUT/attn_bench.txt 2>&1; echo "attn_bench rc=$?"; tail -12 $OUT/attn_bench.txt
  timeout $(cap 60) /tmp/g/bin/nf4_gemm --8b > $OUT/nf4_gemm.txt 2>&1; echo "nf4_gemm rc=$?"; tail -16 $OUT/nf4_gemm.txt
  stamp bench
}

sec_devtests() {  # the cpu-device end-to-end checks on the GPU: streamed vs resident bases
  [ "$(left)" -lt 90 ] && { echo "devtests: skipped ($(left) s left)"; return; }
  FTUNE_BIN=$F FTUNE_TEST_DEVICE=cuda timeout $(cap 150) python3 tests/ref/test_cpu_device.py \
    > $OUT/devtests.txt 2>&1; echo "devtests rc=$?"; grep -E "^(PASS|FAIL) |passed" $OUT/devtests.txt
  stamp devtests
}

sec_unit() {
  for t in /tmp/g/bin/test_*; do
    case $(basename $t) in test_cuda_*) continue;; esac
    [ "$(left)" -lt 40 ] && { echo "unit: $(basename $t) skipped"; continue; }
    FTUNE_DEVICE=cuda CMOCKA_MESSAGE_OUTPUT=stdout timeout $(cap 90) $t > $OUT/$(basename $t).log 2>&1
    echo "$(basename $t) (FTUNE_DEVICE=cuda) rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/$(basename $t).log | tr '\n' ' ')"
  done
  stamp unit
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
    *) echo "unknown section $s" ;;
  esac
done

# The table the reply's tail shows: tok/s of the last two logged steps, peak GPU memory,
# the plan line's prediction, and the done line (RSS) of every run.
echo "==== summary ($(left) s before the deadline) ===="
for f in $OUT/*.log; do
  n=$(basename $f .log)
  case $n in test_*) echo "$n: $(grep -E '^\[  (PASSED|FAILED) ' $f | tr '\n' ' ')"; continue;; esac
  m=$OUT/$n.metrics.jsonl
  tps=$( [ -f $m ] && python3 -c "import json,sys; r=[json.loads(l) for l in open('$m') if '\"tokens_per_s\"' in l]; print(' '.join('%.0f' % x['tokens_per_s'] for x in r[-2:]))" 2>/dev/null)
  echo "$n: tok/s [$tps] $(grep -oE 'peak GPU memory used \(nvidia-smi\) [0-9]+ MiB' $f) $(grep -oE 'predicted [0-9.e+]+ s/step' $f | head -1) $(grep -oE 'peak host RSS [0-9.]+ GiB' $f | head -1)"
done
