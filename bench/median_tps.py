"""Median training tokens/s of a run's metrics.jsonl over the steps after the first two
(warm caches), printed with one decimal. Usage: python3 bench/median_tps.py RUN/metrics.jsonl
(bench/cpu_train.sh, bench/omp_policy.sh)."""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if '"loss"' in line]
print("%.1f" % statistics.median(r["tokens_per_s"] for r in rows[2:]))
