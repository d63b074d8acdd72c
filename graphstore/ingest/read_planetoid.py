"""Read a Planetoid citation dataset (Cora, CiteSeer, PubMed) from its raw ``ind.<name>.*`` files."""

from __future__ import annotations

import importlib.util
import logging
import os
import pickle

from graphstore.errors import InvalidInputError, SourceNotFoundError
from graphstore.ingest.read_pyg import from_pyg
from graphstore.ingest.source import GraphSource

logger = logging.getLogger(__name__)

# the eight files of one dataset, ``ind.<name>.<suffix>``; longest first so ``test.index`` wins
PLANETOID_SUFFIXES = ("test.index", "allx", "ally", "graph", "tx", "ty", "x", "y")
_EXPECTED = "ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}"
# what a corrupt or foreign pickle raises while PyG decodes it
_DECODE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError, TypeError, AttributeError)


def read_planetoid(directory: str) -> GraphSource:
    """Read the raw Planetoid files in ``directory`` with the public train/val/test split.

    The dataset name is inferred from the file names. Parsing is PyG's
    ``torch_geometric.io.read_planetoid_data`` (it handles CiteSeer's isolated test nodes).

    .. warning:: Planetoid files are Python pickles: reading them can run arbitrary code. Only
       read files from a source you trust (e.g. the official Planetoid repository).

    Parameters
    ----------
    directory : str
        A directory holding exactly one dataset's eight files ``ind.<name>.{x,tx,allx,y,ty,ally,
        graph,test.index}`` (the ``raw`` directory of PyG's ``Planetoid`` dataset).

    Returns
    -------
    GraphSource
        Homogeneous; node attributes ``x`` (float32), ``y`` (int64), ``train_mask``, ``val_mask``,
        ``test_mask`` (bool); edges as in PyG (both directions, no self-loops or duplicates).
        ``name`` is the dataset name, ``origin`` is ``"planetoid:<directory>"``.

    Raises
    ------
    SourceNotFoundError
        If ``directory`` does not exist, holds no Planetoid file, or lacks some of the eight files.
    InvalidInputError
        If files of several datasets are present, or the files cannot be decoded.
    ImportError
        If scipy (needed to unpickle the sparse feature matrices) is not installed.

    Examples
    --------
    >>> source = read_planetoid("data/planetoid/Cora/raw")  # doctest: +SKIP
    >>> source.name, source.nodes[None].num_nodes, source.edges[None].num_edges  # doctest: +SKIP
    ('cora', 2708, 10556)
    """
    name = _dataset_name(directory)
    if importlib.util.find_spec("scipy") is None:
        raise ImportError("read_planetoid needs scipy to unpickle Planetoid's sparse matrices: pip install scipy")
    try:
        from torch_geometric.io import read_planetoid_data
    except ImportError as err:  # pragma: no cover - the venv has it
        raise ImportError("read_planetoid needs PyTorch Geometric: pip install torch_geometric") from err
    try:
        data = read_planetoid_data(directory, name)
    except _DECODE_ERRORS as err:
        raise InvalidInputError(
            f"cannot decode the Planetoid files ind.{name}.* in {directory!r}: {type(err).__name__}: {err}; "
            "re-download them from the Planetoid repository"
        ) from err
    except OSError as err:
        raise SourceNotFoundError(f"cannot read the Planetoid files ind.{name}.* in {directory!r}: {err}") from err
    source = from_pyg(data)
    source.name, source.origin = name, f"planetoid:{directory}"
    logger.info(
        "read Planetoid %r from %s: %d nodes, %d edges",
        name, directory, source.nodes[None].num_nodes, source.edges[None].num_edges,
    )
    return source


def _dataset_name(directory: str) -> str:
    """The one ``<name>`` of the ``ind.<name>.*`` files in ``directory``, all eight present."""
    if not os.path.isdir(directory):
        raise SourceNotFoundError(
            f"Planetoid directory {directory!r} does not exist; expected a directory of {_EXPECTED} files"
        )
    names = sorted({n for n in map(_name_of, os.listdir(directory)) if n is not None})
    if not names:
        raise SourceNotFoundError(f"no Planetoid files in {directory!r}; expected {_EXPECTED}")
    if len(names) > 1:
        raise InvalidInputError(
            f"{directory!r} holds files of several Planetoid datasets {names}; "
            "move each dataset's files into its own directory"
        )
    name = names[0]
    files = [f"ind.{name}.{suffix}" for suffix in PLANETOID_SUFFIXES]
    missing = [f for f in files if not os.path.isfile(os.path.join(directory, f))]
    if missing:
        raise SourceNotFoundError(
            f"Planetoid dataset {name!r} in {directory!r} lacks {', '.join(sorted(missing))}; "
            f"all eight files {_EXPECTED} are needed: download the missing ones"
        )
    if name != name.lower():
        raise InvalidInputError(
            f"Planetoid files ind.{name}.* must have a lower-case name (PyG opens ind.{name.lower()}.*); rename them"
        )
    return name


def _name_of(filename: str) -> str | None:
    """``cora`` for ``ind.cora.allx``; None for a file that is not a Planetoid file."""
    if not filename.startswith("ind."):
        return None
    rest = filename[len("ind."):]
    for suffix in PLANETOID_SUFFIXES:
        if rest.endswith("." + suffix) and len(rest) > len(suffix) + 1:
            return rest[: -len(suffix) - 1]
    return None
