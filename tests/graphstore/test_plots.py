"""Pictures: ``graphstore plot METRICS`` (a run's curves and time per epoch), ``graphstore info --plot`` (the
partitions); the images are real PNGs, and a missing matplotlib, a bad metrics file or output is one line."""

from __future__ import annotations

import json
import struct
import sys

import pytest

import graphstore
from graphstore.cli.app import main
from tests.conftest import small_graph, small_hetero

PNG = b"\x89PNG\r\n\x1a\n"


def _record(epoch: int) -> dict:
    """One epoch as graphstore-train --metrics-out writes it (the fields the plot reads, and some it skips)."""
    return {"epoch": epoch, "loss": 1.0 / epoch, "train_acc": 0.5 + epoch / 10, "val_acc": 0.55 + epoch / 20,
            "test_acc": 0.5 + epoch / 20, "train_seconds": 2.0, "eval_seconds": 0.4, "epoch_seconds": 2.4,
            "timing": {"data_wait": 0.3, "forward_backward": 1.2, "optimizer": 0.1, "step_sync": 0.05,
                       "epoch_end": 0.05, "sampling": 0.9, "feature_fetch": 0.4, "grad_sync": 0.2},
            "wire": {"bytes": {"rows": 1000}}, "steps": 10, "evaluation": "full"}


@pytest.fixture
def metrics(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"config": {"dataset": "ds", "model": "sage", "task": "node"}, "world_size": 2,
                                "timing_parts": {"foreground": ["data_wait", "forward_backward", "optimizer",
                                                                "step_sync", "epoch_end"]},
                                "epochs": [_record(1), _record(2), _record(3)]}))
    return path


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("plots")
    source, _ = small_graph(n=200, e=1000)
    graphstore.ingest(source, root / "homo", num_parts=3)
    hetero, _ = small_hetero()
    graphstore.ingest(hetero, root / "hetero", num_parts=2)
    return {"homo": str(root / "homo"), "hetero": str(root / "hetero")}


def _assert_png(path, width: int = 1500, height: int = 450) -> None:
    """A PNG of the figure's pixel size (15 x 4.5 in at 100 dpi) and of a plausible byte count."""
    data = path.read_bytes()
    assert data[:8] == PNG, data[:8]
    assert struct.unpack(">II", data[16:24]) == (width, height)  # IHDR: width, height
    assert 10_000 < len(data) < 1_000_000, len(data)


def test_plot_draws_the_runs_curves_and_time(metrics, tmp_path, capsys):
    out = tmp_path / "curves.png"
    assert main(["plot", str(metrics), "-o", str(out)]) == 0
    assert "of 3 epoch(s)" in capsys.readouterr().out
    _assert_png(out)
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name]


def test_plot_writes_next_to_the_metrics_by_default_and_other_formats(metrics, tmp_path, capsys):
    assert main(["plot", str(metrics)]) == 0
    _assert_png(tmp_path / "metrics.png")
    assert main(["plot", str(metrics), "-o", str(tmp_path / "curves.svg")]) == 0
    assert (tmp_path / "curves.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("kind", ["link", "loader-only"])
def test_plot_draws_what_other_runs_record(tmp_path, capsys, kind):
    """A link run reports AUC (no train accuracy, no evaluation on some epochs); --loader-only has no loss."""
    epochs = [_record(e) for e in (1, 2)]
    for e in epochs:
        del e["train_acc"], e["val_acc"], e["test_acc"]
        if kind == "loader-only":
            del e["loss"]
            e["loader_batches_per_s"] = [10.0 * e["epoch"], 9.0]
        elif e["epoch"] == 2:
            e["val_auc"], e["test_auc"] = 0.9, 0.88
    (tmp_path / "m.json").write_text(json.dumps({"epochs": epochs}))
    assert main(["plot", str(tmp_path / "m.json"), "-o", str(tmp_path / "m.png")]) == 0, capsys.readouterr().err
    _assert_png(tmp_path / "m.png")


@pytest.mark.parametrize("name", ["homo", "hetero"])
def test_info_plot_draws_the_partitions(datasets, tmp_path, capsys, name):
    out = tmp_path / "parts.png"
    assert main(["info", datasets[name], "--plot", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    _assert_png(out)


def test_info_plot_keeps_json_output_clean(datasets, tmp_path, capsys):
    assert main(["info", datasets["homo"], "--json", "--plot", str(tmp_path / "p.png")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_parts"] == 3 and "wrote" in captured.err
    _assert_png(tmp_path / "p.png")


@pytest.mark.parametrize("command", ["plot", "info"])
def test_without_matplotlib_one_line_names_the_extra(metrics, datasets, tmp_path, capsys, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    out = tmp_path / "x.png"
    argv = ["plot", str(metrics), "-o", str(out)] if command == "plot" else ["info", datasets["homo"], "--plot",
                                                                             str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'graphstore[plot]'" in err, err
    assert err.startswith(f"graphstore {command}: error:") and captured.out == ""  # refused before any work
    assert not out.exists()


BAD_METRICS = [
    (None, "no such file"),
    ("{not json", "cannot be read as JSON"),
    ('{"epochs": []}', "not a graphstore-train metrics file"),
    ('[{"epoch": 1}]', "not a graphstore-train metrics file"),
    ('{"epochs": [{"loss": 1.0}]}', "not a graphstore-train metrics file"),
]


@pytest.mark.parametrize("text,word", BAD_METRICS, ids=[w + (f" {t}" if t else "") for t, w in BAD_METRICS])
def test_bad_metrics_file_is_one_line(tmp_path, capsys, text, word):
    path = tmp_path / "m.json"
    if text is not None:
        path.write_text(text)
    assert main(["plot", str(path), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and word in err and str(path) in err, err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("target,word", [("x.xyz", "cannot write .xyz"), ("missing/x.png", "does not exist"),
                                         (".", "is a directory")])
def test_bad_output_is_one_line(metrics, tmp_path, capsys, target, word):
    assert main(["plot", str(metrics), "-o", str(tmp_path / target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and word in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
