#!/usr/bin/env bash
# Installs what ftune's build and tests need when it is missing: Debian -dev packages
# (apt-get) and Python test packages (pip). Idempotent; prints one line per install.
set -euo pipefail
need_deb=()
for p in libopenblas-dev libpcre2-dev libutf8proc-dev libcjson-dev libcmocka-dev liburing-dev libnuma-dev zlib1g-dev pkg-config unzip; do
    dpkg -s "$p" >/dev/null 2>&1 || need_deb+=("$p")
done
if [ ${#need_deb[@]} -gt 0 ]; then
    echo "[deps] apt-get install ${need_deb[*]}"
    SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_deb[@]}" >/dev/null
fi
need_py=()
for m in numpy:numpy safetensors:safetensors gguf:gguf tokenizers:tokenizers transformers:transformers pytest:pytest jsonschema:jsonschema; do
    python3 -c "import ${m%%:*}" 2>/dev/null || need_py+=("${m#*:}")
done
if [ ${#need_py[@]} -gt 0 ]; then
    echo "[deps] pip install ${need_py[*]}"
    python3 -m pip install -q "${need_py[@]}"
fi
