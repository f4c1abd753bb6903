build-lead/offload/exec.o: offload/exec.c offload/exec.h adapters/lora.h \
 kernels/kernels.h src/model/model.h src/model/config.h \
 src/data/tokenizer.h src/data/dataset.h src/model/llama.h src/core/err.h
offload/exec.h:
adapters/lora.h:
kernels/kernels.h:
src/model/model.h:
src/model/config.h:
src/data/tokenizer.h:
src/data/dataset.h:
src/model/llama.h:
src/core/err.h:
