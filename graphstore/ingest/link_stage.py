"""The link split as an edge attribute of a chunked source: computed inside each chunk, or by time.

A random split is a pure function of an edge's two input node IDs and the seed, so each chunk adds
it as it is read (on whichever worker reads it). A time split needs the global quantiles of the
time attribute and each pair's earliest time: the split edge type's ``src``, ``dst`` and time
columns are gathered to the client (24 bytes per edge of that type), split there, and each chunk
then carries its slice of the result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphstore.dataset import layout
from graphstore.errors import InvalidInputError
from graphstore.ingest.chunks import ChunkedSource, ColumnSchema, EdgeBlock, EdgeChunk
from graphstore.ingest.engine import Engine
from graphstore.dataset.linksplit import LinkSplit, assign, check_edge_type, counts

logger = logging.getLogger(__name__)


@dataclass
class LinkSplitChunk:
    """An edge chunk with the edge attribute ``link_split`` added: its slice of a precomputed split, or
    the random split of its own edges."""

    inner: EdgeChunk
    rule: LinkSplit
    symmetric: bool
    split: np.ndarray | None = None

    @property
    def etype(self) -> Any:
        return self.inner.etype

    @property
    def start(self) -> int:
        return self.inner.start

    @property
    def stop(self) -> int:
        return self.inner.stop

    def read(self) -> EdgeBlock:
        block = self.inner.read()
        values = self.split if self.split is not None else \
            assign(block.src, block.dst, None, self.rule, self.symmetric)[0]
        block.attrs = {**block.attrs, layout.LINK_SPLIT: values}
        return block


def _columns(chunk: EdgeChunk, *, time_attr: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stage ``link-split``: one chunk's input-ID endpoints and times (for a time split)."""
    block = chunk.read()
    return (np.asarray(block.src, np.int64), np.asarray(block.dst, np.int64),
            np.asarray(block.attrs[time_attr], np.float64).reshape(len(block.src)))


def add_link_split(source: ChunkedSource, rule: LinkSplit, engine: Engine) -> dict[Any, dict[str, Any]]:
    """Add the edge attribute ``link_split`` to the edge type ``rule`` splits; return its manifest record
    (a random split's counts are added when the edges are written: :func:`finish_record`)."""
    table_attrs = {et: list(source.edge_schema.get(et, {})) for et in source.num_edges}
    etype = check_edge_type(rule, list(source.num_edges), dict(source.num_edges), table_attrs, "link split")
    if layout.LINK_SPLIT in table_attrs[etype]:
        raise InvalidInputError(f"edge type {etype!r} already has an attribute {layout.LINK_SPLIT!r}; rename it or "
                                "drop --link-split")
    symmetric = etype is None or etype[0] == etype[2]
    mine = sorted((c for c in source.edge_chunks if c.etype == etype), key=lambda c: c.start)
    decided: dict[str, Any] = {}
    if rule.by == "random":
        wrapped = {id(c): LinkSplitChunk(c, rule, symmetric) for c in mine}
    else:
        logger.info("time split of %r: gathering its endpoints and times (24 bytes per edge) to the client", etype)
        cols = engine.map("link-split", _columns, mine, None, [c.stop - c.start for c in mine],
                          time_attr=rule.time_attr)
        split, decided = assign(*(np.concatenate([c[k] for c in cols]) for k in range(3)), rule, symmetric)
        wrapped = {id(c): LinkSplitChunk(c, rule, symmetric, split[c.start: c.stop]) for c in mine}
        decided = {**decided, **counts(split)}
    source.edge_chunks = [wrapped.get(id(c), c) for c in source.edge_chunks]  # new containers: a caller's
    source.edge_schema = {**source.edge_schema,  # ChunkedSource keeps its own (see pipeline._open_source)
                          etype: {**source.edge_schema.get(etype, {}), layout.LINK_SPLIT: ColumnSchema("|i1")}}
    return {etype: {"attr": layout.LINK_SPLIT, **rule.describe(), **decided}}


def finish_record(record: dict[str, Any], found: np.ndarray) -> dict[str, Any]:
    """The record with the train/val/test edge counts found while writing (checked against a time split's)."""
    written = {"train": int(found[0]), "val": int(found[1]), "test": int(found[2])}
    if "train" in record and {k: record[k] for k in written} != written:
        raise InvalidInputError(f"link split counts changed while writing: {record} vs {written}; the source "
                                "returned different edges on a second read")
    logger.info("link split: %s", {**record, **written})
    return {**record, **written}
