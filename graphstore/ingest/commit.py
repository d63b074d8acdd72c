"""The manifest of an ingest, assembled on the client from what the stages returned (no data in it)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import numpy as np

from graphstore.ingest.chunks import ChunkedSource
from graphstore.ingest.edge_stage import EdgeTypeResult
from graphstore.ingest.link_stage import finish_record
from graphstore.ingest.node_stage import PartNodes
from graphstore.ingest.relabel import Relabel
from graphstore.ingest.scratch import StoredArray
from graphstore.dataset.manifest import ArrayInfo, AttrSchema, EdgeTypeInfo, Manifest, NodeTypeInfo
from graphstore.dataset.trainable import is_labelled, node_name
from graphstore.errors import InvalidInputError
from graphstore.storage.local import redact_url
from graphstore.dataset.types import EdgeType, NodeType
from graphstore.version import VERSION


def _ends(etype: EdgeType) -> tuple[NodeType, NodeType]:
    return (None, None) if etype is None else (etype[0], etype[2])


def halos_of(source: ChunkedSource, books: dict[NodeType, Relabel],
             edges: dict[EdgeType, EdgeTypeResult]) -> dict[NodeType, list[list[StoredArray]]]:
    """Per node type and part: the files holding the remote sources of the part's edges, one per edge type
    whose sources have that type (their union is the part's halo: ``node_stage.part_halo``)."""
    num_parts = len(next(iter(books.values())).offsets) - 1
    found: dict[NodeType, list[list[StoredArray]]] = {t: [[] for _ in range(num_parts)] for t in source.num_nodes}
    for etype, result in edges.items():
        for part in result.parts:
            found[_ends(etype)[0]][part.part].append(part.halo)
    return found


def _isolated(source: ChunkedSource, books: dict[NodeType, Relabel], edges: dict[EdgeType, EdgeTypeResult]) -> int:
    """Nodes that are neither the source nor the destination of any edge."""
    touched = {t: np.zeros(n, bool) for t, n in source.num_nodes.items()}
    for etype, result in edges.items():
        s_type, d_type = _ends(etype)
        for part in result.parts:
            touched[s_type] |= np.unpackbits(part.touched_src, count=source.num_nodes[s_type]).astype(bool)
            lo, hi = (int(x) for x in books[d_type].offsets[part.part: part.part + 2])
            touched[d_type][lo:hi] |= np.unpackbits(part.touched_dst, count=hi - lo).astype(bool)
    return int(sum(np.count_nonzero(~t) for t in touched.values()))


def _balance(counts: list[int]) -> float:
    mean = sum(counts) / max(len(counts), 1)
    return float(max(counts) / mean) if mean else 1.0


def _quality(source: ChunkedSource, books: dict[NodeType, Relabel], keys: dict[Any, str],
             edges: dict[EdgeType, EdgeTypeResult], nodes: dict[tuple[NodeType, int], PartNodes],
             opts: dict[str, Any]) -> dict[str, Any]:
    num_parts = opts["num_parts"]
    has_train = any("train_mask" in source.node_schema.get(t, {}) for t in source.num_nodes)
    train = [sum(nodes[t, p].masks.get("train_mask", 0) for t in source.num_nodes) for p in range(num_parts)]
    train = train if has_train else []
    counts = [int(sum(b.offsets[p + 1] - b.offsets[p] for b in books.values())) for p in range(num_parts)]
    per_part = [sum(r.parts[p].count for r in edges.values()) for p in range(num_parts)]
    cut = sum(part.cut for r in edges.values() for part in r.parts)
    return {"method": opts["method"], "seed": opts["seed"], "nodes_per_part": counts, "edges_per_part": per_part,
            "edge_cut": cut, "edge_cut_fraction": round(cut / max(sum(per_part), 1), 6),
            "node_balance": round(_balance(counts), 4), "edge_balance": round(_balance(per_part), 4),
            "train_nodes_per_part": train, "train_node_balance": round(_balance(train), 4) if sum(train) else None,
            "node_type_balance": {keys[t]: round(_balance([int(b.offsets[p + 1] - b.offsets[p])
                                                           for p in range(num_parts)]), 4)
                                  for t, b in books.items()},
            **opts["details"]}


def _schema(columns: dict[str, Any]) -> dict[str, AttrSchema]:
    return {n: AttrSchema(np.dtype(s.dtype).name, tuple(s.shape)) for n, s in columns.items()}


def build_manifest(source: ChunkedSource, books: dict[NodeType, Relabel], keys: dict[Any, str],
                   edges: dict[EdgeType, EdgeTypeResult], nodes: dict[tuple[NodeType, int], PartNodes],
                   replicate: dict[NodeType, tuple[str, ...]], opts: dict[str, Any]) -> tuple[Manifest, tuple[int, int]]:
    """The manifest to commit, and the bytes written and checksums read back by the tasks."""
    arrays: dict[str, ArrayInfo] = {}
    written = [0, 0]
    for result in list(edges.values()) + [nodes[k] for k in nodes]:
        for part in result.parts if isinstance(result, EdgeTypeResult) else [result]:
            arrays.update(part.arrays)
            written[0] += part.bytes_written
            written[1] += part.read_back
    ntypes = tuple(NodeTypeInfo(t, keys[t], n, tuple(int(o) for o in books[t].offsets),
                                _schema(source.node_schema.get(t, {})), replicate[t])
                   for t, n in source.num_nodes.items())
    etypes = tuple(EdgeTypeInfo(t, keys[t], keys[_ends(t)[0]], keys[_ends(t)[1]], n,
                                tuple(p.count for p in edges[t].parts), _schema(source.edge_schema.get(t, {})))
                   for t, n in source.num_edges.items())
    splits = {keys[t]: {m: sum(nodes[t, p].masks.get(m, 0) for p in range(opts["num_parts"]))
                        for m in source.node_schema.get(t, {}) if m.endswith("_mask")} for t in source.num_nodes}
    link_splits = {keys[t]: finish_record(r, sum(p.split_counts for p in edges[t].parts))
                   for t, r in opts["link_splits"].items()}
    stats = {"self_loops": sum(p.self_loops for r in edges.values() for p in r.parts),
             "duplicate_edges": sum(p.duplicates for r in edges.values() for p in r.parts),
             "isolated_nodes": _isolated(source, books, edges)}
    manifest = Manifest(source.name, opts["num_parts"], ntypes, etypes, arrays,
                        partitioning=_quality(source, books, keys, edges, nodes, opts), splits=splits,
                        link_splits=link_splits, stats=stats,
                        storage={"compression": opts["compression"], "chunk_bytes": opts["chunk_bytes"]},
                        provenance={"source": redact_url(source.origin), "tool": "graphstore",
                                    "tool_version": VERSION,
                                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                    "seconds": round(time.perf_counter() - opts["started"], 3)})
    _check_trainable(manifest)
    return manifest, (written[0], written[1])


def _check_trainable(manifest: Manifest) -> None:
    """Refuse, before the commit, a labelled node type whose ``train_mask`` holds no node (a chunked source's
    chunks are checked one at a time; only the counts show it): ``graphstore verify`` would fail it."""
    for info in manifest.node_types:
        if is_labelled(info) and manifest.splits.get(info.key, {}).get("train_mask") == 0 and info.num_nodes:
            raise InvalidInputError(f"{node_name(info)}, attribute 'train_mask': no node is in it, so training would "
                                    "have nothing to train on; mark the training nodes, or leave train_mask out")
