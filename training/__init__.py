"""Distributed GNN training over graphstore datasets: the session a training script holds, the CLI trainer,
and the launchers."""

from __future__ import annotations

from graphstore.exports import exports

__all__ = ["Session", "TrainConfig", "Trainer", "World"]

# imported on first use: the launchers, which only start and watch ranks, need not import PyG
_LAZY = {"Session": "training.loop.session", "TrainConfig": "training.config", "Trainer": "training.loop.trainer",
         "World": "training.cluster.world"}

__getattr__ = exports(globals(), _LAZY)
