"""``NeighborSampler``: PyG's ``BaseSampler`` over an in-memory graph, a graphstore dataset or a store pair."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import numbers
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch_geometric.sampler import (BaseSampler, EdgeSamplerInput, HeteroSamplerOutput, NegativeSampling,
                                     NodeSamplerInput, NumNeighbors, SamplerOutput)
from torch_geometric.sampler.neighbor_sampler import edge_sample, node_sample

from graphstore.errors import InvalidInputError, NotOwnedError
from sampling.drivers import hop_driver, subgraph
from sampling.graph.edgemask import MessageEdges, exclusion, link_batch
from sampling.graph.kernel_args import Variants
from sampling.drivers.batch_driver import FastPath
from sampling.kernels.picks import STRATEGY_LAST, STRATEGY_UNIFORM
from sampling.kernels.rng import rng_state
from sampling.graph.topology import (CSCBlock, EdgeTopology, from_dataset, from_graph_store, from_pyg, is_hetero_pyg,
                               node_times)

STRATEGIES = {"uniform": STRATEGY_UNIFORM, "last": STRATEGY_LAST}


@dataclass(frozen=True)
class SamplerConfig:
    """How to sample: fanouts per hop (``-1`` = all), replacement, disjoint subgraphs, time and weights."""

    num_neighbors: Any
    replace: bool = False
    disjoint: bool = False
    temporal_strategy: str = "uniform"
    time_attr: str | None = None
    weight_attr: str | None = None
    subgraph_type: str = "directional"
    is_sorted: bool = False
    message_edges: MessageEdges | None = None  # a link split mask, applied by the kernels
    exclude_seed_edges: bool = False  # link batches: drop their own positive links (and reverses), times strict

    def __post_init__(self) -> None:
        subgraph.check_subgraph_type(self.subgraph_type, self.disjoint or self.time_attr is not None)
        if not isinstance(self.is_sorted, bool):
            raise InvalidInputError(f"is_sorted {self.is_sorted!r}: give True or False")
        if self.message_edges is not None and not isinstance(self.message_edges, MessageEdges):
            raise InvalidInputError(f"message_edges {self.message_edges!r}: pass a sampling.MessageEdges")
        if not isinstance(self.exclude_seed_edges, bool):
            raise InvalidInputError(f"exclude_seed_edges {self.exclude_seed_edges!r}: pass True or False")
        if self.subgraph_type == "induced" and (self.message_edges is not None or self.exclude_seed_edges):
            raise InvalidInputError(
                "subgraph_type='induced' with message_edges/exclude_seed_edges: the induced subgraph adds back "
                "every stored edge among the sampled nodes, held-out and seed links included; use "
                "subgraph_type='directional' or 'bidirectional' for leak-free link prediction")
        if self.temporal_strategy not in STRATEGIES:
            raise InvalidInputError(f"temporal_strategy {self.temporal_strategy!r} is not one of {sorted(STRATEGIES)}")
        values = self.num_neighbors.values if isinstance(self.num_neighbors, NumNeighbors) else self.num_neighbors
        lists = values.values() if isinstance(values, dict) else [values]
        for fanouts in lists:
            if not isinstance(fanouts, (list, tuple)) or any(
                    not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < -1 for k in fanouts):
                raise InvalidInputError(
                    f"num_neighbors {values!r}: give a list of ints per hop (-1 = all neighbors), "
                    "or a dict of such lists per edge type"
                )


class NeighborSampler(BaseSampler):
    """Multi-hop neighbor sampling with numba kernels, de-duplication and relabelling.

    ``data`` is a PyG ``Data``/``HeteroData``, a graphstore ``Dataset`` (every partition, memory-
    mapped), or a ``(FeatureStore, GraphStore)`` pair. Output follows PyG's ``NeighborSampler``:
    ``SamplerOutput``/``HeteroSamplerOutput`` with global node IDs, local ``row`` (source) / ``col``
    (destination), edge IDs (input edge IDs), per-hop counts, and ``batch`` when disjoint.
    ``subgraph_type`` is PyG's (``directional``, ``bidirectional``, ``induced``); ``is_sorted=True``
    says an in-memory graph's ``edge_index`` is already sorted by destination (the sort is skipped, the
    claim checked); datasets and store pairs are stored in CSC order already, so it is refused there.

    ``message_edges`` (:class:`sampling.MessageEdges`) restricts one edge type to the edges of some
    link splits (the kernels skip the others; fanouts count admitted edges). ``exclude_seed_edges``:
    a link batch never contains its own positive links nor their reverses, and with ``edge_label_time``
    only strictly earlier neighbours are sampled (PyG samples ``time <= edge_label_time``).

    Examples
    --------
    >>> sampler = NeighborSampler(graphstore.open_dataset("/data/cora"), [10, 5])  # doctest: +SKIP
    >>> out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.arange(4)))  # doctest: +SKIP
    """

    def __init__(self, data: Any, num_neighbors: Any, *, replace: bool = False, disjoint: bool = False,
                 temporal_strategy: str = "uniform", time_attr: str | None = None, weight_attr: str | None = None,
                 seed: int | None = None, subgraph_type: str = "directional", is_sorted: bool = False,
                 message_edges: MessageEdges | None = None, exclude_seed_edges: bool = False) -> None:
        self.config = SamplerConfig(num_neighbors, replace, disjoint, temporal_strategy, time_attr, weight_attr,
                                    getattr(subgraph_type, "value", subgraph_type), is_sorted, message_edges,
                                    exclude_seed_edges)
        _check_is_sorted(data, is_sorted)
        self._data = data
        self._topology: dict[Any, EdgeTopology] | None = None
        self._node_time: dict[Any, np.ndarray] | None = None
        self._seed = seed
        self._fast_path: FastPath | None | bool = False  # False: not decided yet
        self._runs: dict[Any, list] = {}  # per edge type: the per-hop driver's block runs
        self._local = threading.local()  # per thread: generator state (and its process) and de-duplication tables
        self._threads_seeded = itertools.count(1)  # next() is atomic: two threads never share a stream
        self._epoch = 0  # bumped by the loaders before each pass, so forked workers draw new streams
        topo = self.topology  # validates the data and attribute names now, not in a worker
        self.is_hetero = _is_hetero(data, topo)
        self.edge_types = list(topo)
        self.num_nodes = self._num_nodes()
        self._fanouts = self._hop_fanouts(num_neighbors)
        self._check_time_attr()

    # -- the graph --

    @property
    def topology(self) -> dict[Any, EdgeTopology]:
        if self._topology is None:
            c, data = self.config, self._data
            if _is_dataset(data):
                self._topology = from_dataset(data, list(range(data.num_parts)), c.weight_attr, c.time_attr,
                                              c.disjoint, c.message_edges)
            elif isinstance(data, (tuple, list)):
                self._topology = from_graph_store(data[1], c.weight_attr, c.time_attr, c.disjoint, c.message_edges)
            else:
                self._topology = from_pyg(data, c.weight_attr, c.time_attr, c.is_sorted, c.message_edges)
        return self._topology

    @property
    def node_time(self) -> dict[Any, np.ndarray]:
        """Per node type, the time of every node (global IDs), if ``time_attr`` is a node attribute."""
        if self._node_time is None:
            self._node_time = node_times(self._data, self.config.time_attr)
        return self._node_time

    def _hop_fanouts(self, num_neighbors: Any) -> list[dict[Any, int]]:
        """Per hop, the fanout of every edge type (PyG's ``num_neighbors`` rules, ``-1`` = all)."""
        spec = num_neighbors if isinstance(num_neighbors, NumNeighbors) else NumNeighbors(num_neighbors)
        try:
            values = spec.get_values(self.edge_types) if self.is_hetero else {None: spec.get_values()}
        except ValueError as exc:
            raise InvalidInputError(f"num_neighbors {num_neighbors!r}: {exc}; edge types are {self.edge_types}") from exc
        if not self.is_hetero and isinstance(values[None], dict):
            raise InvalidInputError("num_neighbors is a dict but the graph is homogeneous; give one list per hop")
        return [{et: int(v[hop]) if hop < len(v) else 0 for et, v in values.items()} for hop in range(spec.num_hops)]

    def _num_nodes(self) -> Any:
        counts: dict[Any, int] = {}
        for topo in self.topology.values():
            counts[topo.src_type] = max(counts.get(topo.src_type, 0), topo.num_src)
            counts[topo.dst_type] = max(counts.get(topo.dst_type, 0), topo.num_dst)
        if _is_dataset(self._data):
            counts = {t: self._data.num_nodes(t) for t in self._data.node_types}
        elif is_hetero_pyg(self._data):  # every node type, also those without edges (or no edge types at all)
            counts = {t: self._data[t].num_nodes for t in self._data.node_types}
        return counts if self.is_hetero else counts[None]

    def _check_time_attr(self) -> None:
        c = self.config
        if c.time_attr and not self.node_time and not any(t.has_time for t in self.topology.values()):
            raise InvalidInputError(
                f"time_attr {c.time_attr!r} is neither a node nor an edge attribute of the graph; "
                "name an attribute holding timestamps"
            )
        if c.weight_attr and not any(t.has_weight for t in self.topology.values()):
            raise InvalidInputError(f"weight_attr {c.weight_attr!r} is not an edge attribute of the graph")

    @property
    def fast_path(self) -> FastPath | None:
        """The one-call multi-hop kernel, when this sampler's batches can use it (else ``None``)."""
        if self._fast_path is False:
            topo = self.topology
            c = self.config
            ok = not self.is_hetero and None in topo and all(type(b) is CSCBlock for b in topo[None].blocks)
            self._fast_path = FastPath(topo[None], self.num_nodes, self._fanouts, c.replace,
                                       variants=self._variants(), positions=_is_dataset(self._data)) if ok else None
            if self._fast_path is not None and not self._fast_path.covers_sources:
                self._fast_path = None  # e.g. one partition's store: sources outside it must raise NotOwnedError
        return self._fast_path

    def _variants(self, src_type: Any = None) -> Variants:
        """The variants of edge types whose sources are of ``src_type``."""
        c = self.config
        node_time = self.node_time.get(src_type) if self.is_temporal else None
        return Variants(weighted=c.weight_attr is not None, temporal=self.is_temporal,
                        last=c.temporal_strategy == "last", disjoint=self.disjoint,
                        node_time=None if node_time is None else np.ascontiguousarray(node_time, np.int64))

    def engine_runs(self, etype: Any) -> list[tuple[Any, Any]]:
        """The per-hop driver's runs of ``etype``'s blocks (:func:`sampling.drivers.hop_driver.engine_runs`), built once."""
        runs = self._runs.get(etype)
        if runs is None:
            topo = self.topology[etype]
            variants = self._variants(topo.src_type)
            if variants.weighted and not topo.has_weight:  # as in PyG: a type without the attribute is uniform
                variants = dataclasses.replace(variants, weighted=False)
            runs = self._runs[etype] = hop_driver.engine_runs(topo, variants)
        return runs

    @property
    def is_temporal(self) -> bool:
        return self.config.time_attr is not None

    @property
    def disjoint(self) -> bool:
        return self.config.disjoint or self.is_temporal

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if _is_dataset(self._data) or isinstance(self._data, (tuple, list)):
            state["_topology"] = None  # memory-mapped: cheap to rebuild in the worker
            state["_node_time"] = None
            state["_fast_path"] = False
            state["_runs"] = {}
        state["_local"] = None
        state["_threads_seeded"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()
        self._threads_seeded = itertools.count(1)

    def next_epoch(self) -> None:
        """Start a new pass: DataLoader workers started after this draw streams no earlier pass drew.

        The loaders call it before every pass; call it yourself when feeding this sampler to a plain
        ``torch.utils.data.DataLoader`` with ``seed=`` set and workers that are not persistent.
        """
        self._epoch += 1

    def set_epoch(self, epoch: int) -> None:
        """Start the streams afresh as at pass ``epoch`` (threads seeded anew, counted from one), so the
        draws of a pass depend on the seed and the epoch, not on how many passes or threads came before:
        a job resumed at epoch e samples what an uninterrupted one does there (with ``seed=`` set)."""
        self._epoch = int(epoch)
        self._threads_seeded = itertools.count(1)
        self._local = threading.local()

    # -- BaseSampler --

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs: Any) -> SamplerOutput | HeteroSamplerOutput:
        self._local.input_id = index.input_id  # the batch's positions in the pass: part of its stream
        try:
            return self._subgraph(node_sample(index, self._sample))
        finally:
            self._local.input_id = None

    def sample_from_edges(self, index: EdgeSamplerInput, neg_sampling: NegativeSampling | None = None
                          ) -> SamplerOutput | HeteroSamplerOutput:
        if (not self.disjoint and not self.is_hetero and index.time is None and self.num_nodes <= 1 << 31
                and (neg_sampling is None or not self.node_time)):
            out = self._link_batch(index, neg_sampling)  # seeds and exclusion in one kernel call
            if out is not None:
                return out
        node_time = None
        if self.node_time:
            node_time = {k: torch.from_numpy(v) for k, v in self.node_time.items()}
            node_time = node_time if self.is_hetero else node_time[None]
        self._local.edge_input = index if self.config.exclude_seed_edges else None
        self._local.input_id = index.input_id
        try:
            return self._subgraph(edge_sample(index, self._sample, self.num_nodes, self.disjoint, node_time,
                                              neg_sampling))
        finally:
            self._local.edge_input = None
            self._local.input_id = None

    def _link_batch(self, index: EdgeSamplerInput, neg_sampling: NegativeSampling | None) -> SamplerOutput | None:
        """A homogeneous link batch without times, sampled as PyG's ``edge_sample`` samples it: the same
        negatives drawn in the same order, the pairs' ends de-duplicated and sorted as the seeds, ``metadata``
        saying where each pair's ends are among them; the seeds and the exclusion of the batch's links are made
        in one kernel call (:func:`sampling.graph.edgemask.link_batch`). ``None`` for a batch PyG refuses
        (the general path then raises as it does)."""
        src, dst, label = index.row, index.col, index.label
        num_pos = src.numel()
        triplet = neg_sampling is not None and neg_sampling.is_triplet()
        if triplet and label is not None:
            return None  # PyG's edge_sample refuses labels with triplet negatives
        if neg_sampling is not None:
            num_neg = math.ceil(num_pos * neg_sampling.amount)
            if not triplet:  # binary: a source and a destination per negative, the source drawn first
                src = torch.cat([src, neg_sampling.sample(num_neg, "src", self.num_nodes)])
                label = torch.ones(num_pos) if label is None else label
                label = torch.cat([label, label.new_zeros((num_neg, *label.size()[1:]))])
            dst = torch.cat([dst, neg_sampling.sample(num_neg, "dst", self.num_nodes)])
        links = None
        if self.config.exclude_seed_edges:  # the given links, not the negatives drawn
            links = (_seed_array(index.row), _seed_array(index.col))
            if index.label is not None and index.label.dim() == 1:
                given = (index.label != 0).cpu().numpy()  # given negatives are not links
                links = (links[0][given], links[1][given])
        ends = np.concatenate([_seed_array(src), _seed_array(dst)])
        made = link_batch(ends, links, self.num_nodes)
        if made is None:  # an ID below 0 or from 2**31 (no node here: there are at most 2**31)
            bad = ends[(ends < 0) | (ends >= 1 << 31)]
            raise NotOwnedError(f"link ends {bad[:5].tolist()} are outside [0, {self.num_nodes}), the node IDs of "
                                "this graph; pass IDs of existing nodes")
        seeds, inverse, exclude = made
        self._local.link_exclusion = ({None: (exclude[0], self.num_nodes, 3, exclude[1])} if exclude else {}), False
        self._local.input_id = index.input_id
        try:
            out = self._sample(torch.from_numpy(seeds))
        finally:
            self._local.link_exclusion = None
            self._local.input_id = None
        where = torch.from_numpy(inverse)
        if triplet:
            out.metadata = (index.input_id, where[:num_pos], where[num_pos:2 * num_pos],
                            where[2 * num_pos:].view(num_pos, -1).squeeze(-1), None)
        else:
            out.metadata = (index.input_id, where.view(2, -1), label, None)
        return self._subgraph(out)

    def exclusion(self) -> tuple[dict[Any, tuple], bool]:
        """For the link batch being sampled (``exclude_seed_edges``): per edge type the links the kernels
        must drop, and whether seed times are strict; ``({}, False)`` otherwise."""
        made = getattr(self._local, "link_exclusion", None)
        if made is not None:
            return made
        index = getattr(self._local, "edge_input", None)
        if index is None:
            return {}, False
        row, col = index.row, index.col
        if index.label is not None and index.label.dim() == 1:
            row, col = row[index.label != 0], col[index.label != 0]  # given negatives are not links
        input_type = index.input_type if self.is_hetero else None
        num_dst = self.num_nodes[input_type[2]] if self.is_hetero else self.num_nodes
        return exclusion(self.edge_types, input_type, row, col, num_dst), index.time is not None

    def _subgraph(self, out: SamplerOutput | HeteroSamplerOutput) -> SamplerOutput | HeteroSamplerOutput:
        """PyG's ``subgraph_type`` applied to a directional sample."""
        if self.config.subgraph_type == "induced":
            return subgraph.induced(self.topology, out)
        if self.config.subgraph_type == "bidirectional":
            return subgraph.bidirectional(out)
        return out

    @property
    def edge_permutation(self) -> None:
        return None  # edge IDs we return are already the input edge IDs

    # -- sampling --

    def _ensure_seeded(self) -> None:
        """Seed this thread's generators (numba's, per process and thread, and the fast path's) once
        per thread and process: a forked DataLoader worker inherits its parent's thread state, so the
        process ID is part of the check.

        With ``seed`` set, this stream is replaced before every batch (:meth:`_batch_stream`). Without
        it, a worker starts from torch's seed for that worker and pass (``get_worker_info().seed``), the
        main process from ``torch.initial_seed()``, each thread with a stream of its own.
        """
        pid = os.getpid()
        if getattr(self._local, "pid", None) == pid:
            return
        info = torch.utils.data.get_worker_info()
        count = next(self._threads_seeded)
        if self._seed is None:
            words = [info.seed if info else torch.initial_seed(), count]
        else:
            words = [self._seed % 2**64, info.id + 1 if info else 0, self._epoch, count]
        mixed = int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0])
        self._local.rng = rng_state(mixed)
        self._local.pid = pid

    def _batch_stream(self, seed: Any, seed_time: Any) -> None:
        """With ``seed`` set, each batch draws from a stream of its own: a function of the seed, the pass,
        the batch's positions in the pass's seed list (so a seed listed twice draws twice) and its seed
        nodes (and times), never of which thread or worker samples it or of the batches sampled before.
        So N threads or workers give the batches one does, and a job resumed mid-pass samples the rest of
        the pass as an uninterrupted one does. Applies to batches with positions (``input_id``: every
        loader's); direct calls without them draw on from the thread's stream, fresh each call."""
        digest = hashlib.blake2b(digest_size=8)
        for part in (getattr(self._local, "input_id", None), seed, seed_time):
            items = sorted(part.items(), key=lambda kv: repr(kv[0])) if isinstance(part, dict) else [(None, part)]
            for key, value in items:
                if value is not None:
                    digest.update(repr(key).encode())
                    digest.update(np.ascontiguousarray(_seed_array(value)).tobytes())
        words = [self._seed % 2**64, self._epoch, int.from_bytes(digest.digest(), "little")]
        self._local.rng = rng_state(int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0]))

    def _sample(self, seed: Any, seed_time: Any = None) -> SamplerOutput | HeteroSamplerOutput:
        self._ensure_seeded()
        if self._seed is not None and getattr(self._local, "input_id", None) is not None:
            self._batch_stream(seed, seed_time)  # a loader's batch (a direct call goes on with the thread's)
        excluded, strict = self.exclusion()
        if not isinstance(seed, dict) and self.fast_path is not None:
            seeds = _seed_array(seed)
            times = None
            if self.is_temporal:
                times = _seed_array(seed_time) if seed_time is not None else self.default_seed_times({None: seeds})[None]
            return self.fast_path.sample(seeds, self._local, times, excluded.get(None), strict)
        seeds = seed if isinstance(seed, dict) else {None: seed}
        times = seed_time if isinstance(seed_time, dict) or seed_time is None else {None: seed_time}
        if self.is_temporal and times is None:
            times = self.default_seed_times(seeds)
        return hop_driver.sample(self, self._local, seeds, times, excluded, strict, self.is_hetero)

    def default_seed_times(self, seeds: dict[Any, Any]) -> dict[Any, np.ndarray]:
        """PyG's rule when no seed time is given: each seed at its own time (``time_attr`` of its node)."""
        missing = [t for t in seeds if t not in self.node_time]
        if missing:
            raise InvalidInputError(
                f"time_attr {self.config.time_attr!r} is not a node attribute of seed type(s) {missing}, so seeds "
                "have no time of their own: pass input_time (nodes) or edge_label_time (links)"
            )
        return {t: self.node_time[t][_seed_array(s)] for t, s in seeds.items()}


def _is_hetero(data: Any, topo: dict[Any, EdgeTopology]) -> bool:
    if topo:
        return next(iter(topo)) is not None
    if _is_dataset(data):
        return data.is_hetero
    if isinstance(data, (tuple, list)):
        return any(isinstance(a.group_name, str) for a in data[0].get_all_tensor_attrs())
    return is_hetero_pyg(data)


def _check_is_sorted(data: Any, is_sorted: bool) -> None:
    if is_sorted and (_is_dataset(data) or isinstance(data, (tuple, list))):
        raise InvalidInputError(
            "is_sorted=True applies to an in-memory Data/HeteroData (it skips sorting edge_index); a graphstore "
            "dataset or store pair is stored sorted by destination already: drop is_sorted"
        )


def _is_dataset(data: Any) -> bool:
    from graphstore.dataset.opened import Dataset

    return isinstance(data, Dataset)


def _seed_array(seed: Any) -> np.ndarray:
    if isinstance(seed, torch.Tensor):
        return seed.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.asarray(seed, dtype=np.int64)
