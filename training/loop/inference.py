"""Distributed layer-wise inference: every rank computes its own nodes' outputs over full neighbourhoods.

Layer by layer (as DGL's users learned to do at scale): each rank holds layer i's input rows for the
nodes it owns, computes layer i for them from their complete in-neighbourhood (all in its own CSC),
and fetches the rows of remote in-neighbours from their owners in one request per partition per
batch. No sampling noise: for mean/sum/attention layers (GraphSAGE, GIN, GAT) the result equals a
full-graph forward pass.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from graphstore.errors import InvalidInputError
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.transport import Transport

logger = logging.getLogger(__name__)
LAYER = "graphstore.layer_rows"
EXACT_MODELS = ("sage", "gin", "gat")


class LayerServer:
    """Serves this rank's rows of the current layer's input (named RPC handler)."""

    def __init__(self, lo: int) -> None:
        self.lo, self.layers, self._lock = lo, {}, threading.Lock()

    def publish(self, layer: int, rows: torch.Tensor) -> None:
        with self._lock:
            self.layers[layer] = rows

    def rows(self, layer: int, ids: torch.Tensor) -> torch.Tensor:
        with self._lock:
            table = self.layers[layer]
        return table[ids - self.lo]


@torch.no_grad()
def layerwise_inference(model: torch.nn.Module, dataset: Any, parts: int | tuple[int, ...], transport: Transport,
                        layout: RankLayout, model_name: str, batch_size: int = 4096) -> torch.Tensor:
    """Outputs of ``model`` (a PyG BasicGNN) for every node the partitions ``parts`` own (a contiguous
    block of them), in global-ID order."""
    if model_name not in EXACT_MODELS:
        raise InvalidInputError(f"--infer-out supports {EXACT_MODELS} (GCN's normalisation needs global degrees)")
    model.eval()
    parts = (parts,) if isinstance(parts, int) else tuple(parts)
    lo, hi, indptr, indices, h = _owned(dataset, parts)
    server = LayerServer(lo)
    transport.register(LAYER, server.rows)
    for i, (conv, norm) in enumerate(zip(model.convs, model.norms)):
        server.publish(i, h)
        dist.barrier()  # every rank's layer-i rows are served before anyone asks
        out = [_layer_batch(model, conv, norm, i, h, indptr, indices, lo, start, min(start + batch_size, hi - lo),
                            dataset, transport, layout) for start in range(0, hi - lo, batch_size)]
        h = torch.cat(out) if out else torch.zeros(0)
        dist.barrier()  # nobody still needs layer i
        server.layers.pop(i, None)
    return h


def _owned(dataset: Any, parts: tuple[int, ...]) -> tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ID range ``[lo, hi)`` of a contiguous block of partitions, their CSC arrays joined (indptr
    over the range's destinations) and their features ``x``."""
    ptrs, idx, xs, lo, hi, offset = [], [], [], None, None, 0
    for part in parts:
        fs, gs = dataset.partition(part)
        start, stop = gs.dst_range()
        lo, hi = start if lo is None else lo, stop
        indptr, indices, _ = (torch.from_numpy(np.asarray(a)) for a in gs.csc_arrays())
        ptrs.append(indptr[(1 if ptrs else 0):] + offset)
        offset += int(indptr[-1])
        idx.append(indices)
        xs.append(fs[None, "x", None].float())
    return int(lo), int(hi), torch.cat(ptrs), torch.cat(idx), torch.cat(xs)


def _layer_batch(model: Any, conv: Any, norm: Any, i: int, h: torch.Tensor, indptr: torch.Tensor,
                 indices: torch.Tensor, lo: int, start: int, stop: int, dataset: Any, transport: Transport,
                 layout: RankLayout) -> torch.Tensor:
    a, b = int(indptr[start]), int(indptr[stop])
    src = indices[a:b]
    dst_local = torch.repeat_interleave(torch.arange(stop - start), torch.diff(indptr[start: stop + 1]))
    targets = torch.arange(lo + start, lo + stop)
    nodes, inverse = torch.unique(torch.cat([targets, src]), return_inverse=True)
    x = _rows(i, nodes, h, lo, lo + len(h), dataset, transport, layout)
    edge_index = torch.stack([inverse[len(targets):], inverse[dst_local]])
    y = conv(x, edge_index)[inverse[: len(targets)]]
    if i < model.num_layers - 1:
        if model.act is not None and model.act_first:
            y = model.act(y)
        y = norm(y)
        if model.act is not None and not model.act_first:
            y = model.act(y)
    return y


def _rows(i: int, nodes: torch.Tensor, h: torch.Tensor, lo: int, hi: int, dataset: Any, transport: Transport,
          layout: RankLayout) -> torch.Tensor:
    """Layer-i input rows of ``nodes``: own ones from ``h``, the rest from their owners (batched)."""
    out = torch.empty((len(nodes), h.size(1)), dtype=h.dtype)
    own = (nodes >= lo) & (nodes < hi)
    out[own] = h[nodes[own] - lo]
    owners = torch.from_numpy(dataset.owner(nodes.numpy()))
    pending = []
    for p in torch.unique(owners[~own]).tolist():
        sel = torch.nonzero((owners == p) & ~own).view(-1)
        pending.append((sel, transport.call(layout.server(p, transport.rank), LAYER, i, nodes[sel])))
    for sel, future in pending:
        out[sel] = future.result()
    return out


def inference_bytes(dataset: Any, parts: tuple[int, ...], hidden: int) -> int:
    """What :func:`layerwise_inference` holds at its peak on a rank of partitions ``parts``: their rows of ``x``
    as float32 twice while they are joined, or a layer's input, output and its join (``hidden`` wide, at most
    the features' width), and their CSC arrays (int64, twice while joined). An estimate, from the manifest."""
    node, edge = dataset.manifest.node_types[0], dataset.manifest.edge_types[0]
    nodes = sum(int(node.offsets[p + 1]) - int(node.offsets[p]) for p in parts)
    edges = sum(int(edge.edges_per_part[p]) for p in parts)
    features = int(np.prod(node.attrs["x"].shape)) if "x" in node.attrs else 0
    width = max(2 * features, features + 2 * hidden, 3 * hidden)  # float32 values a node holds at the peak
    return 4 * nodes * width + 16 * (nodes + 1 + edges)


def check_memory(dataset: Any, parts: tuple[int, ...], hidden: int, local_ranks: int) -> None:
    """``--infer-out``, at the door (before training, so that nothing is lost): refuse in one line, naming the
    memory it needs, a rank whose inference would hold more than its memory (:func:`featurecache.memory_limit`:
    its share of its cgroup limit, else of the host's memory)."""
    from training.loop.featurecache import memory_limit

    if dataset.is_hetero or "x" not in dataset.manifest.node_types[0].attrs:
        return  # refused by write_outputs, or by the task, in their own words
    need, have = inference_bytes(dataset, tuple(parts), hidden), memory_limit(local_ranks)
    if need > have:
        raise InvalidInputError(
            f"--infer-out: its pass over the whole graph holds this rank's rows of x and a layer's outputs in memory, "
            f"about {need / 1e9:.2f} GB, and this rank's memory is {have / 1e9:.2f} GB (its share of the memory "
            "limit, or of the host's memory); drop --infer-out (the model trains without it), or run it with more "
            "memory per rank")


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
    out = layerwise_inference(model, dataset, parts, trainer.transport, layout, config.model)
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
