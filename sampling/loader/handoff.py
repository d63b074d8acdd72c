"""A sampler process's batches handed to its rank through blocks of shared memory, reused batch after batch.

Sent as they are, a batch's tensors travel through torch's reductions: each tensor is copied into a new
shared segment whose pages are faulted in on both sides, and a file descriptor is passed for it. For a
batch of fanout 15,10,5 and 1,024 seeds over 128 features (about 50 MB) that cost a worker more than its
sampling and gathering together. Here a worker owns a block per slot (:class:`Slab`;
``sampling.loader.sampler_processes.SLOTS``), each sent to its rank once: the feature
stores gather the rows straight into it (:func:`graphstore.dataset.rowmemory.rows_into`), the
sampler's other outputs are copied in (:func:`pack`), and the batch crosses the pipe with each tensor
replaced by where it lies in the block (:class:`InSlab`). The rank copies each tensor out (into pinned
memory for a GPU: the copy it would make to pin anyway) before it hands that slot its next index batch
(:func:`unpack`). A batch larger than the block goes the old way for
the tensors that do not fit, and the worker sends with it a block a quarter larger than that batch, in
which its next batches come.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

_ALIGN = 64  # bytes: every tensor in a block starts on a cache line


@dataclass(frozen=True)
class InSlab:
    """Where a tensor of the batch lies in its worker's block."""

    start: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def view(self, block: torch.Tensor) -> torch.Tensor:
        return block[self.start:self.start + self.nbytes].view(self.dtype).view(self.shape)


class Slab:
    """A worker's block of shared memory, filled from the start for each batch (:meth:`reset`)."""

    def __init__(self, nbytes: int) -> None:
        self.block = torch.empty(nbytes, dtype=torch.uint8).share_memory_()
        self.used = 0
        self.wanted = 0  # what the batch so far needed, taken or not: the size of the next block

    @property
    def capacity(self) -> int:
        return self.block.numel()

    def reset(self) -> None:
        self.used = self.wanted = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised tensor in the block, or None when it does not fit."""
        nbytes = math.prod(shape) * dtype.itemsize
        start = -(-self.used // _ALIGN) * _ALIGN
        self.wanted += nbytes + _ALIGN
        if start + nbytes > self.capacity:
            return None
        self.used = start + nbytes
        return InSlab(start, tuple(shape), dtype).view(self.block)

    def where(self, tensor: torch.Tensor) -> InSlab | None:
        """Where ``tensor`` lies in the block (None: elsewhere, or not contiguous)."""
        base = self.block.data_ptr()
        offset = tensor.data_ptr() - base
        if not tensor.is_contiguous() or tensor.device.type != "cpu" or not 0 <= offset < self.capacity:
            return None
        if tensor.untyped_storage().data_ptr() != base:
            return None
        return InSlab(offset, tuple(tensor.shape), tensor.dtype)


def _stores(batch: Any) -> list[Any]:
    return list(getattr(batch, "stores", ()))  # PyG's Data and HeteroData; anything else travels as it is


def pack(batch: Any, slab: Slab | None) -> Any:
    """``batch`` with each tensor in ``slab`` replaced by where it lies (copied in first when it was built
    elsewhere and fits). Tensors that do not fit stay in the batch (and count in ``slab.wanted``), as do empty
    ones (nothing to place: a batch whose rows of ``x`` all come from the device cache has none of them)."""
    if slab is None:
        return batch
    for store in _stores(batch):
        for key, value in list(store.items()):
            if not isinstance(value, torch.Tensor) or value.numel() == 0:
                continue
            where = slab.where(value)
            if where is None:
                room = slab.take(tuple(value.shape), value.dtype)
                if room is None:
                    continue
                room.copy_(value)
                where = slab.where(room)
            store[key] = where
    return batch


def unpack(batch: Any, block: torch.Tensor | None, pinned: bool) -> Any:
    """The rank's side: each :class:`InSlab` of ``batch`` copied out of ``block`` (into pinned memory when
    ``pinned``), so the worker may fill the block again."""
    for store in _stores(batch):
        for key, value in list(store.items()):
            if isinstance(value, InSlab):
                out = torch.empty(value.shape, dtype=value.dtype, pin_memory=pinned)
                out.copy_(value.view(block))
                store[key] = out
    return batch


def wanted_block(batch_bytes: int) -> int:
    """The size of a block for batches like one of ``batch_bytes``: a quarter more (at least 1 MiB)."""
    return max(1 << 20, batch_bytes + batch_bytes // 4)


def tensor_bytes(batch: Any) -> int:
    """The bytes of ``batch``'s tensors (aligned as a block would hold them)."""
    total = 0
    for store in _stores(batch):
        for value in store.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size() + _ALIGN
    return total
