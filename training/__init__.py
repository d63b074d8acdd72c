"""Distributed GNN training over graphstore datasets (process groups, loops, launcher)."""

from __future__ import annotations

from graphstore.moved import exports

__all__ = ["TrainConfig", "Trainer", "World"]

# imported on first use: the launcher, which only starts and watches ranks, need not import the trainer (PyG)
_LAZY = {"TrainConfig": "training.config", "Trainer": "training.trainer", "World": "training.world"}

__getattr__ = exports(globals(), _LAZY)
