#!/usr/bin/env bash
# The test command: set up .venv if needed, then run the whole suite. Extra arguments go to pytest.
# pytest's exit code 5 (no tests collected) is a failure here, never a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh || exit 1
.venv/bin/python -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "tools/test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
