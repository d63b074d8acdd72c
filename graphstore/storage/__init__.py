"""Where a dataset's bytes live and how they are read: local disk and object storage (locations), the
chunk cache of remote datasets, retries, memory-mapped chunk files, integrity checks and I/O counters.

The names most callers need are imported on first use, so ``import graphstore.storage.location`` (the
ingest does) loads nothing it does not name.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"open_location": "local", "is_dataset": "local", "FileSlot": "local", "local_error": "local", "LocalLocation": "local", "LocationWrapper": "local",
         "Location": "location", "RemoteLocation": "remote", "CacheConfig": "cache", "RetryPolicy": "retry"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'graphstore.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"graphstore.storage.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
