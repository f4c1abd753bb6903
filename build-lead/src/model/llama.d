build-lead/src/model/llama.o: src/model/llama.c src/model/llama.h \
 adapters/lora.h kernels/kernels.h src/model/model.h src/model/config.h \
 src/data/tokenizer.h src/core/err.h
src/model/llama.h:
adapters/lora.h:
kernels/kernels.h:
src/model/model.h:
src/model/config.h:
src/data/tokenizer.h:
src/core/err.h:
