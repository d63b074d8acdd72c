"""The seed order of a shuffled pass: torch's ``RandomSampler`` order, held as one compact tensor."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import RandomSampler

_INT32_MAX = 2**31 - 1
CHUNK = 1 << 16  # positions turned into Python ints at a time


class ShuffledOrder(RandomSampler):
    """torch's ``RandomSampler`` without its memory: the same draws from the same generator, so the same
    order, but the pass holds its permutation as one int32 tensor (int64 from 2**31 seeds on), turned
    into Python ints :data:`CHUNK` at a time.

    torch's holds ``randperm(n).tolist()`` for the whole pass: a list and an int object per seed, about
    40 bytes each (a rank's 3.6M training seeds: 145 MB, most of it in Python's own heap), and the int64
    permutation besides while the list is made. This one holds 4 bytes per seed. (``randperm`` draws the
    same permutation for either index type.) With ``replacement`` it is torch's sampler unchanged.

    Examples
    --------
    >>> order = ShuffledOrder(range(5), generator=torch.Generator().manual_seed(0))
    >>> list(order) == list(RandomSampler(range(5), generator=torch.Generator().manual_seed(0)))
    True
    """

    def __iter__(self) -> Iterator[int]:
        if self.replacement:
            yield from super().__iter__()
            return
        n = len(self.data_source)
        generator = self.generator
        if generator is None:  # as torch's: a generator of the pass, seeded from torch's global one
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            generator = torch.Generator()
            generator.manual_seed(seed)
        dtype = torch.int32 if n <= _INT32_MAX else torch.int64
        for _ in range(self.num_samples // n):
            yield from _ints(torch.randperm(n, generator=generator, dtype=dtype))
        yield from _ints(torch.randperm(n, generator=generator, dtype=dtype)[: self.num_samples % n])


def _ints(positions: torch.Tensor) -> Iterator[int]:
    for lo in range(0, len(positions), CHUNK):
        yield from positions[lo:lo + CHUNK].tolist()


def compact_shuffle(loader: Any, seed: int | None = None) -> None:
    """Make the ``RandomSampler`` a loader made for ``shuffle=True`` a :class:`ShuffledOrder`, in place
    (the loader and its batch sampler share that object; its generator, set later by whoever reseeds
    passes, stays the one it draws from). Any other sampler is left alone. With the loader's ``seed`` and
    no ``generator`` given, the order draws from a generator of its own seeded from ``seed``: the same
    passes in every process (torch's global generator would differ with whatever else drew from it)."""
    sampler = getattr(loader, "sampler", None)
    if type(sampler) is RandomSampler:
        sampler.__class__ = ShuffledOrder
        if seed is not None and sampler.generator is None:
            sampler.generator = torch.Generator().manual_seed(order_seed(seed))


def order_seed(seed: int) -> int:
    """The 63-bit seed of a loader's seed order, from its sampling ``seed`` (mixed, so the order's draws
    and the sampler's streams are unrelated)."""
    words = [int(seed) % 2**64, 0x0DE5]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> np.uint64(1))
