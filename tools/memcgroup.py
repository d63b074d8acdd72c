"""A cgroup v1 memory limit for a child process tree, removed afterwards (root, Linux).

cgroup v1 charges page cache to the group, so a process in a group limited below its dataset's size
really reads from disk: what the benchmarks and tests of features larger than memory need.

Usage::

    with MemoryCgroup(1_500_000_000) as group:
        proc = subprocess.Popen(cmd, preexec_fn=group.join)
        proc.wait()
        print(group.peak_bytes(), group.oom_kills())
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")


def available() -> str | None:
    """``None`` when a memory cgroup can be made here, else why not."""
    if not (ROOT / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory controller at {ROOT}"
    if os.geteuid() != 0:
        return "making a cgroup needs root"
    return None


class MemoryCgroup:
    """A fresh memory cgroup limited to ``limit`` bytes (swap included where the kernel accounts it)."""

    def __init__(self, limit: int, name: str | None = None) -> None:
        self.limit = int(limit)
        self.path = ROOT / (name or f"graphstore-{os.getpid()}-{uuid.uuid4().hex[:8]}")

    def __enter__(self) -> MemoryCgroup:
        self.path.mkdir()
        try:
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(self.limit))
        except OSError:
            self.path.rmdir()
            raise
        return self

    def join(self) -> None:
        """Move the calling process into the group (a ``preexec_fn``: the child joins before it execs)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def anon_bytes(self) -> int:
        """What the group's processes hold themselves now (``total_rss``: anonymous memory, no page cache)."""
        return self._stat("total_rss")

    def major_faults(self) -> int:
        """Page faults of the group's processes that read from disk so far (``total_pgmajfault``): a mapped
        file's page (the topology, a library's code) the limit had pushed out of the page cache."""
        return self._stat("total_pgmajfault")

    def _stat(self, key: str) -> int:
        for line in (self.path / "memory.stat").read_text().splitlines():
            if line.startswith(key + " "):
                return int(line.split()[1])
        return 0

    def oom_kills(self) -> int:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def __exit__(self, *exc: object) -> None:
        """Kill what is left in the group, then remove it (retried while the kernel releases it)."""
        for _ in range(100):
            pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        raise OSError(f"could not remove the cgroup {self.path}; remove it with rmdir once its processes are gone")


def drop_from_page_cache(root: Path) -> int:
    """Evict every file under ``root`` from the page cache (``POSIX_FADV_DONTNEED``); returns the bytes."""
    total = 0
    for path in Path(root).rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def read_into_page_cache(root: Path) -> int:
    """Read every file under ``root`` once (sequentially), so it starts in the page cache; returns the bytes."""
    total = 0
    for path in Path(root).rglob("*"):
        if path.is_file():
            with open(path, "rb", buffering=0) as fh:
                while chunk := fh.read(1 << 24):
                    total += len(chunk)
    return total


class PinnedInPageCache:
    """Every file under ``root`` read into the page cache and locked there (``mlock`` on a mapping of it,
    root) while the block runs: a baseline that stays in memory even where the host evicts pages not
    touched for a while (this machine runs DAMON's ``pageout`` on pages idle for about a minute)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._maps: list[mmap.mmap] = []

    def __enter__(self) -> PinnedInPageCache:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        for path in sorted(self.root.rglob("*")):
            if not path.is_file() or path.stat().st_size == 0:
                continue
            with open(path, "rb") as fh:
                mapped = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
            self._maps.append(mapped)
            if libc.mlock(_address(mapped), len(mapped)) != 0:
                self.__exit__()
                raise OSError(ctypes.get_errno(), f"mlock {path}: {os.strerror(ctypes.get_errno())}")
        return self

    def __exit__(self, *exc: object) -> None:
        for mapped in self._maps:
            mapped.close()  # unmapping unlocks
        self._maps.clear()


def _address(mapped: mmap.mmap) -> int:
    import numpy as np

    return np.frombuffer(mapped, dtype=np.uint8).ctypes.data
