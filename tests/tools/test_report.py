"""tools/report.py renders the newest record per benchmark and configuration, with its provenance, and the
committed docs/performance.md and the README's table are current with the committed benchmarks/ records."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.conftest import load_tool

ROOT = Path(__file__).resolve().parents[2]


report = load_tool("report")
benchinfo = load_tool("benchinfo")


def _record(root: Path, date: str, figures: dict, *, bench: str = "bench_x", config: dict | None = None,
            commit: str | None = "0123456789abcdef", provenance: str | None = None) -> Path:
    rec = {"benchmark": bench, "config": config if config is not None else {"graph": "g1"},
           "command": [".venv/bin/python", f"tools/{bench}.py", "--seed", "7"], "commit": commit,
           "date": date, "machine": {"cpu": "Test CPU 9000", "logical_cores": 4, "physical_cores": 2,
                                     "usable_cores": 4, "ram_gib": 16.0, "gpus": [], "load_average_1min": 0.25},
           "parameters": {"seed": 7}, "figures": figures, "provenance": provenance}
    return benchinfo.write_record(rec, root)


def test_the_newest_record_of_each_configuration_wins_with_its_provenance(tmp_path):
    root = tmp_path / "benchmarks"
    _record(root, "2026-01-01T10:00:00+00:00", {"rows": [{"variant": "plain", "edges_per_s": 11.0}]})
    newest = _record(root, "2026-03-01T10:00:00+00:00", {"rows": [{"variant": "plain", "edges_per_s": 22.0}]})
    _record(root, "2026-02-01T10:00:00+00:00", {"rows": [{"variant": "plain", "edges_per_s": 33.0}]})
    _record(root, "2025-12-24T10:00:00+00:00", {"rows": [{"run": "old", "time": "3 min 02 s"}]},
            config={"graph": "g2"}, commit=None, provenance="transcribed from README.md at abc1234; measured by x")
    text = report.render(root)
    assert "| plain | 22.00 |" in text and "11.00" not in text and "33.00" not in text
    assert f"`benchmarks/bench_x/{newest.name}`" in text
    assert "#### graph=g1" in text and "#### graph=g2" in text and text.index("graph=g1") < text.index("graph=g2")
    # under each table: command, commit, machine, date; provenance where a record has one
    assert "- command: `.venv/bin/python tools/bench_x.py --seed 7`" in text
    assert "- commit: `0123456789`" in text and "- commit: not recorded" in text
    assert "- machine: Test CPU 9000, 4 logical / 2 physical cores (4 usable), 16.0 GiB RAM, GPU: none" in text
    assert "load average 0.25 at start" in text and "- date: 2026-03-01T10:00:00+00:00" in text
    assert "| old | 3 min 02 s |" in text  # a transcribed cell is shown as the README wrote it
    assert text.count("- provenance:") == 1 and "- provenance: transcribed from README.md at abc1234" in text


def test_a_later_record_of_the_same_day_and_commit_wins(tmp_path):
    first = _record(tmp_path, "2026-01-01T10:00:00+00:00", {"x": 1})
    second = _record(tmp_path, "2026-01-01T10:00:00+00:00", {"x": 2})
    assert (first.name, second.name) == ("2026-01-01-0123456.json", "2026-01-01-0123456-2.json")
    assert "| x | 2 |" in report.render(tmp_path) and not list(tmp_path.glob("*/.*"))  # no partial file left


def test_figures_of_several_shapes_become_tables(tmp_path):
    _record(tmp_path, "2026-01-01T10:00:00+00:00",
            {"graph": {"nodes": 4000, "edges": 32000}, "ours": {"edges_per_s": 3.3e7, "batches_per_s": 38.9},
             "torch_reference": {"edges_per_s": 6.1e5, "batches_per_s": 0.7}, "fanout": [15, 10, 5],
             "minimum": {"2": {"needed_bytes": 25, "ratio": 1.07}}, "notes": ["a note"]})
    text = report.render(tmp_path)
    assert "| ours | 33.00 M | 38.90 |" in text and "| torch_reference | 610,000.0 | 0.7 |" in text
    assert "| 2 | 25 | 1.07 |" in text and "| graph.nodes | 4,000 |" in text and "| fanout | 15, 10, 5 |" in text
    assert "Note: a note" in text


def test_write_then_check_and_a_stale_section_is_one_line(tmp_path):
    root, doc = tmp_path / "benchmarks", tmp_path / "perf.md"
    _record(root, "2026-01-01T10:00:00+00:00", {"x": 1})
    doc.write_text(f"# Title\n\nprose stays\n\n{report.BEGIN}\nold\n{report.END}\n\nafter\n")
    assert report.main(["--records", str(root), "--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Title\n\nprose stays\n") and text.endswith(f"{report.END}\n\nafter\n")
    assert "old" not in text and "| x | 1 |" in text
    assert report.main(["--records", str(root), "--check", str(doc)]) == 0
    _record(root, "2026-02-01T10:00:00+00:00", {"x": 2})
    cmd = [sys.executable, str(ROOT / "tools" / "report.py"), "--records", str(root), "--check", str(doc)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "stale" in done.stderr and "--write" in done.stderr


def test_a_record_without_a_required_key_or_a_page_without_markers_is_refused(tmp_path, capsys):
    doc = tmp_path / "perf.md"
    doc.write_text("no markers here\n")
    (tmp_path / "b").mkdir()
    assert report.main(["--records", str(tmp_path / "b"), "--check", str(doc)]) == 2
    assert "markers" in capsys.readouterr().err
    (tmp_path / "b" / "bench_x").mkdir()
    (tmp_path / "b" / "bench_x" / "2026-01-01-x.json").write_text(json.dumps({"benchmark": "bench_x"}))
    with pytest.raises(report.RecordError, match="lacks"):
        report.render(tmp_path / "b")


def test_the_readme_table_is_the_newest_pyg_lib_run_without_commits(tmp_path):
    def figures(plain: float) -> dict:
        return {"graph": {"nodes": 1000, "edges": 8000}, "fanout": [15, 10], "batch_size": 64,
                "edges_per_s": {"plain": plain, "weighted": 2.5e7, "plain@pyg-lib": 4.0e6, "weighted@pyg-lib": 5.0e5,
                                "plain@memory": plain, "hetero": 9.9e7, "distributed": 2.0e7},
                "ratio_to_plain": {"plain": 1.0, "weighted": 0.5, "hetero": 1.98, "distributed": 0.4},
                "ratio_to_pyg_lib": {"plain": plain / 4.0e6, "weighted": 50.0}, "ratio_to_memory": {"plain": 1.0},
                "pyg_lib": {"version": "0.8.0"}}
    root, readme = tmp_path / "benchmarks", tmp_path / "README.md"
    kw = {"bench": "bench_variants", "config": {"pyg_lib": True}}
    _record(root, "2026-01-01T10:00:00+00:00", figures(3.0e7), **kw)
    _record(root, "2026-02-01T10:00:00+00:00", figures(5.0e7), **kw)
    _record(root, "2026-03-01T10:00:00+00:00", figures(9.0e7), bench="bench_variants", config={"pyg_lib": False})
    readme.write_text(f"# Project\n\n{report.README_BEGIN}\nold\n{report.README_END}\n\n## Docs\n")
    assert report.main(["--records", str(root), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert "| `plain` | 50.0 | 4.00 | 12.5× | 1.00 | 1.00 |" in text
    assert "| `weighted` | 25.0 | 0.50 | 50.0× | 0.50 |  |" in text
    assert "| `distributed` | 20.0 |  |  | 0.40 |  |" in text and "hetero" not in text and "90.0" not in text
    assert "`tools/bench_variants.py --seed 7`" in text and "2026-02-01" in text and "load average" not in text
    assert "0123456" not in text and "old" not in text and text.endswith(f"{report.README_END}\n\n## Docs\n")
    assert report.main(["--records", str(root), "--check", str(readme)]) == 0


def test_the_readme_names_each_variants_worst_shape_from_the_newest_matrix(tmp_path):
    def matrix(ratio: float) -> dict:
        return {"graph": {"nodes": 1000, "edges": 8000}, "degrees": ["uniform", "skewed"], "fanouts": [[15, 10, 5]],
                "seed_times": {"late": [1000000, 1000000]}, "batch_size": 64,
                "shapes": [{"shape": "skewed/15,10,5/late", "variant": "temporal_uniform", "ratio_to_plain": ratio}],
                "worst": {"temporal_uniform": {"shape": "skewed/15,10,5/late", "ratio_to_plain": ratio,
                                               "ratio_to_eligible_plain": ratio,
                                               "ratio_to_eligible_plain_shape": "skewed/15,10,5/late"},
                          "weighted": {"shape": "uniform/15,10,5", "ratio_to_plain": 0.61, "ratio_to_memory_worst": 0.97,
                                       "ratio_to_memory_shape": "uniform/15,10,5"}}}
    root, readme = tmp_path / "benchmarks", tmp_path / "README.md"
    _record(root, "2026-01-01T10:00:00+00:00", {"edges_per_s": {"plain": 5.0e7, "plain@pyg-lib": 4.0e6},
                                                "ratio_to_pyg_lib": {"plain": 12.5}}, bench="bench_variants",
            config={"pyg_lib": True})
    _record(root, "2026-02-01T10:00:00+00:00", matrix(0.5), bench="bench_variants", config={"pyg_lib": False})
    _record(root, "2026-03-01T10:00:00+00:00", matrix(0.7), bench="bench_variants", config={"pyg_lib": False})
    readme.write_text(f"{report.README_BEGIN}\n{report.README_END}\n")
    assert report.main(["--records", str(root), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert "| dataset / in memory | worst shape: ours / our plain |" in text
    assert "| `plain` | 50.0 | 4.00 | 12.5× |  |  | |" in text  # plain is the baseline: no worst shape of its own
    # a variant only the matrix measured: a row of its worst shape alone
    assert "| `temporal_uniform` |  |  |  |  |  | 0.70 (skewed/15,10,5/late) |" in text and "0.50 (" not in text
    assert "| `weighted` |  |  |  |  |  | 0.61 (uniform/15,10,5) |" in text
    assert "uniform, skewed degrees" in text and "2026-03-01" in text and "seed times late 1,000,000" in text


def test_the_worst_shape_column_names_the_newest_matrix_records_shape(tmp_path):
    root, readme = tmp_path / "benchmarks", tmp_path / "README.md"
    _record(root, "2026-01-01T10:00:00+00:00", {"edges_per_s": {"temporal_uniform": 4.0e7}},
            bench="bench_variants", config={"pyg_lib": True})
    for date, ratio in (("2026-02-01", 0.5), ("2026-03-01", 0.7)):
        _record(root, f"{date}T10:00:00+00:00", {"degrees": ["skewed"], "worst": {"temporal_uniform": {
            "shape": "skewed/15,10,5/late", "ratio_to_plain": ratio}}}, bench="bench_variants",
            config={"pyg_lib": False})
    readme.write_text(f"{report.README_BEGIN}\n{report.README_END}\n")
    assert report.main(["--records", str(root), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert "| `temporal_uniform` | 40.0 |  |  |  |  | 0.70 (skewed/15,10,5/late) |" in text and "0.50" not in text


def test_make_record_has_every_key_and_leaves_out_the_record_flags():
    args = argparse.Namespace(json=True, record=None, no_record=False, seed=5, data=Path("/tmp/d"), nodes=10)
    rec = benchinfo.make_record("bench_x", args, {"machine": {"cpu": "c"}, "seed": 5, "rows": [{"a": float("nan")}]},
                                {"nodes": 10})
    assert tuple(rec) == benchinfo.RECORD_KEYS and rec["provenance"] is None
    assert rec["parameters"] == {"seed": 5, "data": "/tmp/d", "nodes": 10}
    assert rec["figures"] == {"rows": [{"a": None}]} and rec["machine"] == {"cpu": "c"}
    assert rec["commit"] is None or len(rec["commit"].split("+")[0]) == 40


def test_committed_records_are_complete_and_the_page_is_current():
    records = report.load(ROOT / "benchmarks")
    assert records, "benchmarks/ holds no record"
    for path, rec in records:
        assert tuple(rec) == benchinfo.RECORD_KEYS or set(rec) == set(benchinfo.RECORD_KEYS), path
        assert rec["provenance"] is None or rec["provenance"].startswith(
            ("transcribed from README.md at ", "ran from a working tree of ")), path
    doc = ROOT / "docs" / "performance.md"
    assert report.main(["--check", str(doc)]) == 0, "run: .venv/bin/python tools/report.py --write docs/performance.md"
    readme = ROOT / "README.md"
    assert report.main(["--check", str(readme)]) == 0, "run: .venv/bin/python tools/report.py --write README.md"


def test_proactive_reclaim_is_named_from_damons_pageout_schemes(tmp_path):
    def write(path: str, text: str) -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    write("0/state", "on\n")
    write("0/contexts/0/monitoring_attrs/intervals/aggr_us", "5000000\n")
    write("0/contexts/0/schemes/0/action", "pageout\n")
    write("0/contexts/0/schemes/0/access_pattern/age/min", "12\n")
    write("0/contexts/0/schemes/1/action", "stat\n")  # watches only
    write("0/contexts/0/schemes/1/access_pattern/age/min", "1\n")
    assert benchinfo.reclaim(str(tmp_path)) == "DAMON pages out memory idle 60 s or more"
    write("0/state", "off\n")
    assert benchinfo.reclaim(str(tmp_path)) is None
    assert benchinfo.reclaim(str(tmp_path / "absent")) is None
