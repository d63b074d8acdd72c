"""Per-epoch timers: data wait, forward/backward, gradient sync (a DDP comm hook), optimizer."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import torch


class Timers:
    """Named second counters, safe to add to from the prefetch thread and DDP's hook callbacks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = defaultdict(float)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._seconds[name] += seconds

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def snapshot(self, reset: bool = True) -> dict[str, float]:
        with self._lock:
            out = {k: round(v, 4) for k, v in self._seconds.items()}
            if reset:
                self._seconds.clear()
        return out


def timed_allreduce_hook(timers: Timers, counts: Timers | None = None) -> Any:
    """A DDP communication hook: the default all-reduce, with the time each bucket takes recorded
    under ``grad_sync`` (it overlaps backward, so it is not additive with ``forward_backward``) and,
    with ``counts``, the bytes of every bucket reduced under ``allreduce``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state: Any, bucket: Any) -> torch.futures.Future:
        start = time.perf_counter()
        if counts is not None:
            buffer = bucket.buffer()
            counts.add("allreduce", float(buffer.numel() * buffer.element_size()))
        future = default_hooks.allreduce_hook(state, bucket)

        def done(f: torch.futures.Future) -> torch.Tensor:
            timers.add("grad_sync", time.perf_counter() - start)
            return f.value()

        return future.then(done)

    import torch.distributed as dist

    # DDP checks these annotations as objects (this module's are strings under PEP 563)
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    return hook
