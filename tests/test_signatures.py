"""No public parameter is accepted and silently ignored: every parameter of the public entry points and
every option of both CLIs is found by introspection (new ones included) and must be used or refused.

Python entry points: each parameter in turn gets a tripwire, a value that records any use (a method,
an attribute, truthiness, comparison, hashing, formatting...) while a small scenario runs (build, then
one batch or a read). The parameter passes when the tripwire was used, or when a refusal of the table
below raises its error. Loader options that decide what a batch holds also get a differential check:
a non-default value must change the first batch. As a floor, each name must be read in its function.

The CLIs' options: ``tests/test_cli_signatures.py``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

import graphstore
from graphstore.errors import InvalidInputError
from sampling import LinkNeighborLoader, NeighborLoader, NeighborSampler
from sampling.distributed.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader
from sampling.distributed.server import PartitionServer
from sampling.distributed.transport import LoopbackTransport
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
    ("DistributedNeighborLoader", "num_workers"): (-1, InvalidInputError, "num_workers=-1"),
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


# the distributed loaders forward their other keyword arguments to these: each is checked through them too
FORWARDS_TO = {"DistributedNeighborLoader": NeighborLoader.__init__,
               "DistributedLinkNeighborLoader": LinkNeighborLoader.__init__}


def _cases() -> list[tuple[str, str]]:
    cases = [(entry, name) for entry, (fn, _) in ENTRY_POINTS.items() for name in _parameters(fn)]
    for entry, parent in FORWARDS_TO.items():
        own = _parameters(ENTRY_POINTS[entry][0])
        cases += [(entry, name) for name in _parameters(parent)
                  if name not in own and name not in ("data", "neighbor_sampler")]
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
    used, outcome = _used(run, world, name)
    assert used, (
        f"{entry}({name}=...) was accepted and never used: the value was not looked at while building and "
        f"running ({str(outcome)[:300]}). Use it, or refuse non-default values and add the refusal to REFUSALS")


def _used(run: Callable, world: Any, name: str) -> tuple[bool, Any]:
    """Whether ``run`` used a tripwire passed as ``name``, or refused it with an error naming it."""
    wire = Tripwire()
    outcome = _outcome(run, world, **{name: wire})
    refused = outcome[0] == "error" and outcome[1] != "Touched" and name in outcome[2]
    return bool(object.__getattribute__(wire, "uses")) or refused, outcome


def test_the_check_catches_an_ignored_parameter():
    """The check itself: a parameter passed along but never looked at fails it; used or refused ones pass."""
    def build(w: Any, used: int = 0, ignored: int = 0, refused: int = 0, stored: int = 0) -> tuple:
        if type(refused) is not int:  # a refusal that never looks at the value itself
            raise InvalidInputError("refused=...: not supported")
        kept = {"stored": stored}  # kept, never looked at: ignored too
        return (used + 1, len(kept))

    assert _used(build, None, "used")[0] and _used(build, None, "refused")[0]
    assert not _used(build, None, "ignored")[0] and not _used(build, None, "stored")[0]


@pytest.mark.filterwarnings("ignore:The usage of the 'directed' argument")  # PyG's, expected here
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
