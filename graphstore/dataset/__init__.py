"""A dataset as readers see it: the on-disk layout and manifest, the opened :class:`Dataset`, the PyG
stores over one partition (``stores``) or the whole dataset on one machine (``whole``), link splits, and
the row gather across partitions.

``Dataset`` and ``open_dataset`` are imported on first use: the ingest reads ``layout`` and ``manifest``
without loading zarr's readers, torch or PyG.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"Dataset": "opened", "open_dataset": "opened", "read_manifest": "opened", "Manifest": "manifest",
         "LinkSplit": "linksplit"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'graphstore.dataset' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"graphstore.dataset.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
