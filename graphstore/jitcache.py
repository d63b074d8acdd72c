"""numba's cache of this project's kernels: stale ones dropped, compiles announced, the warm-up's stamp.

numba keys a cached function on its own file only: a kernel that calls kernels of another file (the
sampling engine's drivers call :mod:`sampling.kernels.picks`, :mod:`sampling.kernels.draws`, ...) is loaded from the
cache unchanged after those files change, and runs the old code. After a ``git pull`` or an edit in a
checkout that is a wrong result, not a slow one. So the first import after a change removes every
cached kernel of ``graphstore`` and ``sampling`` (their ``__pycache__/*.nbi``/``*.nbc``), keyed by a
hash of all their sources kept beside them; numba then compiles afresh. Installed packages whose
``__pycache__`` cannot be written (numba caches elsewhere then, and their files do not change in
place) and a ``NUMBA_CACHE_DIR`` of the user's are left alone.

A kernel compiles when the cache has no copy for its argument types: in the first run after an install
or an update, for a minute or more. :func:`announce_compiles` makes such a run say so (one line, from
numba's compile events: nothing is checked on the hot path), and :func:`warm_stamp` tells whether the
warm-up compiled everything for these sources, this numba and this CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numba.core import event

logger = logging.getLogger(__name__)

_PACKAGES = ("graphstore", "sampling")
_BASE = Path(__file__).resolve().parent.parent  # the folder holding the packages
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
    base = base or _BASE
    roots = [base / name for name in _PACKAGES if (base / name).is_dir()]
    marker = base / "graphstore" / "__pycache__" / MARKER
    try:
        current = source_hash(roots)
        if marker.is_file() and marker.read_text() == current:
            return 0
        dropped = 0
        for root in roots:
            for cached in [*root.rglob("__pycache__/*.nbi"), *root.rglob("__pycache__/*.nbc"),
                           *root.rglob(f"__pycache__/*{CLAIM_SUFFIX}")]:
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


# -- compiles and saves across processes ---------------------------------------------------------------------

SAVE_LOCK = "graphstore-save.lock"  # in each folder numba caches this project's kernels in
CLAIM_SUFFIX = ".claim"  # <function's index name>.<key digest>.claim: held while one process compiles it
CLAIM_WAIT = 600.0  # seconds a process waits for another's compile before compiling the kernel itself

_CLAIMS: dict[tuple[int, tuple], int] = {}  # (id(numba cache), argument types) -> the held claim's descriptor
_CLAIMS_LOCK = threading.Lock()


def _ours(cache: Any) -> bool:
    module = getattr(getattr(cache, "_py_func", None), "__module__", "") or ""
    return module.split(".")[0] in _PROJECT


def _claim_key(cache: Any, sig: Any) -> tuple[int, tuple]:
    from numba.core import sigutils

    return id(cache), tuple(sigutils.normalize_signature(sig)[0])


def _claim_path(cache: Any, sig: Any, target_context: Any) -> str:
    key = cache._index_key(sig, target_context.codegen())  # what numba's index files the specialisation under
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
    return os.path.join(cache._cache_path, f"{cache._cache_file._index_name[:-len('.nbi')]}.{digest}{CLAIM_SUFFIX}")


def _take(path: str, wait: float) -> int | None:
    """An exclusive ``flock`` on ``path`` within ``wait`` seconds (its descriptor), or None."""
    import fcntl

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return None
    deadline, pause = time.monotonic() + wait, 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(pause)
            pause = min(2 * pause, 0.1)
        except OSError:  # a file system without flock
            os.close(fd)
            return None


def _release(key: tuple[int, tuple]) -> None:
    with _CLAIMS_LOCK:
        fd = _CLAIMS.pop(key, None)
    if fd is not None:
        os.close(fd)  # releases the flock


def _drop_inherited_claims() -> None:
    """In a forked child: the parent's claims are the parent's (a copied descriptor would hold its lock)."""
    with _CLAIMS_LOCK:
        fds = list(_CLAIMS.values())
        _CLAIMS.clear()
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _across_processes() -> bool:
    """Make this project's kernels compile once across the processes that share a cache folder.

    - **Claims.** A process that finds no cached copy of a specialisation takes an exclusive ``flock`` on
      a claim file of that specialisation before it compiles, and holds it until it saved the result (or
      the compile failed). A process that finds the claim taken waits for it (at most ``CLAIM_WAIT``),
      then loads what the other one saved. Ranks of one host starting on a cold cache, and the warm-up's
      processes, compile each specialisation once instead of once each, on the same cores. A kernel
      compiles while its callees compile inside it, so claims are taken in the call graph's order and
      never wait on each other in a cycle.
    - **Saves.** numba saves a specialisation by reading the function's index, adding an entry named after
      the first free data file and writing both back, with no lock: two processes saving different
      specialisations of one kernel at once can pick the same data file and keep one index entry (the
      other compiles again in every later run, or its entry names the other's machine code). Saves take
      an exclusive ``flock`` on ``SAVE_LOCK`` in the cache folder.

    A folder where the lock files cannot be made compiles and saves as numba does. Returns whether the
    wrappers are installed (once per process)."""
    try:
        from numba.core import caching
    except ImportError:  # pragma: no cover - numba is a dependency
        return False
    load, save = getattr(caching.Cache, "load_overload", None), getattr(caching.Cache, "_save_overload", None)
    if load is None or save is None or getattr(save, "_graphstore", False):
        return load is not None and save is not None

    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        cres = load(self, sig, target_context)
        if cres is not None or not _ours(self) or not getattr(self, "_enabled", False):
            return cres
        key = _claim_key(self, sig)
        with _CLAIMS_LOCK:
            if key in _CLAIMS:
                return None
        fd = _take(_claim_path(self, sig, target_context), CLAIM_WAIT)
        if fd is None:
            return None
        cres = load(self, sig, target_context)  # what another process compiled while this one waited
        if cres is not None:
            os.close(fd)
            return cres
        with _CLAIMS_LOCK:
            _CLAIMS[key] = fd  # released once saved, or when the compile fails (_Watch.on_end)
        return None

    def _save_overload(self: Any, sig: Any, data: Any) -> None:
        if not _ours(self):
            return save(self, sig, data)
        try:
            fd = _take(os.path.join(self._cache_path, SAVE_LOCK), CLAIM_WAIT)
            try:
                return save(self, sig, data)
            finally:
                if fd is not None:
                    os.close(fd)
        finally:
            _release(_claim_key(self, sig))

    _save_overload._graphstore = True  # type: ignore[attr-defined]
    caching.Cache.load_overload = load_overload
    caching.Cache._save_overload = _save_overload
    os.register_at_fork(after_in_child=_drop_inherited_claims)
    _watch()  # a failed compile releases its claim (numba's compile events)
    return True


# -- compiles: counted, timed and announced -------------------------------------------------------------------

NOTICE_ENV = "GRAPHSTORE_COMPILE_NOTICE"  # "0": say nothing (set once said, so child processes stay quiet)
_LOCAL_RANK_ENV = ("LOCAL_RANK", "SLURM_LOCALID")  # torchrun / srun: only each host's first rank says it
_PROJECT = ("graphstore", "sampling", "training")


@dataclass
class CompileCounts:
    """Compilations of this project's kernels in this process (numba's cache misses): how many
    specialisations, in how many seconds (outermost compiles; the callees they compile are inside)."""

    compiled: int = 0
    seconds: float = 0.0
    names: Counter = field(default_factory=Counter)  # kernel -> specialisations compiled
    times: Counter = field(default_factory=Counter)  # kernel -> seconds

    def since(self, earlier: CompileCounts) -> CompileCounts:
        return CompileCounts(self.compiled - earlier.compiled, self.seconds - earlier.seconds,
                             self.names - earlier.names, self.times - earlier.times)


class _Watch(event.Listener):
    """A numba ``numba:compile`` listener (events fire only when a signature is neither loaded nor cached)."""

    def __init__(self) -> None:
        self.counts = CompileCounts()
        self.announce: dict[str, str] = {}  # package -> how long its kernels take to compile, for the notice
        self._depth, self._start = 0, 0.0

    def on_start(self, ev: Any) -> None:
        package = _package(ev)
        if self._depth == 0 and package:
            self._start = time.perf_counter()
            if package in self.announce:
                _notice(package, self.announce[package])
        self._depth += 1 if package else 0

    def on_end(self, ev: Any) -> None:
        package = _package(ev)
        if not package:
            return
        # a compile that raised (numba's Event.is_failed says the opposite, so its field is read): no save
        # follows, so the processes waiting for this one's claim go on now
        if getattr(ev, "_exc_details", None) is not None:
            cache = getattr(ev.data["dispatcher"], "_cache", None)
            _release((id(cache), tuple(ev.data["args"])))
        self._depth -= 1
        if self._depth == 0:
            seconds = time.perf_counter() - self._start
            self.counts.compiled += 1
            self.counts.seconds += seconds
            self.counts.names[_qualname(ev)] += 1
            self.counts.times[_qualname(ev)] += seconds


_WATCH: _Watch | None = None
_WATCH_LOCK = threading.Lock()


def _watch() -> _Watch:
    global _WATCH
    with _WATCH_LOCK:
        if _WATCH is None:
            _WATCH = _Watch()
            event.register("numba:compile", _WATCH)
    return _WATCH


def _package(ev: Any) -> str | None:
    module = getattr(getattr(ev.data.get("dispatcher"), "py_func", None), "__module__", "") or ""
    name = module.split(".")[0]
    return name if name in _PROJECT else None


def _qualname(ev: Any) -> str:
    func = ev.data["dispatcher"].py_func
    return f"{func.__module__}.{func.__qualname__}"


def announce_compiles(package: str, takes: str) -> None:
    """Say once per process (a WARNING: one line on stderr) when the kernels of ``package`` start compiling,
    and about how long that ``takes`` (they compile when numba's cache has no copy for this installation:
    the first run after an install or an update), instead of a silent first batch. Detected from numba's
    compile events, so a run whose kernels load from the cache pays nothing. Quiet when ``NOTICE_ENV`` is
    ``0``, and an INFO record (the log only) in every rank but the first of its host (``LOCAL_RANK``,
    ``SLURM_LOCALID``) and every DataLoader worker but the first."""
    _watch().announce[package] = takes


def compile_counts() -> CompileCounts:
    """This process's compilations of project kernels so far (a copy; subtract with ``since``)."""
    counts = _watch().counts
    return CompileCounts(counts.compiled, counts.seconds, Counter(counts.names), Counter(counts.times))


def _notice(package: str, takes: str) -> None:
    if os.environ.get(NOTICE_ENV) == "0":
        return
    os.environ[NOTICE_ENV] = "0"  # once per process, and the ranks/workers it starts from now on stay quiet
    first = all(os.environ.get(name, "0") == "0" for name in _LOCAL_RANK_ENV) and _first_worker()
    logger.log(logging.WARNING if first else logging.INFO,
               "graphstore: compiling the %s kernels (the first run after an install or an update; %s); "
               "`graphstore warmup` compiles them ahead of time", package, takes)


# -- the warm-up's stamp -------------------------------------------------------------------------------------

WARM_STAMP = "warmup-stamp.json"
_WARM_PACKAGES = (*_PACKAGES, "training")  # training's sources decide which specialisations its runs need


def cache_location(base: Path | None = None) -> Path:
    """Where this project's kernels are cached: ``NUMBA_CACHE_DIR``, else beside the sources (``__pycache__``)."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    return Path(configured) if configured else (base or _BASE) / "graphstore" / "__pycache__"


def _index_files(base: Path) -> list[Path]:
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return sorted(Path(configured).rglob("*.nbi"))
    return sorted(p for name in _PACKAGES if (base / name).is_dir() for p in (base / name).rglob("__pycache__/*.nbi"))


def warm_key(base: Path | None = None) -> str:
    """What a compiled cache is valid for: the sources (their bytes, and their times and sizes, which numba
    checks), numba, Python, the CPU numba compiles for and the cache's location."""
    import llvmlite.binding as ll
    import numba

    base = base or _BASE
    roots = [base / name for name in _WARM_PACKAGES if (base / name).is_dir()]
    digest = hashlib.sha256(source_hash(roots).encode())
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            stat = path.stat()
            digest.update(f"{path.relative_to(base)}:{stat.st_mtime_ns}:{stat.st_size}".encode())
    for part in (numba.__version__, sys.version, ll.get_process_triple(), ll.get_host_cpu_name(),
                 numba.config.CPU_NAME, numba.config.CPU_FEATURES, str(cache_location(base))):
        digest.update(f"|{part}".encode())
    return digest.hexdigest()


def warm_stamp(base: Path | None = None) -> dict[str, Any] | None:
    """The last complete warm-up's record when it still holds (same :func:`warm_key`, its cache index
    files all there), else ``None``: then kernels may compile in a run, and ``graphstore warmup`` helps."""
    base = base or _BASE
    try:
        stamp = json.loads((cache_location(base) / WARM_STAMP).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("key") != warm_key(base):
        return None
    root = cache_location(base) if os.environ.get("NUMBA_CACHE_DIR") else base
    if not all((root / name).is_file() for name in stamp.get("index", [])):
        return None  # a cache folder emptied by hand
    return stamp


def mark_warm(info: dict[str, Any], key: str | None = None, base: Path | None = None) -> bool:
    """Record a complete warm-up (``info`` is kept in the stamp) of the sources ``key`` describes (taken
    before it started: a source edited meanwhile voids it); False when the cache folder is read-only."""
    base = base or _BASE
    folder = cache_location(base)
    root = folder if os.environ.get("NUMBA_CACHE_DIR") else base
    stamp = {**info, "key": key or warm_key(base), "at": time.strftime("%Y-%m-%d %H:%M:%S"),
             "index": [str(p.relative_to(root)) for p in _index_files(base)]}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{WARM_STAMP}.{os.getpid()}.partial"
        partial.write_text(json.dumps(stamp, indent=1))
        partial.replace(folder / WARM_STAMP)
    except OSError as exc:
        logger.info("could not record the warm-up in %s: %s", folder, exc)
        return False
    return True


def _first_worker() -> bool:
    """Whether this is not a DataLoader worker, or is its first (each worker compiles what it samples)."""
    data = sys.modules.get("torch.utils.data")  # never imported here: a process without torch has no workers
    info = data.get_worker_info() if data is not None else None
    return info is None or info.id == 0


_across_processes()
