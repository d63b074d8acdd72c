#!/usr/bin/env bash
# Create .venv and install graphstore with its test extras. Installs the CPU wheel torch==2.13.0
# first (unless a torch is already installed there), so pip never pulls a multi-GB CUDA build.
# Idempotent: re-installs only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.graphstore-installed
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c "import graphstore" 2>/dev/null; then
  .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==${TORCH_VERSION:-2.13.0}"
  .venv/bin/pip install -q -e ".[test,s3]"
  echo "$want" > "$stamp"
fi
