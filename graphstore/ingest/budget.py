"""The memory one ingest task may use, and the sizes of the pieces of work derived from it.

Every process that runs ingest stages has a budget it can name: a Dask worker's ``memory_limit``,
or for ``--engine local`` the memory this machine has available. Bucket sizes, sort blocks and
whether METIS sees the graph itself or a coarsened one all follow from that budget, never from
the size of the graph, so a worker's peak stays flat as the graph grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any

from graphstore.errors import InvalidInputError

logger = logging.getLogger(__name__)

_BASELINE = 200 << 20  # what a worker process holds before its task (interpreter, numpy, zarr, fsspec)
_TASK_SHARE = 0.5  # of the rest: Dask pauses a worker at 80% of its limit and spills from 60%
BYTES_PER_ROUTED_EDGE = 64  # one edge of a CSC block: its files read and joined, then its key, edge ID and
# permutation sorted (measured: 250-325 MB for blocks of 3.75-5M edges, the part's arrays being written included)
BYTES_PER_ADJ_ENTRY = 48  # one directed entry of the symmetric adjacency while a bucket is deduplicated
BYTES_PER_METIS_ENTRY = 90  # one adjacency entry inside 64-bit METIS (several coarsened copies)
BYTES_PER_METIS_VERTEX = 200  # one vertex inside METIS and the repair (weights, maps, gains)
MIN_TASK_BYTES = 64 << 20


@dataclass(frozen=True)
class Budget:
    """``task_bytes``: memory one task may use for its arrays (beyond its process's baseline)."""

    task_bytes: int

    def __post_init__(self) -> None:
        if self.task_bytes < MIN_TASK_BYTES:
            raise InvalidInputError(f"ingest memory budget {self.task_bytes / 2**20:.0f} MiB per task is below "
                                    f"{MIN_TASK_BYTES >> 20} MiB; give the workers more memory (--memory-limit 1GB)")

    @classmethod
    def from_process_limit(cls, limit: int) -> Budget:
        """The budget of a task in a process limited to ``limit`` bytes in all."""
        return cls(max(MIN_TASK_BYTES, int((limit - _BASELINE) * _TASK_SHARE)))

    @property
    def route_block_edges(self) -> int:
        """Edges one CSC block may hold while it is sorted and written."""
        return max(1 << 16, self.task_bytes // BYTES_PER_ROUTED_EDGE)

    @property
    def bucket_entries(self) -> int:
        """Symmetric-adjacency entries one bucket may hold while it is deduplicated."""
        return max(1 << 16, self.task_bytes // BYTES_PER_ADJ_ENTRY)

    def metis_entries(self, vertices: int) -> int:
        """Adjacency entries METIS (and the repair) may see on a graph of ``vertices`` within one task."""
        return max(0, self.task_bytes - vertices * BYTES_PER_METIS_VERTEX) // BYTES_PER_METIS_ENTRY

    def metis_fits(self, vertices: int, entries: int) -> bool:
        """Whether METIS (and the repair) on this graph fits one task."""
        return entries <= self.metis_entries(vertices)

    @property
    def coarse_vertices(self) -> int:
        """How many clusters a coarsened graph should have: its adjacency (at most ``C * (C - 1)``
        entries) then fits METIS whatever the input graph's size."""
        entries = self.task_bytes // 2 // BYTES_PER_METIS_ENTRY
        return max(64, int(math.isqrt(entries)))


def local_budget() -> Budget:
    """The budget of a task of ``--engine local``: half of what this machine has available now."""
    from graphstore.ingest.validate import available_memory

    return Budget(max(MIN_TASK_BYTES, available_memory() // 2))


WORKER_WAIT_SECONDS = 30.0  # how long an ingest waits for a cluster that has no worker yet


def dask_budget(client: Any, wait: float = WORKER_WAIT_SECONDS) -> Budget:
    """The budget of a task on ``client``'s cluster: from its smallest worker ``memory_limit``.

    Workers without a limit count as 4 GiB. A cluster without workers (still starting, restarting one
    that died, or scaled to zero) is waited for up to ``wait`` seconds, then it is an error.
    """
    workers = _workers(client)
    if not workers:
        logger.warning("the Dask cluster at %s has no workers yet; waiting up to %.0f s for one",
                       client.scheduler.address, wait)
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            client.wait_for_workers(1, timeout=wait)
        workers = _workers(client)
    if not workers:
        raise InvalidInputError(f"the Dask cluster at {client.scheduler.address} has no workers (waited "
                                f"{wait:.0f} s); start workers (dask worker SCHEDULER) or use --workers with a "
                                "local cluster")
    limits = [int(w.get("memory_limit") or 0) or (4 << 30) for w in workers.values()]
    budget = Budget.from_process_limit(min(limits))
    logger.info("ingest tasks plan for %.0f MiB each (smallest worker memory limit %.0f MiB)",
                budget.task_bytes / 2**20, min(limits) / 2**20)
    return budget


def _workers(client: Any) -> dict:
    info = client.scheduler_info(n_workers=-1) if _takes_n_workers(client) else client.scheduler_info()
    return info.get("workers", {})


def _takes_n_workers(client: Any) -> bool:
    import inspect

    return "n_workers" in inspect.signature(client.scheduler_info).parameters
