"""PyG's subgraph types over a sampled batch: ``induced`` (every edge among the sampled nodes) and
``bidirectional`` (each sampled edge also reversed), keeping the edge locators of edge attributes."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch_geometric.sampler import HeteroSamplerOutput, SamplerOutput

from graphstore.errors import InvalidInputError

if TYPE_CHECKING:
    from sampling.graph.topology import EdgeTopology

SUBGRAPH_TYPES = ("directional", "bidirectional", "induced")
_EMPTY_I = np.zeros(0, np.int64)


def check_subgraph_type(subgraph_type: Any, disjoint: bool) -> str:
    """``subgraph_type`` as a string, refused (as PyG refuses it) when unknown or induced and disjoint."""
    value = getattr(subgraph_type, "value", subgraph_type)
    if value not in SUBGRAPH_TYPES:
        raise InvalidInputError(f"subgraph_type {value!r} is not supported; use one of {SUBGRAPH_TYPES}")
    if value == "induced" and disjoint:
        raise InvalidInputError(
            "subgraph_type='induced' cannot be combined with disjoint subgraphs (disjoint=True, or temporal "
            "sampling with time_attr, which is always disjoint): PyG refuses it too; use subgraph_type="
            "'directional' or 'bidirectional'"
        )
    return value


def _pair(part: torch.Tensor, pos: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    return part.numpy(), pos.numpy()


def _locator(part: np.ndarray, pos: np.ndarray) -> functools.partial:
    return functools.partial(_pair, torch.from_numpy(np.ascontiguousarray(part, np.int32)),
                             torch.from_numpy(np.ascontiguousarray(pos, np.int64)))


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Every integer of ``[starts[i], ends[i])``, concatenated in order."""
    counts = ends - starts
    total = int(counts.sum())
    if total == 0:
        return _EMPTY_I
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return offsets + np.arange(total, dtype=np.int64)


def _induced_edges(topo: EdgeTopology, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, ...]:
    """The edges of ``topo`` from a node of ``src`` to a node of ``dst`` (global IDs in local order), as
    ``(row, col, eid, part, pos)``, grouped by destination in local order."""
    order = np.argsort(src, kind="stable")
    sorted_src = src[order]
    cols = [np.zeros(0, np.int64) for _ in range(5)]
    which = topo.block_of(dst) if len(dst) else _EMPTY_I
    pieces = []
    for b in np.unique(which):
        block = topo.blocks[int(b)]
        if getattr(block, "is_remote", False):
            raise InvalidInputError("subgraph_type='induced' needs every partition's topology in this process; "
                                    "the distributed loaders support 'directional' and 'bidirectional'")
        if block.files is not None:
            raise InvalidInputError("subgraph_type='induced' reads every edge among a batch's nodes, which a partition "
                                    "read without mapping (Dataset.read_unmapped) does not serve: leave it mapped, or "
                                    "sample 'directional' or 'bidirectional'")
        local = np.flatnonzero(which == b)
        d = dst[local] - block.lo
        pos = _ranges(block.indptr[d], block.indptr[d + 1])
        col = np.repeat(local, block.indptr[d + 1] - block.indptr[d])
        nbr = block.indices[pos]
        at = np.minimum(np.searchsorted(sorted_src, nbr), max(len(src) - 1, 0))
        keep = sorted_src[at] == nbr if len(src) else np.zeros(len(nbr), bool)
        pieces.append((order[at[keep]], col[keep], block.eid[pos[keep]],
                       np.full(int(keep.sum()), block.part, np.int32), pos[keep]))
    if pieces:
        cols = [np.concatenate(c) for c in zip(*pieces)]
        by_dst = np.argsort(cols[1], kind="stable")
        cols = [c[by_dst] for c in cols]
    return tuple(cols)


def _t(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))


def induced(topology: dict[Any, EdgeTopology], out: SamplerOutput | HeteroSamplerOutput
            ) -> SamplerOutput | HeteroSamplerOutput:
    """``out`` with its edges replaced by every edge among its nodes (PyG's ``subgraph_type='induced'``).

    As in PyG, per-hop counts are dropped (the edges no longer come hop by hop).
    """
    hetero = isinstance(out, HeteroSamplerOutput)
    nodes = out.node if hetero else {None: out.node}
    row, col, edge, locators = {}, {}, {}, {}
    for etype, topo in topology.items():
        src, dst = (nodes.get(t, torch.zeros(0, dtype=torch.long)).numpy() for t in (topo.src_type, topo.dst_type))
        r, c, e, part, pos = _induced_edges(topo, src.astype(np.int64), dst.astype(np.int64))
        row[etype], col[etype], edge[etype] = _t(r), _t(c), _t(e)
        locators[etype] = _locator(part, pos)
    if not hetero:
        new = SamplerOutput(node=out.node, row=row[None], col=col[None], edge=edge[None], batch=out.batch,
                            metadata=out.metadata)
    else:
        new = HeteroSamplerOutput(node=out.node, row=row, col=col, edge=edge, batch=out.batch, metadata=out.metadata)
    new.edge_locator = locators
    return new


def _relocate(ids: torch.Tensor | None, old_ids: torch.Tensor | None, locator: Any) -> Any:
    """A locator for edges ``ids`` built from the locator of ``old_ids`` (each ID found among them)."""
    if ids is None or old_ids is None or locator is None:
        return None
    part, pos = locator()
    old = old_ids.numpy()
    order = np.argsort(old, kind="stable")
    at = order[np.searchsorted(old[order], ids.numpy())] if len(ids) else _EMPTY_I
    return _locator(part[at], pos[at])


def bidirectional(out: SamplerOutput | HeteroSamplerOutput) -> SamplerOutput | HeteroSamplerOutput:
    """PyG's ``to_bidirectional``; a reversed edge keeps its edge ID (as in PyG) and now also its edge
    attributes' locator, so a dataset's weights/times come along. Edge types PyG returns without edge
    IDs (heterogeneous reverse pairs) carry no edge attributes, as in PyG."""
    locators = getattr(out, "edge_locator", None)
    new = out.to_bidirectional()
    if locators is None:
        return new
    if isinstance(out, HeteroSamplerOutput):
        new.edge_locator = {et: _relocate((new.edge or {}).get(et), (out.edge or {}).get(et), locators.get(et))
                            for et in new.row}
    else:
        new.edge_locator = {None: _relocate(new.edge, out.edge, locators.get(None))}
    return new
