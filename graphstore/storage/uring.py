"""Rows read by io_uring: many reads in flight from one thread, with one system call per round.

A ring (:class:`Ring`) is set up once per reading thread with the kernel's ``io_uring_setup``; its
submission and completion queues and their entries are shared memory, seen here as numpy arrays, so a
numba kernel (:func:`read_sorted`) fills submission entries, hands them over with ``io_uring_enter`` (named
by the C library's ``syscall``, so the kernel stays cacheable) and reaps completions without the GIL. The
reads go into ``depth`` aligned slots of the ring; each slot's rows are copied into the batch's as it
completes and the slot takes the next read. Where the rows are whole blocks and the batch's buffer is aligned,
a read of rows that follow each other on disk and in the batch goes straight into the batch's buffer
(:func:`direct_run`), with no slot and no copy.

:func:`open_ring` returns ``None`` where the kernel has no io_uring or refuses it (``ENOSYS``, a sysctl's
``io_uring_disabled``, a container's seccomp filter): the caller keeps its thread pool then.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

ALIGN = 4096
_SYS_SETUP, _SYS_ENTER = 425, 426  # x86-64 and arm64 share these numbers
_OP_READ = 22  # IORING_OP_READ
_ENTER_GETEVENTS = 1
_FEAT_SINGLE_MMAP = 1
_OFF_SQES = 0x10000000
# ``off``: word (uint32) indexes into the rings, as the kernel's byte offsets / 4; then the ring's file
# descriptor and the bytes of one read slot
SQ_HEAD, SQ_TAIL, SQ_MASK, SQ_ARRAY, CQ_HEAD, CQ_TAIL, CQ_MASK, CQ_CQES, RING_FD, SLOT_BYTES = range(10)
_EINTR, _EAGAIN = 4, 11


class _Params(ctypes.Structure):
    _fields_ = [("sq_entries", ctypes.c_uint32), ("cq_entries", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("sq_thread_cpu", ctypes.c_uint32), ("sq_thread_idle", ctypes.c_uint32),
                ("features", ctypes.c_uint32), ("wq_fd", ctypes.c_uint32), ("resv", ctypes.c_uint32 * 3),
                # struct io_sqring_offsets
                ("sq_head", ctypes.c_uint32), ("sq_tail", ctypes.c_uint32), ("sq_ring_mask", ctypes.c_uint32),
                ("sq_ring_entries", ctypes.c_uint32), ("sq_flags", ctypes.c_uint32), ("sq_dropped", ctypes.c_uint32),
                ("sq_array", ctypes.c_uint32), ("sq_resv1", ctypes.c_uint32), ("sq_user_addr", ctypes.c_uint64),
                # struct io_cqring_offsets
                ("cq_head", ctypes.c_uint32), ("cq_tail", ctypes.c_uint32), ("cq_ring_mask", ctypes.c_uint32),
                ("cq_ring_entries", ctypes.c_uint32), ("cq_overflow", ctypes.c_uint32), ("cq_cqes", ctypes.c_uint32),
                ("cq_flags", ctypes.c_uint32), ("cq_resv1", ctypes.c_uint32), ("cq_user_addr", ctypes.c_uint64)]


class Ring:
    """One io_uring instance of ``depth`` entries and ``depth`` aligned read slots of ``slot_bytes`` each, as
    the arrays :func:`read_sorted` takes (:meth:`args`). Closed when garbage-collected."""

    def __init__(self, fd: int, params: _Params, depth: int, slot_bytes: int) -> None:
        self.fd, self.depth, self.slot_bytes = fd, depth, slot_bytes
        p = params
        sq_bytes = p.sq_array + p.sq_entries * 4
        cq_bytes = p.cq_cqes + p.cq_entries * 16
        maps = []
        try:
            if p.features & _FEAT_SINGLE_MMAP:
                ring = mmap.mmap(fd, max(sq_bytes, cq_bytes), flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
                maps += [ring]
                sq_map = cq_map = ring
            else:
                sq_map = mmap.mmap(fd, sq_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
                maps += [sq_map]
                cq_map = mmap.mmap(fd, cq_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE,
                                   offset=0x8000000)
                maps += [cq_map]
            sqe_map = mmap.mmap(fd, p.sq_entries * 64, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE,
                                offset=_OFF_SQES)
            maps += [sqe_map]
        except OSError:
            for m in maps:
                m.close()
            os.close(fd)
            raise
        self.sq = np.frombuffer(sq_map, np.uint32)
        self.cq = np.frombuffer(cq_map, np.uint32)
        self.sqes = np.frombuffer(sqe_map, np.uint64)
        words = [p.sq_head, p.sq_tail, p.sq_ring_mask, p.sq_array, p.cq_head, p.cq_tail, p.cq_ring_mask, p.cq_cqes]
        self.off = np.array([w // 4 for w in words] + [fd, slot_bytes], np.int64)
        self.slots = np.frombuffer(mmap.mmap(-1, depth * slot_bytes), np.uint8)  # anonymous: page-aligned
        weakref.finalize(self, _close, fd, maps)

    def args(self) -> tuple:
        """``(sq, cq, sqes, off, slots)``: the ring as :func:`read_sorted` takes it."""
        return self.sq, self.cq, self.sqes, self.off, self.slots


def _close(fd: int, maps: list) -> None:
    for m in maps:
        try:
            m.close()
        except (BufferError, ValueError):  # a view still exported: the mapping goes with the process
            pass
    try:
        os.close(fd)
    except OSError:
        pass


def open_ring(depth: int, slot_bytes: int) -> Ring | None:
    """A :class:`Ring` of ``depth`` reads in flight (a power of two, at most 4096), or ``None`` where this
    kernel or its sandbox offers no io_uring."""
    if os.uname().sysname != "Linux" or os.uname().machine not in ("x86_64", "aarch64"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    params = _Params()
    fd = libc.syscall(ctypes.c_long(_SYS_SETUP), ctypes.c_long(depth), ctypes.byref(params))
    if fd < 0:
        return None
    try:
        return Ring(fd, params, depth, slot_bytes)
    except OSError:
        return None


@intrinsic
def _enter(typingctx, fd, to_submit, min_complete, flags):
    """``syscall(SYS_io_uring_enter, fd, to_submit, min_complete, flags, NULL, 0)``: -1 on an error."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64], var_arg=True)
        fn = cgutils.get_or_insert_function(builder.module, fnty, "syscall")
        return builder.call(fn, [ir.Constant(i64, _SYS_ENTER), *args, ir.Constant(i64, 0), ir.Constant(i64, 0)])

    return types.int64(types.int64, types.int64, types.int64, types.int64), codegen


@njit(cache=True, nogil=True)
def read_sorted(sq, cq, sqes, off, slots, fds, chunk_rows, row_bytes, rows, order, out,
                gap):  # pragma: no cover - compiled
    """Rows ``rows`` (ascending; ``order[i]`` the output row of ``rows[i]``) of an array stored in chunks of
    ``chunk_rows`` rows (``fds[c]`` chunk ``c``'s file, opened with ``O_DIRECT``; -1: absent, zeros) into
    ``out`` (bytes, ``row_bytes`` a row), through the ring ``sq, cq, sqes, off, slots`` (:meth:`Ring.args`):
    rows of one chunk at most ``gap`` bytes apart share a read of up to a slot, as many reads in flight as the
    ring has slots; a read :func:`direct_run` allows goes into ``out`` itself. Returns the bytes read; -1 on a
    short read (every read in flight reaped first), -2 where the ring kept failing (reads may be in flight: the
    ring is not to be used again)."""
    ring_fd, slot_bytes = off[RING_FD], off[SLOT_BYTES]
    depth = len(slots) // slot_bytes
    sq_mask, cq_mask = np.int64(sq[off[SQ_MASK]]), np.int64(cq[off[CQ_MASK]])
    base, out_base = np.int64(slots.ctypes.data), np.int64(out.ctypes.data)
    lo_of, hi_of = np.empty(depth, np.int64), np.empty(depth, np.int64)
    first_of, need_of, len_of, chunk_of = (np.empty(depth, np.int64), np.empty(depth, np.int64),
                                           np.empty(depth, np.int64), np.empty(depth, np.int64))
    addr_of = np.empty(depth, np.int64)  # where each slot's read lands: the slot, or the batch's rows
    direct_of = np.zeros(depth, np.bool_)  # whether it lands in the batch's rows (nothing to copy)
    free = np.arange(depth)
    free_top = depth
    n, i, total, inflight, failures, short = len(rows), 0, np.int64(0), 0, 0, False
    while (i < n and not short) or inflight > 0:
        while i < n and free_top > 0 and not short:  # the next runs of rows into free slots
            c, first, j, end = aligned_run(rows, i, chunk_rows, row_bytes, gap, slot_bytes)
            if fds[c] < 0:
                for q in range(i, j + 1):
                    out[order[q] * row_bytes:(order[q] + 1) * row_bytes] = 0
                i = j + 1
                continue
            free_top -= 1
            s = free[free_top]
            lo_of[s], hi_of[s], first_of[s], need_of[s], chunk_of[s] = i, j, first, end - first, c
            len_of[s] = -(-(end - first) // ALIGN) * ALIGN
            direct_of[s] = direct_run(rows, order, i, j, row_bytes, out_base)
            addr_of[s] = out_base + order[i] * row_bytes if direct_of[s] else base + s * slot_bytes
            _push(sq, sqes, off, sq_mask, fds[c], first, addr_of[s], len_of[s], s)
            inflight += 1
            i = j + 1
        if inflight == 0:  # the last rows were of absent chunks
            break
        to_submit = (np.int64(sq[off[SQ_TAIL]]) - np.int64(sq[off[SQ_HEAD]])) & 0xFFFFFFFF  # not taken yet
        if _enter(np.int64(ring_fd), to_submit, np.int64(1), np.int64(_ENTER_GETEVENTS)) < 0:
            failures += 1  # a signal interrupted the wait: what was submitted stays submitted
            if failures > 1000:
                return -2  # reads may still be in flight: the caller drops this ring
        head, tail = np.int64(cq[off[CQ_HEAD]]), np.int64(cq[off[CQ_TAIL]])
        while head != tail:
            at = off[CQ_CQES] + (head & cq_mask) * 4
            s = np.int64(cq[at])  # user_data's low word: the slot
            res = np.int64(np.int32(cq[at + 2]))
            head = (head + 1) & 0xFFFFFFFF
            if res == -_EINTR or res == -_EAGAIN:
                _push(sq, sqes, off, sq_mask, fds[chunk_of[s]], first_of[s], addr_of[s], len_of[s], s)
                continue
            free[free_top] = s
            free_top += 1
            inflight -= 1
            if res < need_of[s]:  # the chunk's last block may be short: what is needed must be there
                short = True  # no more reads; those in flight are reaped, so the ring is clean for the next call
                continue
            total += res
            if direct_of[s]:
                continue  # read into the batch's rows themselves
            slot = slots[s * slot_bytes:(s + 1) * slot_bytes]
            c = chunk_of[s]
            for q in range(lo_of[s], hi_of[s] + 1):
                src = (rows[q] - c * chunk_rows) * row_bytes - first_of[s]
                out[order[q] * row_bytes:(order[q] + 1) * row_bytes] = slot[src:src + row_bytes]
        cq[off[CQ_HEAD]] = np.uint32(head)
    return -1 if short else total


@njit(cache=True, nogil=True, inline="always")
def direct_run(rows, order, i, j, row_bytes, out_addr):  # pragma: no cover - compiled
    """Whether the read of ``rows[i..j]`` (from :func:`aligned_run`) can land in the batch's buffer at
    ``out_addr`` itself: rows of whole blocks, the buffer aligned, and the rows next to each other both on disk
    and in the batch (no gap, no repeat), so the read is exactly their bytes at their place."""
    if row_bytes % ALIGN != 0 or out_addr % ALIGN != 0:
        return False
    for q in range(i, j):
        if rows[q + 1] != rows[q] + 1 or order[q + 1] != order[q] + 1:
            return False
    return True


@njit(cache=True, nogil=True, inline="always")
def aligned_run(rows, i, chunk_rows, row_bytes, gap, room):  # pragma: no cover - compiled
    """The rows from ``rows[i]`` (ascending) that one aligned read covers: ``(chunk, first, j, end)``, the read
    from byte ``first`` (aligned down) of chunk file ``chunk`` to byte ``end`` (the end of row ``rows[j]``):
    rows of that chunk at most ``gap`` bytes apart, the read, rounded up to blocks, within ``room`` bytes."""
    c = rows[i] // chunk_rows
    lo = (rows[i] - c * chunk_rows) * row_bytes
    first = lo - lo % ALIGN
    j = i
    while j + 1 < len(rows) and rows[j + 1] // chunk_rows == c:
        nxt = (rows[j + 1] - c * chunk_rows) * row_bytes
        if nxt - (rows[j] - c * chunk_rows + 1) * row_bytes > gap or nxt + row_bytes - first + ALIGN > room:
            break
        j += 1
    return c, first, j, (rows[j] - c * chunk_rows + 1) * row_bytes


@njit(cache=True, nogil=True, inline="always")
def _push(sq, sqes, off, sq_mask, fd, offset, addr, length, user):  # pragma: no cover - compiled
    """A read of ``length`` bytes at ``offset`` of ``fd`` into ``addr`` onto the submission queue."""
    tail = np.int64(sq[off[SQ_TAIL]])
    idx = tail & np.int64(sq_mask)
    w = idx * 8
    sqes[w] = np.uint64(_OP_READ) | (np.uint64(np.uint32(fd)) << np.uint64(32))
    sqes[w + 1] = np.uint64(offset)
    sqes[w + 2] = np.uint64(addr)
    sqes[w + 3] = np.uint64(length)
    sqes[w + 4] = np.uint64(user)
    sqes[w + 5] = 0
    sqes[w + 6] = 0
    sqes[w + 7] = 0
    sq[off[SQ_ARRAY] + idx] = np.uint32(idx)
    sq[off[SQ_TAIL]] = np.uint32((tail + 1) & 0xFFFFFFFF)
