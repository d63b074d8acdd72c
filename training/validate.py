"""Check a training job at the door, before any rank starts: numbers, output paths, the dataset, the task."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from graphstore.errors import InvalidInputError
from training.config import TrainConfig, check_config

if TYPE_CHECKING:
    from graphstore.dataset import Dataset

__all__ = ["check_config", "check_dataset", "check_outputs"]


def check_outputs(c: TrainConfig) -> None:
    """``--checkpoint-dir`` and ``--metrics-out`` can be written: found now, not after an epoch."""
    if c.checkpoint_dir:
        _writable_dir("--checkpoint-dir", c.checkpoint_dir)
    if c.metrics_out:
        path = os.path.abspath(os.path.expanduser(c.metrics_out))
        if os.path.isdir(path):
            raise InvalidInputError(f"--metrics-out {c.metrics_out} is a directory; give a file path")
        _writable_dir("--metrics-out", os.path.dirname(path), creates=False)
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise InvalidInputError(f"--metrics-out {c.metrics_out}: the file cannot be written (permissions)")


def _writable_dir(flag: str, directory: str, creates: bool = True) -> None:
    path = os.path.abspath(os.path.expanduser(directory))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or (existing == path and not os.path.isdir(path)):
        raise InvalidInputError(f"{flag} {directory}: {existing} is a file, not a directory; give another path")
    if existing != path and not creates:
        raise InvalidInputError(f"{flag}: the directory {path} does not exist; create it or give another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{flag} {directory}: {existing} cannot be written (permission denied); "
                                "give a directory you can write")


def check_dataset(c: TrainConfig, ds: Dataset) -> None:
    """The dataset can serve this job: chunk files present and whole, the task's labels or edges there."""
    ds.check_chunk_files()
    if c.task == "link":
        info = ds.manifest.edge_type(c.edge_type) if c.edge_type else ds.manifest.edge_types[0]
        if info.num_edges == 0:
            with_edges = [t.name for t in ds.manifest.edge_types if t.num_edges]
            raise InvalidInputError(f"--task link: edge type {info.name!r} has no edges; pick one with edges "
                                    f"(--edge-type, one of {with_edges})")
        return
    labelled = [t for t in ds.manifest.node_types if {"y", "train_mask"} <= set(t.attrs)]
    if c.target is not None:
        if not any(t.name == c.target for t in labelled):
            raise InvalidInputError(f"--target {c.target!r} has no y/train_mask; node types with labels: "
                                    f"{[t.name for t in labelled]}")
        labelled = [t for t in labelled if t.name == c.target]
    elif not labelled:
        raise InvalidInputError(f"{ds.url} has no node type with y and train_mask to classify (--task node)")
    for info in labelled:
        dtype = np.dtype(info.attrs["y"].dtype)
        if dtype.kind not in "iu":
            raise InvalidInputError(f"{ds.url}: labels y of {info.name or 'the nodes'} are {dtype}, not integer "
                                    "class IDs; re-ingest them as integers (y.astype(np.int64))")
        if np.dtype(info.attrs["train_mask"].dtype) != np.bool_:
            raise InvalidInputError(f"{ds.url}: train_mask of {info.name or 'the nodes'} is "
                                    f"{info.attrs['train_mask'].dtype}, not bool; re-ingest it as bool")
