"""Training checkpoints: model, optimizer, epoch (and step within it), RNG state and the job's identity,
written atomically; read back only from files of our own, named by a pointer that stays in the directory."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import logging
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported where a checkpoint is written or read: the launcher only claims its folder
    import torch

from graphstore.errors import (CorruptDatasetError, GraphstoreError, InvalidInputError, StorageError,
                               StoragePermissionError)
from graphstore.ingest.claim import Claim, Holder
from graphstore.storage.local import FileSlot

logger = logging.getLogger(__name__)

FORMAT = "graphstore-checkpoint"
VERSION = 1
_LATEST = "latest.json"
_PK = b"PK\x03\x04"  # torch.save's zip container
_KEYS = {"epoch", "model", "optimizer"}  # every checkpoint save() ever wrote has them


class NotACheckpointError(InvalidInputError):
    """A file in ``--checkpoint-dir`` (or the pointer to one) that is no checkpoint graphstore wrote."""


class CheckpointMismatchError(InvalidInputError):
    """``--resume`` with a job that differs from the one that wrote the checkpoint."""


def file_name(epoch: int, step: int | None = None) -> str:
    """The checkpoint written after epoch ``epoch`` (0-based), or after ``step`` steps of it."""
    return f"checkpoint-epoch{epoch:04d}.pt" if step is None else f"checkpoint-epoch{epoch:04d}-step{step:07d}.pt"


def save(directory: str, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         extra: dict[str, Any] | None = None, step: int | None = None,
         identity: dict[str, Any] | None = None) -> str:
    """Write ``checkpoint-epoch<N>.pt`` (after epoch N) or, with ``step``, ``checkpoint-epoch<N>-step<S>.pt``
    (the first ``step`` steps of epoch N done), then point ``latest.json`` at it; ``identity`` is the job's
    (:func:`training.loop.resume.identity`), compared when a job resumes.

    Each file is written whole under a temporary name, synced and renamed: a failure (a full disk, a
    read-only file system) raises a one-line :class:`StorageError` naming it and leaves no partial file,
    and ``latest.json`` still names the previous checkpoint.

    Examples
    --------
    >>> save("/tmp/ck", 0, model, optimizer, identity=ident)  # doctest: +SKIP
    '/tmp/ck/checkpoint-epoch0000.pt'
    """
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise write_error(directory, directory, exc) from exc
    import torch

    name = file_name(epoch, step)
    state = {"format": FORMAT, "version": VERSION, "epoch": epoch, "model": model.state_dict(),
             "optimizer": optimizer.state_dict(),
             "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
             "extra": extra or {}, "identity": identity or {}}
    if step is not None:
        state["step"] = step
    buffer = io.BytesIO()  # serialised first: torch.save on a full disk fails as "unexpected pos", not ENOSPC
    torch.save(state, buffer)
    write_atomic(directory, name, buffer.getbuffer())
    pointer = {"format": FORMAT, "version": VERSION, "epoch": epoch, "step": step, "file": name}
    write_atomic(directory, _LATEST, json.dumps(pointer).encode())
    return os.path.join(directory, name)


def write_atomic(directory: str, name: str, data: bytes | memoryview) -> None:
    """``directory/name`` holding ``data``, or unchanged: written as ``name.partial-<pid>``, synced, renamed."""
    path = os.path.join(directory, name)
    tmp = f"{path}.partial-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise write_error(directory, name, exc) from exc


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view, done = memoryview(data).cast("B"), 0
    while done < len(view):
        done += os.write(fd, view[done:])


def write_error(directory: str, name: str, exc: OSError) -> StorageError | StoragePermissionError:
    """``exc`` (writing ``name`` into the checkpoint directory) as one line: what happened, where, the fix."""
    where = f"--checkpoint-dir {directory}: writing {os.path.basename(name) or name} failed"
    mount = _mount_point(directory)
    code = errno.errorcode.get(exc.errno or 0, "")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "no space left on the device" if exc.errno == errno.ENOSPC else "the disk quota is used up"
        return StorageError(f"{where}: {what} at {mount} ({code}); no partial file was left and the previous "
                            "checkpoint is intact: free space there, or give a --checkpoint-dir on another disk")
    if exc.errno == errno.EROFS:
        return StorageError(f"{where}: {mount} is a read-only file system ({code}); give a --checkpoint-dir on a "
                            "writable one")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StoragePermissionError(f"{where}: permission denied ({code}); give a --checkpoint-dir you can write, "
                                      "or fix its permissions")
    return StorageError(f"{where}: {exc.strerror or exc}{f' ({code})' if code else ''}; check the disk, or give "
                        "another --checkpoint-dir")


def _mount_point(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.ismount(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def latest_path(directory: str) -> str | None:
    """The checkpoint ``latest.json`` names (``None`` without a pointer). Refuses a pointer that does not
    parse, or that names anything but a file of this directory (another directory, ``..``, a link out)."""
    folder = os.path.abspath(os.path.expanduser(directory))
    pointer = os.path.join(folder, _LATEST)
    if not os.path.lexists(pointer):
        return None
    try:
        with open(pointer, "rb") as fh:
            name = json.loads(fh.read(1 << 16))["file"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NotACheckpointError(f"--resume: {pointer} is unreadable ({type(exc).__name__}); restore it, or delete "
                                  "it to start at epoch 1") from exc
    fix = "restore it, or delete latest.json to start at epoch 1"
    if not isinstance(name, str) or not name or name in (".", "..") or os.path.basename(name) != name or \
            "\0" in name or (os.altsep and os.altsep in name):
        raise NotACheckpointError(f"--resume: {pointer} names {name!r}, not a file of {folder} (a checkpoint "
                                  f"pointer names a file beside it); {fix}")
    path = os.path.join(folder, name)
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(folder):
        raise NotACheckpointError(f"--resume: {pointer} names {name!r}, a link to {os.path.realpath(path)} outside "
                                  f"{folder}; {fix}")
    if not os.path.isfile(path):
        raise NotACheckpointError(f"--resume: {pointer} names checkpoint {name!r}, which is not in {folder}; {fix}")
    return path


def sniff(path: str) -> None:
    """Refuse ``path`` unless it begins as a PyTorch file does (4 bytes read: garbage is caught cheaply)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise CorruptDatasetError(f"--resume: checkpoint {path} cannot be read ({exc.strerror or exc}); check its "
                                  f"permissions, or delete it (and {_LATEST}) to start at epoch 1") from exc
    if head != _PK:
        raise NotACheckpointError(f"--resume: {path} is not a checkpoint graphstore wrote (not a PyTorch file); "
                                  f"{_FIX}")


_FIX = f"delete it (and {_LATEST}) to start at epoch 1, or give the --checkpoint-dir of the job that wrote it"


def read(path: str) -> dict[str, Any]:
    """The state in checkpoint ``path``, refused in one line unless graphstore's ``save`` wrote it. Read with
    ``weights_only``: tensors, numbers, strings and numpy arrays only, so a foreign file runs no code."""
    import torch

    sniff(path)
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise NotACheckpointError(f"--resume: {path} is not a checkpoint graphstore wrote (it holds Python objects "
                                  f"a checkpoint never does); {_FIX}") from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise CorruptDatasetError(f"--resume: checkpoint {path} is unreadable ({first}): truncated or damaged; "
                                  f"delete it (and {_LATEST}) to start at epoch 1") from exc
    if not isinstance(state, dict) or not _KEYS <= set(state) or state.get("format", FORMAT) != FORMAT:
        raise NotACheckpointError(f"--resume: {path} is a PyTorch file but not a graphstore checkpoint (no epoch, "
                                  f"model and optimizer); {_FIX}")
    return state


def _numpy_globals() -> list[Any]:
    """What the numpy RNG state and numpy scalars in the history pickle as (nothing that runs code)."""
    core = getattr(np, "_core", None) or np.core
    dtypes = [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]  # dtype classes: data only
    return [np.ndarray, np.dtype, core.multiarray._reconstruct, core.multiarray.scalar, *dtypes]


def load_latest(directory: str) -> dict[str, Any] | None:
    """The newest checkpoint in ``directory`` (``None`` when there is none), through :func:`latest_path`
    and :func:`read`."""
    path = latest_path(directory)
    return None if path is None else read(path)


def restore(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            lr: float | None = None) -> tuple[int, int]:
    """Load ``state`` into ``model``/``optimizer`` and the RNGs, with learning rate ``lr`` when given (a
    resumed job's ``--lr``); returns the epoch and step to go on at."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    rng = state.get("rng", {})
    if "torch" in rng:
        import torch

        torch.set_rng_state(rng["torch"])
    if "numpy" in rng:
        np.random.set_state(rng["numpy"])
    if "python" in rng:
        random.setstate(rng["python"])
    return next_position(state)


def next_position(state: dict[str, Any]) -> tuple[int, int]:
    """The epoch (0-based) and step a job resumed from ``state`` goes on at."""
    if state.get("step") is not None:  # written inside an epoch: go on at its next step
        return int(state["epoch"]), int(state["step"])
    return int(state["epoch"]) + 1, 0


_CLAIM = ".graphstore-train.claim"  # inside the checkpoint directory; one job writes there at a time


class CheckpointDirClaimedError(GraphstoreError, FileExistsError):
    """Another job holds the claim on the ``--checkpoint-dir`` this one was given."""


@contextlib.contextmanager
def claimed(directory: str | None) -> Iterator[Claim | None]:
    """Hold the claim on checkpoint directory ``directory`` for the ``with`` block (``None``: no directory),
    as ingest claims its DEST (:mod:`graphstore.ingest.claim`): a second job is refused naming the first; the
    claim of a dead job on this machine is taken over. A directory made for the claim is removed with it
    when the job wrote nothing there.

    Examples
    --------
    >>> with claimed("/tmp/ck"):  # doctest: +SKIP
    ...     run_the_job()
    """
    if directory is None:
        yield None
        return
    folder = os.path.abspath(os.path.expanduser(directory))
    made = []  # the folders made for the claim, deepest first: removed with it when the job left them empty
    missing = folder
    while not os.path.isdir(missing) and os.path.dirname(missing) != missing:
        made.append(missing)
        missing = os.path.dirname(missing)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise write_error(directory, directory, exc) from exc
    claim = take_claim(folder)
    try:
        yield claim
    finally:
        claim.release()
        for path in made:
            with contextlib.suppress(OSError):
                os.rmdir(path)  # only when empty: what the job wrote stays


def take_claim(folder: str) -> Claim:
    """Create ``folder``'s claim, clearing a dead job's (this machine, its pid gone); refuse a live one's."""
    slot = FileSlot(os.path.join(folder, _CLAIM))
    holder = Holder.here(folder)
    for _ in range(3):  # create; clear a dead job's claim and create again; once more if another taker raced
        try:
            created = slot.create(holder.to_bytes())
            raw = slot.read()
        except OSError as exc:
            raise write_error(folder, _CLAIM, exc) from exc
        other = Holder.parse(raw)
        if other is not None and other.token == holder.token:
            return Claim(slot, holder, folder)
        if raw is None:
            continue
        if created or other is None or not other.is_dead():
            raise _claim_refusal(folder, slot.path, other)
        logger.warning("--checkpoint-dir %s: taking over the claim of a job that is gone (%s)", folder,
                       other.describe())
        slot.set_aside(raw)
    raise CheckpointDirClaimedError(f"--checkpoint-dir {folder}: other jobs keep taking its claim; wait for them to "
                                    "finish, then rerun")


def _claim_refusal(folder: str, path: str, other: Holder | None) -> CheckpointDirClaimedError:
    if other is None:
        return CheckpointDirClaimedError(f"--checkpoint-dir {folder} has a job claim graphstore cannot read ({path}); "
                                         "if no job uses the directory, delete that file and rerun")
    if other.on_this_machine():
        return CheckpointDirClaimedError(f"--checkpoint-dir {folder} is in use by another graphstore-train job "
                                         f"({other.describe()}); wait for it to finish, stop it (kill {other.pid}), "
                                         "or give another --checkpoint-dir")
    return CheckpointDirClaimedError(f"--checkpoint-dir {folder} is in use by another graphstore-train job "
                                     f"({other.describe()}); wait for it to finish, or give another --checkpoint-dir; "
                                     f"if it is dead (this host cannot tell), delete {path} and rerun")
