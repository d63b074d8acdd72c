#!/usr/bin/env bash
# Fetch into .whl/ (ignored by git) the wheels a lent GPU machine lacks for tools/device_checks.sh: its Python
# (3.12) has torch, PyG, numba, numpy, scipy, pandas, psutil and fsspec, but not zarr and pymetis. The versions
# are this checkout's own (.venv), so both machines run the same storage code.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
wanted=()
for name in zarr numcodecs donfig google-crc32c pymetis; do
  wanted+=("$name==$(version "$name")")
done
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "${wanted[@]}"
ls .whl
du -sh .whl
