"""Where this thread's feature stores gather rows to: ordinary memory, or pinned (page-locked) host memory.

A loader thread building a batch for a GPU asks for pinned rows (:func:`pinned_rows`): the stores then
gather each batch's rows straight into pinned memory, and the batch goes to the device with no second
copy on the host (pinning a batch after the gather copied its rows once more: on the H100 host of
docs/training.md the loader made 137-146 batches/s that way and makes 198-201 this way, with 0.8 GiB
less peak memory). Pinned blocks come from torch's caching host allocator, so they are reused batch
after batch. Needs an accelerator (torch refuses pinned memory without one).

A sampler process gathers into the block of shared memory it hands its batches over in
(:func:`rows_into`): the rank then reads the rows where they were gathered.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch

_local = threading.local()


def pinned_rows(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within it (with ``on``), this thread's feature stores gather rows into pinned host memory."""
    return _this_thread("pinned", on)


def rows_into(arena: Any) -> contextlib.AbstractContextManager[None]:
    """Within it, this thread's feature stores gather rows into tensors ``arena.take(shape, dtype)`` hands
    out (ordinary memory where it returns None: the arena is full). ``arena`` None: no arena."""
    return _this_thread("arena", arena)


@contextlib.contextmanager
def _this_thread(name: str, value: Any) -> Iterator[None]:
    before = getattr(_local, name, None)
    setattr(_local, name, value)
    try:
        yield
    finally:
        setattr(_local, name, before)


def placed() -> bool:
    """Whether this thread's rows go somewhere of their own (an arena, or pinned memory)."""
    return getattr(_local, "arena", None) is not None or pinned()


def pinned() -> bool:
    """Whether this thread asked for pinned rows."""
    return bool(getattr(_local, "pinned", False))


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor for gathered rows: in this thread's arena when it has one with room, else in
    pinned memory when this thread asked for it."""
    arena = getattr(_local, "arena", None)
    if arena is not None:
        out = arena.take(shape, dtype)
        if out is not None:
            return out
    return _allocate(shape, dtype, pinned())


def _allocate(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=pin)
