#!/usr/bin/env bash
# The test command: set up .venv if needed, then run the whole suite. Extra arguments go to pytest.
# pytest's exit code 5 (no tests collected) is a failure here, never a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
# the suite starts a few hundred Python processes that import this checkout: let them share its bytecode
# (under a machine-wide PYTHONDONTWRITEBYTECODE=1 each one would compile every module it imports again)
unset PYTHONDONTWRITEBYTECODE
bash tools/bootstrap.sh || exit 1
# one pytest worker per core and one more (GRAPHSTORE_TEST_WORKERS overrides; 0 runs in this process): jobs
# waiting on their ranks, rendezvous and fault tests waiting out their timeouts leave a core idle now and then,
# which the extra worker fills
cores="$(nproc 2>/dev/null || echo 1)"
workers="${GRAPHSTORE_TEST_WORKERS:-$((cores + 1))}"
if [ "$workers" = "0" ]; then
  .venv/bin/python -m pytest -q "$@"
else
  .venv/bin/python -m pytest -q -n "$workers" --dist worksteal "$@"
fi
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "tools/test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
