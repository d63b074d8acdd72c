"""``graphstore warmup``: a subcommand found through entry points, a no-op while its stamp holds, and
(on a cache it compiled) a run that compiles nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from graphstore import jitcache
from graphstore.cli import app as cli
from sampling.warmup import runner
from sampling.warmup.runner import Group, Workspace, run_groups

REPO = Path(__file__).resolve().parents[2]


def test_warmup_is_a_subcommand_from_the_layers_above(capsys):
    assert cli.main(["warmup", "--help"]) == 0
    assert "--force" in capsys.readouterr().out
    assert cli.main(["--help"]) == 0
    assert "warmup" in capsys.readouterr().out
    assert {"ingest", "memory", "distributed", "train"} <= {g.name for g in runner.groups()}, "training's group too"


def test_builtin_commands_load_no_plugin():
    parser = cli._parser()
    assert cli._plugin_commands(parser, ["-v", "ingest", "synthetic:nodes=10", "/x"], {"ingest", "info"}) == {}


def test_every_option_changes_the_run_and_a_stamp_makes_it_a_no_op(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    index = tmp_path / "sampling" / "variants.f-1.py311.nbi"  # what a warm-up leaves there
    index.parent.mkdir()
    index.write_bytes(b"x")
    ran: list[str] = []
    fake = [Group(name, f"group {name}", lambda ws, name=name: ran.append(name)) for name in ("a", "b")]
    monkeypatch.setattr(runner, "groups", lambda: fake)
    assert cli.main(["warmup", "--list"]) == 0 and ran == []
    assert "group a" in capsys.readouterr().out
    assert cli.main(["warmup", "--only", "b", "--json"]) == 0 and ran == ["b"]
    assert [g["name"] for g in json.loads(capsys.readouterr().out)["groups"]] == ["b"]
    assert jitcache.warm_stamp() is None, "a partial warm-up stamps nothing"
    assert cli.main(["warmup", "--jobs", "1"]) == 0 and ran == ["b", "a", "b"]
    assert "0 kernel specialisation(s) compiled" in capsys.readouterr().out
    assert cli.main(["warmup"]) == 0 and ran == ["b", "a", "b"], "the stamp holds: nothing runs"
    assert "nothing to compile" in capsys.readouterr().out
    assert cli.main(["warmup", "--force", "--jobs", "1"]) == 0 and ran == ["b", "a", "b", "a", "b"]
    index.unlink()
    assert jitcache.warm_stamp() is None, "a cache folder emptied by hand is cold again"


@pytest.mark.slow
def test_a_warmup_worker_that_ends_before_it_reports_fails_its_group_and_none_is_left_unsaid():
    """Groups go to worker processes, heaviest first; a worker that ends early (here: on a group it does not
    know) fails that group with its exit code, and a group no worker is left for says so."""
    ghosts = [Group(name, "", lambda ws: None, cost=cost) for name, cost in (("ghost-1", 100), ("ghost-2", 50))]
    results = runner._run_apart([Group("ingest", "", lambda ws: None, cost=1), *ghosts], 2)
    assert [r["name"] for r in results] == ["ingest", "ghost-1", "ghost-2"], "in the order given"
    assert results[0]["error"] == "not run: every warm-up process ended", results[0]
    for ghost in results[1:]:
        assert ghost["error"] == "its warm-up process ended with code 1 before it reported", ghost


def test_jobs_below_one_are_refused_in_one_line(capsys):
    assert cli.main(["warmup", "--force", "--jobs", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--jobs 0" in err[0] and "--jobs 1 or more" in err[0], err


def test_the_default_runs_a_worker_per_core_and_one_more_within_the_groups_and_the_memory(monkeypatch):
    """The extra worker compiles while another one waits for a specialisation that a third one is compiling."""
    monkeypatch.setattr(runner, "cores", lambda: 2)
    monkeypatch.setattr(runner, "available_memory", lambda: 64 * runner.PROCESS_BYTES)
    assert (runner.default_jobs(7), runner.default_jobs(2), runner.default_jobs(1)) == (3, 2, 1)
    monkeypatch.setattr(runner, "cores", lambda: 1)
    assert runner.default_jobs(7) == 2
    monkeypatch.setattr(runner, "cores", lambda: 2)
    monkeypatch.setattr(runner, "available_memory", lambda: 2 * runner.PROCESS_BYTES + 1)
    assert runner.default_jobs(7) == 2  # what the memory holds, under the cores' 3
    monkeypatch.setattr(runner, "available_memory", lambda: 0)
    assert runner.default_jobs(7) == 1


def test_a_failing_group_is_named_and_the_others_still_run(tmp_path):
    ran = []

    def broken(ws: Workspace) -> None:
        raise ValueError("no such graph")

    results = run_groups([Group("a", "", broken), Group("b", "", lambda ws: ran.append(ws.path))], Workspace(tmp_path))
    assert [(r.name, r.error) for r in results] == [("a", "ValueError: no such graph"), ("b", None)]
    assert ran == [tmp_path]


@pytest.mark.slow
def test_a_forced_warmup_on_its_own_cache_compiles_nothing():
    """Every path the warm-up runs loads its kernels from the cache the warm-up wrote (so its runs are
    deterministic and complete); only where that cache is warm (CI after tools/bootstrap.sh)."""
    if jitcache.warm_stamp() is None:
        pytest.skip("the kernel cache is not warm here: run `graphstore warmup` (tools/bootstrap.sh does)")
    out = subprocess.run([sys.executable, "-m", "graphstore.cli.app", "warmup", "--force", "--json", "--jobs", "2"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["failed"] == [] and summary["compiled"] == 0, [g for g in summary["groups"] if g["compiled"]]
    # the default on more than one core: worker processes, each group once, reported in the groups' order
    # whichever worker ran it, with each worker's progress lines on stderr
    assert summary["jobs"] == 2 and [g["name"] for g in summary["groups"]] == [g.name for g in runner.groups()]
    started = sorted(line.split()[1] for line in out.stderr.splitlines() if line.endswith(" ..."))
    assert started == sorted(g.name for g in runner.groups()), out.stderr[-3000:]
