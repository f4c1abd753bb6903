#!/usr/bin/env python3
"""test_check_layers.py - check_layers.py is shown to fail: in a temporary tree with the
repository's layer table (docs/architecture.md), a clean include passes, and each planted
violation (an upward include, from a folder or into a subfolder, getenv in library code, a
file in a folder with no layer) makes the check exit 1 naming the file and line. Exits 0 when
every case behaves, else 1 (one line per wrong case). Usage: tests/lint/test_check_layers.py
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
CHECK = os.path.join(HERE, "check_layers.py")


def tree(files):
    """A temp root with docs/architecture.md and files {relpath: text}."""
    root = tempfile.mkdtemp(prefix="ftune-layers-")
    os.makedirs(os.path.join(root, "docs"))
    shutil.copy(os.path.join(REPO, "docs", "architecture.md"), os.path.join(root, "docs"))
    for rel, text in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)
    return root


def run(files):
    root = tree(files)
    try:
        p = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout + p.stderr
    finally:
        shutil.rmtree(root)


BASE = {
    "src/core/err.h": "#pragma once\n",
    "src/model/model.h": '#pragma once\n#include "src/core/err.h"\n',
    "src/train/trainer.c": '#include "src/model/model.h"\n#include <stdio.h>\n',
    "cli/main.c": '#include "src/train/trainer.c"\n#include <stdlib.h>\nint f(void) { return !getenv("X"); }\n',
}

CASES = [
    # (name, extra files, expected exit, text the output must hold)
    ("clean tree", {}, 0, "check_layers: ok"),
    ("upward include", {"src/model/llama.c": '#include "src/train/trainer.c"\n'}, 1,
     "src/model/llama.c:1: upward include: src/model (layer "),
    ("a downward include from a subfolder", {"adapters/export/y.c": '#include "adapters/x.h"\n',
                                             "adapters/x.h": "#pragma once\n"}, 0, "check_layers: ok"),
    ("an upward include into a subfolder", {"adapters/x.c": '\n\n#include "adapters/export/y.h"\n',
                                            "adapters/export/y.h": "#pragma once\n"}, 1,
     "adapters/x.c:3: upward include: adapters (layer "),
    ("upward include from a lower sublayer", {"adapters/x.h": "#pragma once\n",
                                              "src/core/z.c": '#include "src/core/err.h"\n#include "adapters/x.h"\n'}, 1,
     "src/core/z.c:2: upward include: src/core (layer 0)"),
    ("getenv in library code", {"offload/tiers.c": '#include <stdlib.h>\nstatic int g(void) { return !getenv("FTUNE_X"); }\n'},
     1, "offload/tiers.c:2: library code reads the environment"),
    ("getenv in a comment only", {"offload/tiers.c": "/* getenv(\"FTUNE_X\") was read here */\n"}, 0, "check_layers: ok"),
    ("a folder with no layer", {"src/newthing/a.c": "int a;\n"}, 1, "folder src/newthing has no layer"),
    ("a relative include that goes up", {"kernels/cpu/b.c": '#include "../../src/train/t.h"\n',
                                         "src/train/t.h": "#pragma once\n"}, 1,
     "kernels/cpu/b.c:1: upward include: kernels/cpu (layer "),
]


def main():
    bad = 0
    for name, extra, want_rc, want_text in CASES:
        files = dict(BASE)
        files.update(extra)
        rc, out = run(files)
        ok = rc == want_rc and want_text in out
        print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {rc}" + ("" if ok else f" (want {want_rc} and {want_text!r}):\n{out}"))
        bad += not ok
    print(f"test_check_layers: {len(CASES) - bad} of {len(CASES)} cases as expected")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
