"""What a run adds to a dataset or draws from it: derived per-node arrays (``writer``: inference
outputs) and pictures (``plots``: curves of a run's metrics, a dataset's partitions)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "OutputWriter":
        from graphstore.outputs.writer import OutputWriter

        return OutputWriter
    raise AttributeError(f"module 'graphstore.outputs' has no attribute {name!r}")
