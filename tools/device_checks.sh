#!/usr/bin/env bash
# The GPU checks of the open issues, prepared for one call of the device tool on a lent H100/H200 (bare, no
# network, 15 minutes of device time a session, start-up included):
#
#   here, once:   bash tools/device_wheels.sh          # zarr and pymetis as wheels, into .whl/ (git ignores it)
#   device run:   command "bash tools/device_checks.sh", carry [".whl"], timeout_s 590
#
# Steps, each in a time limit of its own, all output in $OUT/log.txt (it comes back, also when a step is cut):
#   1. what the machine has (torch, CUDA, PyG, zarr, numba);
#   2. the sampling kernels compiled ahead (`graphstore warmup`), so no timed step compiles;
#   3. the tests that need a CUDA device (device cache, pinned batches from loader threads and sampler processes,
#      the device feeder, the built-in models in blocks against the CPU's), which CI never runs;
#   4. issue 46's figure: tools/bench_data_wait.py on issue 27's graph, the rank's threads against sampler
#      processes and against sampler processes beside a device cache; the blocks models train on the GPU there.
#      Its record lands in $OUT/bench_data_wait/ (copy it to benchmarks/bench_data_wait/ here).
# CHECKS (space-separated step names) runs a subset; DATA_WAIT_REPEATS (default 1) the benchmark's repeats;
# PYTHON and DEVICE (python3, cuda) let a machine without a GPU try the script's mechanics.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
out="${OUT:-/tmp/graphstore-device-out}"
mkdir -p "$out"
log="$out/log.txt"
checks=" ${CHECKS:-machine warmup tests data-wait} "
py="${PYTHON:-python3}"
device="${DEVICE:-cuda}"

step() {  # step NAME SECONDS COMMAND...: run it if CHECKS names it, logged, within SECONDS
  local name=$1 limit=$2
  shift 2
  [[ "$checks" == *" $name "* ]] || return 0
  echo "== $name (at most ${limit}s), $(date -u +%T)" | tee -a "$log"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  echo "== $name: exit ${PIPESTATUS[0]} at $(date -u +%T)" | tee -a "$log"
}

if compgen -G ".whl/*.whl" > /dev/null; then  # the wheels this machine lacks (tools/device_wheels.sh)
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | tee -a "$log" || exit 1
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
jobs=$(( $(nproc) / 2 ))
[ "$jobs" -ge 1 ] || jobs=1

step machine 60 "$py" -c "
import torch, torch_geometric, zarr, numba, os
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print('pyg', torch_geometric.__version__, 'zarr', zarr.__version__, 'numba', numba.__version__, 'cores', os.cpu_count())"
step warmup 240 "$py" -m graphstore.cli.app warmup --jobs "$jobs"
step tests 150 "$py" -m pytest -q -p no:cacheprovider -p no:randomly -n "$jobs" \
  tests/sampling/test_device_cache.py tests/sampling/test_loader_threads.py tests/sampling/test_sampler_processes.py \
  tests/training/test_trim.py -k "cuda or gpu or pinned or feeder"
step data-wait 330 "$py" tools/bench_data_wait.py --device "$device" --epochs 3 --repeats "${DATA_WAIT_REPEATS:-1}" \
  --seed 1 --record "$out" --way "threads=" --way "p2=--loader-workers 2" --way "p4=--loader-workers 4" \
  --way "p4-gpu-cache=--loader-workers 4 --gpu-cache 256MB"
echo "== done $(date -u +%T)" | tee -a "$log"
