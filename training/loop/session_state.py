"""A session's checkpoints: the script's state with every loader's position and every rank's random state,
written atomically by rank 0 and read back by every rank."""

from __future__ import annotations

import errno
import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from graphstore.errors import CorruptDatasetError, InvalidInputError

FORMAT = "graphstore.session-checkpoint/1"


def _random_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_random_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(session: Any, state: dict[str, Any], path: str) -> str:
    """Rank 0 writes ``state`` with the loaders' positions and every rank's random state to ``path``
    (a temporary name, then a rename); every rank returns once it is there."""
    if not isinstance(state, dict):
        raise InvalidInputError(f"Session.save: state must be a dict (e.g. {{'model': model.state_dict()}}), got "
                                f"{type(state).__name__}")
    path = os.fspath(path)
    randoms: list[Any] = [None] * session.world_size
    dist.all_gather_object(randoms, _random_state(), group=session.cpu_group)
    failed = ""
    if session.rank == 0:
        doc = {"format": FORMAT, "dataset": session.dataset.url, "world_size": session.world_size,
               "loaders": [loader.state() for loader in session.loaders], "random": randoms, "state": state}
        failed = _write(doc, path)
    said = [failed]
    dist.broadcast_object_list(said, src=0, group=session.cpu_group)  # rank 0's outcome, to every rank
    if said[0]:
        raise InvalidInputError(said[0])
    return path


def _write(doc: dict[str, Any], path: str) -> str:
    """Write ``doc`` to ``path`` atomically; ``""``, or one line saying why it could not be written."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.partial-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        torch.save(doc, tmp)
        os.replace(tmp, path)
        return ""
    except (OSError, RuntimeError) as exc:
        try:
            os.remove(tmp)
        except OSError:
            pass
        code = getattr(exc, "errno", None)
        why = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only",
               errno.EACCES: "permission denied", errno.EDQUOT: "the disk quota is exceeded"}.get(
            code, "no space left on the device" if "No space left" in str(exc) else str(exc).splitlines()[0])
        return f"Session.save: cannot write checkpoint {path}: {why}; nothing was written (free space or give another path)"


def load_checkpoint(session: Any, path: str) -> dict[str, Any]:
    """The script's state from ``path``; the session's loaders (and those made later) go on at their
    saved positions, and this rank's random state is the one it saved."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidInputError(f"Session.load: no checkpoint at {path}: give the path Session.save wrote")
    try:
        doc = torch.load(path, map_location="cpu", weights_only=False)  # a file our save() wrote: trusted input
    except Exception as exc:
        raise CorruptDatasetError(f"Session.load: {path} is not a readable checkpoint ({type(exc).__name__}); give "
                                  "a file Session.save wrote") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InvalidInputError(f"Session.load: {path} is not a checkpoint Session.save wrote (no {FORMAT!r} "
                                "format mark)")
    if doc["dataset"] != session.dataset.url:
        raise InvalidInputError(f"Session.load: {path} was written training {doc['dataset']}, not "
                                f"{session.dataset.url}: resume on the dataset it was written for")
    positions = list(doc["loaders"])
    for loader in session.loaders:
        if loader.index < len(positions):
            loader.restore(positions[loader.index])
    session._positions = positions
    if doc["world_size"] == session.world_size:
        _set_random_state(doc["random"][session.rank])
    return doc["state"]
