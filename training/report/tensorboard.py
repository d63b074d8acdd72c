"""``--tensorboard DIR``: each epoch record as TensorBoard scalars (loss, metrics, time, bytes, caches), on rank 0."""

from __future__ import annotations

from typing import Any

from graphstore.errors import MissingBackendError
from training.report.timing import FOREGROUND

__all__ = ["INSTALL", "EpochWriter", "require", "scalars"]

INSTALL = "pip install 'graphstore[tensorboard]'"
_METRICS = {"acc": "accuracy", "auc": "auc", "mrr": "mrr"}  # an epoch record's <split>_<metric> keys


def require() -> None:
    """Raise :class:`MissingBackendError` with the pip command when TensorBoard's writer cannot load."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401  (needs the tensorboard package)
    except ImportError as exc:
        raise MissingBackendError(f"--tensorboard needs the tensorboard package ({exc}); {INSTALL}") from exc


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one epoch record (``training.loop.trainer``): what the record holds, by tag.

    Examples
    --------
    >>> got = scalars({"epoch": 1, "loss": 0.5, "train_acc": 0.8, "val_acc": 0.7, "train_seconds": 2.0,
    ...                "timing": {"data_wait": 0.5, "forward_backward": 1.0}, "wire": {"bytes": {"rows": 10}}})
    >>> got["train/loss"], got["val/accuracy"], got["time/data_wait_share"], got["io/wire_bytes"]
    (0.5, 0.7, 0.25, 10.0)
    """
    out: dict[str, float] = {}
    if "loss" in record:
        out["train/loss"] = record["loss"]
    for split in ("train", "val", "test"):
        for key, name in _METRICS.items():
            if f"{split}_{key}" in record:
                out[f"{split}/{name}"] = record[f"{split}_{key}"]
    for rank, rate in enumerate(record.get("loader_batches_per_s", [])):  # --loader-only
        out[f"loader/batches_per_s/rank{rank}"] = rate
    out.update(_time(record))
    out.update(_traffic(record))
    peaks = record.get("memory_mb", {}).get("peak_rss")
    if peaks:
        out["memory/peak_rss_mb_max"] = max(peaks)
    return {tag: float(value) for tag, value in out.items()}


def _time(record: dict[str, Any]) -> dict[str, float]:
    """Seconds per part of the epoch (per-rank means, as in the epoch line) and the data-wait share."""
    out: dict[str, float] = {}
    for key, tag in (("train_seconds", "train_s"), ("eval_seconds", "eval_s"), ("epoch_seconds", "epoch_s")):
        if key in record:
            out[f"time/{tag}"] = record[key]
    timing = record.get("timing", {})
    for part, seconds in timing.items():
        out[f"time/{part}_s"] = seconds
    train = record.get("train_seconds")
    if train:
        out["time/other_s"] = max(0.0, train - sum(timing.get(k, 0.0) for k in FOREGROUND))
        out["time/data_wait_share"] = timing.get("data_wait", 0.0) / train
    for part, seconds in record.get("per_step", {}).items():
        out[f"time/per_step/{part}_s"] = seconds
    return out


def _feature_counts(record: dict[str, Any]) -> dict[str, float]:
    """``--feature-cache``: hits and misses of the RAM cache (none without a cache)."""
    got = record.get("features") or {}
    return {"hits": got["hits"], "misses": got["rows"] - got["hits"]} if got.get("cache_bytes") else {}


def _traffic(record: dict[str, Any]) -> dict[str, float]:
    """Bytes on the wire (all ranks), remote requests, and the feature-row caches' hits and misses."""
    out: dict[str, float] = {}
    wire = record.get("wire", {}).get("bytes", {})
    if wire:
        out["io/wire_bytes"] = sum(wire.values())
        out.update({f"io/wire_bytes/{kind}": value for kind, value in wire.items()})
    remote = record.get("remote", {})
    for key in ("requests", "rows"):
        if key in remote:
            out[f"io/remote_{key}"] = remote[key]
    for name, got, hits, misses in (("cache", remote, "cache_hits", "cache_misses"),  # --cache-rows
                                    ("gpu_cache", record.get("gpu_cache") or {}, "hits", "misses"),
                                    ("feature_cache", _feature_counts(record), "hits", "misses")):
        if hits in got:
            out[f"{name}/hits"], out[f"{name}/misses"] = got[hits], got.get(misses, 0)
            total = got[hits] + got.get(misses, 0)
            if total:
                out[f"{name}/hit_share"] = got[hits] / total
    got = record.get("features") or {}
    if got:  # features read through the disk path: bytes from disk and the seconds gathering
        out["io/feature_disk_bytes"], out["time/feature_read"] = got["disk_bytes"], got["read_seconds"]
    return out


class EpochWriter:
    """Writes each epoch record to TensorBoard event files in ``log_dir``, at step = the 1-based epoch.

    The event file is opened at the first record; with ``resume`` its step is the purge step, so a
    resumed run hides what an interrupted one wrote for the epochs it trains again.

    Examples
    --------
    >>> import tempfile
    >>> board = EpochWriter(tempfile.mkdtemp())
    >>> board.write({"epoch": 1, "loss": 0.5})
    >>> board.close()
    """

    def __init__(self, log_dir: str, resume: bool = False) -> None:
        require()
        self.log_dir, self.resume = log_dir, resume
        self._writer: Any = None

    def write(self, record: dict[str, Any]) -> None:
        """Add ``record``'s scalars at step ``record["epoch"]`` and flush them to disk."""
        step = int(record["epoch"])
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.log_dir, purge_step=step if self.resume else None)
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()  # an epoch's scalars are on disk before the next epoch starts

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
