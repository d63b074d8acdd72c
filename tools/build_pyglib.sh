#!/usr/bin/env bash
# Build pyg-lib from source into its own virtual environment, for tools/bench_variants.py --pyg-lib (outside CI).
#
#   bash tools/build_pyglib.sh SRC VENV
#
# SRC: a pyg-lib source tree (tag 0.8.0) with the submodules a CPU build reads in place (third_party/METIS with
# its GKlib, third_party/parallel-hashmap; cutlass, cuCollections and cccl are read only with CUDA). pyg-lib is not
# on this machine's package index and nothing here downloads: bring the tree yourself (git clone --recursive
# --branch 0.8.0 https://github.com/pyg-team/pyg-lib where there is a network).
# VENV: created if missing, with the pinned CPU torch and this repo (editable), then pyg-lib built against that
# torch (about 7 minutes on 2 idle cores). VENV/pyglib-build.json records how: source, commit, submodule commits,
# torch, compiler, cmake, the build command and its wall time; bench_variants copies it into its output.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: bash tools/build_pyglib.sh SRC VENV (SRC: pyg-lib's source tree with its submodules)" >&2
  exit 2
fi
repo="$(cd "$(dirname "$0")/.." && pwd)"
src="$(cd "$1" && pwd)"
venv="$2"
for needed in setup.py CMakeLists.txt third_party/METIS/CMakeLists.txt third_party/parallel-hashmap/parallel_hashmap; do
  if [ ! -e "$src/$needed" ]; then
    echo "tools/build_pyglib.sh: $src/$needed is missing; SRC must be pyg-lib's source tree with its submodules" >&2
    exit 2
  fi
done
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
venv="$(cd "$venv" && pwd)"
"$venv/bin/python" -c "import torch" 2>/dev/null || "$venv/bin/pip" install -q "torch==${TORCH_VERSION:-2.13.0}"
"$venv/bin/pip" install -q -e "$repo" ninja cmake setuptools wheel
build_cmd="MAX_JOBS=2 CMAKE_BUILD_PARALLEL_LEVEL=2 FORCE_NINJA=1 pip install --no-build-isolation ."
started=$(date +%s)
(
  # the environment active: otherwise CMake finds a Python without torch and the module fails to import
  # shellcheck disable=SC1091
  source "$venv/bin/activate"
  cd "$src"
  MAX_JOBS=2 CMAKE_BUILD_PARALLEL_LEVEL=2 FORCE_NINJA=1 pip install --no-build-isolation .
)
seconds=$(( $(date +%s) - started ))
commit_of() { git -C "$1" rev-parse HEAD 2>/dev/null || echo "unknown (not a git checkout)"; }
"$venv/bin/python" - "$src" "$seconds" "$build_cmd" "$(commit_of "$src")" "$(commit_of "$src/third_party/METIS")" \
    "$(commit_of "$src/third_party/METIS/GKlib")" "$(commit_of "$src/third_party/parallel-hashmap")" <<'PY'
import json, platform, subprocess, sys
import pyg_lib, torch
src, seconds, command, commit, metis, gklib, phmap = sys.argv[1:]
first = lambda cmd: subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
out = {"pyg_lib": pyg_lib.__version__, "source": src, "commit": commit,
       "submodules": {"third_party/METIS": metis, "third_party/METIS/GKlib": gklib,
                      "third_party/parallel-hashmap": phmap},
       "torch": torch.__version__, "python": platform.python_version(), "compiler": first(["c++", "--version"]),
       "cmake": first([sys.prefix + "/bin/cmake", "--version"]), "command": command, "build_seconds": int(seconds),
       "by": "tools/build_pyglib.sh"}
open(sys.prefix + "/pyglib-build.json", "w").write(json.dumps(out, indent=2) + "\n")
print(json.dumps(out, indent=2))
PY
echo "pyg-lib built into $venv; run: $venv/bin/python tools/bench_variants.py --pyg-lib" >&2
