#!/usr/bin/env bash
# Builds ftune, the GPU test binaries and the kernel benches for the lent GPU machine, which has the CUDA
# toolkit but not libopenblas/pcre2/utf8proc/cjson/cmocka: OpenBLAS, PCRE2 and utf8proc are linked statically,
# the small remaining shared libraries are copied beside the binaries. Output: .gpu/bin,
# .gpu/lib (git-ignored), carried to the machine; run there with LD_LIBRARY_PATH=.gpu/lib.
# Usage: [UNIT="test_dpo test_neftune"] scripts/gpu_bundle.sh [BUILD_DIR]   (default build-gpu)
#   UNIT: device-agnostic unit tests (tests/unit) to bundle too, run there with FTUNE_DEVICE=cuda
#   (each adds a statically linked binary: watch the 64 MiB carry limit)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-gpu}
A=/usr/lib/x86_64-linux-gnu
# MPI=0: Debian ships Open MPI as shared libraries only and the lent machine has none; the
# bundle's NCCL backend then shares its id through a file (FTUNE_NCCL_ID_FILE, docs/distributed.md)
make -j2 --no-print-directory BUILD="$B" CUDA=1 MPI=0 ${CU_EXTRA:+CU_EXTRA=$CU_EXTRA} \
    BLAS_LIBS="$A/openblas-pthread/libopenblas.a -lgfortran" PCRE2_LIBS="$A/libpcre2-8.a" UTF8PROC_LIBS="$A/libutf8proc.a" URING_LIBS="$A/liburing.a" \
    "$B/ftune" $(ls tests/gpu/test_*.c | sed "s|tests/gpu/\(.*\)\.c|$B/tests/gpu/\1|") \
    $(for t in ${UNIT:-}; do echo "$B/tests/$t"; done) >/dev/null
mkdir -p .gpu/bin .gpu/lib
cp "$B/ftune" .gpu/bin/
cp "$B"/tests/gpu/test_* .gpu/bin/
for t in ${UNIT:-}; do cp "$B/tests/$t" .gpu/bin/; done
for l in libcjson.so.1 libcmocka.so.0 libgomp.so.1 libgfortran.so.5 libquadmath.so.0; do
    cp -L "$A/$l" .gpu/lib/
done
# the kernel benches (bench/attn_bench.cu, bench/nf4_gemm.cu; their headers give the same lines)
if [ -n "$(command -v nvcc)" ]; then
    nvcc -O3 -std=c++20 -arch=sm_90 -I. bench/attn_bench.cu "$B/libftune.a" \
        $A/openblas-pthread/libopenblas.a -lgfortran $A/libpcre2-8.a $A/libutf8proc.a -lcjson \
        $A/liburing.a "$(gcc -print-file-name=libnuma.a)" -lgomp -ldl -lrt -lpthread -o .gpu/bin/attn_bench
    nvcc -O3 -std=c++20 -arch=sm_90 -I. -Xcompiler -fopenmp bench/nf4_gemm.cu "$B/src/numeric/nf4.o" \
        "$B/src/core/err.o" -lcublas -lgomp -o .gpu/bin/nf4_gemm
fi
strip --strip-debug .gpu/bin/* 2>/dev/null || true
du -sh .gpu/bin .gpu/lib
# One compressed archive travels (the two statically linked binaries share most bytes):
# on the machine, python3 -c "import tarfile; tarfile.open('.gpu/bundle.tar.xz').extractall('/tmp/g')"
tar cf - -C .gpu bin lib | xz -T2 -6 > .gpu/bundle.tar.xz
ls -la .gpu/bundle.tar.xz
