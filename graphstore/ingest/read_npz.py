"""Read a graph from an ``.npz`` archive or a directory of ``.npy`` files, memory-mapped where possible."""

from __future__ import annotations

import logging
import os
import pickle
import struct
import zipfile

import numpy as np

from graphstore.errors import InvalidInputError, SourceNotFoundError
from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable
from graphstore.ingest.validate import agreed_node_count

logger = logging.getLogger(__name__)

# named keys and the attribute they become; any other ``node_<a>``/``edge_<a>`` key becomes ``<a>``
NODE_KEYS = {"x": "x", "y": "y", "train_mask": "train_mask", "val_mask": "val_mask", "test_mask": "test_mask",
             "node_time": "time"}
EDGE_KEYS = {"edge_time": "time", "edge_weight": "weight", "edge_attr": "edge_attr"}
ACCEPTED_KEYS = ("edge_index (required), num_nodes, x, y, train_mask, val_mask, test_mask, node_time, "
                 "edge_time, edge_weight, edge_attr, node_<name>, edge_<name>")
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # zip local file header: signature, ..., name and extra lengths
_LOAD_ERRORS = (ValueError, pickle.UnpicklingError, EOFError, OSError)


def read_npz(path: str) -> GraphSource:
    """Read a homogeneous graph from an ``.npz`` file or a directory of ``.npy`` files.

    ``.npy`` files and uncompressed ``.npz`` members (``np.savez``) are memory-mapped, so large
    features are never read into memory; members of ``np.savez_compressed`` archives are loaded
    (save with ``np.savez`` to avoid that). Only ``edge_index`` is copied, into int64 arrays.

    Keys: ``edge_index`` (required, integer, shape ``(2, E)``); ``num_nodes`` (scalar); node
    attributes ``x``, ``y``, ``train_mask``, ``val_mask``, ``test_mask``, ``node_time`` (stored as
    ``time``) and ``node_<name>`` (stored as ``<name>``); edge attributes ``edge_time`` (as
    ``time``), ``edge_weight`` (as ``weight``), ``edge_attr`` and ``edge_<name>`` (as ``<name>``).
    Any other key is an error. Without ``num_nodes`` the node count is the row count of the node
    attributes (which must agree), else ``edge_index.max() + 1``.

    Parameters
    ----------
    path : str
        An ``.npz`` file, or a directory whose ``<key>.npy`` files hold the arrays.

    Returns
    -------
    GraphSource
        Homogeneous, named after the file or directory, with origin ``"npz:<path>"``.

    Raises
    ------
    SourceNotFoundError
        If ``path`` does not exist or a directory holds no ``.npy`` file.
    InvalidInputError
        If a key is unknown or maps onto the same attribute as another, ``edge_index`` is missing
        or not an integer ``(2, E)`` array, ``num_nodes`` is not an integer scalar, an attribute
        is a scalar, node attributes disagree on their row count (without ``num_nodes``), or a file
        is not a valid ``.npz``/``.npy`` (or holds pickled objects).

    Examples
    --------
    >>> import numpy as np
    >>> np.savez("/tmp/tiny.npz", edge_index=np.array([[0, 1], [1, 2]]), x=np.ones((3, 4), "float32"))
    >>> source = read_npz("/tmp/tiny.npz")
    >>> source.nodes[None].num_nodes, sorted(source.nodes[None].attrs)
    (3, ['x'])
    """
    arrays = _open_arrays(path)
    if "edge_index" not in arrays:
        raise InvalidInputError(f"{path!r} has no edge_index; add an integer array of shape (2, E) named edge_index")
    src, dst = _edge_index(arrays.pop("edge_index"), path)
    num_nodes_array = arrays.pop("num_nodes", None)
    node_attrs, edge_attrs, keys = _attributes(arrays, path)
    num_nodes = _num_nodes(num_nodes_array, {keys[n]: int(a.shape[0]) for n, a in node_attrs.items()}, src, dst,
                           path)
    stem = os.path.basename(os.path.normpath(path))
    name = stem[: -len(".npz")] if stem.endswith(".npz") else stem
    logger.info("read %s: %d nodes, %d edges, node attrs %s, edge attrs %s",
                path, num_nodes, len(src), sorted(node_attrs), sorted(edge_attrs))
    return GraphSource(
        nodes={None: NodeTable(num_nodes, node_attrs)},
        edges={None: EdgeTable(src, dst, edge_attrs)},
        name=name,
        origin=f"npz:{path}",
    )


def _attributes(arrays: dict[str, np.ndarray], path: str) -> tuple[dict[str, ArrayRows], dict[str, ArrayRows],
                                                                   dict[str, str]]:
    """Sort the remaining keys into node and edge attributes, refusing unknown keys and clashes; also
    return the key each node attribute came from."""
    attrs: dict[str, dict[str, ArrayRows]] = {"node": {}, "edge": {}}
    keys_of: dict[tuple[str, str], str] = {}
    for key in sorted(arrays):
        target = _target(key)
        if target is None:
            raise InvalidInputError(
                f"unknown key {key!r} in {path!r}; accepted keys: {ACCEPTED_KEYS}; rename or drop it"
            )
        if target in keys_of:
            raise InvalidInputError(
                f"keys {keys_of[target]!r} and {key!r} in {path!r} both name {target[0]} attribute "
                f"{target[1]!r}; drop one of them"
            )
        if arrays[key].ndim == 0:
            raise InvalidInputError(
                f"{key!r} in {path!r} is a scalar; a {target[0]} attribute needs one row per {target[0]}"
            )
        keys_of[target] = key
        attrs[target[0]][target[1]] = ArrayRows(arrays[key])
    return attrs["node"], attrs["edge"], {name: key for (kind, name), key in keys_of.items() if kind == "node"}


def _target(key: str) -> tuple[str, str] | None:
    """``("node" | "edge", attribute name)`` for an attribute key, None for an unknown key."""
    if key in NODE_KEYS:
        return "node", NODE_KEYS[key]
    if key in EDGE_KEYS:
        return "edge", EDGE_KEYS[key]
    for prefix in ("node_", "edge_"):
        if key.startswith(prefix) and len(key) > len(prefix):
            return prefix[:-1], key[len(prefix):]
    return None


def _edge_index(array: np.ndarray, path: str) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` int64 copies of an integer ``(2, E)`` array."""
    if array.ndim != 2 or array.shape[0] != 2 or not np.issubdtype(array.dtype, np.integer):
        hint = " (it looks like (E, 2): save edge_index.T)" if array.ndim == 2 and array.shape[1] == 2 else ""
        raise InvalidInputError(
            f"edge_index in {path!r} has shape {array.shape} and dtype {array.dtype}; "
            f"expected an integer array of shape (2, E){hint}"
        )
    return np.array(array[0], dtype=np.int64), np.array(array[1], dtype=np.int64)


def _num_nodes(array: np.ndarray | None, rows: dict[str, int], src: np.ndarray, dst: np.ndarray, path: str) -> int:
    """The ``num_nodes`` key, else the row count the node attributes agree on, else the largest node ID plus one."""
    if array is not None:
        if array.size != 1 or not np.issubdtype(array.dtype, np.integer):
            raise InvalidInputError(
                f"num_nodes in {path!r} has shape {array.shape} and dtype {array.dtype}; "
                "expected one integer (np.savez(..., num_nodes=np.int64(N)))"
            )
        return int(array.reshape(-1)[0])
    needed = int(max(src.max(), dst.max())) + 1 if len(src) else 0
    if rows:  # keyed by the archive key (node_time, not time): the name the user knows
        return agreed_node_count(repr(path), rows, needed, "or save num_nodes=np.int64(N) in the archive")
    return needed


def _open_arrays(path: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file or ``.npy`` directory, keyed by name, memory-mapped if possible."""
    if os.path.isdir(path):
        return _open_npy_dir(path)
    if not os.path.isfile(path):
        raise SourceNotFoundError(f"{path!r} does not exist; expected an .npz file or a directory of .npy files")
    try:
        with zipfile.ZipFile(path) as archive:
            members = [info for info in archive.infolist() if not info.is_dir()]
    except zipfile.BadZipFile as err:
        raise InvalidInputError(
            f"{path!r} is not an .npz archive ({err}); write it with np.savez(path, edge_index=...)"
        ) from err
    except OSError as err:
        raise SourceNotFoundError(f"cannot read {path!r}: {err}") from err
    arrays = {}
    for info in members:
        key = info.filename[: -len(".npy")] if info.filename.endswith(".npy") else info.filename
        arrays[key] = _open_member(path, info, key)
    return arrays


def _open_npy_dir(path: str) -> dict[str, np.ndarray]:
    """Memory-map each ``<key>.npy`` of a directory; other entries are logged and skipped."""
    arrays = {}
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        if not (entry.endswith(".npy") and os.path.isfile(full)):
            logger.warning("read_npz skips %s: not a .npy file", full)
            continue
        try:
            arrays[entry[: -len(".npy")]] = np.load(full, mmap_mode="r", allow_pickle=False)
        except _LOAD_ERRORS as err:
            raise InvalidInputError(f"cannot load {full!r} as a .npy array: {err}; save it with np.save") from err
    if not arrays:
        raise SourceNotFoundError(f"directory {path!r} holds no .npy file; expected edge_index.npy and attribute files")
    return arrays


def _open_member(path: str, info: zipfile.ZipInfo, key: str) -> np.ndarray:
    """One ``.npz`` member: memory-mapped when stored uncompressed, else loaded into memory."""
    try:
        if info.compress_type == zipfile.ZIP_STORED:
            mapped = _map_stored_member(path, info)
            if mapped is not None:
                return mapped
        logger.info("read_npz loads %r of %s into memory (compressed); np.savez keeps it memory-mappable", key, path)
        with np.load(path, allow_pickle=False) as archive:
            return archive[key]
    except _LOAD_ERRORS as err:
        raise InvalidInputError(f"cannot load {key!r} of {path!r} as an array: {err}; save it with np.savez") from err


def _map_stored_member(path: str, info: zipfile.ZipInfo) -> np.ndarray | None:
    """Memory-map an uncompressed ``.npy`` member in place; None if its header version is unusual."""
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        signature, name_len, extra_len = _LOCAL_HEADER.unpack(fh.read(_LOCAL_HEADER.size))
        if signature != b"PK\x03\x04":
            raise ValueError(f"bad zip local header for {info.filename}")
        fh.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            return None
        offset = fh.tell()
    if dtype.hasobject:
        raise ValueError("it holds pickled Python objects")
    if int(np.prod(shape)) == 0:
        return np.empty(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
