"""Per-epoch timers and what they mean together: the training loop's parts, and the prefetch thread's."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

# The training loop runs these one after another: they add up to the epoch's training seconds.
FOREGROUND = ("data_wait", "forward_backward", "optimizer", "step_sync", "epoch_end")
# The prefetch thread runs these at the same time as the foreground (background work, not additive to it).
BACKGROUND = ("sampling", "feature_fetch")
# Parts measured inside others: gradient all-reduce overlaps backward; remote waits are inside the
# prefetch thread's sampling and feature fetch.
WITHIN = {"grad_sync": "forward_backward", "remote_wait": "sampling, feature_fetch"}
LEGEND = {"foreground": list(FOREGROUND), "background": list(BACKGROUND), "within": WITHIN,
          "note": "foreground parts add up to train_seconds; background parts run in the prefetch thread "
                  "and overlap them; seconds are per-rank means"}


def describe(timing: dict[str, float], train_seconds: float) -> str:
    """The breakdown as one line: the foreground sum (with what is left over), then background work.

    Examples
    --------
    >>> describe({"data_wait": 0.5, "forward_backward": 1.0, "optimizer": 0.2, "epoch_end": 0.1,
    ...           "sampling": 1.1, "feature_fetch": 0.3}, 1.9)  # doctest: +NORMALIZE_WHITESPACE
    'training 1.9 s = data wait 0.5 + fwd/bwd 1.0 (grad sync 0.0 within) + optimizer 0.2 + step sync 0.0
    + epoch end 0.1 + other 0.1; prefetch thread, overlapping: sampling 1.1 + features 0.3 (remote wait 0.0 within)'
    """
    t = {k: float(timing.get(k, 0.0)) for k in (*FOREGROUND, *BACKGROUND, *WITHIN)}
    other = train_seconds - sum(t[k] for k in FOREGROUND)
    other = 0.0 if abs(other) < 0.05 else other  # the parts are laps: only rounding is left (no "-0.0")
    return (f"training {train_seconds:.1f} s = data wait {t['data_wait']:.1f} + fwd/bwd {t['forward_backward']:.1f} "
            f"(grad sync {t['grad_sync']:.1f} within) + optimizer {t['optimizer']:.1f} + step sync "
            f"{t['step_sync']:.1f} + epoch end "
            f"{t['epoch_end']:.1f} + other {other:.1f}; prefetch thread, overlapping: sampling {t['sampling']:.1f} "
            f"+ features {t['feature_fetch']:.1f} (remote wait {t['remote_wait']:.1f} within)")


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


class Laps:
    """Back-to-back spans charged to named timers: each :meth:`mark` charges the time since the one
    before (or since the start), so the parts cover the whole span with no gaps between them, whatever
    runs between two timed calls (bookkeeping, waiting for the GIL the prefetch thread holds)."""

    def __init__(self, timers: Timers) -> None:
        self.timers, self._last = timers, time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.timers.add(name, now - self._last)
        self._last = now


def timed_allreduce_hook(timers: Timers, counts: Timers | None = None) -> Any:
    """A DDP communication hook: the default all-reduce, with the time each bucket takes recorded
    under ``grad_sync`` (it overlaps backward, so it is not additive with ``forward_backward``) and,
    with ``counts``, the bytes of every bucket reduced under ``allreduce``."""
    import torch  # here: the launcher formats timings without torch
    import torch.distributed as dist
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

    # DDP checks these annotations as objects (this module's are strings under PEP 563)
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    return hook
