"""graphstore: partitioned Zarr graph datasets for distributed GNN training.

The public names are imported on first use (PEP 562), so a process that only ingests (a Dask
worker, the ``graphstore ingest`` CLI) never loads torch or PyG, which the stores need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from graphstore.ingest import ingest  # no torch: the function, not the subpackage, is graphstore.ingest
from graphstore.jitcache import drop_stale
from graphstore.linksplit import LinkSplit
from graphstore.retry import RetryPolicy
from graphstore.version import __version__

drop_stale()  # before any kernel is loaded from numba's cache (kernels load at their first call, not import)

if TYPE_CHECKING:  # pragma: no cover
    from graphstore.dataset import Dataset, open_dataset
    from graphstore.outputs import OutputWriter

_LAZY = {"Dataset": "graphstore.dataset", "open_dataset": "graphstore.dataset", "OutputWriter": "graphstore.outputs"}

__all__ = ["Dataset", "LinkSplit", "OutputWriter", "RetryPolicy", "__version__", "ingest", "open_dataset"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'graphstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
