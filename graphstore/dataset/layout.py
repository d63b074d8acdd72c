"""Every key of the on-disk dataset layout, defined once."""

from __future__ import annotations

import re

from graphstore.dataset.types import EdgeType, NodeType

FORMAT_NAME = "graphstore"
FORMAT_VERSION = 1
MANIFEST_ATTR = "graphstore"  # the root group's attribute holding the manifest (the commit marker)
ROOT_METADATA = "zarr.json"  # the root group's Zarr v3 metadata document

HOMOGENEOUS_KEY = "_N"  # key of the single node type (and edge type) of a homogeneous graph
ORIG_ID = "orig_id"  # node attribute: the input ID of every node
INDPTR, INDICES, EID = "indptr", "indices", "eid"  # CSC topology arrays of one edge type
PACKED = "packed"  # optional: int32 (source ID, edge ID) pairs in CSC order, for fast sampling
TOPOLOGY = frozenset({INDPTR, INDICES, EID, PACKED})  # names no edge attribute may take
HALO_IDS = "ids"  # sorted global IDs of a partition's halo nodes of one type
LINK_SPLIT = "link_split"  # edge attribute: 0 train, 1 val, 2 test (ingest --link-split)

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def ingest_claim(name: str) -> str:
    """The claim an ingest holds beside its DEST ``name`` (a sibling, never inside): ``.<name>.ingest-lock``."""
    return f".{name}.ingest-lock"


def part_key(part: int) -> str:
    """The group of partition ``part``: ``part_00003``."""
    return f"part_{part:05d}"


def node_array(part: int, ntype_key: str, attr: str) -> str:
    """An owned-node attribute of partition ``part``: ``part_00000/nodes/<ntype>/<attr>``."""
    return f"{part_key(part)}/nodes/{ntype_key}/{attr}"


def edge_array(part: int, etype_key: str, attr: str) -> str:
    """A CSC array or edge attribute of partition ``part``: ``part_00000/edges/<etype>/<attr>``."""
    return f"{part_key(part)}/edges/{etype_key}/{attr}"


def halo_array(part: int, ntype_key: str, attr: str) -> str:
    """Halo IDs or a replicated halo feature: ``part_00000/halo/<ntype>/<attr>``."""
    return f"{part_key(part)}/halo/{ntype_key}/{attr}"


def chunk_key(path: str, index: int, ndim: int) -> str:
    """The store key of row-chunk ``index`` of the array at ``path`` (Zarr v3 default key encoding)."""
    return "/".join([path, "c", str(index)] + ["0"] * (ndim - 1))


def type_keys(names: list[str]) -> list[str]:
    """Readable, unique, path-safe keys for type names (``paper__cites__paper`` style)."""
    keys: list[str] = []
    for name in names:
        key = _SAFE.sub("_", name).lstrip("_") or "t"
        if key in keys or key == HOMOGENEOUS_KEY:
            key = f"{key}_{len(keys)}"
        keys.append(key)
    return keys


def ntype_name(ntype: NodeType) -> str:
    return HOMOGENEOUS_KEY if ntype is None else ntype


def etype_name(etype: EdgeType) -> str:
    return HOMOGENEOUS_KEY if etype is None else "__".join(etype)


def check_attr_name(name: str, where: str) -> str:
    """Refuse attribute names that cannot be Zarr node names."""
    if not name or "/" in name or name.startswith("__") or name in (".", ".."):
        from graphstore.errors import InvalidInputError

        raise InvalidInputError(
            f"attribute name {name!r} of {where} cannot be stored: names must be non-empty, "
            "contain no '/', and not start with '__'; rename the attribute"
        )
    return name
