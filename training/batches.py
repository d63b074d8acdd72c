"""The training loop's batch streams: the model-building batch, epochs of a fixed step count, timed stages."""

from __future__ import annotations

from typing import Any, Iterator

from graphstore.errors import InvalidInputError
from training.timing import Timers


def restart_streams(loaders: dict[str, Any], epoch: int) -> None:
    """Each loader's sampling streams as a function of the epoch, so a resumed run draws what an
    uninterrupted one would (local sampling; a remote partition's server draws from its own stream)."""
    for loader in loaders.values():
        sampler = getattr(loader, "node_sampler", None) or getattr(loader, "link_sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(1000 * (epoch + 1))


def first_batch(loader: Any) -> Any:
    """One batch to build the model from; its prefetcher is closed, so nothing samples on into epoch 1."""
    iterator = iter(loader)
    try:
        return next(iterator)
    finally:
        if hasattr(iterator, "close"):
            iterator.close()


def cycle(loader: Any, steps: int) -> Iterator[Any]:
    """``steps`` batches from ``loader``, starting it again when it runs out; closes its prefetcher."""
    produced = 0
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


def time_loader(loader: Any, timers: Timers) -> None:
    """Record sampling and feature-fetch seconds (spent in the prefetch thread) for the timing breakdown."""
    collate, filter_fn = loader.collate_fn, loader.filter_fn

    def timed_collate(index: Any) -> Any:
        with timers.time("sampling"):
            return collate(index)

    def timed_filter(out: Any) -> Any:
        with timers.time("feature_fetch"):
            return filter_fn(out)

    loader.collate_fn, loader.filter_fn = timed_collate, timed_filter
