"""The methods of :class:`~training.loop.session.Session` that make its loaders (``loader``, ``link_loader``),
count what its disk tier read (``feature_stats``), and have the ranks agree on each loader's length through
the rendezvous store."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from graphstore.errors import GraphstoreError, InvalidInputError
from training.cluster import process_groups, threads
from training.loop import session_features
from training.loop.session_loaders import LOADER_OPTIONS, Loader, link_seeds, node_seeds

logger = logging.getLogger("training.loop.session")  # the session's own logger


class SessionLoaders:
    """The loaders of a :class:`~training.loop.session.Session` (its ``loader``, ``link_loader`` and
    ``feature_stats``), and how the ranks agree on their length through the rendezvous store."""

    def loader(self, num_neighbors: Any, input_nodes: Any = None, *, even: bool = True, **kwargs: Any) -> Loader:
        """PyG's ``NeighborLoader`` over the whole dataset, for this rank's share of the seeds.

        Takes PyG's arguments (``batch_size``, ``shuffle``, ``replace``, ``disjoint``, ``time_attr``,
        ``temporal_strategy``, ``weight_attr``, ``input_time``, ``subgraph_type``, ``transform``, ...)
        and graphstore's (``loader_threads``, ``prefetch``, ``prefetch_rows``, ``cache_rows``, ``edge_ids``);
        ``num_workers=N`` builds the batches in N sampler processes beside this rank
        (:mod:`sampling.loader.sampler_processes`). ``input_nodes`` is a mask name (``"train_mask"``: the
        stored split), ``(node_type, mask)`` in a heterogeneous dataset, global node IDs, or ``None``
        (every node of this rank's partitions). An argument it
        cannot honour is refused by name.

        **Every rank's loader yields the same number of batches per pass** (``even=True``): the ranks
        agree on the largest count, and a rank with fewer batches starts its own seeds over (in a new
        order) until it has that many, so DDP never waits on a rank that ran out. ``even=False`` yields
        exactly this rank's own batches once each (for evaluation, which needs no lock-step).
        """
        if self._joined().servers is not None:
            from training.loop.served import served_node_loader

            inner = self._build("loader", kwargs, lambda **kw: served_node_loader(self, num_neighbors, input_nodes, kw))
            return self._register(inner, even)
        seeds = node_seeds(self._joined(), input_nodes)
        inner = self._build("loader", kwargs, lambda **kw: _node_loader(self, num_neighbors, seeds, kw), num_neighbors)
        return self._register(inner, even)

    def link_loader(self, num_neighbors: Any, split: str | None = "train", *, edge_type: Any = None,
                    even: bool = True, **kwargs: Any) -> Loader:
        """PyG's ``LinkNeighborLoader`` over this rank's links of the stored link split ``split``
        (``"train"``, ``"val"`` or ``"test"``; ``graphstore ingest --link-split``): messages pass over
        training links only (and validation links when testing), and a batch never holds its own links
        or their reverses. ``edge_label_index`` (global IDs) instead of ``split=None`` gives links of your
        own. Same arguments and the same agreement on length as :meth:`loader`."""
        from sampling.distributed.dist_loader import DistributedLinkNeighborLoader

        self._joined()
        if split is not None and "edge_label_index" in kwargs:
            raise InvalidInputError("link_loader: give split='train'/'val'/'test' (the stored split) or "
                                    "edge_label_index with split=None, not both")
        if self.servers is not None:
            from training.loop.served import served_link_loader

            inner = self._build("link_loader", kwargs, lambda **kw: served_link_loader(
                self, num_neighbors, split, edge_type, kw))
            return self._register(inner, even)
        if split is not None:
            index, mask, extra = link_seeds(self, split, edge_type, kwargs.get("time_attr"))
            kwargs = {"message_edges": mask, "exclude_seed_edges": True, **extra, **kwargs,
                      "edge_label_index": index}
        index = kwargs.pop("edge_label_index", None)
        inner = self._build("link_loader", kwargs, lambda **kw: DistributedLinkNeighborLoader(
            self.dataset, num_neighbors, self.transport, index, layout=self.layout, stats=self.stats, **kw),
            num_neighbors)
        return self._register(inner, even)

    def _build(self, what: str, kwargs: dict[str, Any], make: Any, num_neighbors: Any = None) -> Any:
        unknown = sorted(set(kwargs) - LOADER_OPTIONS[what])
        if unknown:
            raise InvalidInputError(f"Session.{what}: {', '.join(unknown)} cannot be honoured here; the "
                                    f"arguments it takes: {', '.join(sorted(LOADER_OPTIONS[what]))}")
        options = {"seed": self.seed * 7919 + self.rank, "pin_memory": self.world.use_cuda,
                   "filter_per_worker": False, "num_workers": self.loader_workers, **kwargs}
        if self.servers is not None:  # the servers sample and gather; loader_threads: batches requested at once
            if self.loader_threads and "loader_threads" not in kwargs:
                options["loader_threads"] = self.loader_threads
            return make(**options)
        if self.features is not None and self.features.short:  # x beyond memory: batches ahead within the limit
            options = session_features.short_rank_options(what, num_neighbors, options, self.features,
                                                          self.world.local_world_size)
        if not options["num_workers"]:  # sampler processes build the batches, or this rank's threads
            options.setdefault("loader_threads", threads.loader_threads(self.loader_threads,
                                                                        self.world.local_world_size))
        return make(**options)

    def _register(self, inner: Any, even: bool) -> Loader:
        index = len(self.loaders)
        steps = self._agree_steps(index, len(inner)) if even else len(inner)
        loader = Loader(inner, steps, index, self.seed, self.rank, even)
        if self._positions is not None and index < len(self._positions):
            loader.restore(self._positions[index])
        self.loaders.append(loader)
        return loader

    _LEFT = "graphstore/session/left/"  # + rank: how many loaders that rank created before it left the session
    _LEFT_COUNT = "graphstore/session/left"  # how many ranks left: a waiting rank reads one key, not one per rank

    def _say_left(self) -> None:
        """Tell the peers, through the rendezvous store, how many loaders this rank created before leaving,
        so one still waiting for its loader names it at once instead of after ``timeout``."""
        try:
            store = dist.distributed_c10d._get_default_store()
            store.set(f"{self._LEFT}{self.world.rank}", str(len(self.loaders)))
            store.add(self._LEFT_COUNT, 1)
        except Exception:  # no store (never joined, or it went away): the peers' timeout names this rank
            logger.debug("could not record leaving the session", exc_info=True)

    def _agree_steps(self, index: int, mine: int) -> int:
        """The largest batch count any rank's loader ``index`` has: through the rendezvous store. A rank that
        left the session without creating it is named as soon as it has left, one that never comes after
        ``timeout`` seconds."""
        store = dist.distributed_c10d._get_default_store()
        prefix = f"graphstore/session/loader/{index}/"
        store.set(f"{prefix}{self.rank}", str(mine))
        keys = [f"{prefix}{r}" for r in range(self.world_size)]
        process_groups.set_stage(f"creating loader {index}")
        deadline, missing, gone = time.monotonic() + self.timeout, [], []
        try:
            while True:
                try:  # the store answers as soon as every key is there; in slices, to see ranks that left
                    store.wait(keys, timedelta(seconds=max(0.001, min(0.5, deadline - time.monotonic()))))
                    break
                except Exception:
                    pass  # the slice ended (a store that failed raises below, as it is: a lost peer)
                if store.add(self._LEFT_COUNT, 0) > 0:
                    gone = [r for r in range(self.world_size) if not _has(store, keys[r])
                            and _has(store, f"{self._LEFT}{r}") and int(store.get(f"{self._LEFT}{r}")) <= index]
                if gone or time.monotonic() >= deadline:
                    missing = [r for r in range(self.world_size) if not _has(store, keys[r])]
                    break
        finally:
            process_groups.set_stage("training")
        if missing:
            # the script's misuse on another rank, not an echo of a failure: it names the job's cause (a peer that
            # gave up waiting for this rank at shutdown in the meantime only echoes it)
            when = "before it left the session" if gone else f"within {self.timeout:.0f} s (timeout)"
            raise GraphstoreError(f"{process_groups.describe(gone or missing)} did not create loader {index} {when}: "
                                  "every rank must create the same loaders in the same order")
        return max(int(store.get(k)) for k in keys)

    def feature_stats(self) -> dict[str, Any]:
        """The rows of ``x`` this job's loaders gathered from the disk tier since the last call (``rows``), the
        RAM cache's ``hits``, ``disk_bytes`` read and ``read_seconds``, summed over the ranks, this rank's
        ``cache_bytes``, and ``cache_bytes_all`` of the ``ranks`` with a disk tier; zeros where no rank reads
        ``x`` from disk (``feature_cache``). Every rank calls it, at
        the same point (once an epoch, say): it is a collective."""
        try:
            return session_features.counts(self._joined().features, self.cpu_group)
        except Exception as exc:
            raise self.explain(exc) from exc


def _node_loader(session: Any, num_neighbors: Any, seeds: Any, kwargs: dict[str, Any]) -> Any:
    from sampling.distributed.dist_loader import DistributedNeighborLoader

    return DistributedNeighborLoader(session.dataset, num_neighbors, session.transport, seeds,
                                     layout=session.layout, stats=session.stats, **kwargs)


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False
