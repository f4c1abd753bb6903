#!/usr/bin/env bash
# Installs what ftune's build and tests need when it is missing: Debian -dev packages
# (apt-get) and Python test packages (pip). Idempotent; prints one line per install.
set -euo pipefail
need_deb=()
for p in libopenblas-dev libxxhash-dev libpcre2-dev libutf8proc-dev libcjson-dev libcmocka-dev liburing-dev libnuma-dev zlib1g-dev libprotobuf-c-dev protobuf-c-compiler pkg-config unzip libopenmpi-dev openmpi-bin; do
    dpkg -s "$p" >/dev/null 2>&1 || need_deb+=("$p")
done
if [ ${#need_deb[@]} -gt 0 ]; then
    echo "[deps] apt-get install ${need_deb[*]}"
    SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_deb[@]}" >/dev/null
fi
# Headless Chromium for the report test (tests/ref/test_report.py takes a screenshot of
# report.html); optional: the test skips, naming the package, where it cannot be installed.
if ! command -v chromium >/dev/null 2>&1 && ! dpkg -s chromium >/dev/null 2>&1; then
    echo "[deps] apt-get install chromium (optional: the report screenshot test)"
    SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium; } >/dev/null 2>&1 ||
        echo "[deps] chromium could not be installed; the report screenshot test will skip"
fi
# A single-node Slurm for the srun test (tests/ref/test_distributed.py starts munged, slurmctld
# and slurmd on localhost); optional: the test skips, saying why, where they are missing.
if ! dpkg -s slurm-wlm >/dev/null 2>&1 || ! dpkg -s munge >/dev/null 2>&1; then
    echo "[deps] apt-get install slurm-wlm munge (optional: the srun test)"
    SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq slurm-wlm munge; } >/dev/null 2>&1 ||
        echo "[deps] slurm-wlm could not be installed; the srun test will skip"
fi
need_py=()
for m in numpy:numpy safetensors:safetensors gguf:gguf tokenizers:tokenizers transformers:transformers pytest:pytest tensorboard:tensorboard PIL:pillow jsonschema:jsonschema; do
    python3 -c "import ${m%%:*}" 2>/dev/null || need_py+=("${m#*:}")
done
if [ ${#need_py[@]} -gt 0 ]; then
    echo "[deps] pip install ${need_py[*]}"
    python3 -m pip install -q "${need_py[@]}"
fi
# PEFT, to read ftune's adapter folders as a PEFT user does (tests/ref/test_adapter_card.py,
# test_peft_layout.py: PeftConfig.from_pretrained). It pulls in torch (about 4 GB with its
# CUDA libraries from PyPI), so a failed install only leaves those checks out.
if ! python3 -c "import peft" 2>/dev/null; then
    echo "[deps] pip install peft (with torch; optional: PEFT's own reading of adapter folders)"
    python3 -m pip install -q peft || echo "[deps] peft could not be installed; the PEFT checks will be left out"
fi
