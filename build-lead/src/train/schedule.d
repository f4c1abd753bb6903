build-lead/src/train/schedule.o: src/train/schedule.c \
 src/train/schedule.h
src/train/schedule.h:
