"""What is trained: node classification (homogeneous or heterogeneous) and link prediction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from graphstore.errors import InvalidInputError
from sampling.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader, local_seeds

if TYPE_CHECKING:
    from training.trainer import Trainer

TASKS = ("node", "link")


def build_model(name: str, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float) -> torch.nn.Module:
    from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

    cls = {"sage": GraphSAGE, "gcn": GCN, "gat": GAT, "gin": GIN}[name]
    return cls(in_dim, hidden, num_layers=layers, out_channels=out_dim, dropout=dropout)


def _loader_options(trainer: Trainer, split: str) -> dict[str, Any]:
    c = trainer.config
    return dict(layout=trainer.layout, stats=trainer.stats, batch_size=c.batch_size, shuffle=split == "train",
                seed=c.seed * 7919 + trainer.world.rank, cache_rows=c.cache_rows, filter_per_worker=False,
                **({"time_attr": c.time_attr} if c.time_attr else {}))


class NodeTask:
    """Node classification on ``target`` (the node type with ``y`` and ``train_mask``): accuracy."""

    metric = "acc"

    def __init__(self, trainer: Trainer) -> None:
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

    def loaders(self) -> dict[str, Any]:
        t, info, out = self.t, self.t.dataset.manifest.node_type(self.target), {}
        fanout = self._fanout()
        for split, mask in (("train", "train_mask"), ("val", "val_mask"), ("test", "test_mask")):
            if mask not in info.attrs:
                continue
            seeds = local_seeds(t.dataset, t.part, mask, t.layout, t.world.rank, node_type=self.target)
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
                               len(c.fanout), c.dropout)
        from torch_geometric.nn import to_hetero

        base = build_model(c.model, -1, c.hidden, int(classes), len(c.fanout), c.dropout)
        return to_hetero(base, (ds.node_types, ds.edge_types), aggr="sum")

    def inputs(self, batch: Any) -> tuple[Any, Any]:
        if not self.hetero:
            return (batch.x.float(), batch.edge_index)
        x = {nt: (batch[nt].x.float() if "x" in batch[nt] else torch.ones(batch[nt].num_nodes, 1))
             for nt in batch.node_types}  # featureless types get a constant input
        return (x, batch.edge_index_dict)

    def step(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, float, int]:
        out = model(*self.inputs(batch))
        store = batch[self.target] if self.hetero else batch
        out = (out[self.target] if self.hetero else out)[: store.batch_size]
        y = store.y[: store.batch_size]
        return F.cross_entropy(out, y), float((out.argmax(-1) == y).sum()), int(len(y))

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, loader: Any) -> float:
        model.eval()
        counts = torch.zeros(2, dtype=torch.float64)
        for batch in loader:
            _, correct, seen = self.step(model, batch.to(self.t.world.device))
            counts += torch.tensor([correct, seen], dtype=torch.float64)
        dist.all_reduce(counts)
        return round(float(counts[0] / max(counts[1], 1)), 5)


class LinkTask:
    """Link prediction on an edge type: binary negatives, dot-product decoder, AUC (all ranks' scores).

    Each rank's seed links are its partition's edges; with ``time_attr`` they are split in time (the
    latest 20% are val+test, cut at the same global times on every rank), else at random.
    """

    metric = "auc"

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        if trainer.dataset.is_hetero:
            raise InvalidInputError("--task link supports homogeneous datasets in this version")

    def loaders(self) -> dict[str, Any]:
        t, c = self.t, self.t.config
        _, gs = t.dataset.partition(t.part)
        indices, indptr = gs.get_edge_index(None, "csc")
        lo, hi = gs.dst_range()
        index = torch.stack([indices, torch.repeat_interleave(torch.arange(lo, hi), torch.diff(indptr))])
        share, ranks = t.world.rank % t.layout.ranks_per_part, t.layout.ranks_per_part
        index = index[:, share::ranks]
        times = gs.edge_attr(c.time_attr)[share::ranks] if c.time_attr else None
        splits = self._split(index.size(1), times)
        out = {}
        for name, sel in splits.items():
            kwargs = {"edge_label_time": times[sel]} if times is not None else {}
            out[name] = DistributedLinkNeighborLoader(
                t.dataset, list(c.fanout), t.transport, index[:, sel], neg_sampling=dict(mode="binary", amount=1),
                **kwargs, **_loader_options(t, name))
        return out

    def _split(self, count: int, times: torch.Tensor | None) -> dict[str, torch.Tensor]:
        if times is None:
            order = torch.randperm(count, generator=torch.Generator().manual_seed(self.t.config.seed + self.t.world.rank))
            a, b = int(0.8 * count), int(0.9 * count)
            return {"train": order[:a], "val": order[a:b], "test": order[b:]}
        cut80, cut90 = _global_quantiles(times, (0.8, 0.9))
        return {"train": torch.nonzero(times <= cut80).view(-1),
                "val": torch.nonzero((times > cut80) & (times <= cut90)).view(-1),
                "test": torch.nonzero(times > cut90).view(-1)}

    def model(self) -> torch.nn.Module:
        c, ds = self.t.config, self.t.dataset
        info = ds.manifest.node_types[0]
        return LinkModel(build_model(c.model, c.hidden, c.hidden, c.hidden, len(c.fanout), c.dropout),
                         ds.num_nodes(), c.hidden, int(np.prod(info.attrs["x"].shape)) if "x" in info.attrs else 0)

    def _scores(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        x = batch.x.float() if "x" in batch else None
        return model(x, batch.n_id, batch.edge_index, batch.edge_label_index)

    def step(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, float, int]:
        scores = self._scores(model, batch)
        loss = F.binary_cross_entropy_with_logits(scores, batch.edge_label)
        correct = float(((scores > 0).float() == batch.edge_label).sum())
        return loss, correct, int(batch.edge_label.numel())

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, loader: Any) -> float:
        model.eval()
        scores, labels = [], []
        for batch in loader:
            batch = batch.to(self.t.world.device)
            scores.append(self._scores(model, batch).cpu())
            labels.append(batch.edge_label.cpu())
        mine = (torch.cat(scores) if scores else torch.zeros(0), torch.cat(labels) if labels else torch.zeros(0))
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        return round(auc(torch.cat([g[0] for g in gathered]), torch.cat([g[1] for g in gathered])), 5)


class LinkModel(torch.nn.Module):
    """A GNN encoder over node features (or a learned embedding per node when there are none) and a
    dot-product decoder of the labelled pairs."""

    def __init__(self, encoder: torch.nn.Module, num_nodes: int, hidden: int, in_dim: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.embed = torch.nn.Embedding(num_nodes, hidden) if in_dim == 0 else None
        self.project = torch.nn.Linear(in_dim, hidden) if in_dim else None

    def forward(self, x: Any, n_id: torch.Tensor, edge_index: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        h = self.embed(n_id) if self.embed is not None else self.project(x)
        h = self.encoder(h, edge_index)
        return (h[pairs[0]] * h[pairs[1]]).sum(-1)


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (ties averaged), 0.5 when one class is missing."""
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    from scipy.stats import rankdata

    ranks = torch.from_numpy(rankdata(scores.numpy()))
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _max_label(trainer: Trainer, target: Any) -> int:
    y = trainer.dataset.partition(trainer.part)[0][target, "y", None]
    return int(y.max()) if y.numel() else 0


def _global_quantiles(values: torch.Tensor, qs: tuple[float, ...]) -> list[float]:
    """Quantiles of a value spread over all ranks (from a bounded sample of each rank's values)."""
    sample = values[torch.randperm(len(values), generator=torch.Generator().manual_seed(0))[:20000]].double()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sample)
    merged = torch.cat(gathered)
    return [float(torch.quantile(merged, q)) for q in qs] if len(merged) else [0.0 for _ in qs]


def make_task(trainer: Trainer) -> NodeTask | LinkTask:
    if trainer.config.task not in TASKS:
        raise InvalidInputError(f"--task {trainer.config.task!r} is not one of {TASKS}")
    return NodeTask(trainer) if trainer.config.task == "node" else LinkTask(trainer)
