build-lead/src/train/metrics.o: src/train/metrics.c src/train/metrics.h \
 src/core/err.h
src/train/metrics.h:
src/core/err.h:
