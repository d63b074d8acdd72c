"""graphstore: partitioned Zarr graph datasets for distributed GNN training."""

from __future__ import annotations

from graphstore.dataset import Dataset, open_dataset
from graphstore.ingest import ingest
from graphstore.linksplit import LinkSplit
from graphstore.outputs import OutputWriter
from graphstore.retry import RetryPolicy
from graphstore.version import __version__

__all__ = ["Dataset", "LinkSplit", "OutputWriter", "RetryPolicy", "__version__", "ingest", "open_dataset"]
