#!/bin/bash
# Issue 6 on the lent GPU machine, one call: GPU tests of the tiers, then the Llama-3-70B shape
# (random NF4 pack written by ftune init-model --pack): all layers resident; --gpu-mem 24G
# (the planner streams layers from pinned host memory); --gpu-mem 24G --host-mem 8G (layers
# read from the pack file on NVMe at each visit). Peak GPU memory sampled with nvidia-smi,
# peak host RSS from getrusage (the "done" line), disk rate from `ftune bench io` in the same
# call, and the disk read-ahead alone (`bench io --stream`). Usage there:
# [TESTS=...] [RUNS="host resident disk stream"] bash bench/offload/run_70b.sh
# (expects .gpu/bundle.tar.xz, $OUT)
DEFAULT_TESTS="test_cuda_stream test_cuda_ops" LOG_LINES=22
. "$(dirname "$0")/common.sh"
M=/tmp/m70
timeout 240 $F init-model --config examples/configs/llama-3-70b.json --out $M --pack --tokenizer tests/fixtures/tokenizers/llama3 2>&1 | tail -3
ls -la $M; df -h /tmp | tail -1
stamp init-model
timeout 60 $F bench io --path $M/model-nf4.ftpack --bytes 8G --device cuda 2>&1 | tail -8 | tee $OUT/bench_io.txt
stamp bench-io
want() { case " ${RUNS:-host resident disk stream} " in *" $1 "*) return 0;; esac; return 1; }
# the disk read-ahead alone (no compute), every layer on disk, one step: its rate against the
# raw probe of the same pack in the same call (issue 6's >= 90%)
want stream && timeout 120 $F bench io --path $M/model-nf4.ftpack --stream --steps 1 --bytes 8G --device cuda 2>&1 | tail -14 | tee $OUT/bench_stream.txt
want stream && stamp bench-stream
want host && run host ${LIM_HOST:-170} --gpu-mem 24G --host-mem 48G --grad-accum auto --max-steps 3 --timeline $OUT/host.svg ${HOST_ARGS:-}
want resident && run resident ${LIM_RES:-150} --grad-accum ${GA_RES:-auto} --max-steps 3 ${RES_ARGS:-}
want disk && run disk ${LIM_DISK:-200} --gpu-mem 24G --host-mem 8G --grad-accum auto --max-steps 2 --timeline $OUT/disk.svg ${DISK_ARGS:-}
