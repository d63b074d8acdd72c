"""tools/plan.py: counts parsed, the ingest model fitted on records below a size and checked above it, dataset
bytes and training traffic from records written to a temporary folder, and bad input refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.conftest import load_tool

ROOT = Path(__file__).resolve().parents[2]


plan = load_tool("plan")
benchinfo = load_tool("benchinfo")
F = 16  # features of the synthetic records


def _write(root: Path, bench: str, date: str, figures: dict, parameters: dict, config: dict | None = None) -> Path:
    record = {"benchmark": bench, "config": config or {}, "command": ["tools/x.py"], "commit": None, "date": date,
              "machine": {"cpu": "Test"}, "parameters": parameters, "figures": figures, "provenance": None}
    return benchinfo.write_record(record, root)


def _ingest_row(nodes: int, seconds_scale: float = 1.0, memory_scale: float = 1.0) -> dict:
    """A Dask row as tools/bench_ingest.py writes it, of a graph whose costs are exact lines in its edges."""
    edges = 20 * nodes
    disk = (4 * F + plan.FORMAT_NODE_BYTES) * nodes + 24 * edges
    return {"graph": f"synthetic:nodes={nodes},avg_degree=20,features={F},classes=8", "engine": "dask",
            "nodes": nodes, "edges": edges, "seconds": (10 + 2e-6 * edges) * seconds_scale,
            "cpu_seconds": 5 + 3e-6 * edges, "peak_rss_gb": (1.0 + 2e-9 * edges) * memory_scale,
            "client_peak_gb": 0.3 + 1e-8 * nodes, "worker_peak_gb": (0.5 + 1e-9 * edges) * memory_scale,
            "disk_gb": disk / 1e9}


def _ingest_records(root: Path, last_scale: float = 1.0) -> None:
    params = {"workers": 2, "memory_limit": "1GB"}
    rows = [_ingest_row(n) for n in (500_000, 1_000_000, 2_000_000)]
    _write(root, "bench_ingest", "2026-01-02T00:00:00+00:00", {"rows": rows}, params)
    last = [_ingest_row(4_000_000, last_scale, last_scale)]
    _write(root, "bench_ingest", "2026-01-03T00:00:00+00:00", {"rows": last}, params)
    # another memory limit: never mixed into the fit
    _write(root, "bench_ingest", "2026-01-04T00:00:00+00:00", {"rows": [_ingest_row(4_000_000, 9.0, 9.0)]},
           {"workers": 2, "memory_limit": "4GB"})


@pytest.mark.parametrize("text, count", [("111M", 111_000_000), ("1.6B", 1_600_000_000), ("2.4e6", 2_400_000),
                                         ("1,000", 1000), ("12_000", 12_000), ("3k", 3000), ("128", 128)])
def test_counts_are_parsed_with_suffixes(text, count):
    assert plan.parse_count(text, "--nodes") == count


@pytest.mark.parametrize("text", ["abc", "0", "1.5", "-3", "1.6X", ""])
def test_a_bad_count_is_refused_naming_the_flag_and_the_fix(text):
    with pytest.raises(plan.PlanInputError, match=r"--edges .* 1\.6B"):
        plan.parse_count(text, "--edges")


def test_the_fit_below_a_size_predicts_it_and_the_check_passes(tmp_path):
    _ingest_records(tmp_path)
    rows = plan.ingest_rows(tmp_path, plan.parse_bytes("1GB", "x"))
    assert [r.edges for r in rows] == [10_000_000, 20_000_000, 40_000_000, 80_000_000]
    model = plan.fit_ingest(rows, below=80_000_000)
    assert {r.edges for r in model.rows} == {10_000_000, 20_000_000, 40_000_000}
    assert model.seconds.slope == pytest.approx(2e-6) and model.seconds.intercept == pytest.approx(10)
    assert model.edge_bytes == pytest.approx(24)  # features and the format's per-node bytes taken out
    compared, ok = plan.check(rows, None)  # default: the largest size, from the others
    assert ok and {c["edges"] for c in compared} == {80_000_000}
    assert {c["figure"] for c in compared} >= {"seconds", "peak RSS, tree (GB)", "worker peak (GB)", "worker-seconds"}
    assert all(abs(c["error_pct"]) < 0.1 for c in compared)


def test_the_check_reports_the_error_and_fails_beyond_25_percent(tmp_path, capsys):
    _ingest_records(tmp_path, last_scale=1 / 1.3)  # the measured 80M run took 1/1.3 of the line's time and memory
    code = plan.main(["--nodes", "4M", "--edges", "80M", "--features", "16", "--machines", "2", "--check",
                      "--records", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "| 80,000,000 | seconds | 170 | 130.769 | +30.0% | yes |" in out
    rows, _ = plan.check(plan.ingest_rows(tmp_path, 10**9), 80_000_000)
    gated = {r["figure"]: r["error_pct"] for r in rows if r["gated"]}
    assert gated["peak RSS, tree (GB)"] == pytest.approx(30.0) and gated["worker peak (GB)"] == pytest.approx(30.0)
    assert plan.main(["--check", "--fit-below", "20M", "--records", str(tmp_path)]) == 1  # 20M, 40M predicted too
    assert "| 20,000,000 | seconds |" in capsys.readouterr().out  # --check needs no --nodes, --edges, ...


def test_newest_row_per_size_wins_and_the_older_formatted_cells_are_read(tmp_path):
    old = {"rows": [{"graph": "1.5M nodes, degree 20, 16 features", "engine": "local", "directed edges": "30,000,000",
                     "seconds": "79.1", "peak RSS, whole tree (GB)": "4.19"},
                    {"graph": "1.5M nodes, degree 20, 16 features", "engine": "dask, 2 × 1GB",
                     "directed edges": "30,000,000", "seconds": "82.9", "peak RSS, whole tree (GB)": "1.45"}]}
    params = {"graphs": ["synthetic:nodes=1500000,avg_degree=20,features=16,classes=8"], "workers": 2,
              "memory_limit": "1GB"}
    _write(tmp_path, "bench_ingest", "2026-01-01T00:00:00+00:00", old, params)
    [row] = plan.ingest_rows(tmp_path, 10**9)
    assert (row.nodes, row.edges, row.features, row.seconds, row.peak_gb, row.cpu_seconds) == \
        (1_500_000, 30_000_000, 16, 82.9, 1.45, None)
    newer = _ingest_row(1_500_000)
    _write(tmp_path, "bench_ingest", "2026-01-05T00:00:00+00:00", {"rows": [newer]}, params)
    [row] = plan.ingest_rows(tmp_path, 10**9)
    assert row.seconds == newer["seconds"] and row.source.startswith("bench_ingest/2026-01-05")


def test_the_plan_adds_up_from_the_records(tmp_path):
    _ingest_records(tmp_path)
    _write(tmp_path, "bench_train", "2026-01-01T00:00:00+00:00",
           {"rows": [{"ranks": "2", "RSS/rank": "1.26–1.29 GB"}, {"ranks": "4", "RSS/rank": "1.01–1.14 GB"}]},
           {"fanout": "10,5"})
    _write(tmp_path, "bench_cluster", "2026-01-01T00:00:00+00:00",
           {"rows": [], "minimum": [{"hosts": "2", "counted MB": "600.0"}]}, {"fanout": "10,5", "batch_size": 256},
           {"spec": "synthetic:nodes=1000000,avg_degree=12,features=32,classes=6,seed=0"})
    argv = ["--nodes", "10M", "--edges", "200M", "--features", "16", "--machines", "4", "--records", str(tmp_path),
            "--json"]
    args = plan.parse_args(argv[:-1])
    assert args.workers == 8  # 2 per machine, as measured
    figures, text, code = plan.run(args)
    assert code == 0 and "| ingest wall time, 8 workers |" in text and "bench_ingest/2026-01-0" in text
    # ingest: 10 s + 2e-6 s/edge on 2 workers, the per-edge part over 8
    assert figures["ingest"]["seconds"] == pytest.approx(10 + 2e-6 * 200e6 * 2 / 8)
    assert figures["ingest"]["worker_peak_gb"] == pytest.approx(0.5 + 1e-9 * 200e6)
    disk = figures["dataset_bytes"]
    assert disk["total"] == pytest.approx((4 * 16 + plan.FORMAT_NODE_BYTES) * 10e6 + 24 * 200e6)
    train = figures["training"]
    seeds = 0.6 * 10e6
    assert train["rank_private_gb"] == pytest.approx(1.29 + plan.SEED_BYTES * seeds / 4 / 1e9)  # 10M nodes: hash maps
    assert train["rank_mapped_gb"] == pytest.approx(disk["total"] / 4 / 1e9)
    # 600 MB over 600,000 seeds x (1 - 1/2) = 2,000 B per seed; rows of 4 x 32 + 3 x (1 + 5) = 146 B
    rows_per_seed = 2000 / 146
    assert train["rpc_bytes"] == pytest.approx(seeds * 0.75 * rows_per_seed * (4 * 16 + 3 * 6))
    steps = -(-int(seeds / 4) // 256)
    assert train["allreduce_bytes_per_machine"] == pytest.approx(steps * 4 * plan.sage_parameters(16, 128, 6, 2))
    assert plan.main(argv) == 0  # --json prints


def test_sage_parameters_and_id_bytes():
    assert plan.sage_parameters(32, 128, 6, 2) == 2 * 32 * 128 + 128 + 2 * 128 * 6 + 6
    assert [plan.id_bytes(n) for n in (50_000, 1_000_000, 111_000_000)] == [2, 3, 4]
    assert plan.nodes_per_seed([10, 5]) == 61


@pytest.mark.parametrize("argv, words", [
    (["--nodes", "abc", "--edges", "1B", "--features", "8", "--machines", "4"], "--nodes 'abc'"),
    (["--nodes", "1M", "--edges", "1B", "--features", "8"], "--machines"),
    (["--nodes", "1M", "--edges", "1B", "--features", "8", "--machines", "4", "--fanout", "10,x"], "--fanout"),
    (["--nodes", "1M", "--edges", "1B", "--features", "8", "--machines", "4", "--train-fraction", "2"],
     "--train-fraction"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, tmp_path, capsys):
    assert plan.main([*argv, "--records", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("plan.py: ") and words in err


def test_no_record_to_check_is_one_line(tmp_path, capsys):
    assert plan.main(["--nodes", "1M", "--edges", "1B", "--features", "8", "--machines", "4", "--check",
                      "--records", str(tmp_path)]) == 2
    assert "tools/bench_ingest.py" in capsys.readouterr().err


def test_a_memory_never_shrinks_with_size_a_cost_line_may_start_anywhere():
    shrinking = plan.fit_line([30e6, 60e6], [0.512, 0.468], memory=True)
    assert (shrinking.slope, shrinking(240e6)) == (0.0, 0.512)  # flat at the largest measured peak
    assert plan.fit_line([1.0, 2.0], [5.0, 3.0])(3.0) == pytest.approx(1.0)  # not a memory: the line as fitted
    assert plan.fit_line([10.0], [4.0])(20.0) == 8.0 and plan.fit_line([10.0], [4.0], memory=True)(20.0) == 4.0


def test_a_rank_s_memory_is_fitted_to_the_newest_bench_rank_memory_record(tmp_path):
    _ingest_records(tmp_path)
    _write(tmp_path, "bench_train", "2026-01-01T00:00:00+00:00",
           {"rows": [{"ranks": "2", "RSS/rank": "1.26–1.29 GB"}]}, {"fanout": "10,5"})

    def rows(small: float, large: float) -> dict:
        return {"rows": [{"nodes": 1_000_000, "private_peak_mb": [small - 5, small]},
                         {"nodes": 9_000_000, "private_peak_mb": [large, large - 3]},
                         {"nodes": 20_000_000, "failed": "exit 1"}]}

    _write(tmp_path, "bench_rank_memory", "2026-01-01T00:00:00+00:00", rows(900.0, 1700.0),
           {"fanout": "10,5", "ranks": 2})
    _write(tmp_path, "bench_rank_memory", "2026-01-02T00:00:00+00:00", rows(500.0, 580.0),
           {"fanout": "10,5", "ranks": 2})
    _write(tmp_path, "bench_rank_memory", "2026-01-03T00:00:00+00:00", rows(100.0, 200.0),
           {"fanout": "15,10", "ranks": 2})
    args = plan.parse_args(["--nodes", "100M", "--edges", "1B", "--features", "16", "--machines", "10", "--records",
                            str(tmp_path)])
    figures, text, _ = plan.run(args)
    train = figures["training"]
    # the newest record at this fanout: 0.5 GB at 0.5M nodes a rank, 0.58 GB at 4.5M: 20 B a node
    assert train["rank_fit"]["source"].startswith("bench_rank_memory/2026-01-02")
    assert train["rank_fit"]["per_node_b"] == pytest.approx(20.0)
    assert train["rank_private_gb"] == pytest.approx(0.49 + 20.0 * 10e6 / 1e9)
    assert "20.0 B per node of the rank" in text
    # the seed lists (12 B a training node) follow the plan's train fraction; the rest of the slope stays
    args = plan.parse_args(["--nodes", "100M", "--edges", "1B", "--features", "16", "--machines", "10", "--records",
                            str(tmp_path), "--train-fraction", "0.1"])
    train = plan.run(args)[0]["training"]
    assert train["rank_private_gb"] == pytest.approx(0.49 + (20.0 - 12 * 0.6 + 12 * 0.1) * 10e6 / 1e9)
