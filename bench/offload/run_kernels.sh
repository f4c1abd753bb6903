#!/bin/bash
# One GPU call (sessions 5 and 7): the GPU tests, the kernel benches (tensor-core
# FlashAttention-2 vs the cuBLAS-tile path vs fp32; fused NF4 GEMM vs dequant + cuBLAS), then
# ftune on the Llama-3-8B shape (random weights), batch 1, seq 2048, same call: bf16 LoRA with
# the tensor-core attention (the default since 2026-11-28) and with the cuBLAS-tile one (FTUNE_ATTN=gemm);
# QLoRA with the NF4 projections dequantized per layer visit (default), then with
# FTUNE_NF4_GEMM=fused (the dequant-fused GEMM in the executor, with its per-op profile), then
# auto (the probe times one layer both ways, keeps the faster). Usage there (two calls when
# one would pass the 600 s limit: SKIP_8B=1, then TESTS=none SKIP_BENCH=1):
# [TESTS=...] [SKIP_8B=1] [SKIP_BENCH=1] bash bench/offload/run_kernels.sh   (expects .gpu/bundle.tar.xz, $OUT)
DEFAULT_TESTS="test_cuda_attn test_cuda_nf4_gemm test_cuda_stream test_cuda_ops test_cuda_nf4" LOG_LINES=14
. "$(dirname "$0")/common.sh"
grep -E "self-check|mma max err|cases|FAIL" $OUT/test_cuda_attn.log | tail -12
grep -E "host checkpoints|deep|disk reads|bytes each way" $OUT/test_cuda_stream.log | head -6
if [ -z "${SKIP_BENCH:-}" ]; then
timeout 120 /tmp/g/bin/attn_bench > $OUT/attn_bench.txt 2>&1; echo "attn_bench rc=$?"; tail -25 $OUT/attn_bench.txt
stamp attn_bench
timeout 150 /tmp/g/bin/nf4_gemm --8b > $OUT/nf4_gemm.txt 2>&1; echo "nf4_gemm rc=$?"; tail -40 $OUT/nf4_gemm.txt
stamp nf4_gemm
fi
[ -n "${SKIP_8B:-}" ] && exit 0
M=/tmp/m8b
timeout 200 $F init-model --config examples/configs/llama-3-8b.json --out $M --pack --safetensors --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | grep -E "safetensors|pack" | tail -2
stamp init-model
run lora_mma 110 --quant bf16 --max-steps 6
FTUNE_ATTN=gemm run lora_gemm 110 --quant bf16 --max-steps 6
run qlora 110 --quant nf4 --max-steps 6
FTUNE_NF4_GEMM=fused run qlora_fused 110 --quant nf4 --max-steps 6 --profile
FTUNE_NF4_GEMM=auto run qlora_auto 110 --quant nf4 --max-steps 4
