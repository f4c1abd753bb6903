/* correction.h - the frozen low-rank correction of a QLoRA run's quantized base
 * (adapters/qcorr.h) set up for a training run: computed from the pack and the unquantized
 * weights at the start of a run and written to OUT/quant_correction/ (a PEFT-format folder:
 * the correction's A0/B0 at the adapter's rank and alpha), then installed in the adapter
 * (ft_lora_set_fixed); a resumed run reads it back with adapters/qcorr.h ft_qcorr_load. */
#ifndef FT_TRAIN_CORRECTION_H
#define FT_TRAIN_CORRECTION_H

#include "adapters/qcorr.h"
#include "offload/pack.h"

/* Computes the correction of l's linears (c: mode, tokens, threads, seed) with Q from `pack`
 * (dequantized per layer) and the calibration micro-batches b (n_b), installs it in l and
 * writes it to out_dir/quant_correction (temp names, fsync, rename). base_name goes to the
 * folder's adapter_config.json. Returns 0 or the errors of ft_qcorr_compute, the pack reads,
 * ft_lora_set_fixed and the save. */
int ft_correction_compute(ft_lora *l, const ft_model *m, ft_pack_file *pack, const ft_batch *b,
                          int64_t n_b, const ft_qcorr_cfg *c, const char *out_dir,
                          const char *base_name, ft_qcorr_stats *st);

#endif
