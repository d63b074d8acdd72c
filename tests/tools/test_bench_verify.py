"""tools/bench_verify.py runs end to end on a tiny dataset and reports every row docs/performance.md quotes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_verify_reports_every_check():
    cmd = [sys.executable, str(ROOT / "tools" / "bench_verify.py"), "--json", "--nodes", "3000", "--repeats", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["check"]: r for r in json.loads(done.stdout)["rows"]}
    assert set(rows) == {"topology: plain read (sum of bytes)", "topology: checksums", "topology: CSC invariants",
                         "node arrays: plain read (sum of bytes)", "node arrays: verify_reads checksums"}
    assert all(r["seconds"] > 0 and r["bytes"] > 0 for r in rows.values())
