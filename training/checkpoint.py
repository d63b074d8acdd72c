"""Training checkpoints: model, optimizer, epoch (and step within it) and RNG state, written atomically;
resumed at the epoch's end or at the exact step within an epoch."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import numpy as np
import torch

from graphstore.errors import CorruptDatasetError

_LATEST = "latest.json"


def file_name(epoch: int, step: int | None = None) -> str:
    """The checkpoint written after epoch ``epoch`` (0-based), or after ``step`` steps of it."""
    return f"checkpoint-epoch{epoch:04d}.pt" if step is None else f"checkpoint-epoch{epoch:04d}-step{step:07d}.pt"


def save(directory: str, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         extra: dict[str, Any] | None = None, step: int | None = None) -> str:
    """Write ``checkpoint-epoch<N>.pt`` (after epoch N) or, with ``step``, ``checkpoint-epoch<N>-step<S>.pt``
    (the first ``step`` steps of epoch N done), via a temporary name and rename, and point
    ``latest.json`` at it."""
    os.makedirs(directory, exist_ok=True)
    name = file_name(epoch, step)
    path = os.path.join(directory, name)
    state = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
             "extra": extra or {}}
    if step is not None:
        state["step"] = step
    tmp = f"{path}.partial-{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)
    tmp_latest = os.path.join(directory, f"{_LATEST}.partial-{os.getpid()}")
    with open(tmp_latest, "w") as fh:
        json.dump({"epoch": epoch, "step": step, "file": name}, fh)
    os.replace(tmp_latest, os.path.join(directory, _LATEST))
    return path


def load_latest(directory: str) -> dict[str, Any] | None:
    """The newest checkpoint in ``directory`` (``None`` when there is none)."""
    latest = os.path.join(directory, _LATEST)
    if not os.path.exists(latest):
        return None
    with open(latest) as fh:
        pointer = json.load(fh)
    path = os.path.join(directory, pointer["file"])
    try:
        return torch.load(path, map_location="cpu", weights_only=False)  # our own file, written by save()
    except (OSError, RuntimeError, EOFError) as exc:
        raise CorruptDatasetError(f"checkpoint {path} is unreadable ({exc}); delete it or resume from another") from exc


def restore(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """Load ``state`` into ``model``/``optimizer`` and the RNGs; returns the epoch and step to go on at."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rng = state.get("rng", {})
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if "numpy" in rng:
        np.random.set_state(rng["numpy"])
    if "python" in rng:
        random.setstate(rng["python"])
    if state.get("step") is not None:  # written inside an epoch: go on at its next step
        return int(state["epoch"]), int(state["step"])
    return int(state["epoch"]) + 1, 0
