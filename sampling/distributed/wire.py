"""What remote calls put on the wire: integers packed narrow, lean sampling answers, bytes per peer and kind."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba import njit

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
    kind = type(obj)
    if kind is tuple or kind is list:  # a call's arguments, an answer's columns: the common cases first
        total = 0
        for item in obj:
            total += payload_bytes(item)
        return total
    if kind is Packed:
        return _SCALAR + int(obj.values.nbytes) + 1  # base, the offsets, one byte naming the dtype
    if obj is None or kind is int or kind is bool:
        return _SCALAR
    if isinstance(obj, Packed):
        return _SCALAR + int(obj.values.nbytes) + 1
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


# what a sampling answer carries besides counts and source IDs (bits of its request's ``returns``)
EDGE_IDS, POSITIONS = 1, 2


@dataclass(frozen=True)
class Packed:
    """Integers on the wire: offsets from ``base`` in the narrowest unsigned dtype that holds them all;
    ``dtype`` and ``tensor`` restore the sender's array exactly (:func:`unpack`)."""

    base: int
    values: np.ndarray
    dtype: str
    tensor: bool = False


def pack(values: Any, bounds: tuple[int, int] | None = None) -> Any:
    """An integer array or tensor as :class:`Packed` (lossless); any other value unchanged. ``bounds = (lo,
    hi)``: where a 1-D int64 array's values should lie (source IDs below the node count, CSC positions below
    the block's edges): it is narrowed to that range's width in one pass, with no pass for its own span; a
    value outside, found in that pass, packs it by its span instead (what arrives is exact either way).

    Examples
    --------
    >>> p = pack(np.array([1000, 1003, 1001]))
    >>> p.values.dtype.name, unpack(p).tolist()
    ('uint8', [1000, 1003, 1001])
    """
    is_tensor = isinstance(values, torch.Tensor)
    array = values.numpy() if is_tensor else values
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iu" or array.dtype.itemsize == 1 \
            or array.dtype == np.uint64:  # bytes are already narrow; uint64 may not fit the int64 arithmetic
        return values
    if not array.size:
        return Packed(0, array.astype(np.uint8), array.dtype.str, is_tensor)
    if array.ndim == 1 and array.dtype == np.int64 and array.flags.c_contiguous:  # one kernel pass (else numpy's)
        if bounds is not None and 0 <= bounds[1] - bounds[0] < 2**63:
            base = int(bounds[0])
            width = _width(int(bounds[1]) - base)
            raw, inside = _narrow_raw(array, np.int64(base), np.int64(bounds[1]), width)
            if inside:
                return Packed(base, raw.view(_UNSIGNED[width]), array.dtype.str, is_tensor)
        lo, hi = span(array)
        width = _width(int(hi) - int(lo))
        raw, _ = _narrow_raw(array, lo, hi, width)
        return Packed(int(lo), raw.view(_UNSIGNED[width]), array.dtype.str, is_tensor)
    base, top = int(array.min()), int(array.max())
    width = _width(top - base)
    with np.errstate(over="ignore"):  # a range wider than int64 wraps, and unwraps exactly in unpack
        offsets = (array.astype(np.int64, copy=False) - np.int64(base)).astype(_UNSIGNED[width])
    return Packed(base, offsets, array.dtype.str, is_tensor)


_UNSIGNED = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
_NO_BYTES = np.zeros(0, np.uint8)


def _width(extent: int) -> int:
    """Bytes of the narrowest unsigned integer holding ``0..extent``."""
    return 1 if extent < 1 << 8 else 2 if extent < 1 << 16 else 4 if extent < 1 << 32 else 8


@njit(cache=True, nogil=True)
def span(a):
    """``(min, max)`` of a non-empty array in one pass (selects, not ``min()``/``max()`` calls: the loop
    compiles to vector compares, 2.8x faster on 350,000 int64)."""
    lo = hi = a[0]
    for i in range(len(a)):
        v = a[i]
        lo = v if v < lo else lo
        hi = v if v > hi else hi
    return lo, hi


@njit(cache=True, nogil=True)
def _narrow(a, base, top, out):
    """``out[i] = a[i] - base`` in ``out``'s dtype (wrapping, as unpack unwraps); whether every ``a[i]`` lies
    in ``[base, top]``, checked in the same pass."""
    outside = 0
    for i in range(len(a)):
        v = a[i]
        outside |= (v < base) | (v > top)
        out[i] = v - base
    return outside == 0


@njit(cache=True, nogil=True)
def _narrow_raw(a, base, top, width):
    """``a - base`` (int64) as the bytes of ``width``-byte integers (8: int64 arithmetic, wrapping as
    :func:`_widen_raw` unwraps), in a new array; whether every value lies in ``[base, top]``. One
    specialisation for every width: a graph's size, not the warm-up's, picks the width."""
    raw = np.empty(len(a) * width, np.uint8)
    if width == 1:
        inside = _narrow(a, base, top, raw)
    elif width == 2:
        inside = _narrow(a, base, top, raw.view(np.uint16))
    elif width == 4:
        inside = _narrow(a, base, top, raw.view(np.uint32))
    else:
        inside = _narrow(a, base, top, raw.view(np.int64))
    return raw, inside


@njit(cache=True, nogil=True)
def _widen(values, base, out):
    """``out[i] = values[i] + base`` (int64, wrapping as the sender's array did)."""
    for i in range(len(values)):
        out[i] = np.int64(values[i]) + base


@njit(cache=True, nogil=True)
def _widen_raw(raw, width, base, out):
    """:func:`_widen` of ``raw`` read as ``width``-byte unsigned integers (8: int64, which wraps alike);
    width 0: a column not sent, -1 everywhere."""
    if width == 0:
        out[:] = -1
    elif width == 1:
        _widen(raw, base, out)
    elif width == 2:
        _widen(raw.view(np.uint16), base, out)
    elif width == 4:
        _widen(raw.view(np.uint32), base, out)
    else:
        _widen(raw.view(np.int64), base, out)


def unpack(value: Any) -> Any:
    """The array or tensor :func:`pack` was given (exact dtype and shape); any other value unchanged."""
    if not isinstance(value, Packed):
        return value
    values = value.values
    if value.dtype == "<i8" and values.ndim == 1 and len(values) and values.flags.c_contiguous:  # one pass
        out = np.empty(len(values), np.int64)
        _widen_raw(values.view(np.uint8), values.itemsize, np.int64(value.base), out)
        return torch.from_numpy(out) if value.tensor else out
    out = values.astype(np.dtype(value.dtype))
    if value.base:
        with np.errstate(over="ignore"):
            out += np.asarray(value.base).astype(out.dtype)
    return torch.from_numpy(out) if value.tensor else out


def unpack_into(value: Any, out: np.ndarray) -> None:
    """:func:`unpack` of a 1-D integer array (packed or not) written into ``out`` (same length), with no
    array of its own; ``None`` (a column not sent) writes -1."""
    raw = _raw(value, len(out))
    if raw is not None and out.dtype == np.int64 and out.flags.c_contiguous:
        if len(out):
            _widen_raw(raw[0], raw[1], np.int64(raw[2]), out)
    elif value is None:
        out[:] = -1
    else:
        values = np.asarray(unpack(value))
        if len(values) != len(out):
            raise ValueError(f"{len(values)} values for {len(out)} places")
        out[:] = values


def _raw(value: Any, n: int) -> tuple[np.ndarray, int, int] | None:
    """A 1-D integer column of ``n`` values as ``(bytes, width, base)`` for the kernels (``None``, a column not
    sent: width 0), or ``None`` when it is another shape or kind (numpy's passes then); raises when it holds
    another number of values."""
    if value is None:
        return _NO_BYTES, 0, 0
    base, values = (value.base, value.values) if isinstance(value, Packed) else (0, value)
    if not isinstance(values, np.ndarray) or values.ndim != 1 or not values.flags.c_contiguous:
        return None
    if len(values) != n:
        raise ValueError(f"{len(values)} values for {n} places")
    packed_narrow = isinstance(value, Packed) and values.dtype.kind == "u"
    if not (packed_narrow or values.dtype == np.int64):
        return None
    return values.view(np.uint8), values.itemsize, base


def answer_edges(answer: tuple[Any, ...]) -> int:
    """How many edges a sampling answer (:func:`pack_sample`) carries."""
    nbrs = answer[1]
    return len(nbrs.values) if isinstance(nbrs, Packed) else len(nbrs)


def pack_sample(col: np.ndarray, num_nodes: int, columns: tuple[np.ndarray, np.ndarray, np.ndarray], returns: int,
                tops: tuple[int, int, int]) -> tuple[Any, ...]:
    """A sampling answer on the wire, from a hop's picks for ``num_nodes`` nodes (``col``: each pick's node,
    a node's picks contiguous; ``columns``: their source IDs, edge IDs and CSC positions, int64): how many
    picks each node has, and the source IDs always, the edge IDs and positions if ``returns`` asks. ``tops``:
    the largest source ID, edge ID and position there can be; each column is packed from 0 to its top
    (by its span if a value lies outside: exact either way), in one kernel call with the counts."""
    sent = (True, bool(returns & EDGE_IDS), bool(returns & POSITIONS))  # a column not asked for is not packed
    widths = np.array([_width(int(top)) if on else 0 for top, on in zip(tops, sent)], np.int64)
    counts, width, raws, inside = _answer(col, num_nodes, *columns, widths, np.array(tops, np.int64))
    out: list[Any] = [Packed(0, counts.view(_UNSIGNED[int(width)]), "<i8")]
    for j, column in enumerate(columns):
        if not sent[j]:
            out.append(None)
        elif inside[j]:
            out.append(Packed(0, raws[j].view(_UNSIGNED[int(widths[j])]), "<i8"))
        else:  # a value beyond its top (damaged data): packed by its span, exact
            out.append(pack(column))
    return tuple(out)


@njit(cache=True, nogil=True)
def _answer(col, n, row, eid, pos, widths, tops):
    """:func:`pack_sample`'s pass: the picks of each of ``n`` nodes (run lengths of ``col``) narrowed to the
    width of the largest, and each column with a width narrowed from 0 to its top; returns ``(counts bytes,
    their width, column bytes, whether each column lay within its top)``."""
    counts = _counts(col, n)
    most = np.int64(0)
    for i in range(n):
        most = max(most, counts[i])
    w = 1 if most < 1 << 8 else 2 if most < 1 << 16 else 4 if most < 1 << 32 else 8
    counts_raw, _ = _narrow_raw(counts, np.int64(0), most, w)
    rows, row_in = _narrow_sent(row, tops[0], widths[0])
    eids, eid_in = _narrow_sent(eid, tops[1], widths[1])
    poss, pos_in = _narrow_sent(pos, tops[2], widths[2])
    return counts_raw, w, (rows, eids, poss), (row_in, eid_in, pos_in)


@njit(cache=True, nogil=True)
def _counts(col, n):
    """``np.bincount(col, minlength=n)`` (values in ``[0, n)``), int64: one write per run of equal values (a
    node's picks are contiguous), not an increment per edge that waits for the store before it."""
    out = np.zeros(n, np.int64)
    x, m = 0, len(col)
    while x < m:
        c, y = col[x], x + 1
        while y < m and col[y] == c:
            y += 1
        out[c] += y - x
        x = y
    return out


@njit(cache=True, nogil=True)
def _narrow_sent(column, top, width):
    if width == 0:  # not sent
        return np.zeros(0, np.uint8), True
    return _narrow_raw(column, np.int64(0), top, width)


def place_sample(answer: tuple[Any, ...], positions: np.ndarray, lo: int, col: np.ndarray, row: np.ndarray,
                 eid: np.ndarray, pos: np.ndarray) -> bool:
    """A sampling answer (:func:`pack_sample`) to the frontier ``positions`` it was asked for (``col`` written
    ``positions`` repeated by the counts, plus ``lo``) read straight into ``row``, ``eid`` and ``pos``
    (int64, one place per edge; -1 for a column not sent), in one kernel call; whether its counts were one
    per position and filled the places exactly, and its columns one value per place."""
    counts = answer[0]
    if (len(counts.values) if isinstance(counts, Packed) else len(counts)) != len(positions):
        return False
    try:
        raws = [_raw(counts, len(positions))] + [_raw(value, len(col)) for value in answer[1:4]]
    except ValueError:  # a column of another length
        return False
    if any(raw is None for raw in raws):  # another kind of column: numpy's passes
        values = np.asarray(unpack(counts), np.int64)
        if values.min(initial=0) < 0 or values.sum() != len(col):
            return False
        col[:] = np.repeat(np.asarray(positions, np.int64), values) + lo
        for value, out in zip(answer[1:4], (row, eid, pos)):
            unpack_into(value, out)
        return True
    (c, cw, cbase), (r, rw, rbase), (e, ew, ebase), (p, pw, pbase) = raws
    return _place(c, cw, np.int64(cbase), np.ascontiguousarray(positions, np.int64), np.int64(lo), col,
                  r, rw, np.int64(rbase), row, e, ew, np.int64(ebase), eid, p, pw, np.int64(pbase), pos)


@njit(cache=True, nogil=True)
def _place(counts, cw, cbase, positions, lo, col, rows, rw, rbase, row, eids, ew, ebase, eid, poss, pw, pbase, pos):
    """:func:`place_sample`'s pass; ``(bytes, width, base)`` per column as :func:`_widen_raw` reads them."""
    if cw == 1:
        filled = _repeat_into(positions, counts, cbase, col, lo)
    elif cw == 2:
        filled = _repeat_into(positions, counts.view(np.uint16), cbase, col, lo)
    elif cw == 4:
        filled = _repeat_into(positions, counts.view(np.uint32), cbase, col, lo)
    else:
        filled = _repeat_into(positions, counts.view(np.int64), cbase, col, lo)
    if not filled:
        return False
    _widen_raw(rows, rw, rbase, row)
    _widen_raw(eids, ew, ebase, eid)
    _widen_raw(poss, pw, pbase, pos)
    return True


@njit(cache=True, nogil=True)
def _repeat_into(values, counts, base, out, lo):
    """``np.repeat(values, counts + base) + lo`` written into ``out``; whether the counts (none negative) filled
    it exactly."""
    x = 0
    for i in range(len(values)):
        c = np.int64(counts[i]) + base
        if c < 0 or x + c > len(out):
            return False
        run = out[x:x + c]  # indexed from 0: contiguous stores, not scatters (see sampling.kernels.draws.uniform_draws)
        v = values[i] + lo
        for j in range(c):
            run[j] = v
        x += c
    return x == len(out)


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
