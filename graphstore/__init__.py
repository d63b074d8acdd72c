"""graphstore: partitioned Zarr graph datasets for distributed GNN training.

The public names are imported on first use (PEP 562), so a process that only ingests (a Dask
worker, the ``graphstore ingest`` CLI) never loads torch or PyG, which the stores need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphstore.exports import exports

# no torch below: graphstore.ingest is the function here, not the subpackage
from graphstore.ingest import ingest
from graphstore.jitcache import drop_stale
from graphstore.dataset.linksplit import LinkSplit
from graphstore.storage.retry import RetryPolicy
from graphstore.version import VERSION

__version__ = VERSION

drop_stale()  # before any kernel is loaded from numba's cache (kernels load at their first call, not import)

if TYPE_CHECKING:  # pragma: no cover
    from graphstore.dataset.opened import Dataset, open_dataset
    from graphstore.outputs.writer import OutputWriter

_LAZY = {"Dataset": "graphstore.dataset.opened", "open_dataset": "graphstore.dataset.opened",
         "OutputWriter": "graphstore.outputs.writer"}

__all__ = ["Dataset", "LinkSplit", "OutputWriter", "RetryPolicy", "__version__", "ingest", "open_dataset"]

__getattr__ = exports(globals(), _LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
