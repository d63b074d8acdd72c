"""The training loop's batch streams: the model-building batch, epochs of a fixed step count, timed stages."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from graphstore.errors import InvalidInputError
from training.report.timing import Timers

# batches the prefetch thread makes ahead of the loop: one hides sampling and fetching whenever they take
# less than a step (data wait ~0 in the runs of docs/performance.md); each more holds another batch and fragments the heap
PREFETCH = 1


def short_rank_loader(workers: bool) -> dict[str, Any]:
    """A loader's options on a rank whose own features exceed its memory (graphstore-train's and a session's):
    worker processes gather rows as they sample, so no batch waits ahead; else one loader thread and one batch
    ahead, whose rows the caller bounds (``prefetch_rows``: what the memory limit leaves beside the batch in
    training)."""
    return {"prefetch": 0} if workers else {"loader_threads": 1, "prefetch": PREFETCH}


def restart_streams(loaders: dict[str, Any], epoch: int, seed: int = 0, rank: int = 0) -> None:
    """Each loader's order and sampling streams as a function of the seed, the epoch and the rank, so a
    resumed run draws what an uninterrupted one would: the seed order from a generator of its own (not
    torch's global one, which dropout shares), each batch's neighbours from a stream of that batch's
    (remote partitions draw from seeds sent with the request)."""
    for loader in loaders.values():
        sampler = getattr(loader, "node_sampler", None) or getattr(loader, "link_sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(1000 * (epoch + 1))
        order = getattr(loader, "sampler", None)
        if getattr(order, "generator", False) is not False:  # shuffled: RandomSampler draws from it
            order.generator = torch.Generator().manual_seed(mix(seed, epoch, rank, 0x5EED))


def mix(*words: int) -> int:
    """A 63-bit seed from integers (SeedSequence's mixing: nearby inputs give unrelated seeds)."""
    return int(np.random.SeedSequence([w % 2**64 for w in words]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def first_batch(loader: Any) -> Any:
    """One batch to build the model from; its prefetcher is closed, so nothing samples on into epoch 1."""
    iterator = iter(loader)
    try:
        return next(iterator)
    finally:
        if hasattr(iterator, "close"):
            iterator.close()


def cycle(loader: Any, steps: int, start: int = 0) -> Iterator[Any]:
    """Batches ``start`` to ``steps`` of ``loader``, starting it again when it runs out; closes its
    prefetcher. The first ``start`` batches are skipped without being sampled (their seed order is
    still drawn, so what follows is what an uninterrupted pass gives)."""
    produced = start
    per_pass = len(loader)
    if start and per_pass:
        sampler = getattr(loader, "node_sampler", None) or getattr(loader, "link_sampler", None)
        for _ in range(start // per_pass):  # whole passes: draw their order, sample nothing
            for _ in loader.batch_sampler:
                pass
            if hasattr(sampler, "next_epoch"):  # as iter(loader) would: the next pass samples from new streams
                sampler.next_epoch()
        if start % per_pass:
            skip_batches(loader, start % per_pass)
    while produced < steps:
        iterator = iter(loader)
        try:
            for batch in iterator:
                yield batch
                produced += 1
                if produced == steps:
                    return
        finally:
            if hasattr(iterator, "close"):
                iterator.close()
        if produced == 0:
            raise InvalidInputError("this rank has no training seeds; use fewer ranks or re-ingest with fewer parts")


def skip_batches(loader: Any, count: int) -> None:
    """The next pass of ``loader`` starts ``count`` batches in, sampling none of those it skips."""
    if not hasattr(loader, "skip_next"):
        raise InvalidInputError(f"{type(loader).__name__} cannot start a pass mid-way; resume at an epoch's end")
    loader.skip_next = count


def time_loader(loader: Any, timers: Timers) -> None:
    """Record sampling and feature-fetch seconds for the timing breakdown: spent in the loader threads,
    so with N of them the seconds add up over the threads (``Timers`` is safe to add to from all)."""
    collate, filter_fn = loader.collate_fn, loader.filter_fn

    def timed_collate(index: Any) -> Any:
        with timers.time("sampling"):
            return collate(index)

    def timed_filter(out: Any) -> Any:
        with timers.time("feature_fetch"):
            return filter_fn(out)

    loader.collate_fn, loader.filter_fn = timed_collate, timed_filter
