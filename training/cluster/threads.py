"""How many threads a rank computes (torch) and loads batches (loader threads) with: its share of the host's cores."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThreadChoice:
    """The number of threads and how it was chosen (for the log and the metrics)."""

    threads: int
    usable_cores: int
    local_ranks: int
    source: str  # "--threads", "SLURM_CPUS_PER_TASK" or "cores / local ranks"

    def describe(self) -> str:
        if self.source == "cores / local ranks":
            why = f"{self.usable_cores} usable cores / {self.local_ranks} ranks on this host"
        else:
            why = f"from {self.source}"
        return f"{self.threads} torch thread(s) per rank ({why}; --threads N overrides)"


def usable_cores(cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """Cores this process may run on: its CPU affinity (taskset, cpusets, SLURM binding), capped by a
    cgroup v2 CPU quota (containers) when one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open(cgroup_cpu_max) as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def choose(requested: int | None, local_ranks: int, env: dict[str, str] | None = None,
           cores: int | None = None) -> ThreadChoice:
    """Threads for one rank: ``requested`` (``--threads``) when given; else SLURM's ``--cpus-per-task``
    when the job sets it; else the usable cores divided by the ranks on this host (at least one).

    ``OMP_NUM_THREADS`` is not consulted: torchrun sets it to 1 for every multi-process job, which
    would leave all but one core idle when a host runs fewer ranks than it has cores.

    Examples
    --------
    >>> choose(None, local_ranks=2, env={}, cores=8).threads
    4
    >>> choose(3, local_ranks=2, env={}, cores=8).source
    '--threads'
    """
    env = dict(os.environ if env is None else env)
    cores = usable_cores() if cores is None else cores
    local_ranks = max(1, local_ranks)
    if requested is not None:
        return ThreadChoice(int(requested), cores, local_ranks, "--threads")
    slurm = env.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return ThreadChoice(int(slurm), cores, local_ranks, "SLURM_CPUS_PER_TASK")
    return ThreadChoice(max(1, cores // local_ranks), cores, local_ranks, "cores / local ranks")


def loader_threads(requested: int | None, local_ranks: int, env: dict[str, str] | None = None,
                   cores: int | None = None) -> int:
    """Loader threads for one rank (sampling and feature gather, ``--loader-threads``): ``requested`` when
    given, else the rank's share of the host's cores, as for torch threads (:func:`choose`): the loader
    keeps the accelerator busy, so it gets the cores a GPU job leaves idle.

    Examples
    --------
    >>> loader_threads(None, local_ranks=2, env={}, cores=8), loader_threads(1, local_ranks=2, env={}, cores=8)
    (4, 1)
    """
    if requested is not None:
        return int(requested)
    return choose(None, local_ranks, env, cores).threads


def apply(choice: ThreadChoice) -> None:
    """Set torch's intra-op threads for this process (the model's forward and backward)."""
    import torch

    torch.set_num_threads(choice.threads)
    logger.info("%s", choice.describe())
