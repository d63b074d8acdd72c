"""A session's features larger than its rank's memory: the ``feature_cache`` option, the disk tier it installs
(:class:`~training.loop.featurecache.FeatureReader`, as graphstore-train's ``--feature-cache``), what the
loaders of a rank short of memory default to, and the counts a script reads per epoch."""

from __future__ import annotations

import math
from typing import Any

from graphstore.errors import ConfigError, InvalidInputError
from graphstore.storage.cache import parse_size
from training.loop import featurecache
from training.loop.batches import short_rank_loader


def feature_cache_option(value: Any, where: str) -> int | str | None:
    """``feature_cache`` as the session keeps it: ``None`` (the disk tier only when this rank's own ``x``
    exceeds half of its memory), ``"off"`` (never), or the bytes of the RAM cache of hot rows (0: disk reads,
    no cache); one line naming ``where`` when it is none of these."""
    if value is None or value == "off":
        return value
    try:
        size = parse_size(value, where) if not isinstance(value, bool) else None
    except ConfigError:
        size = None
    if size is None or size < 0:
        raise InvalidInputError(f"{where} {value!r}: give a size (e.g. 512MB) of RAM for the hottest rows of x, 0 (disk "
                                "reads, no RAM cache) or 'off' (never read x from disk), or leave it out")
    return size


def short_rank_options(what: str, num_neighbors: Any, options: dict[str, Any], features: Any,
                       local_ranks: int) -> dict[str, Any]:
    """A loader's options on a rank whose own features exceed its memory (``features.short``), as
    graphstore-train's loaders have them: one loader thread and one batch ahead, whose feature rows wait until
    the memory the limit leaves beside the batch in training holds them (``prefetch_rows``); with worker
    processes, no batch ahead (they gather as they sample; their batches in flight are counted, and the RAM
    cache the rank sizes is in shared memory, read by them too). An option the script gave wins. A batch that
    cannot fit in the limit at all is refused here, in one line naming the memory it needs."""
    out = dict(options)
    seeds = int(out.get("batch_size", 1)) * seeds_per_example(what, out)
    shape = f"batch_size={out.get('batch_size', 1)}, num_neighbors={num_neighbors!r}"
    workers = int(out.get("num_workers") or 0)
    ahead = featurecache.check_room(seeds, fanout_bound(num_neighbors), features.row_bytes, local_ranks, shape,
                                    smaller="batch_size or num_neighbors", workers=workers)
    for key, value in short_rank_loader(bool(workers)).items():  # prefetch, loader_threads: only from the script
        out.setdefault(key, value)
    if workers:  # their batches are counted above; the cache in shared memory, read by them too
        featurecache.fill_what_is_left(features, ahead, seeds, fanout_bound(num_neighbors), local_ranks, 0, shared=True)
        return out
    waits = out["prefetch"] > 0 or out["loader_threads"] > 1  # a batch ahead, or a second thread: rows can wait
    if waits and not out.get("filter_per_worker"):
        if "prefetch_rows" not in out:  # the hottest rows in RAM in what is left (feature_cache left out)
            ahead = featurecache.fill_what_is_left(features, ahead, seeds, fanout_bound(num_neighbors), local_ranks,
                                                   max(int(out["prefetch"]), 1))
        out.setdefault("prefetch_rows", ahead)
    return out


def seeds_per_example(what: str, options: dict[str, Any]) -> int:
    """Seed nodes a batch samples per example: one per seed node; per link its two ends, and its negatives'
    (binary: two ends per negative link; triplet: one destination per negative)."""
    if what == "loader":
        return 1
    from torch_geometric.sampler import NegativeSampling

    neg = options.get("neg_sampling")
    if neg is None and options.get("neg_sampling_ratio"):
        neg = NegativeSampling("binary", options["neg_sampling_ratio"])
    neg = NegativeSampling.cast(neg)
    if neg is None:
        return 2
    amount = math.ceil(neg.amount)
    return 2 + (2 * amount if neg.is_binary() else amount)


def fanout_bound(num_neighbors: Any) -> tuple[int, ...]:
    """Neighbours drawn per node at each hop, at most: the list itself, or, per edge type
    (``{edge_type: [...]}``), their sum per hop (a node may draw over every type); -1 where a hop takes all."""
    from torch_geometric.sampler import NumNeighbors

    values = num_neighbors.values if isinstance(num_neighbors, NumNeighbors) else num_neighbors
    if isinstance(values, dict):
        hops = max((len(v) for v in values.values()), default=0)
        per_hop = [[int(v[h]) for v in values.values() if h < len(v)] for h in range(hops)]
        return tuple(-1 if any(k < 0 for k in ks) else sum(ks) for ks in per_hop)
    return tuple(int(k) for k in values)


def counts(features: Any, group: Any) -> dict[str, Any]:
    """Feature rows gathered for training batches since the last call, the RAM cache's hits, bytes read from
    disk and seconds reading, summed over the ranks (a collective), and this rank's cache size; zeros where no
    disk tier was installed."""
    if features is None:
        features = featurecache.FeatureReader([], 0, automatic=False)
    return features.epoch_record(group)
