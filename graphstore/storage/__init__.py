"""Where a dataset's bytes live and how they are read: local disk and object storage (locations), the
chunk cache of remote datasets, retries, memory-mapped chunk files, integrity checks and I/O counters.

The names most callers need are imported on first use, so ``import graphstore.storage.location`` (the
ingest does) loads nothing it does not name.
"""

from __future__ import annotations

from graphstore.exports import exports

_LAZY = {"open_location": "graphstore.storage.local", "is_dataset": "graphstore.storage.local",
         "FileSlot": "graphstore.storage.local", "local_error": "graphstore.storage.local",
         "LocalLocation": "graphstore.storage.local", "LocationWrapper": "graphstore.storage.local",
         "Location": "graphstore.storage.location", "RemoteLocation": "graphstore.storage.remote",
         "CacheConfig": "graphstore.storage.cache", "RetryPolicy": "graphstore.storage.retry"}

__all__ = sorted(_LAZY)

__getattr__ = exports(globals(), _LAZY)
