#!/usr/bin/env bash
# Create .venv and install bert-kit with its dev extras. Idempotent.
# torch: a machine with an NVIDIA driver gets the newest CUDA build from PyPI; a machine
# without one gets the pinned 2.13.0 CPU build (kept on disk on our CPU machines), unless
# torch is already installed in the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/pip install -q "torch>=2.4"
  else
    .venv/bin/pip install -q "torch==2.13.0" || .venv/bin/pip install -q "torch>=2.4"
  fi
fi
.venv/bin/pip install -q -e ".[dev]"
touch .venv/.installed
