"""``graphstore.ingest``: read → validate → partition → write every array → commit the manifest."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from graphstore import layout
from graphstore.errors import GraphstoreError, InvalidInputError, StorageError
from graphstore.ingest.dest import check_dest
from graphstore.ingest.partition import METIS_MAX_EDGES, partition_nodes
from graphstore.ingest.edge_stage import WriteSpec
from graphstore.ingest.engine import Engine, engine_for
from graphstore.ingest.parts_writer import EdgeStats, PartsWriter
from graphstore.ingest.pipeline_edges import write_edges
from graphstore.ingest.relabel import relabel
from graphstore.ingest.source import ArrayRows, GraphSource
from graphstore.linksplit import LinkSplit, assign, check_edge_type, check_fractions, counts
from graphstore.ingest.sources import resolve_source
from graphstore.ingest.validate import check_finite, check_options, validate_source
from graphstore.ingest.writer import ArrayWriter
from graphstore.manifest import AttrSchema, EdgeTypeInfo, Manifest, NodeTypeInfo
from graphstore.storage import LocalLocation, Location, open_location, redact_url
from graphstore.version import __version__

logger = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class IngestSummary:
    """What an ingest wrote: per-partition counts, partition quality, bytes and seconds."""

    dest: str
    num_parts: int
    method: str
    nodes_per_part: list[int]
    edges_per_part: list[int]
    edge_cut: int
    edge_cut_fraction: float
    node_balance: float
    edge_balance: float
    bytes_written: int
    seconds: float
    checksums_read_back: int = 0  # chunks whose checksum was read back from storage (normally 0)
    link_splits: dict[str, dict[str, Any]] = field(default_factory=dict)  # as in the manifest
    train_nodes_per_part: list[int] = field(default_factory=list)  # empty when no node type has a train_mask
    train_node_balance: float | None = None  # max / mean of train_nodes_per_part; None without train nodes
    node_type_balance: dict[str, float] = field(default_factory=dict)  # per node type key: max / mean nodes
    rebalanced_nodes: int = 0  # nodes the boundary repair moved after METIS (0: METIS balanced alone)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ingest(data: Any, dest: str | os.PathLike[str], *, num_parts: int = 1, method: str = "metis", seed: int = 0,
           overwrite: bool = False, compression: str = "none", halo_features: tuple[str, ...] | str = (),
           allow_nan: bool = False, chunk_mb: float = 32, to_undirected: bool | None = None,
           metis_max_edges: int | None = METIS_MAX_EDGES, storage_options: dict[str, Any] | None = None,
           progress: Progress | None = None, link_split: Any = None, link_split_by: str | None = None,
           link_split_edge_type: Any = None, link_split_time_attr: str | None = None, engine: str = "local",
           client: Any = None) -> IngestSummary:
    """Partition a graph and write it to ``dest`` as a graphstore dataset (Zarr v3).

    ``data`` is a SOURCE string (``planetoid:DIR``, ``ogb:DIR``, ``npz:PATH``, ``synthetic:...``), a PyG
    ``Data``/``HeteroData``, or a :class:`GraphSource`. ``dest`` is a local/NFS path or any fsspec URL
    (``s3://bucket/name`` with ``storage_options``). Everything is validated before anything is deleted.
    ``engine="dask"`` runs the edge stages (route chunks to parts, sort and write each part) as tasks on
    ``client`` (a ``distributed.Client``), whose workers must all reach ``dest``; ``"local"`` runs the
    same stage functions in this process.
    On a local file system nothing at ``dest`` is touched until the new dataset is complete: it is
    written beside ``dest`` and renamed into place after its manifest. Object storage has no rename:
    the dataset is written in place, manifest last; replacing one first deletes its manifest (so it
    stops opening), then its arrays, so a failed overwrite there leaves no valid dataset.

    Examples
    --------
    >>> import graphstore
    >>> s = graphstore.ingest("synthetic:nodes=1000,avg_degree=5", "/tmp/demo", num_parts=2)  # doctest: +SKIP
    >>> s.num_parts  # doctest: +SKIP
    2
    """
    started = time.perf_counter()
    rule = _link_split_rule(link_split, link_split_by, link_split_edge_type, link_split_time_attr, seed)
    check_options(seed=seed, chunk_mb=chunk_mb, metis_max_edges=metis_max_edges)
    runner = engine_for(engine, client)
    location = open_location(dest, storage_options)
    replacing = check_dest(location, overwrite, data)
    source = resolve_source(data, to_undirected=to_undirected)
    options = dict(num_parts=num_parts, method=method, seed=seed, compression=compression,
                   halo_features=halo_features, allow_nan=allow_nan, chunk_bytes=int(chunk_mb * (1 << 20)),
                   metis_max_edges=metis_max_edges, progress=progress, started=started, engine=runner)
    try:
        validate_source(source, num_parts)
        options["link_splits"] = add_link_split(source, rule) if rule is not None else {}
        _compact_ids(source)
        if location.local_root is not None:  # a directory here: stage beside it, then rename
            summary = _ingest_staged(source, LocalLocation(location.local_root), options)
        else:
            summary = _ingest_in_place(source, location, replacing, options)
    finally:
        source.close()
    return IngestSummary(**{**summary.to_json(), "dest": location.url, "seconds": time.perf_counter() - started})


def _ingest_staged(source: GraphSource, location: LocalLocation, options: dict[str, Any]) -> IngestSummary:
    """Write into a hidden sibling directory, then rename it into place: DEST is never half-written."""
    staged = _on_disk(location, "creating a staging directory beside it", location.staging)
    try:
        summary = _write_dataset(source, staged, **options)
        _on_disk(location, "renaming the new dataset into place", lambda: location.replace_with(staged))
    except BaseException:
        staged.remove()
        raise
    return summary


def _on_disk(location: LocalLocation, action: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, with a file-system error (read-only, full, permissions) named as the DEST's."""
    try:
        return fn()
    except GraphstoreError:
        raise
    except OSError as exc:
        raise StorageError(f"DEST {location.root}: {action} failed ({exc.strerror or exc}); nothing was "
                           "changed at DEST: choose a writable place with free space") from exc


def _ingest_in_place(source: GraphSource, location: Location, replacing: bool,
                     options: dict[str, Any]) -> IngestSummary:
    """Object storage: write where the dataset lives (no rename there), the manifest last.

    Input values are checked before the old dataset is deleted, which happens only after
    partitioning, right before the first write: manifest first (it stops opening), then the rest.
    """
    if replacing and not options["allow_nan"]:
        check_finite(source)  # otherwise found while writing, after the old dataset is gone

    writing = []

    def clear() -> None:
        writing.append(True)
        if replacing:
            logger.info("deleting the dataset at %s: its manifest first, then its arrays", location.url)
            location.remove_key(layout.ROOT_METADATA)
            location.remove()

    try:
        return _write_dataset(source, location, prepare=clear, **options)
    except Exception:
        if not writing:  # failed before anything was deleted or written
            raise
        logger.warning("ingest into %s failed; deleting the arrays it wrote (it has no manifest, so it never "
                       "opens as a dataset)", location.url)
        try:
            location.remove()
        except Exception as exc:  # noqa: BLE001  (the original error matters more)
            logger.warning("could not delete the partial dataset at %s (%s)", location.url, type(exc).__name__)
        raise


def _link_split_rule(fractions: Any, by: str | None, edge_type: Any, time_attr: str | None,
                     seed: int) -> LinkSplit | None:
    """The link split asked for, validated before anything is read or written (``None``: none)."""
    if fractions is None:
        given = {"link_split_by": by, "link_split_edge_type": edge_type, "link_split_time_attr": time_attr}
        stray = [k for k, v in given.items() if v is not None]
        if stray:
            raise InvalidInputError(f"{', '.join(stray)} given without link_split: pass link_split=(0.8, 0.1, 0.1) "
                                    "(--link-split 0.8,0.1,0.1) too, or drop them")
        return None
    if isinstance(fractions, LinkSplit):
        if by is not None or edge_type is not None or time_attr is not None:
            raise InvalidInputError("link_split is a LinkSplit: set by, edge_type and time_attr on it, not beside it")
        return fractions
    if time_attr is not None and by != "time":
        raise InvalidInputError(f"link_split_time_attr={time_attr!r} needs link_split_by='time' (a random split "
                                "uses no times)")
    return LinkSplit(check_fractions(fractions), by or "random", edge_type, seed, time_attr or "time")


def add_link_split(source: GraphSource, rule: LinkSplit) -> dict[Any, dict[str, Any]]:
    """Add the edge attribute ``link_split`` to the edge type ``rule`` splits; return its manifest record."""
    table_attrs = {et: list(t.attrs) for et, t in source.edges.items()}
    etype = check_edge_type(rule, list(source.edges), {et: t.num_edges for et, t in source.edges.items()},
                            table_attrs, "link split")
    table = source.edges[etype]
    if layout.LINK_SPLIT in table.attrs:
        raise InvalidInputError(f"edge type {etype!r} already has an attribute {layout.LINK_SPLIT!r}; rename it or "
                                "drop --link-split")
    times = table.attrs[rule.time_attr].take(np.arange(table.num_edges)) if rule.by == "time" else None
    symmetric = etype is None or etype[0] == etype[2]
    split, decided = assign(table.src, table.dst, times, rule, symmetric)
    table.attrs[layout.LINK_SPLIT] = ArrayRows(split)
    record = {"attr": layout.LINK_SPLIT, **rule.describe(), **decided, **counts(split)}
    logger.info("link split of %r: %s", etype, record)
    return {etype: record}


def _compact_ids(source: GraphSource) -> None:
    """Hold edge endpoints as int32 where the node counts allow: halves the largest arrays of an ingest."""
    for etype, table in source.edges.items():
        s_type, d_type = (None, None) if etype is None else (etype[0], etype[2])
        if max(source.nodes[s_type].num_nodes, source.nodes[d_type].num_nodes) < 2**31:
            table.src = np.asarray(table.src).astype(np.int32, copy=False)
            table.dst = np.asarray(table.dst).astype(np.int32, copy=False)


def _halo_attrs(source: GraphSource, spec: tuple[str, ...] | str) -> dict[Any, tuple[str, ...]]:
    names = tuple(n for n in spec.split(",") if n) if isinstance(spec, str) else tuple(spec)
    out = {}
    for ntype, table in source.nodes.items():
        if names == ("all",):
            out[ntype] = tuple(n for n in table.attrs if not n.endswith("_mask"))
        else:
            out[ntype] = tuple(n for n in names if n in table.attrs)
    missing = [n for n in names if n != "all" and not any(n in t.attrs for t in source.nodes.values())]
    if missing:
        raise InvalidInputError(f"--halo-features names {missing}, which no node type has; use attribute names or 'all'")
    return out


def _write_dataset(source: GraphSource, staged: Location, *, num_parts: int, method: str, seed: int,
                   compression: str, halo_features: tuple[str, ...] | str, allow_nan: bool, chunk_bytes: int,
                   metis_max_edges: int | None, progress: Progress | None, started: float,
                   link_splits: dict[Any, dict[str, Any]], engine: Engine, prepare: Callable[[], None] | None = None) -> IngestSummary:
    replicate = _halo_attrs(source, halo_features)
    logger.info("partitioning %s into %d parts by %s", source.name, num_parts, method)
    assign, details = partition_nodes(source, num_parts, method, seed, progress, metis_max_edges)
    books = {ntype: relabel(a, num_parts) for ntype, a in assign.items()}
    logger.info("partitioned after %.1f s; writing into %s", time.perf_counter() - started, staged.url)
    keys = _type_keys(source)
    if prepare is not None:
        prepare()
    writer = ArrayWriter(staged, compression=compression, chunk_bytes=chunk_bytes)
    parts = PartsWriter(source, books, keys, writer, allow_nan=allow_nan, progress=progress)
    edge_stats = write_edges(source, WriteSpec(staged, compression, chunk_bytes, allow_nan), assign, books,
                             keys, parts, engine=engine)
    del assign
    logger.info("wrote edges after %.1f s on the %s engine", time.perf_counter() - started, engine.name)
    splits = {keys[ntype]: parts.write_nodes(ntype) for ntype in source.nodes}
    logger.info("wrote node attributes after %.1f s", time.perf_counter() - started)
    for ntype in source.nodes:
        parts.write_halo(ntype, replicate[ntype])
    manifest = _manifest(source, books, keys, parts, edge_stats, replicate, splits,
                         dict(method=method, seed=seed, num_parts=num_parts, compression=compression,
                              chunk_bytes=chunk_bytes, started=started, details=details,
                              link_splits={keys[et]: record for et, record in link_splits.items()}))
    writer.commit(manifest.to_json())
    q = manifest.partitioning
    return IngestSummary(staged.url, num_parts, method, q["nodes_per_part"], q["edges_per_part"], q["edge_cut"],
                         q["edge_cut_fraction"], q["node_balance"], q["edge_balance"], writer.bytes_written, 0.0,
                         writer.read_back, manifest.link_splits, q["train_nodes_per_part"], q["train_node_balance"],
                         q["node_type_balance"], q.get("rebalanced_nodes", 0))


def _type_keys(source: GraphSource) -> dict[Any, str]:
    if not source.is_hetero:
        return {None: layout.HOMOGENEOUS_KEY}
    ntypes, etypes = list(source.nodes), list(source.edges)
    out: dict[Any, str] = dict(zip(ntypes, layout.type_keys([str(t) for t in ntypes])))
    out.update(zip(etypes, layout.type_keys(["__".join(e) for e in etypes])))
    return out


def _balance(counts: list[int]) -> float:
    mean = sum(counts) / max(len(counts), 1)
    return float(max(counts) / mean) if mean else 1.0


def _manifest(source: GraphSource, books: dict, keys: dict, parts: PartsWriter, edge_stats: dict[Any, EdgeStats],
              replicate: dict, splits: dict, opts: dict[str, Any]) -> Manifest:
    ntypes = tuple(
        NodeTypeInfo(ntype, keys[ntype], table.num_nodes, tuple(int(o) for o in books[ntype].offsets),
                     {n: AttrSchema(np.dtype(r.dtype).name, tuple(r.shape[1:])) for n, r in table.attrs.items()},
                     replicate[ntype])
        for ntype, table in source.nodes.items()
    )
    etypes = tuple(
        EdgeTypeInfo(etype, keys[etype], keys[None if etype is None else etype[0]],
                     keys[None if etype is None else etype[2]], table.num_edges, tuple(edge_stats[etype].per_part),
                     {n: AttrSchema(np.dtype(r.dtype).name, tuple(r.shape[1:])) for n, r in table.attrs.items()})
        for etype, table in source.edges.items()
    )
    return Manifest(source.name, opts["num_parts"], ntypes, etypes, dict(parts.arrays),
                    partitioning=_quality(source, books, keys, edge_stats, opts), splits=splits,
                    link_splits=opts["link_splits"],
                    stats=_stats(source, edge_stats),
                    storage={"compression": opts["compression"], "chunk_bytes": opts["chunk_bytes"]},
                    provenance={"source": redact_url(source.origin), "tool": "graphstore",
                                "tool_version": __version__,
                                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                "seconds": round(time.perf_counter() - opts["started"], 3)})


def _train_per_part(source: GraphSource, books: dict) -> list[int]:
    """Training nodes (``train_mask``, all node types) each partition owns; empty without any mask."""
    counts, found = np.zeros(len(next(iter(books.values())).offsets) - 1, np.int64), False
    for ntype, table in source.nodes.items():
        if "train_mask" in table.attrs:
            found = True
            book = books[ntype]
            prefix = np.zeros(book.num_nodes + 1, np.int64)
            np.cumsum(table.attrs["train_mask"].take(book.order).astype(bool), out=prefix[1:])
            counts += np.diff(prefix[np.asarray(book.offsets)])
    return [int(c) for c in counts] if found else []


def _quality(source: GraphSource, books: dict, keys: dict, edge_stats: dict[Any, EdgeStats],
             opts: dict[str, Any]) -> dict[str, Any]:
    num_parts = opts["num_parts"]
    train = _train_per_part(source, books)
    nodes = [int(sum(b.offsets[p + 1] - b.offsets[p] for b in books.values())) for p in range(num_parts)]
    edges = [sum(s.per_part[p] for s in edge_stats.values()) for p in range(num_parts)]
    cut = sum(s.cut for s in edge_stats.values())
    return {"method": opts["method"], "seed": opts["seed"], "nodes_per_part": nodes, "edges_per_part": edges,
            "edge_cut": cut, "edge_cut_fraction": round(cut / max(sum(edges), 1), 6),
            "node_balance": round(_balance(nodes), 4), "edge_balance": round(_balance(edges), 4),
            "train_nodes_per_part": train, "train_node_balance": round(_balance(train), 4) if sum(train) else None,
            "node_type_balance": {keys[t]: round(_balance([int(b.offsets[p + 1] - b.offsets[p])
                                                           for p in range(num_parts)]), 4)
                                  for t, b in books.items()},
            **opts["details"]}


def _stats(source: GraphSource, edge_stats: dict[Any, EdgeStats]) -> dict[str, Any]:
    touched = {ntype: np.zeros(t.num_nodes, bool) for ntype, t in source.nodes.items()}
    for etype, table in source.edges.items():
        touched[None if etype is None else etype[0]][table.src] = True
        touched[None if etype is None else etype[2]][table.dst] = True
    return {"self_loops": sum(s.self_loops for s in edge_stats.values()),
            "duplicate_edges": sum(s.duplicates for s in edge_stats.values()),
            "isolated_nodes": int(sum(np.count_nonzero(~t) for t in touched.values()))}
