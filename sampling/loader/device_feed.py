"""Batches onto the GPU: pinned host memory, and each batch's copy issued a step ahead on a side CUDA stream."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

_END = object()


def pin(batch: Any) -> Any:
    """``batch`` in pinned (page-locked) host memory, so a ``non_blocking`` copy to the GPU is truly
    asynchronous: a tensor, a PyG ``Data``/``HeteroData`` (every tensor attribute, in place), or a
    list, tuple or dict of them; anything else unchanged. Needs an accelerator (torch refuses otherwise)."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.is_pinned() else batch.pin_memory()
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(pin(b) for b in batch)
    if isinstance(batch, dict):
        return {k: pin(v) for k, v in batch.items()}
    if hasattr(batch, "pin_memory"):
        return batch.pin_memory()
    return batch


def _to(batch: Any, device: torch.device) -> Any:
    """``batch`` copied to ``device`` without blocking the host (from pinned memory)."""
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, torch.Tensor) or hasattr(batch, "to"):
        return batch.to(device, non_blocking=True)
    return batch


def _each_tensor(batch: Any, fn: Callable[[torch.Tensor], Any]) -> None:
    if isinstance(batch, torch.Tensor):
        fn(batch)
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            _each_tensor(b, fn)
    elif isinstance(batch, dict):
        for b in batch.values():
            _each_tensor(b, fn)
    elif hasattr(batch, "apply"):  # PyG Data/HeteroData: every attribute (tensors, and lists of them)
        batch.apply(lambda t: (fn(t) if isinstance(t, torch.Tensor) else None) or t)


def is_pinned(batch: Any) -> bool:
    """Whether every tensor of ``batch`` is in pinned host memory."""
    pinned = [True]

    def check(t: torch.Tensor) -> None:
        pinned[0] = pinned[0] and t.is_pinned()

    _each_tensor(batch, check)
    return pinned[0]


class DeviceFeeder:
    """Iterates ``batches`` on ``device``. On a CUDA device, batch k + 1's copy is issued on a side
    stream (``non_blocking``, from pinned memory) when batch k is handed out, so it overlaps the step on
    batch k; the consumer's stream waits for the copy's event before using a batch, and every tensor
    of it is recorded on that stream so the caching allocator does not hand its memory out early. A
    batch not in pinned memory is pinned here first (faster: ``pin_memory=True`` on the loader pins in
    its threads). On the CPU it passes the batches through unchanged; on another device it copies
    each one when taken.

    ``close`` closes ``batches`` (a loader's iterator: its threads stop).

    Examples
    --------
    >>> list(DeviceFeeder([torch.tensor([1])], "cpu"))
    [tensor([1])]
    >>> feeder = DeviceFeeder(iter(loader), torch.device("cuda", 0))  # doctest: +SKIP
    >>> for batch in feeder:  # doctest: +SKIP
    ...     loss = model(batch.x, batch.edge_index)  # batch k + 1 is being copied meanwhile
    """

    def __init__(self, batches: Iterable[Any], device: torch.device | str | None) -> None:
        self.device = torch.device("cpu" if device is None else device)
        self._source = iter(batches)
        self._cuda = self.device.type == "cuda"
        if self._cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._ahead: Any = None  # (batch on the device, its copy's event), _END, or what the source raised

    def __iter__(self) -> DeviceFeeder:
        return self

    def __next__(self) -> Any:
        if self.device.type == "cpu":
            return next(self._source)
        if not self._cuda:
            return _to(next(self._source), self.device)
        ahead = self._ahead if self._ahead is not None else self._copy_next()
        if ahead is _END:
            self._ahead = _END
            raise StopIteration
        if isinstance(ahead, BaseException):
            self._ahead = _END
            raise ahead
        batch, event = ahead
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)  # the copy is done before the step's kernels read the batch
        _each_tensor(batch, lambda t: t.record_stream(current) if t.is_cuda else None)
        self._ahead = self._copy_next()  # batch k + 1 travels while the caller computes on batch k
        return batch

    def _copy_next(self) -> Any:
        """The next batch's copy, issued on the side stream; ``_END``, or what the source raised (given
        to the consumer after the batch it already has)."""
        try:
            host = next(self._source)
        except StopIteration:
            return _END
        except Exception as exc:
            return exc
        if not is_pinned(host):
            host = pin(host)
        with torch.cuda.stream(self._stream):
            batch = _to(host, self.device)
            event = torch.cuda.Event()
            event.record(self._stream)
        # the pinned host memory may be freed once ``host`` goes: torch's pinned-memory allocator records
        # the copy on the side stream and reuses the block only after it completes
        return batch, event

    def close(self) -> None:
        """Close the source (a loader's iterator stops its threads) and drop the batch copied ahead."""
        self._ahead = _END
        close = getattr(self._source, "close", None)
        if close is not None:
            close()
