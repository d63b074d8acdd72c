"""The warm-up group of ``graphstore-train``: each task's loaders built as a rank builds them, one batch each.

A rank's loaders are :func:`training.loop.tasks.make_task`'s, over the rank's partitions, with the other
partitions served over a transport; here every rank lives in this process (loopback transport, a
partition server each), so the kernels compiled are those of a real job's ranks: node classification
and link prediction (binary and triplet negatives, the split masks and exclusion), with ``--time-attr``
or not, on homogeneous and heterogeneous datasets, with one partition a rank or two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sampling.distributed.dist_sampler import RemoteStats
from sampling.warmup.runner import Group, Workspace
from sampling.warmup.groups import first, homogeneous, mag, ranks
from training.config import TrainConfig
from training.loop.tasks import make_task
from training.cluster.world import World

# (dataset, options): the jobs graphstore-train users run first; "time" is a node time, "etime" an edge time
JOBS: list[tuple[str, dict[str, Any]]] = [
    ("homogeneous", {}), ("homogeneous", {"task": "link"}),
    ("homogeneous", {"task": "link", "neg_sampling": "triplet"}),
    ("homogeneous", {"time_attr": "time"}),
    ("homogeneous", {"task": "link", "time_attr": "etime"}),
    ("mag", {}), ("mag", {"time_attr": "time"}), ("mag", {"task": "link"}),
]  # not --task link with a node time alone: PyG's negative sampling asserts (edge_label_time is None)


def groups() -> list[Group]:
    """The ``training`` entry of ``graphstore.warmup``."""
    return [Group("train", "graphstore-train's node and link tasks (in time or not), 1 and 2 partitions a rank",
                  _train, 30, 1)]  # its kernels are mostly the distributed group's (cost: after it)


@dataclass
class _Rank:
    """What a task reads from the rank running it (``training.loop.tasks.TaskHost``)."""

    config: TrainConfig
    dataset: Any
    world: World
    layout: Any
    parts: tuple[int, ...]
    transport: Any
    stats: RemoteStats = field(default_factory=RemoteStats)

    @property
    def part(self) -> int:
        return self.parts[0]


def _train(ws: Workspace) -> None:
    datasets = {"homogeneous": homogeneous(ws), "mag": mag(ws)}
    for world_size in (2, 1):
        for name, options in JOBS:
            ds = datasets[name]
            with ranks(ds, world_size) as (transport, layout):
                config = TrainConfig(dataset=ds.url, fanout=(3, 2), batch_size=8, progress=False, **options)
                world = World(0, world_size, 0, "file:///unused", local_world_size=world_size)
                rank = _Rank(config, ds, world, layout, layout.parts_of(0), transport)
                for loader in make_task(rank).loaders().values():
                    first(loader)
