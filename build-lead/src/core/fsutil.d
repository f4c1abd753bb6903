build-lead/src/core/fsutil.o: src/core/fsutil.c src/core/fsutil.h \
 src/core/err.h
src/core/fsutil.h:
src/core/err.h:
