"""graphstore: partitioned Zarr graph datasets for distributed GNN training."""

from __future__ import annotations

__version__ = "0.1.0"

from graphstore.dataset import Dataset, open_dataset  # noqa: E402
from graphstore.ingest import ingest  # noqa: E402
from graphstore.linksplit import LinkSplit  # noqa: E402
from graphstore.outputs import OutputWriter  # noqa: E402
from graphstore.retry import RetryPolicy  # noqa: E402

__all__ = ["Dataset", "LinkSplit", "OutputWriter", "RetryPolicy", "__version__", "ingest", "open_dataset"]
