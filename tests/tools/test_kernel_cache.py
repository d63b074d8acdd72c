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


def test_compare_records_gives_each_variants_ratio_over_the_shared_shapes(tmp_path):
    import json

    tool = load_tool("compare_records")

    def record(name, plain, weighted, extra=None):
        shapes = [{"shape": "u/5", "variant": "plain", "edges_per_s": plain},
                  {"shape": "u/5", "variant": "weighted", "edges_per_s": weighted}] + (extra or [])
        (tmp_path / name).write_text(json.dumps({"benchmark": "bench_variants", "figures": {"shapes": shapes}}))
        return tool.rates(tmp_path / name)

    old = [record("o1", 100.0, 50.0), record("o2", 100.0, 70.0)]
    new = [record("n1", 110.0, 60.0, [{"shape": "s/5", "variant": "plain", "edges_per_s": 1.0}]),
           record("n2", 130.0, 60.0)]
    out = tool.compare(old, new)
    assert out["shapes"] == 2  # the shape only one record has is left out
    assert out["new_over_baseline"]["plain"] == {"shapes": 1, "min": 1.2, "median": 1.2, "max": 1.2}
    assert out["new_over_baseline"]["weighted"]["median"] == 1.0
    assert out["second_run_over_first"]["baseline"] == {"min": 1.0, "median": 1.2, "max": 1.4}
