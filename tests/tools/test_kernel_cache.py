"""tools/kernel_cache.py counts the specialisations numba cached, per kernel."""

from __future__ import annotations

import subprocess
import sys

from tests.tools.conftest import load_tool


def test_it_counts_each_argument_type_a_kernel_was_compiled_for(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "k.py").write_text("from numba import njit\n\n\n@njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    code = "from pkg.k import twice; twice(1); twice(1.5); twice(2)"  # int64 and float64: two entries
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=120,
                   env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    tool = load_tool("kernel_cache")
    counts = tool.specialisations(tmp_path)
    assert counts == {"pkg/k.twice": 2}, counts
    assert tool.totals(counts) == {"pkg": 2}

