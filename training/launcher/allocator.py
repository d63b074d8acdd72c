"""The allocator a training rank runs under: jemalloc preloaded by its launcher where the machine has
it, else glibc tuned (``graphstore.heap``), and the check a rank started by another launcher makes.

``GRAPHSTORE_MALLOC`` chooses (``graphstore.heap`` lists the values); ``GRAPHSTORE_JEMALLOC`` names the
library file when it is not in a standard place. The heap's mechanics (tuning, handing freed memory back,
its counts) live in ``graphstore.heap`` and are re-exported here for the trainer.
"""

from __future__ import annotations

import glob
import os
import platform
import sys

from graphstore.errors import InvalidInputError
from graphstore.heap import (MODES, HeapStats, heap_stats, jemalloc_active, keep_freed_memory, mode, name,
                             release_freed, tuned)

__all__ = ["JEMALLOC_CONF", "MODES", "HeapStats", "check_rank", "find_jemalloc", "heap_stats", "jemalloc_active",
           "keep_freed_memory", "mode", "name", "preload_env", "release_freed", "tuned"]

# jemalloc's options for ranks (MALLOC_CONF, unless the user set it). oversize_threshold:0: blocks of 8 MiB
# and more are not given an arena of their own that unmaps them when freed. dirty_decay_ms:-1: freed
# pages stay mapped, so a step's activations reuse the last step's pages instead of faulting fresh ones in
# (as the glibc tuning does); release_freed() hands them back (the trainer does at each epoch's start).
# narenas:1: every thread (training loop, prefetch, RPC) allocates from one arena, so what one frees
# another reuses. jemalloc's size classes and extent reuse keep this heap from fragmenting the way glibc's
# does (docs/training.md: Memory and the allocator).
JEMALLOC_CONF = "oversize_threshold:0,dirty_decay_ms:-1,narenas:1"
_JEMALLOC_DIRS = ("/usr/lib/{arch}-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def check_rank() -> str | None:
    """For a rank started by another launcher (torchrun, srun): raises when ``GRAPHSTORE_MALLOC=jemalloc``
    but this process does not run under it; returns a hint when jemalloc is on the machine but not in use
    (``auto``), else ``None``."""
    chosen = mode()
    if chosen in ("glibc", "default") or jemalloc_active():
        return None
    path = find_jemalloc()
    hint = (f"LD_PRELOAD={path} MALLOC_CONF={JEMALLOC_CONF}" if path else
            "LD_PRELOAD=/path/to/libjemalloc.so.2 (Debian/Ubuntu: apt install libjemalloc2)")
    if chosen == "jemalloc":
        raise InvalidInputError(f"GRAPHSTORE_MALLOC=jemalloc, but this rank does not run under jemalloc; start it "
                                f"with {hint} in its environment, or set GRAPHSTORE_MALLOC=glibc")
    if path is None:
        return None
    return (f"this rank runs under glibc's allocator although jemalloc is installed; start ranks with {hint} "
            "in their environment for flat memory per rank (graphstore-train does it itself)")


def find_jemalloc(env: dict[str, str] | None = None) -> str | None:
    """The path of this machine's ``libjemalloc.so.2`` (``GRAPHSTORE_JEMALLOC`` if set), or ``None``."""
    env = os.environ if env is None else env
    named = env.get("GRAPHSTORE_JEMALLOC", "").strip()
    if named:
        if not os.path.isfile(named):
            raise InvalidInputError(f"GRAPHSTORE_JEMALLOC={named!r} is not a file; name jemalloc's shared library "
                                    "(e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2) or unset it")
        if not _is_shared_object(named):
            raise InvalidInputError(f"GRAPHSTORE_JEMALLOC={named!r} is not an ELF shared library, so it cannot be "
                                    "preloaded; name jemalloc's (e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2) "
                                    "or unset it")
        return named
    if not sys.platform.startswith("linux"):
        return None
    for folder in _JEMALLOC_DIRS:
        found = sorted(glob.glob(os.path.join(folder.format(arch=platform.machine()), "libjemalloc.so.2")))
        if found:
            return found[0]
    return None


def _is_shared_object(path: str) -> bool:
    """Whether ``path`` is an ELF shared object (``e_type`` ET_DYN), as ``LD_PRELOAD`` needs: anything else
    makes the dynamic loader print an error into every process started with it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(18)
    except OSError:
        return False
    if len(head) < 18 or head[:4] != b"\x7fELF" or head[5] not in (1, 2):
        return False
    return int.from_bytes(head[16:18], "little" if head[5] == 1 else "big") == 3  # ET_DYN


def preload_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a rank process: with jemalloc preloaded (``LD_PRELOAD``, and :data:`JEMALLOC_CONF` as
    ``MALLOC_CONF`` unless set) when ``GRAPHSTORE_MALLOC`` is ``auto`` or ``jemalloc`` and the machine
    has it. Raises :class:`InvalidInputError` for ``jemalloc`` without the library."""
    chosen = mode(env)
    if chosen in ("glibc", "default"):
        return env
    if "jemalloc" in env.get("LD_PRELOAD", ""):  # preloaded by the user: our options unless theirs are set
        return {**env, "MALLOC_CONF": env.get("MALLOC_CONF", JEMALLOC_CONF)}
    path = find_jemalloc(env)
    if path is None:
        if chosen == "jemalloc":
            raise InvalidInputError(
                "GRAPHSTORE_MALLOC=jemalloc, but no libjemalloc.so.2 was found in "
                f"{', '.join(d.format(arch=platform.machine()) for d in _JEMALLOC_DIRS)}; install it (Debian/Ubuntu: "
                "apt install libjemalloc2), name it with GRAPHSTORE_JEMALLOC=PATH, or set GRAPHSTORE_MALLOC=glibc")
        return env
    out = dict(env)
    out["LD_PRELOAD"] = ":".join(p for p in (path, env.get("LD_PRELOAD", "")) if p)
    out.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    return out
