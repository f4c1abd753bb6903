#!/usr/bin/env python3
"""check_layers.py - the layer rules of docs/architecture.md, checked over the tree.

Reads the layer table of docs/architecture.md (rows `| N | folder | ... |`: N the layer, lowest
first), then every `#include "..."` of the library and cli/ sources (.c .h .cu .cuh), and
fails when:
  - a file's folder is in no row (a new folder must be given its layer);
  - a file includes a header of a folder of the same or a higher layer than its own (an
    upward include, or an include between two folders of one layer, which could close a cycle);
  - library code (every folder but cli/) calls getenv: only cli/ reads the environment, and
    passes what it read down as options.
Prints one line per violation (file:line, what, the two layers) and exits 1 if any, else
prints a summary and exits 0. Usage: tests/lint/check_layers.py [ROOT]
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.path.join(ROOT, "docs", "architecture.md")
TOPS = ["src", "kernels", "offload", "adapters", "cli"]
EXTS = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
GETENV = re.compile(r'\b(secure_)?getenv\s*\(')
# Known upward includes, each with the change that removes it; an entry that no longer
# matches is named in a note (not a failure, so that the branch removing the include merges
# cleanly), to be deleted.
ALLOW = set()


def read_layers():
    layers = {}
    row = re.compile(r'^\|\s*(\d+)\s*\|\s*`?([A-Za-z0-9_/]+)/?`?\s*\|')
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            m = row.match(line)
            if m:
                layers[m.group(2).rstrip("/")] = int(m.group(1))
    if not layers:
        sys.exit(f"check_layers: {DOC}: no layer table (rows '| N | folder | ... |')")
    return layers


def folder_of(path, layers):
    """The deepest folder of the table holding path (a repo-relative file path)."""
    d = os.path.dirname(path)
    while d:
        if d in layers:
            return d
        d = os.path.dirname(d)
    return None


def strip_comments(text):
    """C source without /* */ and // comments (string literals kept), lines preserved."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def main():
    layers = read_layers()
    bad, n_files, n_edges, allowed = [], 0, 0, set()
    for top in TOPS:
        for dp, _, fns in os.walk(os.path.join(ROOT, top)):
            for fn in sorted(fns):
                if not fn.endswith(EXTS):
                    continue
                rel = os.path.relpath(os.path.join(dp, fn), ROOT)
                n_files += 1
                src = folder_of(rel, layers)
                if src is None:
                    bad.append(f"{rel}: folder {os.path.dirname(rel)} has no layer in docs/architecture.md")
                    continue
                with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for ln, line in enumerate(text.split("\n"), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if not os.path.exists(os.path.join(ROOT, inc)):
                        inc = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
                        if not os.path.exists(os.path.join(ROOT, inc)):
                            continue  # a system or generated header
                    dst = folder_of(inc, layers)
                    if dst is None or dst == src:
                        continue
                    n_edges += 1
                    if (rel, inc) in ALLOW:
                        allowed.add((rel, inc))
                        continue
                    if layers[dst] >= layers[src]:
                        kind = "upward include" if layers[dst] > layers[src] else "include between folders of one layer"
                        bad.append(f"{rel}:{ln}: {kind}: {src} (layer {layers[src]}) includes {m.group(1)} "
                                   f"({dst}, layer {layers[dst]})")
                if not rel.startswith("cli/"):
                    code = strip_comments(text)
                    for ln, line in enumerate(code.split("\n"), 1):
                        if GETENV.search(line):
                            bad.append(f"{rel}:{ln}: library code reads the environment (getenv): only cli/ may, "
                                       "passing the value down as an option")
    if os.path.isfile(os.path.join(ROOT, "offload", "exec.h")):  # the real tree, not a test's
        for a, b in sorted(ALLOW - allowed):
            print(f"check_layers: note: {a} no longer includes {b}: delete its ALLOW entry in tests/lint/check_layers.py")
    for b in bad:
        print(b)
    if bad:
        print(f"check_layers: {len(bad)} violation(s) of the layer rules of docs/architecture.md")
        return 1
    print(f"check_layers: ok: {n_files} files, {n_edges} includes across {len(layers)} folders, none upward"
          f"{f' but {len(allowed)} allowed (ALLOW)' if allowed else ''}, no getenv outside cli/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
