"""Builds alpaca_seed_pref.jsonl (a small preference set for `ftune train --method dpo`) from
alpaca_seed_175.jsonl: record i is TRL's conversational explicit-prompt form
{"prompt": [user], "chosen": [assistant], "rejected": [assistant]} with the user turn of task i
(instruction, then a blank line and the input when there is one, as ftune joins Alpaca fields),
chosen = task i's own answer, rejected = the answer of task (i + 88) % 175: a preference for
the answer that belongs to the question. No text is changed. Run: python3 make_pref.py"""
import json

rows = [json.loads(l) for l in open("alpaca_seed_175.jsonl", encoding="utf-8")]
n = len(rows)
with open("alpaca_seed_pref.jsonl", "w", encoding="utf-8") as f:
    for i, r in enumerate(rows):
        user = r["instruction"] + ("\n\n" + r["input"] if r["input"] else "")
        other = rows[(i + 88) % n]["output"]
        rec = {"prompt": [{"role": "user", "content": user}],
               "chosen": [{"role": "assistant", "content": r["output"]}],
               "rejected": [{"role": "assistant", "content": other}]}
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
