"""No public parameter is accepted and silently ignored: every parameter of the public entry points and
every option of both CLIs is found by introspection (new ones included) and must be used or refused.

Python entry points: each parameter in turn gets a tripwire, a value that records any use (a method,
an attribute, truthiness, comparison, hashing, formatting...) while a small scenario runs (build, then
one batch or a read). The parameter passes when the tripwire was used, or when a refusal of the table
below raises its error. Loader options that decide what a batch holds also get a differential check:
a non-default value must change the first batch. As a floor, each name must be read in its function.

CLI options: each option in turn is given a non-default value; the command runs with the heavy work
stubbed (ingest, the launcher) and the parsed namespace recording reads. The option must be read,
and the captured calls, output or exit code must differ from a run without it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import io
import logging
import re
import textwrap
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

import graphstore
from graphstore.errors import GraphstoreError, InvalidInputError
from sampling import LinkNeighborLoader, NeighborLoader, NeighborSampler
from sampling.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader
from sampling.distributed import PartitionServer
from sampling.transport import LoopbackTransport
from tests.conftest import small_graph


# -- the tripwire --

class Touched(Exception):
    """Raised when the tripwire is used."""


def _touch(self: Tripwire, how: str) -> Any:
    object.__getattribute__(self, "uses").append(how)
    raise Touched(how)


class Tripwire:
    """A value that records every use and stops the code that uses it."""

    def __init__(self) -> None:
        object.__setattr__(self, "uses", [])

    def __getattribute__(self, name: str) -> Any:
        if name == "uses":
            return object.__getattribute__(self, name)
        return _touch(self, f"attribute {name}")

    def __setattr__(self, name: str, value: Any) -> None:
        _touch(self, f"set {name}")

    def __repr__(self) -> str:
        object.__getattribute__(self, "uses").append("repr")
        return "<tripwire>"


def _dunder(name: str) -> Callable:
    return lambda self, *args: _touch(self, name)


for _name in ("bool", "int", "index", "float", "len", "iter", "hash", "eq", "ne", "lt", "le", "gt", "ge", "call",
              "getitem", "contains", "str", "format", "fspath", "add", "radd", "sub", "rsub", "mul", "rmul",
              "truediv", "floordiv", "mod", "rmod", "neg", "and", "or", "reduce_ex", "deepcopy", "copy"):
    setattr(Tripwire, f"__{_name}__", _dunder(_name))


# -- scenarios: build with valid arguments (plus overrides), run a little, return what a user sees --

def _graph() -> Data:
    rng = np.random.default_rng(0)
    n, e = 60, 400
    ei = rng.integers(0, n, (2, e))
    ei = torch.from_numpy(ei[:, np.argsort(ei[1], kind="stable")])  # by destination, not by source within one
    return Data(edge_index=ei, x=torch.from_numpy(rng.standard_normal((n, 3))),
                time=torch.from_numpy(rng.integers(0, 9, n)), weight=torch.from_numpy(rng.random(e) + 0.1),
                num_nodes=n)


def _batch_view(batch: Any) -> tuple:
    return tuple((k, v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in sorted(batch.to_dict().items()))


def _first(loader: Any) -> tuple:
    return _batch_view(next(iter(loader)))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    source, _ = small_graph(n=80, e=500)
    dest = tmp_path_factory.mktemp("sig") / "ds"
    graphstore.ingest(source, dest, num_parts=2)
    ds = graphstore.open_dataset(dest)
    transports = LoopbackTransport.group(2)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    return SimpleNamespace(dest=dest, ds=ds, transport=transports[0], tmp=tmp_path_factory.mktemp("sigtmp"))


def _node_loader(w: Any, **kw: Any) -> tuple:
    args = dict(data=_graph(), num_neighbors=[4, 2], batch_size=8, seed=0) | kw
    return _first(NeighborLoader(**args))


def _link_loader(w: Any, **kw: Any) -> tuple:
    args = dict(data=_graph(), num_neighbors=[3], batch_size=8, seed=0) | kw
    return _first(LinkNeighborLoader(**args))


def _sampler(w: Any, **kw: Any) -> tuple:
    from torch_geometric.sampler import NodeSamplerInput

    args = dict(data=_graph(), num_neighbors=[4, 2], seed=0) | kw
    out = NeighborSampler(**args).sample_from_nodes(NodeSamplerInput(None, torch.arange(6)))
    return (out.node.tolist(), out.row.tolist(), out.col.tolist())


def _dist_node_loader(w: Any, **kw: Any) -> tuple:
    args = dict(dataset=w.ds, num_neighbors=[3, 2], transport=w.transport, input_nodes=torch.arange(12),
                batch_size=6, seed=0, prefetch=0) | kw
    return _first(DistributedNeighborLoader(**args))


def _dist_link_loader(w: Any, **kw: Any) -> tuple:
    args = dict(dataset=w.ds, num_neighbors=[3], transport=w.transport, batch_size=6, seed=0, prefetch=0) | kw
    return _first(DistributedLinkNeighborLoader(**args))


def _ingest(w: Any, **kw: Any) -> tuple:
    dest = w.tmp / "ingested"  # exists, so that overwrite matters
    if not dest.exists():
        graphstore.ingest(small_graph(n=40, e=200)[0], dest)
    args = dict(data=small_graph(n=40, e=200)[0], dest=dest, overwrite=True, num_parts=2) | kw
    summary = graphstore.ingest(**args)
    return tuple(sorted(summary.to_json().items()))


def _open(w: Any, **kw: Any) -> tuple:
    ds = graphstore.open_dataset(**(dict(url=w.dest) | kw))
    return (ds.num_parts, ds.partition(0)[0][None, "x", None].sum().item())


ENTRY_POINTS: dict[str, tuple[Callable, Callable]] = {
    "NeighborLoader": (NeighborLoader.__init__, _node_loader),
    "LinkNeighborLoader": (LinkNeighborLoader.__init__, _link_loader),
    "NeighborSampler": (NeighborSampler.__init__, _sampler),
    "DistributedNeighborLoader": (DistributedNeighborLoader.__init__, _dist_node_loader),
    "DistributedLinkNeighborLoader": (DistributedLinkNeighborLoader.__init__, _dist_link_loader),
    "graphstore.ingest": (graphstore.ingest, _ingest),
    "graphstore.open_dataset": (graphstore.open_dataset, _open),
}

# (entry point, parameter) -> (value, error class, message pattern): a documented refusal, exercised
REFUSALS: dict[tuple[str, str], tuple[Any, type, str]] = {
    ("DistributedNeighborLoader", "subgraph_type"): ("induced", InvalidInputError, "not supported by the distributed"),
    ("DistributedLinkNeighborLoader", "subgraph_type"): ("induced", InvalidInputError,
                                                         "not supported by the distributed"),
    ("DistributedNeighborLoader", "directed"): (False, InvalidInputError, "not supported by the distributed"),
    ("DistributedLinkNeighborLoader", "directed"): (False, InvalidInputError, "not supported by the distributed"),
    ("DistributedNeighborLoader", "is_sorted"): (True, InvalidInputError, "is_sorted=True applies to an in-memory"),
    ("DistributedLinkNeighborLoader", "is_sorted"): (True, InvalidInputError,
                                                     "is_sorted=True applies to an in-memory"),
    ("DistributedNeighborLoader", "num_workers"): (2, InvalidInputError, "drop num_workers"),
}

# loader options that decide what a batch holds: a non-default value must change the first batch
DIFFERENTIAL: dict[str, Any] = {
    "replace": True, "disjoint": True, "subgraph_type": "bidirectional", "directed": False, "is_sorted": True,
    "time_attr": "time", "weight_attr": "weight", "temporal_strategy": "last",
}
_CONTEXT = {"temporal_strategy": {"time_attr": "time"}}  # only meaningful together with these


def _parameters(fn: Callable) -> list[str]:
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.name != "self" and p.kind not in skip]


def _cases() -> list[tuple[str, str]]:
    cases = [(entry, name) for entry, (fn, _) in ENTRY_POINTS.items() for name in _parameters(fn)]
    return cases + [key for key in REFUSALS if key not in cases]


def _outcome(run: Callable, w: Any, **kw: Any) -> Any:
    try:
        return ("ok", run(w, **kw))
    except Exception as exc:  # an error is an outcome too (a refusal, or a conflict PyG raises on)
        return ("error", type(exc).__name__, str(exc))


@pytest.mark.parametrize("entry,name", _cases(), ids=lambda v: v if isinstance(v, str) else None)
def test_parameter_is_used_or_refused(world, entry, name):
    fn, run = ENTRY_POINTS[entry]
    if (entry, name) in REFUSALS:
        value, error, pattern = REFUSALS[(entry, name)]
        with pytest.raises(error, match=pattern):
            run(world, **{name: value})
        return
    wire = Tripwire()
    outcome = _outcome(run, world, **{name: wire})
    refused = outcome[0] == "error" and outcome[1] != "Touched" and name in outcome[2]
    uses = list(object.__getattribute__(wire, "uses"))
    del wire  # pytest's assertion rewriting must not look at it
    assert uses or refused, (
        f"{entry}({name}=...) was accepted and never used: the value was not looked at while building and "
        f"running ({str(outcome)[:300]}). Use it, or refuse non-default values and add the refusal to REFUSALS")


@pytest.mark.parametrize("entry", [e for e in ENTRY_POINTS if "Loader" in e])
@pytest.mark.parametrize("name", sorted(DIFFERENTIAL))
def test_loader_option_changes_the_batch(world, entry, name):
    fn, run = ENTRY_POINTS[entry]
    if name not in _parameters(fn) and "Distributed" not in entry:
        pytest.fail(f"{entry} lost its {name} parameter")
    if (entry, name) in REFUSALS:
        return  # exercised by test_parameter_is_used_or_refused
    context, extra = dict(_CONTEXT.get(name, {})), {}
    if entry == "LinkNeighborLoader":  # PyG's rule: time_attr comes with edge_label_time (one per seed link)
        times = {"edge_label_time": torch.full((400,), 100, dtype=torch.long)}  # later than every node
        context, extra = (context | times, extra) if "time_attr" in context else (context, times)
    base = _outcome(run, world, **context)
    assert base[0] == "ok", base
    assert _outcome(run, world, **context) == base, "the scenario is not deterministic: the check would be vacuous"
    changed = _outcome(run, world, **(context | extra | {name: DIFFERENTIAL[name]}))
    assert changed != base, f"{entry}({name}={DIFFERENTIAL[name]!r}) gave the same first batch as the default"


def _reads(fn: Callable) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_parameter_is_read_in_its_function(entry):
    fn, _ = ENTRY_POINTS[entry]
    unread = [name for name in _parameters(fn) if name not in _reads(fn)]
    assert not unread, f"{entry}: parameters never read: {unread}"


# -- the CLIs --

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
                               node_balance=1.0, edge_balance=1.0, to_json=lambda: {"kwargs": repr(kwargs)})

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
            "info": ["info", str(world.dest)], "verify": ["verify", str(world.dest)]}[command]


def _cli_cases() -> list[tuple[str, str | None, str]]:
    cases = []
    for module in ("graphstore.cli", "training.launch"):
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
             "dataset": str(world.tmp / "elsewhere"), "command": None}
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
