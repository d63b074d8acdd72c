"""Run METIS where a signal cannot tear it: a forked child with SIGTERM and SIGINT blocked.

METIS (GKlib's ``gk_sigtrap``) installs its own process-wide SIGTERM handler while it runs, which
``longjmp``s out of the signal: in the thread that called METIS that ends in ``RuntimeError: Caught an
unknown exception!``, in any other thread in a segmentation fault. In a child that blocks the signals,
METIS never sees them; the ingest process keeps Python's handlers, so SIGTERM or Ctrl-C ends it as in any
other stage (the child is killed, the claim and staging directory removed).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from graphstore.errors import IngestStageError

logger = logging.getLogger(__name__)

_BLOCKED = {signal.SIGTERM, signal.SIGINT}
_PR_SET_PDEATHSIG = 1


def run_parts(call: Callable[[], Any], count: int) -> np.ndarray:
    """``call()`` (a ``pymetis.part_graph``) in a child process; its ``count`` parts as int32.

    Where there is no ``fork`` (Windows) or it fails (memory overcommit refused), ``call`` runs here.
    """
    if not hasattr(os, "fork"):
        return np.asarray(call()[1], dtype=np.int32)
    shared = mmap.mmap(-1, max(4 * count, 1))  # anonymous and shared: the child writes the parts here
    libc = _libc()
    read_fd, write_fd = os.pipe()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)  # the child starts with them blocked
    try:
        pid = os.fork()
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(read_fd)
        os.close(write_fd)
        logger.warning("cannot fork a process for METIS (%s); running it in this one", exc)
        return np.asarray(call()[1], dtype=np.int32)
    if pid == 0:
        _child(call, count, shared, read_fd, write_fd, libc)
    return _wait(pid, read_fd, write_fd, shared, count, mask)


def _child(call: Callable[[], Any], count: int, shared: mmap.mmap, read_fd: int, write_fd: int, libc: Any) -> None:
    """The forked child: never returns; exit 0 with the parts in ``shared``, else 1 with the error in the pipe."""
    code = 1
    try:
        os.close(read_fd)
        if libc is not None:  # die with the ingest (even kill -9), never run on as an orphan
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        parts = np.asarray(call()[1], dtype=np.int32)
        np.frombuffer(shared, dtype=np.int32, count=count)[:] = parts
        code = 0
    except BaseException as exc:  # noqa: BLE001  (reported to the parent, whatever it is)
        with contextlib.suppress(BaseException):
            os.write(write_fd, " ".join(f"{type(exc).__name__}: {exc}".split())[:2000].encode())
    finally:
        os._exit(code)


def _wait(pid: int, read_fd: int, write_fd: int, shared: mmap.mmap, count: int, mask: Any) -> np.ndarray:
    """The child's parts; a signal here (Python's handler raising) kills the child before it propagates."""
    try:
        os.close(write_fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal that came meanwhile is handled now
        message = b""
        while chunk := os.read(read_fd, 4096):
            message += chunk
        _, status = os.waitpid(pid, 0)
        pid = 0
    finally:
        os.close(read_fd)
        if pid:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        shared.close()
        name = signal.Signals(os.WTERMSIG(status)).name
        raise IngestStageError(f"METIS ended with signal {name} (killed for memory?); lower --metis-max-edges, or "
                               "partition with --method random")
    if os.WEXITSTATUS(status) != 0:
        shared.close()
        raise IngestStageError(f"METIS failed: {message.decode(errors='replace') or 'no reason given'}")
    parts = np.frombuffer(shared, dtype=np.int32, count=count).copy()
    shared.close()
    return parts


def _libc() -> Any:
    """libc for ``prctl`` (Linux), loaded before the fork; ``None`` elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
