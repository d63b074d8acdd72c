"""Drops numba's cached kernels of this project when any of its source files changed since they were built.

numba keys a cached function on its own file only: a kernel that calls kernels of another file (the
sampling engine's drivers call :mod:`sampling.picks`, :mod:`sampling.draws`, ...) is loaded from the
cache unchanged after those files change, and runs the old code. After a ``git pull`` or an edit in a
checkout that is a wrong result, not a slow one. So the first import after a change removes every
cached kernel of ``graphstore`` and ``sampling`` (their ``__pycache__/*.nbi``/``*.nbc``), keyed by a
hash of all their sources kept beside them; numba then compiles afresh. Installed packages whose
``__pycache__`` cannot be written (numba caches elsewhere then, and their files do not change in
place) and a ``NUMBA_CACHE_DIR`` of the user's are left alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

_PACKAGES = ("graphstore", "sampling")
MARKER = "jit-sources.sha256"


def source_hash(roots: list[Path]) -> str:
    """sha256 over the relative paths and bytes of every ``.py`` file below ``roots``."""
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def drop_stale(base: Path | None = None) -> int:
    """Remove the cached kernels below ``base`` (the folder holding both packages; default: this
    checkout's) when the sources changed since the marker was written; returns how many files went."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return 0
    base = base or Path(__file__).resolve().parent.parent
    roots = [base / name for name in _PACKAGES if (base / name).is_dir()]
    marker = base / "graphstore" / "__pycache__" / MARKER
    try:
        current = source_hash(roots)
        if marker.is_file() and marker.read_text() == current:
            return 0
        dropped = 0
        for root in roots:
            for cached in [*root.rglob("__pycache__/*.nbi"), *root.rglob("__pycache__/*.nbc")]:
                cached.unlink(missing_ok=True)
                dropped += 1
        marker.parent.mkdir(exist_ok=True)
        partial = marker.with_name(f"{MARKER}.{os.getpid()}.partial")
        partial.write_text(current)
        partial.replace(marker)  # atomic: another process reads the old marker or the new one
    except OSError as exc:  # a read-only install: numba caches in the user's folder, files never change there
        logger.debug("numba cache check skipped: %s", exc)
        return 0
    if dropped:
        logger.info("sources changed since numba cached %d kernel files: dropped them (they compile again)",
                    dropped)
    return dropped
