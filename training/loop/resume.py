"""What a resumed job must share with the checkpoint it resumes (its identity), and what may change."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from training.loop import checkpoint
from training.loop.checkpoint import CheckpointMismatchError

if TYPE_CHECKING:
    from graphstore.dataset.opened import Dataset
    from training.config import TrainConfig

# field -> the flag that sets it (None: the dataset decides), in the order a mismatch is reported
FIXED = {"dataset": None, "task": "--task", "target": "--target", "edge_type": "--edge-type", "model": "--model",
         "hidden": "--hidden", "fanout": "--fanout", "feature_width": None, "batch_size": "--batch-size",
         "neg_sampling": "--neg-sampling", "time_attr": "--time-attr", "loss": "--loss"}
CHANGEABLE = {"lr": "--lr", "epochs": "--epochs"}  # applied on resume, and said once


def identity(c: TrainConfig, ds: Dataset, world_size: int) -> dict[str, Any]:
    """The job's identity, stored in each checkpoint: the dataset (by content, wherever it lies), the task and
    its types, the model's shape, batching, and ``world_size`` (a mid-epoch checkpoint's steps depend on it).

    Examples
    --------
    >>> identity(config, graphstore.open_dataset("ds"), world_size=2)["hidden"]  # doctest: +SKIP
    128
    """
    return {"dataset": dataset_identity(ds), "task": c.task, "target": _target(c, ds), "edge_type": _edge_type(c, ds),
            "model": c.model, "hidden": c.hidden, "fanout": list(c.fanout), "feature_width": _widths(ds),
            "batch_size": c.batch_size, "neg_sampling": c.neg_sampling if c.task == "link" else None,
            "time_attr": c.time_attr, "loss": getattr(c, "loss", None), "world_size": int(world_size), "lr": c.lr,
            "epochs": c.epochs}


def dataset_identity(ds: Dataset) -> dict[str, Any]:
    """Name, creation stamp and a digest of the manifest as ingest wrote it (every chunk's checksum: another
    dataset of the same shape differs; a copy elsewhere, or one with ``--infer-out`` outputs added, does not)."""
    m = ds.manifest
    doc = json.dumps(m.without_outputs().to_json(), sort_keys=True, default=str).encode()
    return {"name": m.name, "created": m.provenance.get("created"), "digest": hashlib.sha256(doc).hexdigest()[:16],
            "url": ds.url}


def _target(c: TrainConfig, ds: Dataset) -> str | None:
    if c.task != "node" or not ds.is_hetero:
        return None
    labelled = [t.name for t in ds.manifest.node_types if {"y", "train_mask"} <= set(t.attrs)]
    return c.target if c.target is not None else (labelled[0] if labelled else None)


def _edge_type(c: TrainConfig, ds: Dataset) -> list[str] | None:
    if c.task != "link" or not ds.is_hetero:
        return None
    name = ds.manifest.edge_type(c.edge_type).name if c.edge_type else ds.manifest.edge_types[0].name
    return list(name) if name is not None else None


def _widths(ds: Dataset) -> dict[str, int]:
    """Feature width per node type with ``x`` (the model's input layer)."""
    return {t.key: int(np.prod(t.attrs["x"].shape, dtype=np.int64)) for t in ds.manifest.node_types if "x" in t.attrs}


def compare(path: str, state: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """Refuse (:class:`CheckpointMismatchError`, one line naming ``path``, the field, the stored and the given
    value) a job that differs from the one that wrote ``state``; otherwise the lines to say once: changed
    ``--lr``/``--epochs``, another rank count, a checkpoint from before identities were stored."""
    stored = state.get("identity") or {}
    if not stored:
        return [f"--resume: checkpoint {path} was written without its job's identity (an older graphstore): the "
                "dataset, model and flags are not compared"]
    for field, flag in FIXED.items():
        if field in stored and _plain(stored[field]) != _plain(given.get(field)):
            raise CheckpointMismatchError(_mismatch(path, field, flag, stored[field], given.get(field)))
    said = _world(path, state, stored.get("world_size"), given["world_size"])
    first, _ = checkpoint.next_position(state)
    if first >= given["epochs"]:
        raise CheckpointMismatchError(
            f"--resume: checkpoint {path} has finished epoch {first} and --epochs is {given['epochs']}: nothing is "
            f"left to train; give --epochs {first + 1} or more to train on, or a new --checkpoint-dir to start over")
    for field, flag in CHANGEABLE.items():
        if field in stored and stored[field] != given[field]:
            said.append(f"--resume: {flag} {given[field]} applies from epoch {first + 1} on (checkpoint {path} was "
                        f"written with {flag} {stored[field]})")
    return said


def _plain(value: Any) -> Any:
    """A value as JSON holds it (tuples as lists), so stored and given compare alike; a dataset by its content,
    not where it lies."""
    if isinstance(value, dict) and "digest" in value:
        value = {k: v for k, v in value.items() if k != "url"}
    return json.loads(json.dumps(value, default=str))


def _mismatch(path: str, field: str, flag: str | None, stored: Any, given: Any) -> str:
    head = f"--resume: checkpoint {path} belongs to another job"
    if field == "dataset":
        was, now = (f"{d.get('name')!r} created {d.get('created')} (digest {d.get('digest')}, at {d.get('url')})"
                    for d in (stored, given))
        return (f"{head}: dataset {was} there, {now} now; resume on the dataset it was trained on, or give a new "
                "--checkpoint-dir to start over")
    if flag is None:  # the feature width: the dataset's, not a flag
        return (f"{head}: feature_width {stored} there, {given} now (the dataset's features changed); resume on the "
                "dataset it was trained on, or give a new --checkpoint-dir to start over")
    shown = {"fanout": lambda v: ",".join(map(str, v)), "edge_type": lambda v: ",".join(v) if v else v}
    was, now = (shown.get(field, lambda v: v)(v) for v in (stored, given))
    again = f"give {flag} {was} as before" if was is not None else f"drop {flag}"
    return f"{head}: {field} {was} there, {now} now; {again}, or a new --checkpoint-dir to start over"


def _world(path: str, state: dict[str, Any], stored: int | None, given: int) -> list[str]:
    """A mid-epoch checkpoint resumes on as many ranks as wrote it (its step counts that epoch's batches as
    they were dealt); an epoch's end on any number, said once."""
    if stored is None or stored == given:
        return []
    if state.get("step") is not None:
        raise CheckpointMismatchError(
            f"--resume: checkpoint {path} was written at step {state['step']} of epoch {int(state['epoch']) + 1} by "
            f"{stored} ranks, and the job now has {given}; a resume inside an epoch needs the same ranks: give "
            f"--nproc {stored} (or as many ranks under torchrun/srun), or a new --checkpoint-dir")
    return [f"--resume: {given} ranks go on from checkpoint {path}, written by {stored}: each epoch's batches are "
            "dealt anew"]
