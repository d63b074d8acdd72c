#!/usr/bin/env bash
# Create .venv and install graphstore with its test extras. Pins torch==2.13.0, the CPU wheel (unless a
# torch is already installed there), so the installer never pulls a multi-GB CUDA build.
# Idempotent: re-installs only when pyproject.toml changed; compiles the numba kernels only when they are not.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.graphstore-installed
want=$(sha256sum pyproject.toml | cut -c1-16)
# pip install "$@" into .venv, through uv where the index has it and every pip setting here has a uv
# translation (tools/pip_as_uv.py: the same indexes, find-links and constraints, so the same packages, in a
# fraction of pip's time); else, or when uv fails, through pip. GRAPHSTORE_PIP=1 always uses pip.
install() {
  if [ -z "${GRAPHSTORE_PIP:-}" ] && { [ -x .venv/bin/uv ] || .venv/bin/pip install -q uv >/dev/null 2>&1; } \
      && .venv/bin/python tools/pip_as_uv.py --pip .venv/bin/pip > .venv/.uv-args; then
    local args=() envs=() line
    while IFS= read -r line; do
      case "$line" in "ENV "*) envs+=("${line#ENV }") ;; *) args+=("$line") ;; esac
    done < .venv/.uv-args
    if env ${envs[@]+"${envs[@]}"} .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode \
        ${args[@]+"${args[@]}"} "$@"; then
      return 0
    fi
    echo "tools/bootstrap.sh: uv could not install $*; installing with pip" >&2
  fi
  .venv/bin/pip install -q "$@"
}
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c "import graphstore" 2>/dev/null; then
  torch=()  # the pinned CPU wheel in the same resolution, unless a torch is installed there already
  .venv/bin/python -c "import torch" 2>/dev/null || torch=("torch==${TORCH_VERSION:-2.13.0}")
  install ${torch[@]+"${torch[@]}"} -e ".[test,s3]"
  echo "$want" > "$stamp"
fi
# jemalloc: graphstore-train runs its ranks under it where the machine has it (training/launcher/allocator.py:
# flat memory per rank). Installed here when this runs as root on Debian/Ubuntu and it is missing, tried
# once per .venv (.venv/.jemalloc-tried); set GRAPHSTORE_NO_APT=1 to skip. Without it ranks use glibc's
# allocator, tuned.
have_jemalloc() {  # where training/launcher/allocator.py looks (GRAPHSTORE_JEMALLOC aside)
  .venv/bin/python -c "import sys; from training.launcher.allocator import find_jemalloc; sys.exit(find_jemalloc({}) is None)"
}
if [ -z "${GRAPHSTORE_NO_APT:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
    && [ ! -e .venv/.jemalloc-tried ] && ! have_jemalloc; then
  touch .venv/.jemalloc-tried
  apt_get() { timeout 300 apt-get -q -o Acquire::http::Timeout=30 -o Acquire::Retries=1 "$@" >/dev/null 2>&1; }
  echo "tools/bootstrap.sh: installing libjemalloc2 (apt-get; GRAPHSTORE_NO_APT=1 skips this)" >&2
  apt_get install -y libjemalloc2 || { apt_get update && apt_get install -y libjemalloc2; } \
    || echo "tools/bootstrap.sh: could not install libjemalloc2; ranks will use glibc's allocator" >&2
fi
# numba's kernels: compiled here, once per installation, instead of silently in a user's first batch
# (graphstore warmup: minutes the first time; a no-op, checked in about a second, while its stamp holds:
# same sources, numba, Python and CPU). GRAPHSTORE_NO_WARMUP=1 skips it; a failed warm-up only warns.
if [ -z "${GRAPHSTORE_NO_WARMUP:-}" ] && ! .venv/bin/python -c \
    "import sys; from graphstore.jitcache import warm_stamp; sys.exit(warm_stamp() is None)" 2>/dev/null; then
  echo "tools/bootstrap.sh: compiling the numba kernels (graphstore warmup; GRAPHSTORE_NO_WARMUP=1 skips it)" >&2
  .venv/bin/graphstore warmup \
    || echo "tools/bootstrap.sh: the warm-up failed; kernels will compile in the first runs instead" >&2
fi
