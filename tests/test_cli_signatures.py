"""No CLI option is accepted and silently ignored: every option of ``graphstore`` (all subcommands) and
``graphstore-train`` is found in the parsers (new ones included) and must be used.

Each option in turn is given a non-default value; the command runs with the heavy work stubbed
(ingest, the launcher) and the parsed namespace recording reads. The option must be read, and the
captured calls into the library, the output or the exit code must differ from a run without it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import re
from types import SimpleNamespace
from typing import Any, Callable

import pytest

import graphstore
from tests.conftest import small_graph


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    source, _ = small_graph(n=80, e=500)
    dest = tmp_path_factory.mktemp("cli") / "ds"
    graphstore.ingest(source, dest, num_parts=2)
    metrics = tmp_path_factory.mktemp("run") / "metrics.json"  # graphstore plot's input: --metrics-out's shape
    metrics.write_text(json.dumps({"epochs": [{"epoch": e, "loss": 1.0 / e, "val_acc": 0.5 + e / 10,
                                               "train_seconds": 1.0, "timing": {"data_wait": 0.2}}
                                              for e in (1, 2)]}))
    return SimpleNamespace(dest=dest, tmp=tmp_path_factory.mktemp("clitmp"), metrics=metrics)


class Recording(argparse.Namespace):
    """A namespace that records which attributes the command reads (after parsing)."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            object.__getattribute__(self, "__dict__").setdefault("_reads", set()).add(name)
        return object.__getattribute__(self, name)


def _recording(factory: Callable, namespaces: list) -> Callable:
    def make() -> argparse.ArgumentParser:
        parser = factory()
        parse = parser.parse_args

        def parse_args(args: Any = None, namespace: Any = None) -> Any:
            ns = parse(args, Recording())
            ns.__dict__["_reads"] = set()
            namespaces.append(ns)
            return ns

        parser.parse_args = parse_args  # type: ignore[method-assign]
        return parser
    return make


def _options(parser: argparse.ArgumentParser) -> list[tuple[str | None, argparse.Action]]:
    """(subcommand or None, action) for every option and positional, subcommands included."""
    out: list[tuple[str | None, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                out += [(command, a) for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        elif not isinstance(action, argparse._HelpAction):
            out.append((None, action))
    return out


# values where a generic one would not parse or would touch the working directory
CLI_VALUES = {"--fanout": ["5,5"], "--prefetch": ["all"], "--cache-max-bytes": ["1GB"], "--edge-type": ["a,b,c"],
              "--storage-option": ["anon=true"], "--halo-features": ["x"]}


def _value(action: argparse.Action, tmp: Any) -> list[str]:
    flag = max(action.option_strings, key=len)
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return [flag]
    if flag in CLI_VALUES:
        return [flag, *CLI_VALUES[flag]]
    if action.choices:
        return [flag, next(str(c) for c in action.choices if c != action.default)]
    if action.type is int:
        return [flag, str(2 if action.default is None else action.default + 1)]
    if action.type is float:
        return [flag, str(2.5 if action.default is None else action.default * 2 + 1)]
    return [flag, str(tmp / f"value-{action.dest}")]


class _Cli:
    """One command line run with its heavy work stubbed; ``record`` holds what reached the library."""

    def __init__(self, monkeypatch: Any, module: str, world: Any) -> None:
        self.module = importlib.import_module(module)
        self.world, self.record, self.namespaces = world, [], []
        monkeypatch.setattr(self.module, "_parser", _recording(self.module._parser, self.namespaces))
        monkeypatch.setattr(logging, "basicConfig", lambda **kw: self.record.append(("log", kw.get("level"))))
        ingest_module = importlib.import_module("graphstore.ingest")
        monkeypatch.setattr(ingest_module, "ingest", self._ingest)
        opener = graphstore.open_dataset
        monkeypatch.setattr(graphstore, "open_dataset",
                            lambda *a, **k: self.record.append(("open", repr(a), repr(k))) or opener(*a, **k))
        prefetch = graphstore.Dataset.prefetch
        monkeypatch.setattr(graphstore.Dataset, "prefetch",
                            lambda ds, *a, **k: self.record.append(("prefetch", a[:1])) or prefetch(ds, *a, **k))
        if module == "training.launch":
            monkeypatch.setattr(self.module, "launch_local",
                                lambda config, nproc, grace: self.record.append(("launch", repr(config), nproc)) or 0)
            for var in ("RANK", "WORLD_SIZE", "GRAPHSTORE_INIT_METHOD", "SLURM_PROCID"):
                monkeypatch.delenv(var, raising=False)

    def _ingest(self, *args: Any, **kwargs: Any) -> Any:
        shown = re.sub(r" at 0x[0-9a-f]+", "", repr(sorted(kwargs.items(), key=lambda kv: kv[0])))
        self.record.append(("ingest", repr(args), shown))
        return SimpleNamespace(dest=args[1], num_parts=1, method="m", seconds=0.0, bytes_written=0,
                               nodes_per_part=[1], edges_per_part=[0], edge_cut_fraction=0.0, edge_cut=0,
                               node_balance=1.0, edge_balance=1.0, link_splits={}, train_node_balance=None,
                               rebalanced_nodes=0, to_json=lambda: {"kwargs": repr(kwargs)})

    def run(self, argv: list[str]) -> tuple:
        self.record.clear()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = self.module.main(argv)
            except SystemExit as exc:
                code = exc.code
        return (code, list(self.record), out.getvalue(), err.getvalue())


def _base_argv(module: str, command: str | None, world: Any) -> list[str]:
    if module == "training.launch":
        return [str(world.dest)]
    return {"ingest": ["ingest", "synthetic:nodes=50,avg_degree=3", str(world.tmp / "out")],
            "info": ["info", str(world.dest)], "verify": ["verify", str(world.dest)],
            "plot": ["plot", str(world.metrics)]}[command]


def _cli_cases() -> list[tuple[str, str | None, str]]:
    cases = []
    for module in ("graphstore.cli.app", "training.launch"):
        for command, action in _options(importlib.import_module(module)._parser()):
            cases.append((module, command, action.dest))
    return cases


def _variant(module: str, command: str | None, action: argparse.Action, world: Any) -> list[str]:
    base = _base_argv(module, command, world)
    if action.option_strings:
        if module == "training.launch":
            return base + _value(action, world.tmp)
        return _value(action, world.tmp) + base if action in _subparser(module, None)._actions else \
            [base[0], *_value(action, world.tmp), *base[1:]]
    position = [a.dest for a in _subparser(module, command)._actions if not a.option_strings
                and not isinstance(a, argparse._HelpAction)].index(action.dest)
    changed = list(base)
    offset = 0 if module == "training.launch" else 1
    other = {"source": "synthetic:nodes=60,avg_degree=2", "dest": str(world.tmp / "elsewhere"),
             "dataset": str(world.tmp / "elsewhere"), "metrics": str(world.tmp / "elsewhere.json"), "command": None}
    changed[offset + position] = other[action.dest] or changed[offset + position]
    return changed


def _subparser(module: str, command: str | None) -> argparse.ArgumentParser:
    parser = importlib.import_module(module)._parser()
    if command is None:
        return parser
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


@pytest.mark.parametrize("module,command,dest", _cli_cases())
def test_cli_option_is_read_and_changes_the_run(world, monkeypatch, module, command, dest):
    if dest == "command":
        return  # the subcommand itself: every run dispatches on it
    cli = _Cli(monkeypatch, module, world)
    commands = [command] if command or module == "training.launch" else ["info"]
    action = next(a for _, a in _options(cli.module._parser()) if a.dest == dest)
    for cmd in commands:
        base = cli.run(_base_argv(module, cmd, world))
        assert base[0] in (0, None), f"the base run failed: {base}"
        assert cli.run(_base_argv(module, cmd, world)) == base, "the base run is not deterministic"
        argv = _variant(module, cmd, action, world)
        variant = cli.run(argv)
        read = cli.namespaces[-1].__dict__.get("_reads", set())
        assert dest in read, f"{' '.join(argv)}: the command never read {dest!r} ({str(variant)[:300]})"
        assert variant != base, f"{' '.join(argv)}: nothing the command did changed ({str(variant)[:300]})"
