"""Distributed GNN training over graphstore datasets (process groups, loops, launcher)."""

from __future__ import annotations

from typing import Any

__all__ = ["TrainConfig", "Trainer", "World"]

# imported on first use: the launcher, which only starts and watches ranks, need not import the trainer (PyG)
_WHERE = {"TrainConfig": "training.config", "Trainer": "training.trainer", "World": "training.world"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'training' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
