"""The dataset manifest: its schema, JSON (de)serialisation and validation of what a reader finds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from graphstore.dataset import layout
from graphstore.errors import CorruptDatasetError, FormatVersionError, UnknownAttributeError
from graphstore.dataset.types import EdgeType, NodeType


@dataclass(frozen=True)
class AttrSchema:
    """One named per-node or per-edge array: dtype and the shape of one row."""

    dtype: str
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class ArrayInfo:
    """One stored Zarr array: its full shape, dtype, rows per chunk, codec and per-chunk checksums."""

    shape: tuple[int, ...]
    dtype: str
    chunk_rows: int
    compression: str
    checksums: tuple[str, ...]

    @property
    def num_chunks(self) -> int:
        return len(self.checksums)


@dataclass(frozen=True)
class NodeTypeInfo:
    """A node type: its name (``None`` when homogeneous), key, counts and the range partition book."""

    name: NodeType
    key: str
    num_nodes: int
    offsets: tuple[int, ...]  # partition p owns global IDs [offsets[p], offsets[p+1])
    attrs: dict[str, AttrSchema]
    halo_attrs: tuple[str, ...] = ()  # attributes replicated for halo nodes


@dataclass(frozen=True)
class EdgeTypeInfo:
    """An edge type ``(src, rel, dst)`` (``None`` when homogeneous): key, counts, attributes."""

    name: EdgeType
    key: str
    src: str  # node type keys
    dst: str
    num_edges: int
    edges_per_part: tuple[int, ...]
    attrs: dict[str, AttrSchema]


@dataclass(frozen=True)
class OutputInfo:
    """A node attribute added to the dataset after ingest (e.g. inference embeddings): name, when, what."""

    name: str
    node_type: NodeType
    created: str  # UTC ISO time of the commit
    description: str = ""


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to know about a dataset; stored last, as the commit marker."""

    name: str
    num_parts: int
    node_types: tuple[NodeTypeInfo, ...]
    edge_types: tuple[EdgeTypeInfo, ...]
    arrays: dict[str, ArrayInfo]
    partitioning: dict[str, Any] = field(default_factory=dict)
    splits: dict[str, dict[str, int]] = field(default_factory=dict)
    link_splits: dict[str, dict[str, Any]] = field(default_factory=dict)  # edge type key -> rule and counts
    stats: dict[str, Any] = field(default_factory=dict)
    storage: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    outputs: tuple[OutputInfo, ...] = ()  # derived node attributes, in commit order
    format_version: int = layout.FORMAT_VERSION

    @property
    def is_hetero(self) -> bool:
        return self.node_types[0].name is not None

    def node_type(self, ntype: NodeType) -> NodeTypeInfo:
        for info in self.node_types:
            if info.name == ntype:
                return info
        known = [info.name for info in self.node_types]
        raise UnknownAttributeError(f"node type {ntype!r} is not in dataset {self.name!r}; it has {known}")

    def edge_type(self, etype: EdgeType) -> EdgeTypeInfo:
        etype = tuple(etype) if isinstance(etype, list) else etype
        for info in self.edge_types:
            if info.name == etype or (etype is not None and info.name is not None and _matches(info.name, etype)):
                return info
        known = [info.name for info in self.edge_types]
        raise UnknownAttributeError(f"edge type {etype!r} is not in dataset {self.name!r}; it has {known}")

    def link_split(self, etype: EdgeType) -> dict[str, Any] | None:
        """The stored link split of ``etype`` (rule and counts; edge attribute ``link_split``), or ``None``."""
        return self.link_splits.get(self.edge_type(etype).key)

    def without_outputs(self) -> Manifest:
        """The manifest as ingest wrote it: the derived attributes of ``outputs`` and their arrays left out."""
        if not self.outputs:
            return self
        derived = {(out.node_type, out.name) for out in self.outputs}
        paths = {layout.node_array(p, t.key, name) for t in self.node_types for name in t.attrs
                 if (t.name, name) in derived for p in range(self.num_parts)}
        ntypes = tuple(replace(t, attrs={k: v for k, v in t.attrs.items() if (t.name, k) not in derived})
                       for t in self.node_types)
        arrays = {path: info for path, info in self.arrays.items() if path not in paths}
        return replace(self, node_types=ntypes, arrays=arrays, outputs=())

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["format"] = layout.FORMAT_NAME
        return out

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Manifest:
        """Parse and check a manifest read from ``where``; refuse unknown versions and damage."""
        if not isinstance(doc, dict) or doc.get("format") != layout.FORMAT_NAME:
            raise CorruptDatasetError(f"{where}: the manifest is not a graphstore manifest")
        version = doc.get("format_version")
        if version != layout.FORMAT_VERSION:
            raise FormatVersionError(
                f"{where} is in graphstore format version {version!r}; this graphstore reads version "
                f"{layout.FORMAT_VERSION}. Install the graphstore release that wrote it, or re-ingest."
            )
        try:
            return _parse(doc)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptDatasetError(f"{where}: the manifest is malformed ({exc!r}); re-ingest the dataset") from exc


def _matches(name: tuple[str, str, str], etype: tuple[str, ...]) -> bool:
    # PyG lets users name an edge type by its relation alone when that is unambiguous
    return len(etype) == 1 and name[1] == etype[0]


def _schemas(doc: dict[str, Any]) -> dict[str, AttrSchema]:
    return {k: AttrSchema(v["dtype"], tuple(v["shape"])) for k, v in doc.items()}


def _parse(doc: dict[str, Any]) -> Manifest:
    ntypes = tuple(
        NodeTypeInfo(n["name"], n["key"], int(n["num_nodes"]), tuple(n["offsets"]), _schemas(n["attrs"]),
                     tuple(n.get("halo_attrs", ())))
        for n in doc["node_types"]
    )
    etypes = tuple(
        EdgeTypeInfo(tuple(e["name"]) if e["name"] is not None else None, e["key"], e["src"], e["dst"],
                     int(e["num_edges"]), tuple(e["edges_per_part"]), _schemas(e["attrs"]))
        for e in doc["edge_types"]
    )
    arrays = {
        path: ArrayInfo(tuple(a["shape"]), a["dtype"], int(a["chunk_rows"]), a["compression"], tuple(a["checksums"]))
        for path, a in doc["arrays"].items()
    }
    for info in arrays.values():
        np.dtype(info.dtype)  # raises TypeError on garbage
    outputs = tuple(OutputInfo(o["name"], o["node_type"], o["created"], o.get("description", ""))
                    for o in doc.get("outputs", ()))  # absent in manifests written before outputs existed
    keys = ("partitioning", "splits", "link_splits", "stats", "storage", "provenance")
    return Manifest(doc["name"], int(doc["num_parts"]), ntypes, etypes, arrays,
                    **{k: doc.get(k, {}) for k in keys}, outputs=outputs, format_version=doc["format_version"])
