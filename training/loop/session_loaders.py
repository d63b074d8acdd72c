"""The session's loaders: seeds resolved from stored splits, the arguments they take, and ``Loader``, which
yields the same number of batches on every rank and knows its position for checkpoints."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from graphstore.dataset.linksplit import SPLIT_NAMES
from graphstore.errors import InvalidInputError
from sampling.distributed.dist_loader import local_links, local_seeds
from sampling.graph.edgemask import MessageEdges, dataset_split
from training.loop.batches import cycle, mix, restart_streams

# PyG's NeighborLoader / LinkNeighborLoader arguments the session's loaders honour, and graphstore's own
_COMMON = {"batch_size", "shuffle", "drop_last", "replace", "disjoint", "temporal_strategy", "time_attr",
           "weight_attr", "subgraph_type", "directed", "is_sorted", "transform", "transform_sampler_output",
           "pin_memory", "seed", "loader_threads", "prefetch", "prefetch_rows", "cache_rows", "edge_ids",
           "filter_per_worker", "num_workers"}
LOADER_OPTIONS = {
    "loader": _COMMON | {"input_time"},
    "link_loader": _COMMON | {"edge_label_index", "edge_label", "edge_label_time", "neg_sampling",
                              "neg_sampling_ratio", "message_edges", "exclude_seed_edges"},
}
# the split values messages pass over for each split's links (PyG's convention: test also sees val links)
MESSAGES = {"train": (0,), "val": (0,), "test": (0, 1)}


class Loader:
    """One of a session's loaders: iterate it once per pass (epoch).

    ``len(loader)`` batches every pass, the same on every rank (or this rank's own count, made with
    ``even=False``). The order and the sampling of pass ``p`` follow from the session's seed, ``p`` and
    the rank alone, so a pass resumed at a batch goes on as an uninterrupted one does, and iterating
    never draws from torch's global random generator (your model's dropout has it to itself).
    """

    def __init__(self, inner: Any, steps: int, index: int, seed: int, rank: int, even: bool) -> None:
        self.inner, self.steps, self.index, self.even = inner, steps, index, even
        self.seed, self.rank = seed, rank
        self.passes = 0  # the current pass (or the next, when none has begun)
        self.position = 0  # batches handed out in the current pass
        self._begun = False  # the current pass has begun: a new iter() starts the next one
        self._resume = False  # restored from a checkpoint: the next iter() goes on at ``position``

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        """A pass: from the start, or at the batch after the last one handed out before a checkpoint
        (:meth:`restore`); a pass left unfinished (``break``) is not resumed by the next ``iter()``."""
        if self._resume:
            self._resume = False
        else:
            if self._begun:
                self.passes += 1
            self.position = 0
        self._begun = True
        return self._pass(self.passes, self.position)

    def _pass(self, number: int, start: int) -> Iterator[Any]:
        restart_streams({"": self.inner}, number, self.seed, self.rank)
        # torch's iterator draws a base seed per pass: from a generator of the pass, not the global one
        self.inner.generator = torch.Generator().manual_seed(mix(self.seed, number, self.rank, 0xB0A7))
        if start < self.steps:
            source = cycle(self.inner, self.steps, start)
            try:
                for batch in source:
                    self.position += 1
                    yield batch
            finally:
                source.close()
        self.passes, self.position, self._begun = number + 1, 0, False

    def state(self) -> tuple[int, int, int]:
        """(the current pass, batches handed out in it, batches per pass)."""
        return self.passes, self.position, self.steps

    def restore(self, saved: Any) -> None:
        """The next ``iter()`` goes on where :meth:`state` was taken, at the batch after the last handed out."""
        passes, position, steps = (int(v) for v in saved)
        if steps != self.steps:
            raise InvalidInputError(
                f"loader {self.index} makes {self.steps} batches per pass, but the checkpoint's made {steps}: resume "
                "with the same loader arguments (batch_size, seeds, split) and the same rank count")
        self.passes, self.position, self._begun, self._resume = passes, position, False, True

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size


def node_seeds(session: Any, input_nodes: Any) -> Any:
    """``input_nodes`` as this rank's seeds: a mask name resolved on its partitions (its share when ranks
    share one), ``(node_type, mask)`` in a heterogeneous dataset, or IDs as given."""
    ds = session.dataset
    node_type, mask = seed_mask(ds, input_nodes)
    if not isinstance(mask, str) and mask is not None:
        return input_nodes
    seeds = local_seeds(ds, session.parts, mask, session.layout, session.rank, node_type=node_type)
    return (node_type, seeds) if node_type is not None else seeds


def seed_mask(ds: Any, input_nodes: Any) -> tuple[Any, Any]:
    """``input_nodes`` split into (node type, mask name or IDs or ``None``), a mask name checked against the
    manifest: every loader of a session (partitions held, or sampler servers) reads its seeds through it."""
    node_type, mask = (input_nodes if isinstance(input_nodes, tuple) and len(input_nodes) == 2
                       else (None, input_nodes))
    if ds.is_hetero and node_type is None:
        types = [n.name for n in ds.manifest.node_types]
        raise InvalidInputError(f"{ds.url} is heterogeneous: give input_nodes=(node_type, mask or IDs), a node type "
                                f"of {types}")
    if isinstance(mask, str):
        info = ds.manifest.node_type(node_type)
        attr = info.attrs.get(mask)
        if attr is None or attr.dtype != "bool":
            masks = sorted(k for k, a in info.attrs.items() if a.dtype == "bool")
            raise InvalidInputError(f"input_nodes={mask!r}: {ds.url} has no node mask of that name"
                                    f"{'' if node_type is None else f' for {node_type!r}'}; its masks: {masks}")
    return node_type, mask


def link_seeds(session: Any, split: str, edge_type: Any, time_attr: str | None,
               rule: Any = None) -> tuple[Any, MessageEdges, dict[str, Any]]:
    """This rank's links of the stored split ``split`` (global IDs; computed by ``rule``, a
    :class:`~graphstore.dataset.linksplit.LinkSplit`, when given), the message mask of that split, and
    ``edge_label_time`` (each link at its own time) when ``time_attr`` is an attribute of the edge type."""
    ds = session.dataset
    if split not in SPLIT_NAMES:
        raise InvalidInputError(f"link_loader split={split!r}: give one of {SPLIT_NAMES}, or split=None with "
                                "edge_label_index")
    info = ds.manifest.edge_type(edge_type) if edge_type is not None else ds.manifest.edge_types[0]
    mask = MessageEdges(info.name, MESSAGES[split], rule)
    timed = bool(time_attr) and time_attr in info.attrs
    index, times = local_links(ds, session.layout, session.rank, info.name, time_attr if timed else None)
    splits = []
    for part in session.parts:
        share, ranks = session.layout.share(session.rank, part)
        splits.append(torch.from_numpy(np.asarray(dataset_split(ds, part, info.name, mask)))[share::ranks])
    sel = torch.nonzero(torch.cat(splits) == SPLIT_NAMES.index(split)).view(-1)
    extra = {"edge_label_time": times[sel]} if times is not None else {}
    index = index[:, sel]
    return ((info.name, index) if ds.is_hetero else index), mask, extra
