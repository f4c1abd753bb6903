build-lead/adapters/peft.o: adapters/peft.c adapters/peft.h \
 adapters/lora.h kernels/kernels.h src/model/model.h src/model/config.h \
 src/data/tokenizer.h src/core/err.h src/core/fsutil.h \
 src/model/safetensors.h
adapters/peft.h:
adapters/lora.h:
kernels/kernels.h:
src/model/model.h:
src/model/config.h:
src/data/tokenizer.h:
src/core/err.h:
src/core/fsutil.h:
src/model/safetensors.h:
