"""``NeighborLoader`` and ``LinkNeighborLoader``: PyG's loaders, same arguments, our sampler underneath."""

from __future__ import annotations

import hashlib
import threading
import weakref
from typing import Any, Callable

import numpy as np
import torch
from torch_geometric.loader import LinkLoader, NodeLoader
from torch_geometric.sampler import HeteroSamplerOutput, NegativeSampling, SamplerOutput

from graphstore.dataset import rowmemory
from graphstore.dataset.opened import Dataset
from graphstore.dataset.whole import DatasetFeatureStore, DatasetGraphStore
from graphstore.errors import InvalidInputError
from sampling.loader import compat
from sampling.loader.device_feed import pin
from sampling.graph.edgemask import MessageEdges
from sampling.loader.seed_order import compact_shuffle
from sampling.loader.loader_threads import LoaderThreads, Prefetcher, RowsAhead
from sampling.drivers.neighbor_sampler import NeighborSampler


def _as_pyg_data(data: Any) -> Any:
    """What PyG's loader machinery gets: a Dataset becomes a (FeatureStore, GraphStore) pair."""
    if isinstance(data, Dataset):
        return DatasetFeatureStore(data), DatasetGraphStore(data)
    return data


def _make_sampler(data: Any, num_neighbors: Any, neighbor_sampler: NeighborSampler | None, loader: str,
                  **options: Any) -> NeighborSampler:
    """The loader's sampler: ``neighbor_sampler`` (whose options must agree with the loader's), or a new one."""
    if neighbor_sampler is not None:
        compat.check_given_sampler(neighbor_sampler, options, loader)
        return neighbor_sampler
    return NeighborSampler(data, num_neighbors, **options)


class _EdgeAttrs:
    """Adds a Dataset's edge attributes (weight, time, edge_attr, ...) to sampled batches."""

    _graph_dataset: Dataset | None

    def _remember(self, data: Any) -> None:
        """The dataset edge attributes come from."""
        self._graph_dataset = data if isinstance(data, Dataset) else None

    def _add_edge_attrs(self, batch: Any, out: SamplerOutput | HeteroSamplerOutput) -> Any:
        if self._graph_dataset is None or not hasattr(out, "edge_locator"):
            return batch
        for info in self._graph_dataset.manifest.edge_types:
            locator = out.edge_locator.get(info.name)
            if not info.attrs or locator is None:  # None: PyG returns no edge IDs for it (hetero bidirectional)
                continue
            part, pos = locator()  # computed on demand: most graphs have no edge attrs
            store = batch if info.name is None else batch[info.name]
            for name, schema in info.attrs.items():
                store[name] = self._gather_edges(info.name, name, part, pos, schema)
        return batch

    def _gather_edges(self, etype: Any, name: str, part: np.ndarray, pos: np.ndarray, schema: Any) -> torch.Tensor:
        out = torch.empty((len(pos), *schema.shape), dtype=getattr(torch, schema.dtype))
        for p in np.unique(part):
            sel = np.flatnonzero(part == p)
            gs = self._graph_dataset.partition(int(p))[1]
            out[torch.from_numpy(sel)] = gs.edge_attr(name, etype, torch.from_numpy(pos[sel]))
        return out


class _NewStreamEachPass:
    """Tells the sampler that a pass starts, so workers forked for it draw streams no pass drew before
    (with ``seed=`` set, a new worker would otherwise repeat the last pass's samples)."""

    def __iter__(self) -> Any:
        sampler = getattr(self, "node_sampler", None) or getattr(self, "link_sampler", None)
        if isinstance(sampler, NeighborSampler):
            sampler.next_epoch()
        return super().__iter__()  # type: ignore[misc]


class _Threaded:
    """A pass built by ``loader_threads`` threads, ``prefetch`` batches ahead of the consumer (neither: in
    the consumer's thread, as PyG does), and a pass that starts mid-way (``skip_next``)."""

    loader_threads: int = 1
    prefetch: int = 0
    _prefetch_rows: int | None = None
    skip_next = 0  # the next pass starts this many batches in (a job resumed mid-epoch); then back to 0

    def _set_threads(self, loader_threads: Any, prefetch: Any, num_workers: Any) -> None:
        for name, value, low in (("loader_threads", loader_threads, 1), ("prefetch", prefetch, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise InvalidInputError(f"{name}={value!r} given to {type(self).__name__}: give an integer >= {low}")
        if loader_threads > 1 and num_workers:
            raise InvalidInputError(
                f"loader_threads={loader_threads} with num_workers={num_workers}: both build batches in parallel "
                "(threads in this process, or worker processes); give one of them")
        self.loader_threads, self.prefetch = int(loader_threads), int(prefetch)
        self._workers = num_workers

    @property
    def prefetch_rows(self) -> int | None:
        """At most this many feature rows (sampled nodes, all types) in the batches built ahead of the
        consumer: a batch that would pass it is sampled, then waits to gather its rows until a batch ahead
        is taken or the consumer asks for it (``None``: no bound; ``0``: none gathered ahead). For rows too
        large to keep ``prefetch`` batches of them: features larger than memory, read from disk."""
        return self._prefetch_rows

    @prefetch_rows.setter
    def prefetch_rows(self, rows: Any) -> None:
        name = type(self).__name__
        if rows is None:
            self._prefetch_rows = None
            return
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
            raise InvalidInputError(f"prefetch_rows={rows!r} given to {name}: give an integer >= 0, or None")
        if self.loader_threads == 1 and not self.prefetch:
            raise InvalidInputError(f"prefetch_rows={rows} given to {name} with prefetch=0 and one loader thread: no "
                                    "batch is built ahead to bound; give prefetch=1 or more, or drop prefetch_rows")
        if self._workers or getattr(self, "sampler_processes", 0):
            raise InvalidInputError(f"prefetch_rows={rows} given to {name} with num_workers: worker processes gather "
                                    "each batch's rows as they sample it, so nothing can wait between; give one")
        if getattr(self, "filter_per_worker", False):
            raise InvalidInputError(f"prefetch_rows={rows} given to {name} with filter_per_worker=True: the rows are "
                                    "gathered as each batch is sampled, so nothing can wait between; give one")
        self._prefetch_rows = int(rows)

    def __iter__(self) -> Any:
        base = super().__iter__()  # type: ignore[misc]
        skip, self.skip_next = self.skip_next, 0
        inner = getattr(base, "iterator", base)  # PyG's DataLoaderIterator wraps torch's
        in_process = hasattr(inner, "_dataset_fetcher") and not self.num_workers  # type: ignore[attr-defined]
        if skip and not in_process:
            raise InvalidInputError(f"{type(self).__name__} with num_workers cannot start a pass mid-way (its workers "
                                    "have drawn their index batches already); resume at an epoch's end")
        for _ in range(skip):  # the seed order is drawn as in a whole pass; skipped batches are not sampled
            inner._next_index()
        processes = getattr(self, "sampler_processes", 0)
        if processes:  # a distributed loader's sampler processes build the batches; threads keep their order
            from sampling.loader.sampler_processes import SLOTS

            pinned = bool(getattr(inner, "_pin_memory", False))
            return LoaderThreads(inner._next_index, self._process_builder(processes, pinned), processes * SLOTS,
                                 self.prefetch)
        if self.loader_threads == 1 and not self.prefetch:
            return base
        if not in_process:  # worker processes build the batches: a thread only keeps them coming
            return Prefetcher(base, self.prefetch)
        sampler = getattr(self, "node_sampler", None) or getattr(self, "link_sampler", None)
        if isinstance(sampler, NeighborSampler):  # what the sampler builds lazily is built here, before the threads
            _ = sampler.fast_path, sampler.node_time
        if self._prefetch_rows is not None:
            sample, gather = _builder(base, inner, split=True)
            return LoaderThreads(inner._next_index, sample, self.loader_threads, self.prefetch,
                                 ahead=RowsAhead(gather, sampled_rows, self._prefetch_rows))
        return LoaderThreads(inner._next_index, _builder(base, inner), self.loader_threads, self.prefetch)


    def _process_builder(self, count: int, pinned: bool = False) -> Callable[[Any], Any]:
        """What a loader thread does with an index batch when sampler processes build it: hand it, with
        this pass's stream number, to one of them (started on the first pass, kept for the later ones); the
        thread copies the batch out of the worker's shared memory, into pinned memory when the loader pins
        (a GPU rank): the copy is this loader thread's, not the training loop's."""
        pool = getattr(self, "_pool", None)
        if pool is None:
            pool = self._pool = process_pool(self, count, pinned)
        sampler = getattr(self, "node_sampler", None) or getattr(self, "link_sampler", None)
        stream = sampler._epoch
        return lambda index: pool.build(stream, index)


def process_pool(loader: Any, count: int, pinned: bool = False) -> Any:
    """``count`` sampler processes (:class:`sampling.loader.sampler_processes.SamplerProcesses`) that build a
    distributed loader's batches from its recipe, closed with the loader; ``pool.build(stream, index)``."""
    from sampling.loader.sampler_processes import SamplerProcesses

    cls, dataset, fanout, seeds, kwargs = loader._recipe
    threads = ("num_workers", "loader_threads", "prefetch", "prefetch_rows")  # the rank's, not its workers'
    kwargs = {k: v for k, v in kwargs.items() if k not in threads}
    cache = getattr(getattr(loader, "features", None), "device_cache", None)  # --gpu-cache: its hits left out
    pool = SamplerProcesses((cls, dataset, fanout, seeds, kwargs), count, loader.transport, pinned, cache)
    pool.stats = loader.stats
    weakref.finalize(loader, pool.close)
    return pool


def _builder(base: Any, inner: Any, split: bool = False) -> Any:
    """What a loader thread does with an index batch: sample it (the loader's ``collate_fn``), gather
    its features (``filter_fn``; already done in ``collate_fn`` with ``filter_per_worker``), and pin it
    when the loader was given ``pin_memory=True`` and there is an accelerator: then the feature stores
    gather the rows straight into pinned memory (:mod:`graphstore.dataset.rowmemory`). With ``split``, the
    two steps apart: ``(sample, gather)`` (``prefetch_rows`` waits between them)."""
    fetch = inner._dataset_fetcher.fetch  # collate_fn of the batch's items, as torch's iterator calls it
    gather = base.transform_fn if base is not inner else None
    pinned = bool(getattr(inner, "_pin_memory", False))

    def sample(index: Any) -> Any:
        with rowmemory.pinned_rows(pinned):
            return fetch(index)

    def finish(batch: Any) -> Any:
        with rowmemory.pinned_rows(pinned):  # the stores gather the rows into pinned memory: no second copy
            if gather is not None:
                batch = gather(batch)
        return pin(batch) if pinned else batch  # what is not pinned yet (the sampler's outputs)

    if split:
        return sample, finish
    return lambda index: finish(sample(index))


def sampled_rows(out: Any) -> int:
    """The feature rows a sampled batch gathers: its nodes, of every type."""
    node = getattr(out, "node", None)
    if isinstance(node, dict):
        return sum(int(n.numel()) for n in node.values())
    return int(node.numel()) if isinstance(node, torch.Tensor) else 0


class NeighborLoader(_Threaded, _NewStreamEachPass, _EdgeAttrs, NodeLoader):
    """A drop-in for ``torch_geometric.loader.NeighborLoader`` that also reads graphstore datasets.

    ``data`` is a PyG ``Data``/``HeteroData``, a ``(FeatureStore, GraphStore)`` pair, or a graphstore
    ``Dataset`` (all partitions, memory-mapped). Arguments are PyG's; ``seed`` fixes the sampling RNG, and with
    ``shuffle=True`` (no ``generator`` given) the seed order of every pass too.

    ``loader_threads=N`` builds batches (sampling, feature gather) in N threads of this process, handed
    out in order, at most ``prefetch + N`` in flight; ``prefetch=P`` keeps P batches ready ahead (with
    N = 1, one background thread). ``prefetch_rows=R`` bounds the feature rows those batches ahead hold (R
    sampled nodes in all; a batch past it is sampled, then gathers its rows once it fits or the consumer asks
    for it): for rows too large to keep P batches of. With ``seed`` set the batches are the same for every N
    (and for any ``num_workers``, or ``prefetch_rows``). ``pin_memory=True`` (PyG's and torch's argument)
    pins each batch in the loader threads when there is an accelerator (a graphstore store gathers its rows
    straight into pinned memory); :class:`sampling.DeviceFeeder` then copies it to the GPU ahead.

    Examples
    --------
    >>> ds = graphstore.open_dataset("/data/cora")  # doctest: +SKIP
    >>> loader = NeighborLoader(ds, [10, 5], input_nodes=train_ids, batch_size=128, shuffle=True)  # doctest: +SKIP
    >>> batch = next(iter(loader))  # doctest: +SKIP
    >>> batch.x.shape[0] == batch.n_id.numel()  # doctest: +SKIP
    True
    """

    def __init__(self, data: Any, num_neighbors: Any, input_nodes: Any = None, input_time: Any = None,
                 replace: bool = False, subgraph_type: str = "directional", disjoint: bool = False,
                 temporal_strategy: str = "uniform", time_attr: str | None = None, weight_attr: str | None = None,
                 transform: Callable | None = None, transform_sampler_output: Callable | None = None,
                 is_sorted: bool = False, filter_per_worker: bool | None = None,
                 neighbor_sampler: NeighborSampler | None = None, directed: bool = True, seed: int | None = None,
                 message_edges: MessageEdges | None = None, loader_threads: int = 1, prefetch: int = 0,
                 prefetch_rows: int | None = None, **kwargs: Any) -> None:
        self._set_threads(loader_threads, prefetch, kwargs.get("num_workers", 0))
        if input_time is not None and time_attr is None:
            raise InvalidInputError("input_time is set but time_attr is not: name the time attribute too")
        subgraph_type = compat.resolve_subgraph_type(subgraph_type, directed, type(self).__name__)
        sampler = _make_sampler(data, num_neighbors, neighbor_sampler, type(self).__name__, replace=replace,
                                disjoint=disjoint, temporal_strategy=temporal_strategy, time_attr=time_attr,
                                weight_attr=weight_attr, seed=seed, subgraph_type=subgraph_type, is_sorted=is_sorted,
                                message_edges=message_edges)
        self._remember(data)
        super().__init__(_as_pyg_data(data), sampler, input_nodes=_default_input_nodes(data, input_nodes),
                         input_time=input_time, transform=transform, transform_sampler_output=transform_sampler_output,
                         filter_per_worker=_filter_per_worker(data, filter_per_worker, prefetch_rows), **kwargs)
        compact_shuffle(self, seed)  # shuffle=True: torch's order, 4 bytes per seed instead of a Python int each
        if time_attr is not None and input_time is None:
            self.input_data.time = _seed_times(sampler, self.input_data, type(self).__name__)
        self.prefetch_rows = prefetch_rows  # checked against the threads, workers and filter_per_worker

    def filter_fn(self, out: Any) -> Any:
        return self._add_edge_attrs(super().filter_fn(out), out)


class LinkNeighborLoader(_Threaded, _NewStreamEachPass, _EdgeAttrs, LinkLoader):
    """A drop-in for ``torch_geometric.loader.LinkNeighborLoader`` that also reads graphstore datasets.

    ``edge_label_index`` defaults to every edge of the (only, or named) edge type; binary and triplet
    negative sampling and temporal (``edge_label_time``) seeds work as in PyG. Leak-free link
    prediction (not PyG's defaults): ``message_edges=MessageEdges(allowed=(0,))`` passes messages over
    train links only, ``exclude_seed_edges=True`` keeps each batch's own links (and reverses) out of
    its subgraph and makes temporal sampling strictly earlier than ``edge_label_time``. ``loader_threads``,
    ``prefetch``, ``prefetch_rows`` and ``pin_memory``: as for :class:`NeighborLoader`.

    Examples
    --------
    >>> loader = LinkNeighborLoader(ds, [10, 5], batch_size=256,
    ...                             neg_sampling=dict(mode="binary", amount=1))  # doctest: +SKIP
    """

    _pyg_time_rule = True  # PyG's: time_attr needs edge_label_time (the distributed loader relaxes it)

    def __init__(self, data: Any, num_neighbors: Any, edge_label_index: Any = None, edge_label: Any = None,
                 edge_label_time: Any = None, replace: bool = False, subgraph_type: str = "directional",
                 disjoint: bool = False, temporal_strategy: str = "uniform", neg_sampling: Any = None,
                 neg_sampling_ratio: float | None = None, time_attr: str | None = None,
                 weight_attr: str | None = None, transform: Callable | None = None,
                 transform_sampler_output: Callable | None = None, is_sorted: bool = False,
                 filter_per_worker: bool | None = None, neighbor_sampler: NeighborSampler | None = None,
                 directed: bool = True, seed: int | None = None, message_edges: MessageEdges | None = None,
                 exclude_seed_edges: bool = False, loader_threads: int = 1, prefetch: int = 0,
                 prefetch_rows: int | None = None, **kwargs: Any) -> None:
        self._set_threads(loader_threads, prefetch, kwargs.get("num_workers", 0))
        if self._pyg_time_rule or time_attr is None:
            compat.check_link_time(time_attr, edge_label_time, type(self).__name__)
        subgraph_type = compat.resolve_subgraph_type(subgraph_type, directed, type(self).__name__)
        sampler = _make_sampler(data, num_neighbors, neighbor_sampler, type(self).__name__, replace=replace,
                                disjoint=disjoint, temporal_strategy=temporal_strategy, time_attr=time_attr,
                                weight_attr=weight_attr, seed=seed, subgraph_type=subgraph_type, is_sorted=is_sorted,
                                message_edges=message_edges, exclude_seed_edges=exclude_seed_edges)
        self._remember(data)
        edge_label_index = _default_edge_label_index(data, edge_label_index)
        if isinstance(neg_sampling, dict):
            from torch_geometric.sampler import NegativeSampling

            neg_sampling = NegativeSampling(**neg_sampling)
        super().__init__(_as_pyg_data(data), sampler, edge_label_index=edge_label_index, edge_label=edge_label,
                         edge_label_time=edge_label_time, neg_sampling=neg_sampling,
                         neg_sampling_ratio=neg_sampling_ratio, transform=transform,
                         transform_sampler_output=transform_sampler_output,
                         filter_per_worker=_filter_per_worker(data, filter_per_worker, prefetch_rows), **kwargs)
        compact_shuffle(self, seed)
        if self.neg_sampling is not None:
            self.neg_sampling = BatchNegatives(self.neg_sampling)
        self.prefetch_rows = prefetch_rows

    def collate_fn(self, index: Any) -> Any:
        if isinstance(self.neg_sampling, BatchNegatives):
            self.neg_sampling.start(_negatives_seed(self.link_sampler, index))
        return super().collate_fn(index)

    def filter_fn(self, out: Any) -> Any:
        return self._add_edge_attrs(super().filter_fn(out), out)


class BatchNegatives(NegativeSampling):
    """PyG's negative sampling, drawn, when the sampler has a ``seed``, from a generator of each batch's
    own (seeded by the seed, the pass and the batch's links): torch's global generator is shared by the
    loader threads (and the training loop), so draws from it would depend on timing and thread count."""

    def __init__(self, base: NegativeSampling) -> None:
        super().__init__(base.mode, base.amount, base.src_weight, base.dst_weight)
        self._local = threading.local()

    def start(self, seed: int | None) -> None:
        """The batch this thread samples next draws from ``seed`` (``None``: torch's global generator)."""
        self._local.generator = None if seed is None else torch.Generator().manual_seed(seed)

    def sample(self, num_samples: int, endpoint: Any = "src", num_nodes: int | None = None) -> torch.Tensor:
        generator = getattr(self._local, "generator", None)
        weight = self.src_weight if endpoint == "src" else self.dst_weight
        if generator is None or (weight is not None and num_nodes is not None and weight.numel() != num_nodes):
            return super().sample(num_samples, endpoint, num_nodes)  # PyG's draw (and its errors)
        if weight is None:
            if num_nodes is None:
                return super().sample(num_samples, endpoint, num_nodes)
            return torch.randint(num_nodes, (num_samples,), generator=generator)
        return torch.multinomial(weight, num_samples, replacement=True, generator=generator)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()


def _negatives_seed(sampler: Any, index: Any) -> int | None:
    """The seed of a link batch's negatives: the sampler's seed, its pass and the batch's positions in
    ``edge_label_index`` (``None`` without a seed: torch's global generator, as PyG draws)."""
    seed = getattr(sampler, "_seed", None)
    if seed is None:
        return None
    positions = index.numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    digest = hashlib.blake2b(np.ascontiguousarray(positions, np.int64).tobytes(), digest_size=8).digest()
    words = [seed % 2**64, getattr(sampler, "_epoch", 0), int.from_bytes(digest, "little"), 0x4E4547]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _filter_per_worker(data: Any, filter_per_worker: bool | None, prefetch_rows: Any = None) -> bool | None:
    """PyG's default, except for graphstore datasets and loaders given ``prefetch_rows`` (which waits
    between sampling a batch and gathering its rows): rows are fetched in the main process.

    A dataset's rows are already in (shared) page cache, so the main process copies them into the
    batch once; fetched in a worker they are copied again into shared memory to cross processes.
    Measured on the products benchmark with 2 workers: 2.58 batches/s this way, 2.32 fetching in the
    workers, 2.21 with no workers (docs/performance.md). Pass ``filter_per_worker=True`` to fetch in workers.
    """
    if filter_per_worker is None and (isinstance(data, Dataset) or prefetch_rows is not None):
        return False
    return filter_per_worker


def _default_input_nodes(data: Any, input_nodes: Any) -> Any:
    """PyG's rules, extended to datasets: ``None`` = all nodes, a node type, ``(type, ids or mask)``,
    and, for datasets, a mask attribute by name (``"train_mask"`` or ``("paper", "train_mask")``).
    """
    if not isinstance(data, Dataset):
        return input_nodes
    ntype, nodes = None, input_nodes
    if isinstance(input_nodes, str):
        ntype, nodes = (input_nodes, None) if input_nodes in data.node_types else (None, input_nodes)
    elif isinstance(input_nodes, (tuple, list)) and len(input_nodes) == 2 and isinstance(input_nodes[0], str):
        ntype, nodes = input_nodes
    if data.is_hetero and ntype is None:
        raise InvalidInputError(f"name the node type of input_nodes for a heterogeneous dataset: {data.node_types}")
    if isinstance(nodes, str):
        nodes = DatasetFeatureStore(data)[ntype, nodes, None].nonzero().view(-1)
    elif nodes is None:
        nodes = torch.arange(data.num_nodes(ntype))
    return (ntype, nodes) if ntype is not None else nodes


def _default_edge_label_index(data: Any, edge_label_index: Any) -> Any:
    if not isinstance(data, Dataset):
        return edge_label_index
    if edge_label_index is None and data.is_hetero:
        raise InvalidInputError(f"name the edge type of edge_label_index for a heterogeneous dataset: {data.edge_types}")
    if edge_label_index is None or (isinstance(edge_label_index, (tuple, list)) and isinstance(edge_label_index[0], str)):
        etype = None if edge_label_index is None else tuple(edge_label_index)
        src, dst = DatasetGraphStore(data).get_edge_index(etype, "coo")
        return etype, torch.stack([src, dst])
    if isinstance(edge_label_index, torch.Tensor):  # PyG wants (edge type, index) for store pairs
        return None, edge_label_index
    return edge_label_index


def _seed_times(sampler: NeighborSampler, input_data: Any, loader: str) -> torch.Tensor:
    """PyG's seed times when ``input_time`` is not given: each seed node's own ``time_attr``."""
    compat.check_node_seed_time(sampler, input_data.input_type, loader)
    return torch.from_numpy(sampler.node_time[input_data.input_type][input_data.node.numpy()])
