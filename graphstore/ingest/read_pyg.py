"""Turn an in-memory PyG ``Data`` or ``HeteroData`` object into a :class:`GraphSource`."""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from graphstore.errors import InvalidInputError
from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable
from graphstore.ingest.validate import SPLIT_MASKS, agreed_node_count

if TYPE_CHECKING:
    from torch_geometric.data import Data, HeteroData

logger = logging.getLogger(__name__)

# keys that describe structure, never attributes
_STRUCTURE_KEYS = frozenset({"edge_index", "num_nodes", "adj", "adj_t"})
_NODE_NAMES = frozenset({"x", "y", *SPLIT_MASKS})  # node attributes by name, whatever their row count


def from_pyg(data: Data | HeteroData) -> GraphSource:
    """Describe a PyG graph as a :class:`GraphSource`, keeping PyG's attribute names.

    Node attributes are every node-level array of a node store (``x``, ``y``, masks, ...), edge
    attributes every edge-level array of an edge store except ``edge_index``. Arrays are wrapped
    as they are (no copy of features); only ``edge_index`` is copied into int64 arrays.

    Parameters
    ----------
    data : torch_geometric.data.Data or torch_geometric.data.HeteroData
        The graph. Edges must be given as COO ``edge_index`` tensors of shape ``(2, E)``.

    Returns
    -------
    GraphSource
        Homogeneous (types ``None``) for ``Data``; typed node and edge tables for ``HeteroData``.

    Raises
    ------
    InvalidInputError
        If ``data`` is neither ``Data`` nor ``HeteroData``, an edge store has no ``edge_index``
        (or only a sparse ``adj_t``), ``edge_index`` is not an integer ``(2, E)`` array, or the
        number of nodes of a type cannot be inferred.
    ImportError
        If PyTorch Geometric is not installed.

    Examples
    --------
    >>> import torch
    >>> from torch_geometric.data import Data
    >>> data = Data(x=torch.rand(3, 4), edge_index=torch.tensor([[0, 1], [1, 2]]))
    >>> source = from_pyg(data)
    >>> source.nodes[None].num_nodes, source.edges[None].num_edges
    (3, 2)
    """
    try:
        from torch_geometric.data import Data, HeteroData
    except ImportError as err:  # pragma: no cover - the venv has it
        raise ImportError("from_pyg needs PyTorch Geometric: pip install torch_geometric") from err
    with warnings.catch_warnings():  # PyG warns when it infers num_nodes; we decide ourselves
        warnings.simplefilter("ignore", UserWarning)
        if isinstance(data, HeteroData):
            return _from_hetero(data)
        if isinstance(data, Data):
            return _from_data(data)
    raise InvalidInputError(
        f"from_pyg got a {type(data).__name__}; it reads torch_geometric.data.Data or HeteroData "
        "objects: build one with Data(x=..., edge_index=...)"
    )


def _from_data(data: Data) -> GraphSource:
    """Homogeneous ``Data``: one store holding node and edge attributes side by side."""
    src, dst = _edge_index(data, "data")
    node_attrs: dict[str, ArrayRows] = {}
    edge_attrs: dict[str, ArrayRows] = {}
    for key, value in data.items():
        if key in _STRUCTURE_KEYS or not _is_array(value, f"data.{key}"):
            continue
        if _is_node_attr(data, key):
            node_attrs[key] = _rows(value, f"data.{key}")
        elif data.is_edge_attr(key):
            edge_attrs[key] = _rows(value, f"data.{key}")
        else:
            _skip(f"data.{key}", value)
    needed = int(max(src.max(), dst.max())) + 1 if len(src) else 0
    num_nodes = _node_count(data, node_attrs, "data", "data", needed, "data.num_nodes = N")
    return GraphSource(
        nodes={None: NodeTable(num_nodes, node_attrs)},
        edges={None: EdgeTable(src, dst, edge_attrs)},
        origin="pyg:Data",
    )


def _from_hetero(data: HeteroData) -> GraphSource:
    """``HeteroData``: one node table per node type, one edge table per edge type."""
    nodes: dict[str | None, NodeTable] = {}
    for node_type in data.node_types:
        store = data[node_type]
        where = f"data[{node_type!r}]"
        attrs = _store_attrs(store, where, lambda key, store=store: _is_node_attr(store, key))
        count = _node_count(store, attrs, where, f"node type {node_type!r}", 0, f"{where}.num_nodes = N")
        nodes[node_type] = NodeTable(count, attrs)
    edges: dict[tuple[str, str, str] | None, EdgeTable] = {}
    for edge_type in data.edge_types:
        missing = [t for t in (edge_type[0], edge_type[2]) if t not in nodes]
        if missing:
            raise InvalidInputError(
                f"edge type {edge_type!r} connects node type(s) {missing} that have no node store; "
                f"set data[{missing[0]!r}].num_nodes (and its features) before calling from_pyg"
            )
        store = data[edge_type]
        where = f"data[{edge_type!r}]"
        src, dst = _edge_index(store, where)
        edges[edge_type] = EdgeTable(src, dst, _store_attrs(store, where, store.is_edge_attr))
    return GraphSource(nodes=nodes, edges=edges, origin="pyg:HeteroData")


def _store_attrs(store: Any, where: str, belongs: Any) -> dict[str, ArrayRows]:
    """The arrays of one typed store for which ``belongs(key)`` holds; others are logged and skipped."""
    attrs: dict[str, ArrayRows] = {}
    for key, value in store.items():
        if key in _STRUCTURE_KEYS or not _is_array(value, f"{where}.{key}"):
            continue
        if belongs(key):
            attrs[key] = _rows(value, f"{where}.{key}")
        else:
            _skip(f"{where}.{key}", value)
    return attrs


def _edge_index(store: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` int64 copies of the store's ``edge_index``, or an error saying what to set."""
    if "edge_index" not in store:
        if "adj_t" in store or "adj" in store:
            raise InvalidInputError(
                f"{where} holds a sparse adjacency ('adj_t'/'adj') and no edge_index; graphstore "
                "reads COO edges: convert it to an edge_index of shape (2, E), e.g. "
                "`edge_index, _ = torch_geometric.utils.to_edge_index(adj_t.t())`"
            )
        raise InvalidInputError(f"{where} has no edge_index; set {where}.edge_index to an int64 tensor of shape (2, E)")
    value = store["edge_index"]
    if not _is_array(value, f"{where}.edge_index"):
        raise InvalidInputError(f"{where}.edge_index is a {type(value).__name__}; expected an int64 tensor (2, E)")
    array = _to_numpy(value, f"{where}.edge_index")
    if array.ndim != 2 or array.shape[0] != 2 or not np.issubdtype(array.dtype, np.integer):
        raise InvalidInputError(
            f"{where}.edge_index has shape {tuple(array.shape)} and dtype {array.dtype}; expected an "
            "integer array of shape (2, E) (transpose an (E, 2) array with .t())"
        )
    return array[0].astype(np.int64), array[1].astype(np.int64)


def _is_node_attr(store: Any, key: str) -> bool:
    """Well-known node attributes (``x``, ``y``, split masks) always, whatever their row count (PyG decides
    by size, so a short ``y`` would be skipped or taken for an edge attribute); else PyG's rule."""
    return key in _NODE_NAMES or (not store.is_edge_attr(key) and store.is_node_attr(key))


def _node_count(store: Any, attrs: dict[str, ArrayRows], where: str, what: str, needed: int, fix: str) -> int:
    """``num_nodes`` when set, else the row count every node attribute agrees on (naming any that does not)."""
    if "num_nodes" in store or not attrs:
        return _num_nodes(store.num_nodes, what, fix)
    rows = {f"{where}.{key}": int(rows.shape[0]) for key, rows in attrs.items()}
    return agreed_node_count(where, rows, needed, f"or set {fix}")


def _num_nodes(value: Any, what: str, fix: str) -> int:
    """PyG's inferred node count as an int, or an error naming ``what`` and how to set it."""
    if value is None:
        raise InvalidInputError(f"cannot infer the number of nodes of {what}: it has no node-level tensor; set {fix}")
    return int(value)


def _is_array(value: Any, where: str) -> bool:
    """True for dense tensors and numpy arrays; sparse tensors are an error, other values are skipped."""
    if isinstance(value, np.ndarray):
        return True
    layout = getattr(value, "layout", None)
    if layout is not None and hasattr(value, "to_dense"):
        import torch

        if layout != torch.strided:
            raise InvalidInputError(f"{where} is a sparse tensor ({layout}); densify it with .to_dense() first")
        return True
    if value is not None:
        logger.debug("from_pyg skips %s: a %s, not an array", where, type(value).__name__)
    return False


def _to_numpy(value: Any, where: str) -> np.ndarray:
    """A numpy view of a tensor or array; dtypes numpy lacks (bfloat16) are an error."""
    if isinstance(value, np.ndarray):
        return value
    try:
        return value.detach().cpu().numpy()
    except (TypeError, RuntimeError) as err:
        raise InvalidInputError(
            f"{where} has dtype {value.dtype}, which numpy cannot hold; cast it (e.g. .float())"
        ) from err


def _rows(value: Any, where: str) -> ArrayRows:
    """Wrap one node or edge attribute as a row source (no copy for CPU tensors)."""
    return ArrayRows(_to_numpy(value, where))


def _skip(where: str, value: Any) -> None:
    logger.warning(
        "from_pyg skips %s (shape %s): it is neither node-level nor edge-level", where, tuple(value.shape)
    )
