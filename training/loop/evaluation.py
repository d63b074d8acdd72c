"""When a rank evaluates and over how much: the cadence (``--eval-every``) and subset (``--eval-max-batches``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass(frozen=True)
class EvalPlan:
    """Evaluate after every ``every``-th epoch over at most ``max_batches`` batches per rank and split
    (0: all), and after the last epoch always over every batch (the final figures are whole).

    Examples
    --------
    >>> plan = EvalPlan(every=2, max_batches=3, epochs=5)
    >>> [plan.kind(e) for e in range(5)]  # 0-based epochs
    [None, 'subset', None, 'subset', 'full']
    >>> EvalPlan(every=1, max_batches=0, epochs=2).kind(0)
    'full'
    """

    every: int
    max_batches: int
    epochs: int

    def kind(self, epoch: int) -> str | None:
        """``"full"``, ``"subset"`` or ``None`` (no evaluation) after 0-based ``epoch``."""
        if epoch == self.epochs - 1:
            return "full"
        if (epoch + 1) % self.every:
            return None
        return "subset" if self.max_batches else "full"

    def next_after(self, epoch: int) -> int:
        """The 1-based epoch of the next evaluation after 0-based ``epoch``."""
        upcoming = [e for e in range(epoch + 1, self.epochs) if self.kind(e)]
        return upcoming[0] + 1 if upcoming else self.epochs


def limited(loader: Any, max_batches: int) -> Iterator[Any]:
    """The first ``max_batches`` batches of ``loader`` (all when 0): the same nodes every time (evaluation
    loaders do not shuffle); a prefetching iterator is closed as soon as enough were taken."""
    iterator = iter(loader)
    try:
        for taken, batch in enumerate(iterator):
            if max_batches and taken >= max_batches:
                return
            yield batch
    finally:
        if hasattr(iterator, "close"):
            iterator.close()


def evaluate(task: Any, model: Any, loaders: dict[str, Any], kind: str | None, max_batches: int) -> dict[str, Any]:
    """The epoch record's evaluation fields: ``val_<metric>``/``test_<metric>`` when ``kind`` says to
    evaluate, and always ``evaluation`` (``kind`` or ``"none"``) and ``eval_seconds``."""
    started = time.perf_counter()
    out: dict[str, Any] = {"evaluation": kind or "none"}
    if kind:
        cap = max_batches if kind == "subset" else 0
        for split in ("val", "test"):
            if split in loaders:
                out[f"{split}_{task.metric}"] = task.evaluate(model, limited(loaders[split], cap))
    out["eval_seconds"] = round(time.perf_counter() - started, 3)
    return out
