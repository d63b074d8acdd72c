"""Process-local I/O counters of a dataset: requests, bytes fetched, cache hits and misses, per array."""

from __future__ import annotations

import threading
from typing import Any

FIELDS = ("requests", "bytes", "hits", "misses", "retries", "wait_seconds")


class IOStats:
    """Counters per array path, updated once per chunk event (never per row), safe across threads.

    ``requests`` counts every storage request (retries included), ``bytes`` the bytes downloaded,
    ``hits`` chunks found in the local cache and ``misses`` chunks downloaded when this process
    first needed them, ``retries`` transient errors retried, ``wait_seconds`` the time reads spent
    waiting for downloads. Counters are process-local and start at zero in a new process.

    Examples
    --------
    >>> stats = IOStats()
    >>> stats.add("part_00000/nodes/_N/x", requests=1, nbytes=4096, misses=1)
    >>> stats.snapshot()["bytes"]
    4096
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrays: dict[str, list[float]] = {}

    def add(self, array: str, *, requests: int = 0, nbytes: int = 0, hits: int = 0, misses: int = 0,
            retries: int = 0, wait_seconds: float = 0.0) -> None:
        with self._lock:
            row = self._arrays.get(array)
            if row is None:
                row = self._arrays[array] = [0, 0, 0, 0, 0, 0.0]
            for i, value in enumerate((requests, nbytes, hits, misses, retries, wait_seconds)):
                row[i] += value

    def snapshot(self) -> dict[str, Any]:
        """Totals and per-array counters as a plain (JSON-ready) dict."""
        with self._lock:
            arrays = {path: _row(values) for path, values in sorted(self._arrays.items())}
        totals = _row([sum(a[f] for a in arrays.values()) for f in FIELDS])
        return {**totals, "arrays": arrays}

    def reset(self) -> None:
        with self._lock:
            self._arrays.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # counters are process-local

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


def _row(values: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {f: int(v) for f, v in zip(FIELDS[:-1], values)}
    out["wait_seconds"] = round(float(values[-1]), 6)
    return out
