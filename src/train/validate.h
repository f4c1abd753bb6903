/* validate.h - the domain of every setting of a training run (ft_train_cfg), checked before
 * anything is loaded: what the CLI's option table (cli/args.c) checks for its flags, for a
 * caller of the library that fills the struct itself. */
#ifndef FT_TRAIN_VALIDATE_H
#define FT_TRAIN_VALIDATE_H

#include "src/train/trainer.h"

/* 0 when every numeric setting of c is finite and within its domain (torch's AdamW: lr > 0,
 * 0 <= betas < 1, weight_decay >= 0, and eps > 0 here, since 0 gives 0/0 where a gradient
 * is 0; PEFT's LoRA: 1 <= r <= 4096, a finite alpha > 0, 0 <= dropout < 1; counts >= 0 or
 * >= 1 as each says; fractions in their ranges; the enums known) and the combinations hold
 * (DPO settings, early stopping and --save-best need evaluations). Else FT_E_INVALID with one
 * line naming the setting by its flag ("--adam-eps must be a finite number > 0"). */
int ft_train_cfg_validate(const ft_train_cfg *c);

#endif
