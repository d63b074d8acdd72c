"""tools/bench_unmapped.py: arguments that would measure nothing are refused with the fix."""

from __future__ import annotations

import pytest

from tests.tools.conftest import load_tool

bench = load_tool("bench_unmapped")


@pytest.mark.parametrize("argv, words", [
    (["--every", "64", "--batches", "8"], "--every 64 is more than --batches 8: a pass would never unmap"),
    (["--every", "0"], "--every: '0' is not a list of counts; give positive integers"),
    (["--every", "1,x"], "--every: '1,x' is not a list of counts"),
    (["--batches", "0"], "--batches: 0 is out of range"),
    (["missing-dataset"], "missing-dataset: no such dataset"),
])
def test_arguments_that_would_measure_nothing_are_refused(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main([*argv, "--no-record"])
    assert exc.value.code == 2 and words in capsys.readouterr().err
