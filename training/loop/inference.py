"""Distributed layer-wise inference: every rank computes its own nodes' outputs over full neighbourhoods.

Layer by layer (as DGL's users learned to do at scale): each rank holds layer i's input rows for the
nodes it owns, computes layer i for them from their complete in-neighbourhood (all in its own CSC),
and fetches the rows of remote in-neighbours from their owners in one request per partition per
batch. No sampling noise: for mean/sum/attention layers (GraphSAGE, GIN, GAT) the result equals a
full-graph forward pass.

Layer 0's input, ``x``, is never held whole: it is read from the partitions' stores a batch at a time
(through the rank's disk tier where ``x`` is larger than its memory: :mod:`training.loop.featurecache`), so
a rank holds its CSC, a layer's input and output (``hidden`` wide) and one batch's rows. GraphSAGE's and GIN's
layer 0 read it once, in ID order, projected first (:func:`projects_first`); GAT reads each batch's
in-neighbours' rows.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from graphstore.errors import InvalidInputError
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.transport import Transport

logger = logging.getLogger(__name__)
LAYER = "graphstore.layer_rows"
EXACT_MODELS = ("sage", "gin", "gat")
BATCH = 4096  # destinations a rank computes at once


class OwnRows:
    """Layer 0's input: the rows of ``x`` of a contiguous block of partitions (IDs ``[lo, hi)``), read from
    their feature stores batch by batch (:meth:`take`) as float32, never all at once."""

    def __init__(self, dataset: Any, parts: tuple[int, ...]) -> None:
        offsets = dataset.node_offsets()
        self.stores = [dataset.partition(p)[0] for p in parts]
        self.bounds = [int(offsets[p]) for p in parts] + [int(offsets[parts[-1] + 1])]
        self.lo = self.bounds[0]
        shape = dataset.manifest.node_types[0].attrs["x"].shape
        self.width = int(np.prod(shape)) if shape else 1

    def __len__(self) -> int:
        return self.bounds[-1] - self.lo

    def take(self, local: torch.Tensor) -> torch.Tensor:
        """Rows of the block-local IDs ``local`` (int64), in their order."""
        ids = local.to(torch.int64) + self.lo
        if len(self.stores) == 1:
            return self.stores[0][None, "x", ids].float().reshape(len(ids), self.width)
        out = torch.empty((len(ids), self.width), dtype=torch.float32)
        part = torch.bucketize(ids, torch.tensor(self.bounds[1:-1], dtype=torch.int64), right=True)
        for p in torch.unique(part).tolist():
            sel = torch.nonzero(part == p).view(-1)
            out[sel] = self.stores[p][None, "x", ids[sel]].float().reshape(len(sel), self.width)
        return out


def _take(table: torch.Tensor | OwnRows, local: torch.Tensor) -> torch.Tensor:
    return table.take(local) if isinstance(table, OwnRows) else table[local]


class LayerServer:
    """Serves this rank's rows of the current layer's input (named RPC handler)."""

    def __init__(self, lo: int) -> None:
        self.lo, self.layers, self._lock = lo, {}, threading.Lock()

    def publish(self, layer: int, rows: torch.Tensor | OwnRows) -> None:
        with self._lock:
            self.layers[layer] = rows

    def rows(self, layer: int, ids: torch.Tensor) -> torch.Tensor:
        with self._lock:
            table = self.layers[layer]
        return _take(table, ids - self.lo)


@torch.no_grad()
def layerwise_inference(model: torch.nn.Module, dataset: Any, parts: int | tuple[int, ...], transport: Transport,
                        layout: RankLayout, model_name: str, batch_size: int = BATCH) -> torch.Tensor:
    """Outputs of ``model`` (a PyG BasicGNN) for every node the partitions ``parts`` own (a contiguous
    block of them), in global-ID order."""
    if model_name not in EXACT_MODELS:
        raise InvalidInputError(f"--infer-out supports {EXACT_MODELS} (GCN's normalisation needs global degrees)")
    model.eval()
    parts = (parts,) if isinstance(parts, int) else tuple(parts)
    lo, hi, indptr, indices = _owned(dataset, parts)
    h: torch.Tensor | OwnRows = OwnRows(dataset, parts)
    server = LayerServer(lo)
    transport.register(LAYER, server.rows)
    for i, (conv, norm) in enumerate(zip(model.convs, model.norms)):
        how = projection(conv) if i == 0 else None
        root = None
        if how is not None:  # x read once, in order, and projected: its neighbours' rows are narrow
            h, root = _project(how, h, batch_size)
        server.publish(i, h)
        dist.barrier()  # every rank's layer-i rows are served before anyone asks
        out = root if root is not None else torch.zeros(0)  # a batch's own rows of ``root`` are its output's
        for start in range(0, hi - lo, batch_size):  # into one output: a layer's rows are held once, not twice
            stop = min(start + batch_size, hi - lo)
            if root is not None:
                y = _projected_batch(model, how, norm, h, root[start:stop], indptr, indices, lo, hi, start, stop,
                                     dataset, transport, layout)
            else:
                y = _layer_batch(model, conv, norm, i, h, indptr, indices, lo, hi, start, stop, dataset, transport,
                                 layout)
            if start == 0 and root is None:
                out = torch.empty((hi - lo, *y.shape[1:]), dtype=y.dtype)
            out[start:stop] = y
        h = out
        dist.barrier()  # nobody still needs layer i
        server.layers.pop(i, None)
    return h


@dataclass(frozen=True)
class Projection:
    """How a layer linear in each neighbour's row is computed projection first: ``first``, the linear layer
    whose weights project each row of ``x`` (its bias left out: a mean or sum of projections would count it
    once per neighbour); ``own(x, z)``, a node's own term from its row and projection; ``finish``, what the
    layer applies after the aggregate plus the own term; ``reduce``, the aggregate."""

    first: Any
    own: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    finish: Callable[[torch.Tensor], torch.Tensor]
    reduce: str


def projection(conv: Any) -> Projection | None:
    """A layer's :class:`Projection` where it is linear in each neighbour's row before it aggregates, else
    ``None``: PyG's ``SAGEConv`` with a mean or sum (no projection of its own), and ``GINConv`` (a sum) whose
    network is an ``MLP`` (its first layer linear), as :mod:`training.loop.models` builds them."""
    from torch_geometric.nn import MLP
    from torch_geometric.nn.conv import GINConv, SAGEConv

    reduce = {"mean": "mean", "sum": "sum", "add": "sum"}.get(str(conv.aggr))
    if type(conv) is SAGEConv and reduce is not None and not conv.project:
        def own(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # lin_r, and lin_l's bias
            term = conv.lin_r(x) if conv.root_weight else torch.zeros_like(z)
            return term + conv.lin_l.bias if conv.lin_l.bias is not None else term

        def finish(y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.normalize(y, p=2.0, dim=-1) if conv.normalize else y

        return Projection(conv.lin_l, own, finish, reduce)
    if type(conv) is GINConv and reduce == "sum" and type(conv.nn) is MLP:
        rest = copy.copy(conv.nn)  # the network after its first layer's weights: that layer adds its bias alone
        rest._modules = dict(conv.nn._modules)  # its own table of submodules: the model's MLP keeps its layers
        rest.lins = torch.nn.ModuleList([_Bias(conv.nn.lins[0].bias), *conv.nn.lins[1:]])
        return Projection(conv.nn.lins[0], lambda x, z: (1 + conv.eps) * z, rest, reduce)
    return None


def projects_first(conv: Any) -> bool:
    """Whether layer 0 reads each row of ``x`` once and aggregates its projection (:func:`projection`)."""
    return projection(conv) is not None


class _Bias(torch.nn.Module):
    """A linear layer's bias alone: the layer's weights applied before the sum (:func:`projection`)."""

    def __init__(self, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.bias is None else x + self.bias


def _project(how: Projection, rows: OwnRows, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0's rows of ``x`` read once, in ID order, a batch at a time, into each node's projection ``z``
    (what its in-neighbours aggregate) and its own term."""
    n, width = len(rows), how.first.weight.shape[0]
    z, root = torch.empty((n, width)), torch.empty((n, width))
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        x = rows.take(torch.arange(start, stop))
        z[start:stop] = torch.nn.functional.linear(x, how.first.weight)
        root[start:stop] = how.own(x, z[start:stop])
    return z, root


def _projected_batch(model: Any, how: Projection, norm: Any, z: torch.Tensor, root: torch.Tensor,
                     indptr: torch.Tensor, indices: torch.Tensor, lo: int, hi: int, start: int, stop: int, dataset: Any,
                     transport: Transport, layout: RankLayout) -> torch.Tensor:
    """Layer 0 of destinations ``[start, stop)`` from the projections ``z`` of their in-neighbours (remote ones
    from their owners) and their own terms ``root``: what the layer computes from ``x``, in another order."""
    from torch_geometric.utils import scatter

    a, b = int(indptr[start]), int(indptr[stop])
    nodes, inverse = torch.unique(indices[a:b], return_inverse=True)
    dst_local = torch.repeat_interleave(torch.arange(stop - start), torch.diff(indptr[start: stop + 1]))
    rows = _rows(0, nodes, z, lo, hi, dataset, transport, layout)[inverse]
    aggregate = scatter(rows, dst_local, dim=0, dim_size=stop - start, reduce=how.reduce)
    return _after(model, norm, 0, how.finish(aggregate + root))


def _after(model: Any, norm: Any, i: int, y: torch.Tensor) -> torch.Tensor:
    """Layer ``i``'s activation and norm, as the model applies them (none after the last)."""
    if i < model.num_layers - 1:
        if model.act is not None and model.act_first:
            y = model.act(y)
        y = norm(y)
        if model.act is not None and not model.act_first:
            y = model.act(y)
    return y


def _owned(dataset: Any, parts: tuple[int, ...]) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """The ID range ``[lo, hi)`` of a contiguous block of partitions and their CSC arrays joined (indptr
    over the range's destinations)."""
    ptrs, idx, lo, hi, offset = [], [], None, None, 0
    for part in parts:
        _, gs = dataset.partition(part)
        start, stop = gs.dst_range()
        lo, hi = start if lo is None else lo, stop
        indptr, indices, _ = (torch.from_numpy(np.asarray(a)) for a in gs.csc_arrays())
        ptrs.append(indptr[(1 if ptrs else 0):] + offset)
        offset += int(indptr[-1])
        idx.append(indices)
    return int(lo), int(hi), torch.cat(ptrs), torch.cat(idx)


def _layer_batch(model: Any, conv: Any, norm: Any, i: int, h: torch.Tensor | OwnRows, indptr: torch.Tensor,
                 indices: torch.Tensor, lo: int, hi: int, start: int, stop: int, dataset: Any, transport: Transport,
                 layout: RankLayout) -> torch.Tensor:
    a, b = int(indptr[start]), int(indptr[stop])
    src = indices[a:b]
    dst_local = torch.repeat_interleave(torch.arange(stop - start), torch.diff(indptr[start: stop + 1]))
    targets = torch.arange(lo + start, lo + stop)
    nodes, inverse = torch.unique(torch.cat([targets, src]), return_inverse=True)
    x = _rows(i, nodes, h, lo, hi, dataset, transport, layout)
    edge_index = torch.stack([inverse[len(targets):], inverse[dst_local]])
    return _after(model, norm, i, conv(x, edge_index)[inverse[: len(targets)]])


def _rows(i: int, nodes: torch.Tensor, h: torch.Tensor | OwnRows, lo: int, hi: int, dataset: Any,
          transport: Transport, layout: RankLayout) -> torch.Tensor:
    """Layer-i input rows of ``nodes``: own ones from ``h``, the rest from their owners (batched)."""
    own = (nodes >= lo) & (nodes < hi)
    if bool(own.all()):  # every row this rank's: read straight into the batch, not copied again
        return _take(h, nodes - lo)
    width = h.width if isinstance(h, OwnRows) else h.size(1)
    out = torch.empty((len(nodes), width), dtype=torch.float32 if isinstance(h, OwnRows) else h.dtype)
    out[own] = _take(h, nodes[own] - lo)
    owners = torch.from_numpy(dataset.owner(nodes.numpy()))
    pending = []
    for p in torch.unique(owners[~own]).tolist():
        sel = torch.nonzero((owners == p) & ~own).view(-1)
        pending.append((sel, transport.call(layout.server(p, transport.rank), LAYER, i, nodes[sel])))
    for sel, future in pending:
        out[sel] = future.result()
    return out


def inference_bytes(dataset: Any, parts: tuple[int, ...], hidden: int, batch_size: int = BATCH,
                    projected: bool = False) -> int:
    """What :func:`layerwise_inference` holds at its peak on a rank of partitions ``parts``: their CSC arrays
    (int64, twice while joined), a layer's input and output for their nodes (``hidden`` wide, float32), and
    the largest batch's working set (:func:`batch_bytes`; ``projected``: layer 0 projects first). ``x`` itself is
    read batch by batch, never held whole. An estimate, from the manifest and the mapped pointers."""
    node, edge = dataset.manifest.node_types[0], dataset.manifest.edge_types[0]
    nodes = sum(int(node.offsets[p + 1]) - int(node.offsets[p]) for p in parts)
    edges = sum(int(edge.edges_per_part[p]) for p in parts)
    return (4 * nodes * 2 * hidden + 16 * (nodes + 1 + edges)
            + batch_bytes(dataset, parts, hidden, batch_size, projected))


def batch_bytes(dataset: Any, parts: tuple[int, ...], hidden: int, batch_size: int, projected: bool = False) -> int:
    """The largest working set of a batch of ``batch_size`` destinations, from the CSC's pointers: its rows
    (``x``'s width at layer 0) for them and every in-neighbour about four times over (read, assembled, and a
    layer's own intermediates over all of them: GIN's sum and ``(1 + eps) x``, its network's input), and a row per
    in-edge twice (the messages and what the layer makes of them). GIN with ``x`` 4 KiB a row was OOM-killed in a
    1.1 GB limit with twice each (before it projected first). Where layer 0 projects first (``projected``) the
    rows and messages are ``hidden`` wide at every layer (counted as often: a skewed graph's hub batch was
    OOM-killed in 1.1 GB with its rows counted once), and its projection reads a batch's own rows of ``x``."""
    node = dataset.manifest.node_types[0]
    features = int(np.prod(node.attrs["x"].shape)) if "x" in node.attrs else 0
    width, most = (hidden if projected else max(features, hidden)), 0  # a batch's rows: x's at layer 0, then a layer's
    for p in parts:
        indptr = np.asarray(dataset.partition(p)[1].csc_arrays()[0])
        ends = indptr[np.minimum(np.arange(0, len(indptr) - 1 + batch_size, batch_size), len(indptr) - 1)]
        edges = int(np.diff(ends).max(initial=0))  # most in-edges of a batch's destinations
        own = min(batch_size, len(indptr) - 1)
        rows = min(own + edges, node.num_nodes)  # its nodes, at most every one
        most = max(most, 4 * width * (4 * rows + 2 * edges) + 32 * edges,
                   4 * own * (features + 2 * hidden) if projected else 0)  # the projection's rows of x and theirs
    return most


def inference_batch(dataset: Any, parts: tuple[int, ...], hidden: int, memory: int, projected: bool = False) -> int:
    """How many destinations a batch of inference computes at once: :data:`BATCH`, halved (down to 64) while
    its working set (:func:`batch_bytes`) exceeds an eighth of the rank's ``memory``: wide rows of ``x`` read
    from disk in a memory limit take smaller batches, not the OOM killer."""
    size = BATCH
    while size > 64 and batch_bytes(dataset, parts, hidden, size, projected) > memory // 8:
        size //= 2
    return size


def check_memory(dataset: Any, parts: tuple[int, ...], hidden: int, local_ranks: int, model: str = "sage") -> None:
    """``--infer-out``, at the door (before training, so that nothing is lost): refuse in one line, naming the
    memory it needs, a rank whose inference would hold more than its memory (:func:`featurecache.memory_limit`:
    its share of its cgroup limit, else of the host's memory) beside what the rank holds already (torch, the
    dataset's open arrays: its resident set now; training's batches and RAM cache are let go before the pass).
    ``model``: graphstore-train's ``--model`` (whether its layer 0 projects first)."""
    from training.loop.featurecache import memory_limit
    from training.loop.models import MODELS

    if dataset.is_hetero or "x" not in dataset.manifest.node_types[0].attrs:
        return  # refused by write_outputs, or by the task, in their own words
    have, held = memory_limit(local_ranks), resident_bytes()
    projected = model in MODELS and projects_first(MODELS[model](1, 1, num_layers=1).convs[0])  # as built
    batch = inference_batch(dataset, tuple(parts), hidden, have, projected)
    need = inference_bytes(dataset, tuple(parts), hidden, batch, projected)
    if need + held > have:
        raise InvalidInputError(
            f"--infer-out: its pass over the whole graph holds a layer's outputs ({hidden} wide) for this rank's "
            f"nodes, their CSC and a batch's rows in memory, about {need / 1e9:.2f} GB beside the "
            f"{held / 1e9:.2f} GB the rank holds already, and this rank's memory is {have / 1e9:.2f} GB (its share "
            "of the memory limit, or of the host's memory); drop --infer-out (the model trains without it), lower "
            "--hidden, or run it with more memory per rank")


def resident_bytes() -> int:
    """This process's resident set now."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def write_outputs(trainer: Any, model: torch.nn.Module) -> None:
    """``--infer-out``: layer-wise inference over full neighbourhoods with the ``trainer``'s model; each
    partition's outputs written into the dataset by its first rank, committed to the manifest by rank 0
    once all are written."""
    from graphstore.outputs.writer import OutputWriter

    config, dataset, parts, layout = trainer.config, trainer.dataset, trainer.parts, trainer.layout
    world = trainer.world
    if config.task != "node" or dataset.is_hetero:
        raise InvalidInputError("--infer-out supports homogeneous node classification in this version")
    start_time = time.perf_counter()
    from training.loop.featurecache import memory_limit

    if trainer.features is not None:  # a pass reading every row once: the RAM cache of hot rows makes room for it
        trainer.features.fill(0)
    batch = inference_batch(dataset, tuple(parts), config.hidden, memory_limit(world.local_world_size),
                            projects_first(model.convs[0]))
    out = layerwise_inference(model, dataset, parts, trainer.transport, layout, config.model, batch_size=batch)
    writer = OutputWriter(dataset, config.infer_out, row_shape=tuple(out.shape[1:]),
                          description=f"graphstore-train {config.model} outputs")
    offsets, first = dataset.node_offsets(), int(dataset.node_offsets()[parts[0]])
    infos = {p: writer.write_part(p, out[int(offsets[p]) - first: int(offsets[p + 1]) - first].numpy())
             for p in parts if layout.owner_of(p) == world.rank}  # one writer per partition
    gathered: list[Any] = [None] * world.world_size
    dist.all_gather_object(gathered, infos)
    if world.rank == 0:
        writer.commit({p: i for written in gathered for p, i in written.items()})
        logger.warning("wrote %s for %d nodes into %s in %.1f s", config.infer_out, dataset.num_nodes(),
                       dataset.url, time.perf_counter() - start_time)
    dist.barrier()
