"""The README's first command's script: tools/demo.py ingests, prints the dataset and trains on 2 ranks (smaller here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.distributed
def test_demo_ingests_and_trains_across_two_ranks(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--out", str(tmp_path), "--nodes", "3000",
                           "--epochs", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "$ graphstore ingest synthetic:nodes=3000" in done.stdout and "$ graphstore-train" in done.stdout
    finished = re.search(r"demo finished in \d+ s: 2 ranks, 2 epochs, test accuracy ([0-9.]+) \(chance 0\.167\)",
                         done.stdout)
    assert finished, done.stdout[-2000:]
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert doc["world_size"] == 2 and doc["num_parts"] == 2 and len(doc["epochs"]) == 2
    assert float(finished.group(1)) == pytest.approx(doc["epochs"][-1]["test_acc"], abs=5e-4)
    assert doc["epochs"][-1]["remote"]["requests"] > 0, "the two ranks never sampled across partitions"
