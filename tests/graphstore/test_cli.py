"""The graphstore command: ingest/info/verify, JSON output, exit codes, killed ingests, damaged chunks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import graphstore
from graphstore.cli.app import main
from graphstore.errors import DatasetNotFoundError

SPEC = "synthetic:nodes=2000,avg_degree=5,features=8,classes=3,seed=1"


def test_ingest_info_verify_json(tmp_path, capsys):
    dest = str(tmp_path / "ds")
    assert main(["ingest", SPEC, dest, "--parts", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_parts"] == 2 and sum(summary["nodes_per_part"]) == 2000
    assert 0 <= summary["edge_cut_fraction"] < 0.5 and summary["bytes_written"] > 0
    assert main(["info", dest, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format_version"] == 1 and info["node_types"][0]["num_nodes"] == 2000
    assert info["provenance"]["source"].startswith("synthetic:nodes=2000,")  # every parameter, for reproducibility
    assert main(["info", dest]) == 0
    assert "2 partition(s)" in capsys.readouterr().out
    assert main(["verify", dest, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_errors_exit_2_with_the_message(tmp_path, capsys):
    assert main(["ingest", "bogus:x", str(tmp_path / "d")]) == 2
    assert "unknown SOURCE 'bogus:x'" in capsys.readouterr().err
    assert main(["ingest", SPEC, str(tmp_path / "d"), "--parts", "0"]) == 2
    assert "argument --parts: 0 is out of range" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "none")]) == 2
    assert "no graphstore dataset" in capsys.readouterr().err


def test_verify_names_the_corrupted_array_and_chunk(tmp_path, capsys):
    dest = tmp_path / "ds"
    assert main(["ingest", SPEC, str(dest), "--parts", "2", "--chunk-mb", "0.01", "--json"]) == 0
    chunk = dest / "part_00001" / "edges" / "_N" / "indices" / "c" / "1"
    raw = bytearray(chunk.read_bytes())
    raw[17] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["verify", str(dest)]) == 1
    err = capsys.readouterr().err
    assert "part_00001/edges/_N/indices: chunk 1" in err and "corrupted" in err
    os.remove(chunk)
    assert main(["verify", str(dest), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and any("chunk 1" in p and "missing" in p for p in report["problems"])


@pytest.mark.slow
def test_killed_ingest_leaves_nothing_that_opens(tmp_path):
    dest = tmp_path / "big"
    spec = "synthetic:nodes=400000,avg_degree=10,features=64,classes=5"
    proc = subprocess.Popen([sys.executable, "-m", "graphstore.cli.app", "ingest", spec, str(dest), "--parts", "2",
                             "--method", "random", "--chunk-mb", "1"], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    staged = []
    while time.monotonic() < deadline and proc.poll() is None:  # wait until arrays are being written
        staged = [p for p in tmp_path.iterdir() if ".partial-" in p.name]
        if staged and (staged[0] / "part_00001").exists():
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"ingest finished before it could be killed: {proc.stderr.read().decode()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with pytest.raises(DatasetNotFoundError):
        graphstore.open_dataset(dest)
    with pytest.raises(DatasetNotFoundError, match="no manifest"):
        graphstore.open_dataset(staged[0])  # the half-written staging directory is not valid either
    # the next ingest to the same place clears the dead run's leftovers and succeeds
    assert main(["ingest", "synthetic:nodes=500,avg_degree=4", str(dest), "--json"]) == 0
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    assert graphstore.open_dataset(dest).num_nodes() == 500
