"""Distributed layer-wise inference: every rank computes its own nodes' outputs over full neighbourhoods.

Layer by layer (as DGL's users learned to do at scale): each rank holds layer i's input rows for the
nodes it owns, computes layer i for them from their complete in-neighbourhood (all in its own CSC),
and fetches the rows of remote in-neighbours from their owners in one request per partition per
batch. No sampling noise: for mean/sum/attention layers (GraphSAGE, GIN, GAT) the result equals a
full-graph forward pass.

Layer 0's input, ``x``, is never held whole: it is read from the partitions' stores a batch at a time
(through the rank's disk tier where ``x`` is larger than its memory: :mod:`training.loop.featurecache`), so
a rank holds its CSC, a layer's input and output (``hidden`` wide) and one batch's rows. GraphSAGE's and GIN's
layers read their input once, in ID order, projected first (:func:`projects_first`; ``x`` included); GAT reads
each batch's in-neighbours' rows. Where a layer's input and output do not fit beside the rest, they go to disk
(:class:`SpillFile`, in ``TMPDIR``): the rank then holds one layer's projections (:func:`plan`).
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
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
MOUNTS = "/proc/self/mounts"  # where a spill directory's file system is looked up


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


class SpillFile:
    """A layer's rows for this rank's nodes on disk, where they do not fit beside the rest in memory: written in
    ID order, a batch at a time (``pwrite``), flushed and their pages dropped every :attr:`FLUSH` bytes (so the
    page cache a memory limit charges stays small), then mapped read-only and unlinked (:meth:`rows`): the file is
    gone when its tensor is, also if the rank dies."""

    FLUSH = 64 << 20

    def __init__(self, directory: str, rows: int, width: int) -> None:
        fd, self.path = tempfile.mkstemp(prefix="graphstore-layer-", suffix=".f32", dir=directory)
        self.shape, self._fd, self._clean = (rows, width), fd, 0
        os.ftruncate(fd, 4 * rows * width)

    def __setitem__(self, rows: slice, y: torch.Tensor) -> None:
        data = np.ascontiguousarray(y.detach().numpy(), dtype=np.float32)
        offset, view = 4 * rows.start * self.shape[1], memoryview(data).cast("B")
        while view:
            done = os.pwrite(self._fd, view, offset)
            view, offset = view[done:], offset + done
        if offset - self._clean >= self.FLUSH:
            self._flush(offset)

    def _flush(self, end: int) -> None:
        os.fdatasync(self._fd)
        os.posix_fadvise(self._fd, self._clean, end - self._clean, os.POSIX_FADV_DONTNEED)
        self._clean = end

    def rows(self) -> torch.Tensor:
        """The rows written, mapped (private, clean pages: the kernel reclaims what a memory limit needs)."""
        self._flush(4 * self.shape[0] * self.shape[1])
        os.close(self._fd)
        mapped = np.memmap(self.path, dtype=np.float32, mode="c", shape=self.shape) if self.shape[0] else \
            np.empty(self.shape, dtype=np.float32)
        os.unlink(self.path)
        return torch.from_numpy(mapped)


class _Outputs:
    """Where a layer's outputs go: memory (``spill`` None), or a :class:`SpillFile` in the directory ``spill``
    (every layer but the last, whose outputs are the job's: ``classes`` wide)."""

    def __init__(self, spill: str | None, rows: int) -> None:
        self.spill, self.rows = spill, rows

    def new(self, shape: tuple[int, ...], last: bool) -> torch.Tensor | SpillFile:
        if self.spill is None or last:
            return torch.empty((self.rows, *shape))
        return SpillFile(self.spill, self.rows, int(np.prod(shape)))

    @staticmethod
    def done(out: torch.Tensor | SpillFile) -> torch.Tensor:
        return out.rows() if isinstance(out, SpillFile) else out


@torch.no_grad()
def layerwise_inference(model: torch.nn.Module, dataset: Any, parts: int | tuple[int, ...], transport: Transport,
                        layout: RankLayout, model_name: str, batch_size: int = BATCH,
                        spill: str | None = None) -> torch.Tensor:
    """Outputs of ``model`` (a PyG BasicGNN) for every node the partitions ``parts`` own (a contiguous
    block of them), in global-ID order. Every layer that can projects first (:func:`projection`; after layer 0,
    where that does not widen its rows): its input read once, in order, its own terms written over that input, its
    projections what its batches aggregate. ``spill``: a directory for the layers' rows where they do not fit in
    memory (:class:`SpillFile`): the rank then holds one layer's projections."""
    if model_name not in EXACT_MODELS:
        raise InvalidInputError(f"--infer-out supports {EXACT_MODELS} (GCN's normalisation needs global degrees)")
    model.eval()
    parts = (parts,) if isinstance(parts, int) else tuple(parts)
    lo, hi, indptr, indices = _owned(dataset, parts)
    h: torch.Tensor | OwnRows = OwnRows(dataset, parts)
    outputs = _Outputs(spill, hi - lo)
    server = LayerServer(lo)
    transport.register(LAYER, server.rows)
    for i, (conv, norm) in enumerate(zip(model.convs, model.norms)):
        last, how = i == len(model.convs) - 1, projection(conv)
        if how is not None and i > 0 and how.first.weight.shape[0] > how.first.weight.shape[1]:
            how = None  # a widening layer: its projections would outweigh its input (every rank decides alike)
        root: Any = None
        if how is not None:  # the input read once, in order, and projected: its neighbours' rows are narrow
            width = how.first.weight.shape[0]
            if isinstance(h, torch.Tensor) and spill is None:
                root = h[:, :width]  # in place: a batch's input rows are read before its own terms replace them
            else:
                root = outputs.new((width,), last)
            h = _project(how, h, batch_size, root)
        server.publish(i, h)
        dist.barrier()  # every rank's layer-i rows are served before anyone asks
        out: Any = torch.zeros(0)
        if isinstance(root, SpillFile):  # read back in order; the outputs go to a file of their own
            root = root.rows()
            out = outputs.new(root.shape[1:], last)
        elif root is not None:
            out = root  # a batch's own rows of ``root`` are its output's: one tensor, overwritten in order
        for start in range(0, hi - lo, batch_size):  # into one output: a layer's rows are held once, not twice
            stop = min(start + batch_size, hi - lo)
            if root is not None:
                y = _projected_batch(model, how, norm, i, h, root[start:stop], indptr, indices, lo, hi, start, stop,
                                     dataset, transport, layout)
            else:
                y = _layer_batch(model, conv, norm, i, h, indptr, indices, lo, hi, start, stop, dataset, transport,
                                 layout)
            if start == 0 and root is None:
                out = outputs.new(y.shape[1:], last)
            out[start:stop] = y
        h = outputs.done(out)
        root = None
        dist.barrier()  # nobody still needs layer i
        server.layers.pop(i, None)
    return h.contiguous()  # the last layer's own terms may be a view of its input's rows


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


def _project(how: Projection, rows: torch.Tensor | OwnRows, batch_size: int,
             root: torch.Tensor | SpillFile) -> torch.Tensor:
    """A layer's input rows read once, in ID order, a batch at a time, into each node's projection (returned: what
    its in-neighbours aggregate) and its own term (written into ``root``, which may be the first columns of
    ``rows`` themselves: a batch's rows are read before their own terms are written)."""
    n, width = len(rows), how.first.weight.shape[0]
    z = torch.empty((n, width))
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        x = rows.take(torch.arange(start, stop)) if isinstance(rows, OwnRows) else rows[start:stop]
        z[start:stop] = torch.nn.functional.linear(x, how.first.weight)
        root[start:stop] = how.own(x, z[start:stop])
    return z


def _projected_batch(model: Any, how: Projection, norm: Any, i: int, z: torch.Tensor, root: torch.Tensor,
                     indptr: torch.Tensor, indices: torch.Tensor, lo: int, hi: int, start: int, stop: int, dataset: Any,
                     transport: Transport, layout: RankLayout) -> torch.Tensor:
    """Layer ``i`` of destinations ``[start, stop)`` from the projections ``z`` of their in-neighbours (remote
    ones from their owners) and their own terms ``root``: what the layer computes from its input, in another
    order."""
    from torch_geometric.utils import scatter

    a, b = int(indptr[start]), int(indptr[stop])
    nodes, inverse = torch.unique(indices[a:b], return_inverse=True)
    dst_local = torch.repeat_interleave(torch.arange(stop - start), torch.diff(indptr[start: stop + 1]))
    rows = _rows(i, nodes, z, lo, hi, dataset, transport, layout)[inverse]
    aggregate = scatter(rows, dst_local, dim=0, dim_size=stop - start, reduce=how.reduce)
    return _after(model, norm, i, how.finish(aggregate + root))


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
                    projected: bool = False, spilled: bool = False) -> int:
    """What :func:`layerwise_inference` holds at its peak on a rank of partitions ``parts``: their CSC arrays
    (int64, twice while joined), a layer's input and output for their nodes (``hidden`` wide, float32; with
    ``spilled`` layers, one layer's projections: the rest are on disk), and the largest batch's working set
    (:func:`batch_bytes`; ``projected``: layer 0 projects first). ``x`` itself is read batch by batch, never held
    whole. An estimate, from the manifest and the mapped pointers."""
    node, edge = dataset.manifest.node_types[0], dataset.manifest.edge_types[0]
    nodes = sum(int(node.offsets[p + 1]) - int(node.offsets[p]) for p in parts)
    edges = sum(int(edge.edges_per_part[p]) for p in parts)
    return (4 * nodes * (1 if spilled else 2) * hidden + 16 * (nodes + 1 + edges)
            + batch_bytes(dataset, parts, hidden, batch_size, projected))


def spill_bytes(dataset: Any, parts: tuple[int, ...], hidden: int) -> int:
    """The disk a pass with spilled layers takes at most: two layers' rows (``hidden`` wide) for the rank's
    nodes, the one read and the one written."""
    node = dataset.manifest.node_types[0]
    return 8 * hidden * sum(int(node.offsets[p + 1]) - int(node.offsets[p]) for p in parts)


def spill_refusal(directory: str, need: int) -> str | None:
    """Why layers cannot be spilled into ``directory`` (``None`` where they can): a file system in memory
    (tmpfs, ramfs: the bytes would count against the same memory), or less free space than ``need``."""
    path, best, kind = os.path.realpath(directory), "", ""
    try:
        with open(MOUNTS) as fh:
            for line in fh:
                fields = line.split()
                mount = fields[1].replace("\\040", " ")
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        pass
    if kind in ("tmpfs", "ramfs"):
        return f"{directory} is {kind}, in memory"
    stat = os.statvfs(directory)
    if stat.f_bavail * stat.f_frsize < need:
        return f"{directory} has {stat.f_bavail * stat.f_frsize / 1e9:.2f} GB free of the {need / 1e9:.2f} GB they take"
    return None


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


@dataclass(frozen=True)
class Plan:
    """How a rank runs :func:`layerwise_inference`: its batch of destinations, and where its layers' outputs go
    (``spill``: a directory, or ``None``: memory). ``need``: the bytes it holds (:func:`inference_bytes`)."""

    batch: int
    spill: str | None
    need: int


def plan(dataset: Any, parts: tuple[int, ...], hidden: int, memory: int, held: int, projected: bool,
         refuse: bool = True) -> Plan:
    """The :class:`Plan` of a rank with ``memory`` bytes holding ``held`` already: its layers in memory where they
    fit beside the rest, else spilled to the temporary directory (``TMPDIR``; the launcher's job directory)
    where they fit there. Neither: ``refuse`` raises the one line that says so, else the layers go to disk where
    they can (they hold less there: a resident set after training counts memory its allocator keeps but no
    longer uses)."""
    batch = inference_batch(dataset, parts, hidden, memory, projected)
    need = inference_bytes(dataset, parts, hidden, batch, projected)
    if need + held <= memory:
        return Plan(batch, None, need)
    spilled = inference_bytes(dataset, parts, hidden, batch, projected, spilled=True)
    directory = tempfile.gettempdir()
    why = spill_refusal(directory, spill_bytes(dataset, parts, hidden))
    if spilled + held <= memory and why is None:
        return Plan(batch, directory, spilled)
    if not refuse:
        return Plan(batch, None, need) if why else Plan(batch, directory, spilled)
    because = f"; its layers cannot go to disk: {why} (TMPDIR names the directory)" if why else ""
    raise InvalidInputError(
        f"--infer-out: its pass over the whole graph holds a layer's outputs ({hidden} wide) for this rank's "
        f"nodes, their CSC and a batch's rows in memory, about {need / 1e9:.2f} GB, or {spilled / 1e9:.2f} GB with "
        f"its layers spilled to disk (TMPDIR), beside the {held / 1e9:.2f} GB the rank holds already, and this "
        f"rank's memory is {memory / 1e9:.2f} GB (its share of the memory limit, or of the host's memory){because}; "
        "drop --infer-out (the model trains without it), lower --hidden, run it with more memory per rank"
        + (", or set TMPDIR to a disk with room" if why else ""))


def check_memory(dataset: Any, parts: tuple[int, ...], hidden: int, local_ranks: int, model: str = "sage") -> None:
    """``--infer-out``, at the door (before training, so that nothing is lost): refuse in one line, naming the
    memory it needs, a rank whose inference would hold more than its memory (:func:`featurecache.memory_limit`:
    its share of its cgroup limit, else of the host's memory) beside what the rank holds already (torch, the
    dataset's open arrays: its resident set now; training's batches and RAM cache are let go before the pass),
    even with its layers' outputs on disk (:func:`plan`). ``model``: graphstore-train's ``--model`` (whether its
    layer 0 projects first)."""
    from training.loop.featurecache import memory_limit
    from training.loop.models import MODELS

    if dataset.is_hetero or "x" not in dataset.manifest.node_types[0].attrs:
        return  # refused by write_outputs, or by the task, in their own words
    projected = model in MODELS and projects_first(MODELS[model](1, 1, num_layers=1).convs[0])  # as built
    chosen = plan(dataset, tuple(parts), hidden, memory_limit(local_ranks), resident_bytes(), projected)
    if chosen.spill is not None:
        logger.warning("--infer-out: a layer's outputs for this rank's nodes do not fit in its memory beside the "
                       "rest; they will be written to %s and read back (%.2f GB of disk at most)", chosen.spill,
                       spill_bytes(dataset, tuple(parts), hidden) / 1e9)


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
    chosen = plan(dataset, tuple(parts), config.hidden, memory_limit(world.local_world_size), resident_bytes(),
                  projects_first(model.convs[0]), refuse=False)  # admitted at the door: spilled if need be
    if chosen.spill is not None:
        logger.warning("--infer-out: writing its layers' rows to %s", chosen.spill)
    out = layerwise_inference(model, dataset, parts, trainer.transport, layout, config.model, batch_size=chosen.batch,
                              spill=chosen.spill)
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
