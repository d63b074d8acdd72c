"""Distributed GNN training over graphstore datasets (process groups, loops, launcher)."""

from __future__ import annotations

from training.trainer import TrainConfig, Trainer
from training.world import World

__all__ = ["TrainConfig", "Trainer", "World"]
