"""tools/compare_records.py compares two checkouts' bench_variants records."""

from __future__ import annotations

import json

from tests.tools.conftest import load_tool


def test_compare_records_gives_each_variants_ratio_over_the_shared_shapes(tmp_path):
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
