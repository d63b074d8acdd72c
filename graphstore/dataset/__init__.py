"""A dataset as readers see it: the on-disk layout and manifest, the opened :class:`Dataset`, the PyG
stores over one partition (``stores``) or the whole dataset on one machine (``whole``), link splits, and
the row gather across partitions.

``Dataset`` and ``open_dataset`` are imported on first use: the ingest reads ``layout`` and ``manifest``
without loading zarr's readers, torch or PyG.
"""

from __future__ import annotations

from graphstore.exports import exports

_LAZY = {"Dataset": "graphstore.dataset.opened", "open_dataset": "graphstore.dataset.opened",
         "read_manifest": "graphstore.dataset.opened", "Manifest": "graphstore.dataset.manifest",
         "LinkSplit": "graphstore.dataset.linksplit"}

__all__ = sorted(_LAZY)

__getattr__ = exports(globals(), _LAZY)
