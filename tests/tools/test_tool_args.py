"""The tools' command lines: a missing dataset, a non-integer or out-of-range flag is one line, exit 2.

A row of ``TOOL_CASES`` is (tool, arguments, a word of the line); ``{t}`` is the row's own empty directory.
"""

from __future__ import annotations

import sys

import pytest

from tests.tools.conftest import ROOT, load_tool

TOOL_CASES = [
    ("bench_verify", ["--data", "{t}/missing"], "{t}/missing: no such dataset"),
    ("bench_verify", ["--data", "{t}"], "is not a graphstore dataset (no zarr.json)"),
    ("bench_verify", ["--nodes", "many"], "argument --nodes: 'many' is not an integer >= 1"),
    ("bench_rank_memory", ["{t}/missing"], "no such dataset"),
    ("bench_rank_memory", ["{t}", "--ranks", "0"], "is not a graphstore dataset"),
    ("bench_unmapped", ["{t}/missing"], "no such dataset"),
    ("bench_unmapped", ["--every", "1,x"], "--every: '1,x' is not a list of counts"),
    ("bench_sampler", ["--batches", "0"], "argument --batches: 0 is out of range"),
    ("bench_store", ["--repeats", "2.5"], "argument --repeats: '2.5' is not an integer"),
    ("bench_remote", ["--latency-ms", "nan"], "argument --latency-ms: nan is out of range"),
    ("bench_loader", ["--threads", "0,1"], "--threads: '0,1': give loader thread counts"),
    ("bench_data_wait", ["--way", "p2"], "'p2': give NAME=FLAGS"),
    ("bench_data_wait", ["--epochs", "1"], "argument --epochs: 1 is out of range"),
    ("bench_train", ["--fanout", "5,x"], "--fanout: '5,x' is not a fanout"),
    ("bench_ingest", ["--memory-limit", "lots"], "--memory-limit: 'lots' is not a size"),
    ("bench_partition", ["--parts", "two"], "argument --parts: 'two' is not an integer"),
    ("bench_trim", ["--steps", "-1"], "argument --steps: -1 is out of range"),
    ("bench_trim", ["--shapes", "64"], "--shapes: '64' is not FEATURES:FANOUT"),
    ("bench_variants", ["--batches", "x"], "argument --batches: 'x' is not an integer"),
    ("demo", ["--nproc", "0"], "argument --nproc: 0 is out of range"),
    ("kernel_cache", ["{t}/missing"], "{t}/missing: no such checkout"),
    ("compile_profile", ["--top", "x"], "argument --top: 'x' is not an integer"),
    ("compare_records", ["{t}/a.json", "--against", "{t}/b.json"], "give bench_variants records"),
    ("make_link_graphs", ["regular", "{t}/g.npz", "--degree", "-1"], "argument --degree: -1 is out of range"),
]


@pytest.mark.parametrize("tool,args,word", TOOL_CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in TOOL_CASES])
def test_a_bad_flag_or_dataset_of_a_tool_is_one_line(tmp_path, capsys, monkeypatch, tool, args, word):
    module = load_tool(tool)
    sys.path.insert(0, str(ROOT / "tools"))
    import toolargs

    argv = [a.format(t=tmp_path) for a in args]
    monkeypatch.setattr(sys, "argv", [f"tools/{tool}.py", *argv])
    monkeypatch.setenv("GRAPHSTORE_BENCH_REEXEC", "1")  # bench_loader: never re-execute the test process
    main = getattr(module, "main", None) or module.run
    with pytest.raises(SystemExit) as exit_:
        sys.exit(toolargs.run(main))
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"tools/{tool}.py: error: ") and word.format(t=tmp_path) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was written"


def test_a_graphstore_error_inside_a_tool_is_one_line(capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    import toolargs
    from graphstore.errors import DatasetNotFoundError

    def main() -> int:
        raise DatasetNotFoundError("no graphstore dataset at /data/x; ingest one first")

    assert toolargs.run(main) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(": error: no graphstore dataset at /data/x; ingest one first") and "\n" not in err, err
