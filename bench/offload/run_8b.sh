#!/bin/bash
# First GPU call of session 4: the device tiers on the Llama-3-8B shape before the 70B run.
# GPU tests (tiers bit-identical, ops), then ftune on random 8B weights: bf16 LoRA, QLoRA with
# every layer resident, QLoRA with --gpu-mem low enough that the planner streams layers from
# pinned host memory, and with --host-mem low enough that layers are read from the pack file.
DEFAULT_TESTS="test_cuda_stream test_cuda_ops test_cuda_nf4" LOG_LINES=16
. "$(dirname "$0")/common.sh"
M=/tmp/m8b
timeout 200 $F init-model --config examples/configs/llama-3-8b.json --out $M --pack --safetensors --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | grep -E "safetensors|pack"
stamp init-model
timeout 60 $F bench io --path $M/model-nf4.ftpack --bytes 4G --device cuda 2>&1 | tail -6 | tee $OUT/bench_io.txt
stamp bench-io
run lora 120 --quant bf16 --max-steps 6
run qlora 120 --quant nf4 --max-steps 6
run qlora_host 150 --quant nf4 --gpu-mem ${GPU_HOST:-14G} --host-mem 16G --grad-accum auto --max-steps 4 --timeline $OUT/host8b.svg
run qlora_disk 150 --quant nf4 --gpu-mem ${GPU_HOST:-14G} --host-mem 1G --grad-accum auto --max-steps 3 --timeline $OUT/disk8b.svg
