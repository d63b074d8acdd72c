"""A rank's memory, measured: peak resident set per epoch, the heap as the allocator sees it, mapped pages."""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

from graphstore import jitcache
from training.launcher import allocator

logger = logging.getLogger(__name__)
_STATUS = "/proc/self/status"


def _status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (``VmHWM``, ``RssAnon``), ``None`` where there is none."""
    try:
        with open(_STATUS) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class PeakMeter:
    """This process's peak resident set since :meth:`reset` (Linux: ``VmHWM``, reset through
    ``/proc/self/clear_refs``); where the peak cannot be reset it is the peak since the process started
    (``since`` says which), and where there is no ``/proc`` the resident set when read.

    Examples
    --------
    >>> meter = PeakMeter()
    >>> meter.reset()
    >>> meter.peak_bytes() > 0
    True
    """

    def __init__(self) -> None:
        self.since = "epoch"

    def reset(self) -> None:
        """Start a new peak (the kernel sets the high-water mark to the current resident set)."""
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
        except OSError as exc:  # not Linux, or not allowed: the peak counts from the process start
            if self.since != "start":
                logger.info("cannot reset the peak resident set (%s): peaks count from the process start", exc)
            self.since = "start"

    def peak_bytes(self) -> int:
        """The peak resident set in bytes (never below the current one)."""
        kib = _status_kib("VmHWM")
        if kib is not None:
            return kib * 1024
        import psutil

        return int(psutil.Process().memory_info().rss)


def memory_per_rank(dataset: Any, peak: PeakMeter) -> dict[str, list[float]]:
    """Every rank's memory (MB): ``peak_rss`` (the epoch's peak resident set, evaluation included);
    ``rss`` and ``anon`` (private memory, where copies would land) at the epoch's end; ``heap_in_use`` and
    ``heap_free`` (what the allocator hands out, and what it holds freed for reuse: see
    ``training.launcher.allocator``); ``dataset_rss``/``dataset_pss``, the dataset's memory-mapped pages
    resident in this rank and its proportional share of them (one copy in the page cache); ``dataset_mapped``,
    the size of the dataset's files mapped into the rank, resident or not (to the KB: none under ``--unmapped``)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, _mine(dataset, peak))
    return {k: [round(g.get(k, 0) / 2**20, 3 if k == "dataset_mapped" else 1) for g in gathered] for k in gathered[0]}


def compiled_per_rank(before: Any) -> dict[str, list[float]]:
    """Every rank's kernel compiles (numba cache misses, see :mod:`graphstore.jitcache`): ``epoch``, how many
    specialisations it compiled since ``before`` (a ``compile_counts()`` taken at the epoch's start) and
    ``seconds`` they took; ``run``, how many since the rank started. A rank that compiled holds the compiler's
    memory from then on, so memory figures compare only between runs that compiled alike (``graphstore warmup``
    compiles the kernels ahead of time)."""
    now = jitcache.compile_counts()
    mine = {"epoch": now.compiled - before.compiled, "seconds": round(now.seconds - before.seconds, 1),
            "run": now.compiled}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {k: [g[k] for g in gathered] for k in mine}


def _mine(dataset: Any, peak: PeakMeter) -> dict[str, int]:
    import psutil

    proc = psutil.Process()
    mine = {"peak_rss": peak.peak_bytes(), "rss": proc.memory_info().rss, "anon": (_status_kib("RssAnon") or 0) * 1024}
    heap = allocator.heap_stats()
    if heap is not None:
        mine.update(heap_in_use=heap.in_use, heap_free=heap.free)
    mine.update(_dataset_pages(dataset, proc))
    return mine


def _dataset_pages(dataset: Any, proc: Any) -> dict[str, int]:
    import psutil

    out = {"dataset_rss": 0, "dataset_pss": 0, "dataset_mapped": 0}
    root = str(getattr(getattr(dataset, "location", None), "root", "") or "")  # none: a trainer of sampler servers
    try:
        for m in proc.memory_maps(grouped=True):
            if root and m.path.startswith(root):
                out["dataset_rss"] += m.rss
                out["dataset_pss"] += getattr(m, "pss", m.rss)
                out["dataset_mapped"] += getattr(m, "size", 0)
    except (OSError, psutil.Error):
        pass  # not Linux: no mapped-page counts
    return out
