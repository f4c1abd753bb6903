/* summary.h - OUT/summary.json of a completed training run: what was trained (steps, tokens,
 * time, the losses: null for one not measured, e.g. without an eval split), on what (the data
 * files and counts, the base's quantization and, on a device, where the offload planner put
 * its layers; the pack), how it ended (best eval loss and step, the best adapter's folder,
 * early stopping, the step resumed from, the last checkpoint), and the settings that change
 * what the adapter is (DPO, LoRA+, NEFTune, the quantization correction). Numbers exact
 * (best_eval_loss is a metrics.jsonl value), written atomically. */
#ifndef FT_TRAIN_SUMMARY_H
#define FT_TRAIN_SUMMARY_H

#include "src/train/adapter.h"

/* Writes cfg->out/summary.json of adapter a (its cfg, res, st and early flag; has_eval: the
 * run had held-out batches; pack: the pack file the base was read from, or NULL). Returns 0,
 * -ENOMEM, or the write's error naming the file. */
int ft_train_summary_write(const ft_train_adapter *a, int has_eval, const char *pack);

#endif
