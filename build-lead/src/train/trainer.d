build-lead/src/train/trainer.o: src/train/trainer.c src/train/trainer.h \
 adapters/lora.h kernels/kernels.h src/model/model.h src/model/config.h \
 src/data/tokenizer.h src/data/dataset.h adapters/peft.h offload/exec.h \
 src/model/llama.h src/core/err.h src/core/fsutil.h src/train/metrics.h \
 src/train/schedule.h
src/train/trainer.h:
adapters/lora.h:
kernels/kernels.h:
src/model/model.h:
src/model/config.h:
src/data/tokenizer.h:
src/data/dataset.h:
adapters/peft.h:
offload/exec.h:
src/model/llama.h:
src/core/err.h:
src/core/fsutil.h:
src/train/metrics.h:
src/train/schedule.h:
