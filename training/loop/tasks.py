"""What is trained: node classification (homogeneous or heterogeneous) and link prediction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from graphstore.errors import InvalidInputError
from graphstore.dataset.linksplit import SPLIT_NAMES, LinkSplit
from sampling.distributed.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader, local_links, local_seeds
from sampling.graph.edgemask import MessageEdges, dataset_split
from training.loop.batches import PREFETCH, short_rank_loader

if TYPE_CHECKING:
    from graphstore.dataset.opened import Dataset
    from graphstore.dataset.rank_layout import RankLayout
    from sampling.distributed.dist_sampler import RemoteStats
    from training.config import TrainConfig
    from training.cluster.world import World

TASKS = ("node", "link")


class TaskHost(Protocol):
    """What a task reads from the rank running it (``training.loop.trainer.Trainer`` is one)."""

    config: TrainConfig
    dataset: Dataset
    world: World
    layout: RankLayout
    parts: tuple[int, ...]
    stats: RemoteStats

    def to_device(self, batch: Any) -> Any: ...
# models whose layers are trimmed to the nodes and edges the next layer still uses (PyG's trim_to_layer);
# not GCN: its normalisation reads the degree of every source node, which trimming changes
TRIMMED_MODELS = ("sage", "gat", "gin")
SPARSE_MODELS = ("sage", "gin")  # on CPU, aggregate in blocks by a sparse product: no feature row per edge


def build_model(name: str, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float,
                config: Any = None) -> torch.nn.Module:
    """A built-in model by name, or your own (``MODULE:FACTORY``: ``FACTORY(in_dim, out_dim, config)``)."""
    if ":" in name:
        from training.loop.usercode import build_model as build_yours

        return build_yours(name, in_dim, out_dim, config)
    from torch_geometric.nn.models import GCN

    from training.loop.models import MODELS

    cls = {"gcn": GCN, **MODELS}[name]  # SAGE, GAT and GIN run layer by layer over the nodes the next layer reads
    return cls(in_dim, hidden, num_layers=layers, out_channels=out_dim, dropout=dropout)


def trim_arguments(model: str, batch: Any) -> dict[str, Any]:
    """Keyword arguments making a built-in homogeneous ``model`` trim each layer (PyG's ``trim_to_layer``).

    Layer i drops the nodes and edges of the outermost i hops, which no later layer reads, so the
    seeds' outputs stay the same. Needs the batch's per-hop counts (``num_sampled_nodes``/``_edges``);
    empty for GCN, heterogeneous batches (``to_hetero`` models cannot trim in PyG 2.8) or batches without them.
    """
    nodes, edges = getattr(batch, "num_sampled_nodes", None), getattr(batch, "num_sampled_edges", None)
    if model not in TRIMMED_MODELS or not isinstance(nodes, list) or not isinstance(edges, list):
        return {}
    return {"num_sampled_nodes_per_hop": nodes, "num_sampled_edges_per_hop": edges}


def _loader_options(trainer: TaskHost, split: str) -> dict[str, Any]:
    """The loaders' options: the seed order and streams of the rank, ``--loader-threads`` (default: the
    rank's share of the host's cores; the batches do not depend on it), batches pinned for a GPU; one thread
    when the rank reads features larger than its memory from disk, its batches ahead holding no rows until
    the trainer has counted the memory left for them (``prefetch_rows``, set after ``check_room``)."""
    from training.cluster.threads import loader_threads

    c = trainer.config
    # features beyond memory: a batch's rows are the largest thing a rank holds, so a batch ahead gathers its rows
    # only where the memory limit leaves room for them beside the batch in training (worker processes: none ahead)
    short = getattr(getattr(trainer, "features", None), "short", False)
    workers = c.loader_workers if split == "train" else 0
    ahead: dict[str, Any] = dict(prefetch=PREFETCH, loader_threads=1 if workers else
                                 loader_threads(c.loader_threads, trainer.world.local_world_size))
    if short:
        ahead |= short_rank_loader(bool(workers))
        if not workers:
            ahead["prefetch_rows"] = 0  # until the trainer has counted the room (check_room)
    return dict(layout=trainer.layout, stats=trainer.stats, batch_size=c.batch_size, shuffle=split == "train",
                seed=c.seed * 7919 + trainer.world.rank, cache_rows=c.cache_rows, filter_per_worker=False,
                edge_ids=False,  # no task reads e_id: remote sampling answers leave edge IDs out
                **ahead, num_workers=workers,
                pin_memory=trainer.world.use_cuda,  # pinned in the loader threads: the copy to the GPU is async
                **({"time_attr": c.time_attr} if c.time_attr else {}))


class NodeTask:
    """Node classification on ``target`` (the node type with ``y`` and ``train_mask``): accuracy."""

    metric = "acc"
    seeds_per_example = 1  # sampled seed nodes per batch example

    @property
    def edge_rows(self) -> bool:
        """Whether the model gathers a feature row per sampled edge (featurecache.check_room): not the
        built-in GraphSAGE and GIN on CPU, which aggregate in blocks by a sparse product."""
        c = self.t.config
        return self.hetero or c.model not in SPARSE_MODELS or self.t.world.use_cuda

    def __init__(self, trainer: TaskHost) -> None:
        self.t = trainer
        manifest = trainer.dataset.manifest
        labelled = [n.name for n in manifest.node_types if {"y", "train_mask"} <= set(n.attrs)]
        target = trainer.config.target
        if target is None:
            if not labelled:
                raise InvalidInputError(f"{trainer.dataset.url} has no node type with y and train_mask to classify")
            target = labelled[0]
        elif target not in labelled:
            raise InvalidInputError(f"--target {target!r} has no y/train_mask; node types with labels: {labelled}")
        self.target = target
        self.hetero = trainer.dataset.is_hetero
        self.loss = F.cross_entropy
        if trainer.config.loss:
            from training.loop.usercode import load

            self.loss = load(trainer.config.loss, "--loss")

    def loaders(self) -> dict[str, Any]:
        t, info, out = self.t, self.t.dataset.manifest.node_type(self.target), {}
        fanout = self._fanout()
        for split, mask in (("train", "train_mask"), ("val", "val_mask"), ("test", "test_mask")):
            if mask not in info.attrs:
                continue
            if getattr(t, "servers", None) is not None:
                out[split] = _served_loader(t, fanout, (self.target, mask) if self.hetero else mask, split)
                continue
            seeds = local_seeds(t.dataset, t.parts, mask, t.layout, t.world.rank, node_type=self.target)
            seeds = (self.target, seeds) if self.hetero else seeds
            out[split] = DistributedNeighborLoader(t.dataset, fanout, t.transport, seeds, **_loader_options(t, split))
        return out

    def _fanout(self) -> Any:
        fanout = list(self.t.config.fanout)
        return {et: fanout for et in self.t.dataset.edge_types} if self.hetero else fanout

    def model(self) -> torch.nn.Module:
        c, ds = self.t.config, self.t.dataset
        classes = torch.tensor(_max_label(self.t, self.target) + 1)
        dist.all_reduce(classes, op=dist.ReduceOp.MAX)
        if not self.hetero:
            info = ds.manifest.node_types[0]
            if "x" not in info.attrs:
                raise InvalidInputError(f"{ds.url} has no node features x to classify from")
            return build_model(c.model, int(np.prod(info.attrs["x"].shape)), c.hidden, int(classes),
                               len(c.fanout), c.dropout, c)
        from torch_geometric.nn import to_hetero

        base = build_model(c.model, -1, c.hidden, int(classes), len(c.fanout), c.dropout, c)
        return to_hetero(base, (ds.node_types, ds.edge_types), aggr="sum")

    def inputs(self, batch: Any) -> tuple[Any, Any]:
        if not self.hetero:
            return (batch.x.float(), batch.edge_index)
        x = {nt: (batch[nt].x.float() if "x" in batch[nt] else torch.ones(batch[nt].num_nodes, 1))
             for nt in batch.node_types}  # featureless types get a constant input
        return (x, batch.edge_index_dict)

    def step(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, float, int]:
        trim = {} if self.hetero else trim_arguments(self.t.config.model, batch)
        out = model(*self.inputs(batch), **trim)
        store = batch[self.target] if self.hetero else batch
        out = (out[self.target] if self.hetero else out)[: store.batch_size]
        y = store.y[: store.batch_size]
        return self.loss(out, y), float((out.argmax(-1) == y).sum()), int(len(y))

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, loader: Any) -> float:
        model.eval()
        counts = torch.zeros(2, dtype=torch.float64)
        for batch in loader:
            _, correct, seen = self.step(model, self.t.to_device(batch))
            counts += torch.tensor([correct, seen], dtype=torch.float64)
        dist.all_reduce(counts)
        return round(float(counts[0] / max(counts[1], 1)), 5)


class LinkTask:
    """Link prediction on one edge type: negatives ``binary`` (AUC) or ``triplet`` (MRR), all ranks' results.

    Links are split as the dataset stores it (``graphstore ingest --link-split``); without a stored
    split every rank computes the same one by the ingest rules (0.8/0.1/0.1; by time when
    ``time_attr`` is an attribute of the edge type, else at random from ``seed``) and logs that it did.
    Each rank's seed links are its partition's links of each split (shared between the partition's
    ranks). Messages pass over train links only when training and validating, over train and
    validation links when testing (PyG's convention): the kernels apply the mask, on every partition.
    A batch never holds its own links nor their reverses, and temporal sampling sees strictly earlier
    edges only. Heterogeneous graphs use ``to_hetero`` encoders; node types without features get a
    learned embedding per node.
    """

    # counted as a row per edge: an encoder that cannot run in blocks gathers one (hidden-wide) per edge
    edge_rows = True

    MESSAGES = {"train": (0,), "val": (0,), "test": (0, 1)}  # split values messages pass over

    def __init__(self, trainer: TaskHost) -> None:
        self.t = trainer
        ds, c = trainer.dataset, trainer.config
        self.hetero = ds.is_hetero
        self.edge_type = ds.manifest.edge_type(c.edge_type).name if c.edge_type else ds.edge_types[0]
        self.triplet = c.neg_sampling == "triplet"
        self.metric = "mrr" if self.triplet else "auc"
        # sampled seed nodes per link at most: its two ends and its negatives' (binary: one negative link;
        # triplet: five negative destinations)
        self.seeds_per_example = 7 if self.triplet else 4
        self.rule = None if ds.manifest.link_split(self.edge_type) else self._fallback_rule()

    def _fallback_rule(self) -> LinkSplit:
        c, info = self.t.config, self.t.dataset.manifest.edge_type(self.edge_type)
        by_time = bool(c.time_attr) and c.time_attr in info.attrs
        return LinkSplit((0.8, 0.1, 0.1), "time" if by_time else "random", info.name, c.seed, c.time_attr or "time")

    def _own_links(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """This rank's links (global IDs), their times (or ``None``) and their splits."""
        t, c = self.t, self.t.config
        has_time = c.time_attr and c.time_attr in t.dataset.manifest.edge_type(self.edge_type).attrs
        index, times = local_links(t.dataset, t.layout, t.world.rank, self.edge_type, c.time_attr if has_time else None)
        splits = []
        for part in t.parts:
            share, ranks = t.layout.share(t.world.rank, part)
            split = dataset_split(t.dataset, part, self.edge_type, self._mask("train"))
            splits.append(torch.from_numpy(np.asarray(split))[share::ranks])
        return index, times, torch.cat(splits)

    def _mask(self, name: str) -> MessageEdges:
        return MessageEdges(self.edge_type, self.MESSAGES[name], self.rule)

    def loaders(self) -> dict[str, Any]:
        t, c = self.t, self.t.config
        fanout = {et: list(c.fanout) for et in t.dataset.edge_types} if self.hetero else list(c.fanout)
        negatives = dict(mode=c.neg_sampling, amount=1 if not self.triplet else 5)
        if getattr(t, "servers", None) is not None:
            return self._served_loaders(fanout, negatives)
        index, times, split = self._own_links()
        out = {}
        for value, name in enumerate(SPLIT_NAMES):
            sel = torch.nonzero(split == value).view(-1)
            kwargs = {"edge_label_time": times[sel]} if times is not None else {}
            seeds = (self.edge_type, index[:, sel]) if self.hetero else index[:, sel]
            out[name] = DistributedLinkNeighborLoader(t.dataset, fanout, t.transport, seeds, neg_sampling=negatives,
                                                      message_edges=self._mask(name), exclude_seed_edges=True,
                                                      **kwargs, **_loader_options(t, name))
        return out

    def _served_loaders(self, fanout: Any, negatives: dict[str, Any]) -> dict[str, Any]:
        """Each split's loader over sampler servers (``--servers``): this rank's share of the split's links as
        the servers hold them (the stored split, or computed there by :attr:`rule`), the same masks."""
        from sampling.remote.client import ServedLoader
        from training.loop.served import split_links

        t, out = self.t, {}
        for name in SPLIT_NAMES:
            index, extra = split_links(t.session, name, self.edge_type, t.config.time_attr, self.rule)
            seeds = (self.edge_type, index) if self.hetero else index
            out[name] = ServedLoader(t.servers, "link", fanout, seeds, neg_sampling=negatives,
                                     message_edges=self._mask(name), exclude_seed_edges=True, **extra,
                                     **_served_options(t, name))
        return out

    def model(self) -> torch.nn.Module:
        c, ds = self.t.config, self.t.dataset
        encoder = build_model(c.model, c.hidden if not self.hetero else -1, c.hidden, c.hidden, len(c.fanout),
                              c.dropout, c)
        if self.hetero:
            from torch_geometric.nn import to_hetero

            encoder = to_hetero(encoder, (ds.node_types, ds.edge_types), aggr="sum")
        dims = {n.name: int(np.prod(n.attrs["x"].shape)) if "x" in n.attrs else 0 for n in ds.manifest.node_types}
        return LinkModel(encoder, {n.name: n.num_nodes for n in ds.manifest.node_types}, dims, c.hidden,
                         self.edge_type if self.hetero else None, c.model)

    def _store(self, batch: Any) -> Any:
        return batch[self.edge_type] if self.hetero else batch

    def step(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, float, int]:
        if self.triplet:
            pos, neg = self._triplet_scores(model, batch)
            loss = F.softplus(neg - pos.unsqueeze(-1)).mean()  # BPR: positives above their negatives
            return loss, float((pos.unsqueeze(-1) > neg).float().mean(-1).sum()), int(pos.numel())
        store = self._store(batch)
        scores = model(batch, (store.edge_label_index[0], store.edge_label_index[1]))
        loss = F.binary_cross_entropy_with_logits(scores, store.edge_label)
        return loss, float(((scores > 0).float() == store.edge_label).sum()), int(store.edge_label.numel())

    def _triplet_scores(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        src_store = batch[self.edge_type[0]] if self.hetero else batch
        dst_store = batch[self.edge_type[2]] if self.hetero else batch
        src, pos = src_store.src_index, dst_store.dst_pos_index
        neg = dst_store.dst_neg_index.view(len(src), -1)
        pos_scores, neg_scores = model(batch, (src, pos), (src.repeat_interleave(neg.size(1)), neg.reshape(-1)))
        return pos_scores, neg_scores.view(len(src), -1)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, loader: Any) -> float:
        model.eval()
        if self.triplet:  # mean reciprocal rank of each positive among its negatives
            sums = torch.zeros(2, dtype=torch.float64)
            for batch in loader:
                pos, neg = self._triplet_scores(model, self.t.to_device(batch))
                rank = 1 + (neg >= pos.unsqueeze(-1)).sum(-1)
                sums += torch.tensor([float((1.0 / rank).sum()), pos.numel()], dtype=torch.float64)
            dist.all_reduce(sums)
            return round(float(sums[0] / max(sums[1], 1)), 5)
        scores, labels = [], []
        for batch in loader:
            store = self._store(self.t.to_device(batch))
            scores.append(model(batch, (store.edge_label_index[0], store.edge_label_index[1])).cpu())
            labels.append(store.edge_label.cpu())
        mine = (torch.cat(scores) if scores else torch.zeros(0), torch.cat(labels) if labels else torch.zeros(0))
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        return round(auc(torch.cat([g[0] for g in gathered]), torch.cat([g[1] for g in gathered])), 5)


class LinkModel(torch.nn.Module):
    """Inputs per node type (features projected to ``hidden``, or a learned embedding per node when a
    type has none), a GNN encoder (``to_hetero`` for heterogeneous graphs), and a dot-product decoder
    of labelled pairs (source rows of the edge type's source type, destination rows of its target).

    A built-in homogeneous encoder runs in blocks down to the batch's seeds (the links' ends and their
    negatives: hop 0) when every scored node is one, so only their rows come out of its last layer."""

    def __init__(self, encoder: torch.nn.Module, num_nodes: dict, dims: dict, hidden: int, edge_type: Any,
                 model: str = "") -> None:
        super().__init__()
        self.encoder, self.edge_type, self.model = encoder, edge_type, model
        keys = {nt: str(i) for i, nt in enumerate(num_nodes)}
        self.keys = keys
        self.inputs = torch.nn.ModuleDict({
            keys[nt]: torch.nn.Linear(dims[nt], hidden) if dims[nt] else torch.nn.Embedding(num_nodes[nt], hidden)
            for nt in num_nodes})

    def _input(self, ntype: Any, store: Any) -> torch.Tensor:
        layer = self.inputs[self.keys[ntype]]
        return layer(store.x.float()) if isinstance(layer, torch.nn.Linear) else layer(store.n_id)

    def forward(self, batch: Any, *pairs: tuple[torch.Tensor, torch.Tensor]) -> Any:
        """The scores of each of ``pairs`` (source rows, destination rows), from one pass of the encoder: a
        tensor for one pair of index tensors, a tuple for several."""
        if self.edge_type is None:
            h = self.encoder(self._input(None, batch), batch.edge_index, **self._hops(batch, pairs))
            scores = tuple((h[a] * h[b]).sum(-1) for a, b in pairs)
        else:
            x = {nt: self._input(nt, batch[nt]) for nt in batch.node_types}
            h = self.encoder(x, batch.edge_index_dict)
            src, _, dst = self.edge_type
            scores = tuple((h[src][a] * h[dst][b]).sum(-1) for a, b in pairs)
        return scores[0] if len(scores) == 1 else scores

    def _hops(self, batch: Any, pairs: tuple[tuple[torch.Tensor, torch.Tensor], ...]) -> dict[str, Any]:
        """The per-hop counts that run a built-in encoder in blocks, where every scored node is a seed."""
        hops = trim_arguments(self.model, batch)
        seeds = hops.get("num_sampled_nodes_per_hop", [0])[0]
        ends = [int(t.max()) for pair in pairs for t in pair if t.numel()]
        return hops if hops and max(ends, default=-1) < seeds else {}


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (ties averaged), 0.5 when one class is missing."""
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    from scipy.stats import rankdata

    ranks = torch.from_numpy(rankdata(scores.numpy()))
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _served_options(trainer: Any, split: str) -> dict[str, Any]:
    """A split's loader options when sampler servers build the batches (``--servers``): those of
    :func:`_loader_options` that the servers or the trainer honour; ``--loader-threads``: requests at once."""
    options = _loader_options(trainer, split)
    for name in ("layout", "stats", "filter_per_worker", "num_workers"):
        options.pop(name)
    options["loader_threads"] = trainer.config.loader_threads
    return options


def _served_loader(trainer: Any, fanout: Any, input_nodes: Any, split: str) -> Any:
    """A node split's loader over sampler servers."""
    from sampling.remote.client import ServedLoader
    from training.loop.served import node_seeds

    seeds = node_seeds(trainer.session, input_nodes)
    return ServedLoader(trainer.servers, "node", fanout, seeds, **_served_options(trainer, split))


def _max_label(trainer: TaskHost, target: Any) -> int:
    """The largest label of this rank's partitions (the ranks then agree on the largest of all)."""
    if getattr(trainer, "servers", None) is not None:
        return trainer.session.largest_label(target)
    ys = [trainer.dataset.partition(p)[0][target, "y", None] for p in trainer.parts]
    return max((int(y.max()) for y in ys if y.numel()), default=0)


def make_task(trainer: TaskHost) -> NodeTask | LinkTask:
    if trainer.config.task not in TASKS:
        raise InvalidInputError(f"--task {trainer.config.task!r} is not one of {TASKS}")
    return NodeTask(trainer) if trainer.config.task == "node" else LinkTask(trainer)
