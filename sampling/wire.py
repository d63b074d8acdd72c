"""Bytes on the wire of remote calls, per peer and per kind (neighbours, rows), counted at the caller."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import numpy as np

# handler name -> the kind of traffic it carries (the names users read in the epoch breakdown)
KINDS = {"sample": "neighbours", "gather": "rows", "edge_attr": "edge_attrs"}  # last part of the name
_SCALAR = 8  # bytes counted for a number, a bool or None in a request (its value on the wire)


def payload_bytes(obj: Any) -> int:
    """The bytes a call's arguments or result carry: array and tensor bytes, string lengths, 8 per
    scalar; containers add up their items. TensorPipe's framing (tens of bytes a message) is not counted.

    Examples
    --------
    >>> payload_bytes((np.zeros(4, np.int64), "ab", 3))
    42
    """
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):  # torch.Tensor
        return int(obj.element_size() * obj.numel())
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, str):
        return len(obj.encode())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return sum(payload_bytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(payload_bytes(k) + payload_bytes(v) for k, v in obj.items())
    return _SCALAR


class WireStats:
    """Thread-safe counters: per peer rank and kind, bytes sent (requests) and received (responses)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[tuple[int, str, str], int] = defaultdict(int)
        self._calls: dict[tuple[int, str], int] = defaultdict(int)

    def add(self, peer: int, handler: str, sent: int = 0, received: int = 0) -> None:
        short = handler.rsplit(".", 1)[-1]  # "graphstore.sample" -> "sample"
        kind = KINDS.get(short, short)
        with self._lock:
            self._bytes[(peer, kind, "sent")] += sent
            self._bytes[(peer, kind, "received")] += received
            self._calls[(peer, kind)] += 1 if sent else 0

    def snapshot(self, reset: bool = False) -> dict[str, dict[str, dict[str, int]]]:
        """``{peer: {kind: {"sent": B, "received": B, "calls": N}}}`` (peer as a string, for JSON)."""
        with self._lock:
            out: dict[str, dict[str, dict[str, int]]] = {}
            for (peer, kind, way), value in sorted(self._bytes.items()):
                out.setdefault(str(peer), {}).setdefault(kind, {"sent": 0, "received": 0, "calls": 0})[way] = value
            for (peer, kind), calls in self._calls.items():
                out[str(peer)][kind]["calls"] = calls
            if reset:
                self._bytes.clear()
                self._calls.clear()
        return out


def totals(per_peer: dict[str, dict[str, dict[str, int]]]) -> dict[str, int]:
    """Bytes per kind (sent plus received) summed over peers."""
    out: dict[str, int] = defaultdict(int)
    for kinds in per_peer.values():
        for kind, ways in kinds.items():
            out[kind] += ways["sent"] + ways["received"]
    return dict(out)
