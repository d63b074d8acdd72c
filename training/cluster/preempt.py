"""Preemption: SIGTERM asks every rank to stop at the next step boundary, after a checkpoint (exit 75)."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from typing import Any


EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on request with a checkpoint written; rerun with --resume
_REQUESTED = threading.Event()


def install() -> None:
    """Turn SIGTERM (what SLURM, cloud schedulers and ``graphstore-train`` send before a kill) into a
    request to stop at the next step. Call from the main thread of a rank."""
    signal.signal(signal.SIGTERM, _on_term)


def _on_term(signum: int, frame: Any) -> None:
    _REQUESTED.set()


def requested() -> bool:
    """Whether this process was asked to stop."""
    return _REQUESTED.is_set()


def agreed(group: Any = None) -> bool:
    """Whether any rank was asked to stop: every rank calls this at the same step, so all stop there."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if _REQUESTED.is_set() else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


@dataclass
class Stopped(Exception):
    """Raised out of an epoch when the ranks agreed to stop: where, and the checkpoint (or ``None``)."""

    epoch: int  # 0-based
    step: int  # steps of that epoch done
    checkpoint: str | None

    def line(self, directory: str | None) -> str:
        """The one line rank 0 prints as the job stops."""
        where = f"epoch {self.epoch + 1}, after step {self.step}"
        if self.checkpoint is None:
            return (f"graphstore-train: stopped on SIGTERM at {where}; no --checkpoint-dir, so nothing was saved "
                    "(give --checkpoint-dir to be able to resume)")
        return (f"graphstore-train: stopped on SIGTERM at {where}; checkpoint {self.checkpoint}: rerun the same "
                f"command with --resume (--checkpoint-dir {directory}) to go on from there")
