"""``graphstore.ingest``: read → validate → partition → write every array → commit the manifest."""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from graphstore.dataset import layout
from graphstore.errors import GraphstoreError, IngestStageError, InvalidInputError
from graphstore.ingest.budget import Budget
from graphstore.ingest.chunks import ChunkedSource
from graphstore.ingest.claim import Claim, claimed
from graphstore.ingest.commit import build_manifest, halos_of
from graphstore.ingest.dest import check_unchanged, inspect_dest
from graphstore.ingest.edge_stage import WriteSpec, run_edge_stages
from graphstore.ingest.engine import Engine, engine_for
from graphstore.ingest.link_stage import add_link_split
from graphstore.ingest.node_stage import NodePlan, read_node_chunk, run_node_stages
from graphstore.ingest.partition import METIS_MAX_EDGES, partition_graph
from graphstore.ingest.relabel import relabel
from graphstore.ingest.scratch import scratch_dir
from graphstore.ingest.sources import as_chunked, reads_in_chunks, resolve_chunked, resolve_source
from graphstore.ingest.validate import (check_finite_rows, check_options, read_edge_block, validate_chunked,
                                        validate_source)
from graphstore.ingest.chunk_writer import ArrayWriter
from graphstore.dataset.linksplit import LinkSplit, check_fractions
from graphstore.storage.local import LocalLocation, Location, local_error, open_location

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
           client: Any = None, parents: bool = False) -> IngestSummary:
    """Partition a graph and write it to ``dest`` as a graphstore dataset (Zarr v3).

    ``data`` is a SOURCE string (``planetoid:DIR``, ``ogb:DIR``, ``npz:PATH``, ``parquet:DIR``,
    ``synthetic:...``), a PyG ``Data``/``HeteroData``, a :class:`GraphSource` or a :class:`ChunkedSource`.
    ``dest`` is a local/NFS path or any fsspec URL (``s3://bucket/name`` with ``storage_options``).
    Everything is validated before anything is deleted. Every stage (partition, route and write edges,
    route and write node rows) runs over bounded chunks; ``engine="dask"`` runs them as tasks on
    ``client`` (a ``distributed.Client``), whose workers must all reach ``dest``, and ``"local"`` runs the
    same stage functions in this process. Task sizes follow the memory budget of the engine (a
    worker's ``memory_limit``, or what this machine has available).
    On a local file system nothing at ``dest`` is touched until the new dataset is complete: it is
    written beside ``dest`` and renamed into place after its manifest. Object storage has no rename:
    the dataset is written in place, manifest last; replacing one first deletes its manifest (so it
    stops opening), then its arrays, so a failed overwrite there leaves no valid dataset.

    One ingest writes a DEST at a time: each takes a claim beside DEST (``.<name>.ingest-lock``) before it
    reads the source, refuses a DEST another live ingest claims (naming it), clears the claim of a dead
    one on this machine, and commits only if its claim and DEST are as they were. A local DEST's parent
    directory must exist unless ``parents`` (a mistyped mount path must not fill the root disk).

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
    state = inspect_dest(location, overwrite, data, parents)
    plan = IngestPlan(num_parts=num_parts, method=method, seed=seed, compression=compression, allow_nan=allow_nan,
                      chunk_bytes=int(chunk_mb * (1 << 20)), metis_max_edges=metis_max_edges, progress=progress,
                      started=started, engine=runner)
    if parents and location.local_root is not None:
        _on_disk(LocalLocation(location.local_root), "creating its parent directories",
                 lambda: os.makedirs(os.path.dirname(location.local_root or ""), exist_ok=True))
    try:
        with claimed(location) as claim:
            plan = replace(plan, commit=_Commit(location, claim, state.fingerprint))
            plan.commit.check()  # nothing changed between the checks and the claim
            source = _open_source(data, to_undirected, num_parts)
            try:
                summary = _ingest_source(source, location, state.replacing, halo_features, rule, plan)
            finally:
                source.close()
    except (OSError, IngestStageError) as exc:
        raise _named(location, exc) from exc
    return IngestSummary(**{**summary.to_json(), "dest": location.url, "seconds": time.perf_counter() - started})


@dataclass(frozen=True)
class IngestPlan:
    """What one ingest was asked for, checked at the door, and what it settled before writing (the claim's
    commit check, the halo attributes, the link splits, the engine's memory budget): handed down whole."""

    num_parts: int
    method: str
    seed: int
    compression: str
    allow_nan: bool
    chunk_bytes: int
    metis_max_edges: int | None
    progress: Progress | None
    started: float
    engine: Engine
    commit: _Commit | None = None
    replicate: dict[Any, tuple[str, ...]] = field(default_factory=dict)
    link_splits: dict[Any, dict[str, Any]] = field(default_factory=dict)
    budget: Budget | None = None


@dataclass(frozen=True)
class _Commit:
    """What must still hold when an ingest commits: its claim on DEST, and DEST as it was checked."""

    location: Location
    claim: Claim | None
    seen: str  # DEST's fingerprint when it was checked

    def check(self, dest_too: bool = True) -> None:
        if self.claim is not None:
            self.claim.check()
        if dest_too:
            check_unchanged(self.location, self.seen)


def _ingest_source(source: ChunkedSource, location: Location, replacing: bool, halo_features: Any,
                   rule: LinkSplit | None, plan: IngestPlan) -> IngestSummary:
    plan = replace(plan, replicate=_halo_attrs(source, halo_features), budget=plan.engine.budget(),
                   link_splits=add_link_split(source, rule, plan.engine) if rule is not None else {})
    if location.local_root is not None:  # a directory here: stage beside it, then rename
        return _ingest_staged(source, LocalLocation(location.local_root), plan)
    return _ingest_in_place(source, location, replacing, plan)


def _named(location: Location, exc: BaseException) -> BaseException:
    """An operating-system error of the write path (a scratch file, a Dask task's) as one line naming DEST.

    Graphstore errors pass as they are, and so does an error about a file elsewhere (the SOURCE's).
    """
    cause = exc.__cause__ if isinstance(exc, IngestStageError) else exc
    if not isinstance(cause, OSError) or isinstance(cause, GraphstoreError):
        return exc
    beside = os.path.dirname(location.local_root or "") + os.sep  # DEST and its staging directory
    if location.local_root is not None and cause.filename and not os.fspath(cause.filename).startswith(beside):
        return exc
    error = location.storage_error(cause, "writing the dataset")
    return local_error(f"DEST {location.url}", "writing the dataset", cause) if error is cause else error


def _open_source(data: Any, to_undirected: bool | None, num_parts: int) -> ChunkedSource:
    """The SOURCE as chunks, checked at the door: a graph read whole is checked whole (every array), a
    chunked one by what it declares (its chunks are checked as they are read)."""
    if reads_in_chunks(data):
        source = copy.copy(resolve_chunked(data, to_undirected=to_undirected))  # never the caller's object
    else:
        graph = resolve_source(data, to_undirected=to_undirected)
        try:
            validate_source(graph, num_parts)
        except BaseException:
            graph.close()
            raise
        source = as_chunked(graph)
    try:
        validate_chunked(source, num_parts)
    except BaseException:
        source.close()
        raise
    return source


def _ingest_staged(source: ChunkedSource, location: LocalLocation, plan: IngestPlan) -> IngestSummary:
    """Write into a hidden sibling directory, then rename it into place: DEST is never half-written."""
    staged = _on_disk(location, "creating a staging directory beside it", location.staging)
    try:
        summary = _write_dataset(source, staged, plan)
        _on_disk(location, "checking DEST before the commit", plan.commit.check)
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
        raise local_error(f"DEST {location.root}", action, exc, "nothing was changed at DEST") from exc


def _ingest_in_place(source: ChunkedSource, location: Location, replacing: bool,
                     plan: IngestPlan) -> IngestSummary:
    """Object storage: write where the dataset lives (no rename there), the manifest last.

    Input values are checked before the old dataset is deleted, which happens only after
    partitioning, right before the first write: manifest first (it stops opening), then the rest.
    """
    if replacing:  # bad input is otherwise found while writing, after the old dataset is gone
        items = [("nodes", c) for c in source.node_chunks] + [("edges", c) for c in source.edge_chunks]
        plan.engine.map("check", _check_chunk, items, plan.progress, None, allow_nan=plan.allow_nan,
                        plan=NodePlan({}, dict(source.node_schema), {}), num_nodes=dict(source.num_nodes))

    writing = []

    def clear() -> None:
        plan.commit.check()  # the last look before anything at DEST is deleted or written
        writing.append(True)
        if replacing:
            logger.info("deleting the dataset at %s: its manifest first, then its arrays", location.url)
            location.remove_key(layout.ROOT_METADATA)
            location.remove()

    try:
        return _write_dataset(source, location, plan, prepare=clear)
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


def _check_chunk(item: tuple[str, Any], *, allow_nan: bool, plan: NodePlan, num_nodes: dict[Any, int]) -> None:
    """Stage ``check``: one node or edge chunk read and checked as the writing stages would (IDs in range,
    row counts, dtypes, NaN/inf unless ``allow_nan``), before an in-place overwrite deletes anything."""
    kind, chunk = item
    if kind == "nodes":
        rows, where = read_node_chunk(chunk, plan), plan.where(chunk.ntype)
    else:
        s_type, d_type = (None, None) if chunk.etype is None else (chunk.etype[0], chunk.etype[2])
        rows = read_edge_block(chunk, num_nodes[s_type], num_nodes[d_type]).attrs
        where = "the edges" if chunk.etype is None else f"edge type {chunk.etype!r}"
    for name, values in rows.items() if not allow_nan else ():
        check_finite_rows(where, name, values, chunk.start)


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


def _halo_attrs(source: ChunkedSource, spec: tuple[str, ...] | str) -> dict[Any, tuple[str, ...]]:
    names = tuple(n for n in spec.split(",") if n) if isinstance(spec, str) else tuple(spec)
    out = {}
    for ntype in source.num_nodes:
        attrs = source.node_schema.get(ntype, {})
        if names == ("all",):
            out[ntype] = tuple(n for n in attrs if not n.endswith("_mask"))
        else:
            out[ntype] = tuple(n for n in names if n in attrs)
    missing = [n for n in names if n != "all" and not any(n in source.node_schema.get(t, {}) for t in source.num_nodes)]
    if missing:
        raise InvalidInputError(f"--halo-features names {missing}, which no node type has; use attribute names or 'all'")
    return out


def _write_dataset(source: ChunkedSource, staged: Location, plan: IngestPlan,
                   prepare: Callable[[], None] | None = None) -> IngestSummary:
    num_parts, method, seed, engine, budget = plan.num_parts, plan.method, plan.seed, plan.engine, plan.budget
    compression, chunk_bytes, progress, started = plan.compression, plan.chunk_bytes, plan.progress, plan.started
    keys = _type_keys(source)
    logger.info("partitioning %s into %d parts by %s on the %s engine", source.name, num_parts, method, engine.name)
    train = _train_flags(engine, source, progress) if method == "metis" and num_parts > 1 else {}
    reuse = method == "metis" and num_parts > 1 and prepare is None  # in place, DEST is cleared before writing
    # creating the root group clears the folder: before the first scratch file when staged, after prepare in place
    writer = ArrayWriter(staged, compression=compression, chunk_bytes=chunk_bytes) if prepare is None else None
    with scratch_dir(staged) as first:
        assign, details = partition_graph(source, num_parts, method, seed, engine=engine, scratch=first,
                                          budget=budget, train=train, progress=progress,
                                          metis_max_edges=plan.metis_max_edges, keep_ends=reuse)
        if reuse:
            first.keep_only("ends")  # the edge chunks' endpoints, read again by the route stage
        else:
            first.clear()  # in place, DEST must hold nothing of this ingest's at its last check (prepare)
        del train
        logger.info("partitioned after %.1f s; writing into %s", time.perf_counter() - started, staged.url)
        if prepare is not None:
            prepare()
            writer = ArrayWriter(staged, compression=compression, chunk_bytes=chunk_bytes)
        spec = WriteSpec(staged, compression, chunk_bytes, plan.allow_nan)
        with scratch_dir(staged) as scratch:
            # the books' per-node maps go to files the tasks read; the client keeps each type's offsets only
            books = {t: relabel(assign.pop(t), num_parts).stored(scratch, keys[t]) for t in list(assign)}
            edges = run_edge_stages(engine, source, scratch=scratch, books=books, keys=keys, spec=spec,
                                    block_edges=budget.route_block_edges, progress=progress,
                                    saved=first if reuse else None)
            first.remove("ends")
            logger.info("wrote edges after %.1f s", time.perf_counter() - started)
            node_plan = NodePlan({t: keys[t] for t in source.num_nodes}, dict(source.node_schema), plan.replicate)
            nodes = run_node_stages(engine, source, scratch=scratch, books=books, plan=node_plan,
                                    halos=halos_of(source, books, edges), spec=spec, progress=progress)
            logger.info("wrote node attributes after %.1f s", time.perf_counter() - started)
    manifest, written = build_manifest(source, books, keys, edges, nodes, plan.replicate, dict(
        method=method, seed=seed, num_parts=num_parts, compression=compression, chunk_bytes=chunk_bytes,
        started=started, details=details, link_splits=plan.link_splits))
    plan.commit.check(dest_too=False)  # in place, DEST holds this ingest's arrays: only the claim can be checked
    writer.commit(manifest.to_json())
    q = manifest.partitioning
    return IngestSummary(dest=staged.url, num_parts=num_parts, method=method, nodes_per_part=q["nodes_per_part"],
                         edges_per_part=q["edges_per_part"], edge_cut=q["edge_cut"],
                         edge_cut_fraction=q["edge_cut_fraction"], node_balance=q["node_balance"],
                         edge_balance=q["edge_balance"], bytes_written=writer.bytes_written + written[0], seconds=0.0,
                         checksums_read_back=writer.read_back + written[1], link_splits=manifest.link_splits,
                         train_nodes_per_part=q["train_nodes_per_part"], train_node_balance=q["train_node_balance"],
                         node_type_balance=q["node_type_balance"], rebalanced_nodes=q.get("rebalanced_nodes", 0))


def _train_flags(engine: Engine, source: ChunkedSource, progress: Progress | None) -> dict[Any, np.ndarray]:
    """``train_mask`` of every node type that has one (what METIS balances), read chunk by chunk."""
    typed = {t for t, schema in source.node_schema.items() if "train_mask" in schema}
    chunks = sorted((c for c in source.node_chunks if c.ntype in typed), key=lambda c: c.start)
    plan = NodePlan({}, dict(source.node_schema), {})
    found = engine.map("train-mask", _train_chunk, chunks, progress, [c.stop - c.start for c in chunks], plan=plan)
    out = {t: np.zeros(source.num_nodes[t], bool) for t in typed}
    for chunk, bits in zip(chunks, found):
        out[chunk.ntype][chunk.start: chunk.stop] = np.unpackbits(bits, count=chunk.stop - chunk.start).astype(bool)
    return out


def _train_chunk(chunk: Any, *, plan: NodePlan) -> np.ndarray:
    """Stage ``train-mask``: one node chunk's ``train_mask``, packed 8 nodes a byte."""
    return np.packbits(read_node_chunk(chunk, plan, ["train_mask"])["train_mask"])


def _type_keys(source: ChunkedSource) -> dict[Any, str]:
    if not source.is_hetero:
        return {None: layout.HOMOGENEOUS_KEY}
    ntypes, etypes = list(source.num_nodes), list(source.num_edges)
    out: dict[Any, str] = dict(zip(ntypes, layout.type_keys([str(t) for t in ntypes])))
    out.update(zip(etypes, layout.type_keys(["__".join(e) for e in etypes])))
    return out
