build-lead/adapters/lora.o: adapters/lora.c adapters/lora.h \
 kernels/kernels.h src/model/model.h src/model/config.h \
 src/data/tokenizer.h src/core/err.h src/core/rng.h
adapters/lora.h:
kernels/kernels.h:
src/model/model.h:
src/model/config.h:
src/data/tokenizer.h:
src/core/err.h:
src/core/rng.h:
