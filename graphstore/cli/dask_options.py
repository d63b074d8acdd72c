"""The ingest CLI's Dask flags: validate them, and start (or join) the cluster the ingest runs on."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import struct
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from graphstore.errors import InvalidInputError, MissingBackendError, UnreachableHostError
from graphstore.ingest import budget

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", ""}
# a worker holds about 200 MiB before its first task and needs room for one task of at least MIN_TASK_BYTES at
# the budget's share of the rest (graphstore.ingest.budget); below that its nanny restarts it forever
MIN_MEMORY_LIMIT = budget._BASELINE + int(budget.MIN_TASK_BYTES / budget._TASK_SHARE)  # 328 MiB
CONNECT_SECONDS = 5  # --scheduler: how long to wait for it to accept a connection, and then to answer
_DEFAULT_PORT = 8786
DEFAULT_WORKERS, DEFAULT_MEMORY_LIMIT = 2, "4GB"  # the LocalCluster --engine dask starts without flags
WORKERS_PER_CORE = 4  # beyond this the worker processes only compete for the cores


def add_dask_arguments(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--workers``, ``--memory-limit`` and ``--scheduler`` on the ingest parser."""
    parser.add_argument("--engine", choices=("local", "dask"), default="local",
                        help="local: in this process (default); dask: the same stages as tasks on a Dask cluster")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="--engine dask: worker processes of the LocalCluster started (default 2)")
    parser.add_argument("--memory-limit", metavar="SIZE",
                        help="--engine dask: memory limit per worker of the LocalCluster, e.g. 4GB (default 4GB)")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="--engine dask: join this running cluster (tcp://host:8786) instead of starting one")


def check_dask_arguments(args: argparse.Namespace) -> None:
    """Refuse flags that do not apply, before any work: every flag given is used."""
    given = [f for f, v in (("--workers", args.workers), ("--memory-limit", args.memory_limit),
                            ("--scheduler", args.scheduler)) if v is not None]
    if args.engine == "local" and given:
        raise InvalidInputError(f"{', '.join(given)} apply only to --engine dask; add --engine dask or drop them")
    if args.scheduler is not None and (args.workers is not None or args.memory_limit is not None):
        raise InvalidInputError("--workers/--memory-limit size a cluster this command starts, but --scheduler "
                                f"{args.scheduler} joins a running one: drop one of them")
    if args.workers is not None and args.workers < 1:
        raise InvalidInputError(f"--workers {args.workers}: give at least 1 worker")
    if args.memory_limit is not None and _parse_bytes(args.memory_limit) < MIN_MEMORY_LIMIT:
        raise InvalidInputError(f"--memory-limit {args.memory_limit} is below {MIN_MEMORY_LIMIT >> 20} MiB, the least "
                                "a worker runs with (about 200 MiB to start, plus room for one ingest task; below "
                                "it the worker is restarted forever): give e.g. 1GB")
    if args.workers is not None or args.memory_limit is not None:
        _check_fits(args.workers or DEFAULT_WORKERS, args.memory_limit or DEFAULT_MEMORY_LIMIT)
    if args.scheduler is not None:
        _check_reachable_dest(args.scheduler, str(args.dest))
        _probe(args.scheduler)


def _check_fits(workers: int, memory_limit: str) -> None:
    """Refuse a LocalCluster this machine cannot hold, before any worker process starts: more workers than
    :data:`WORKERS_PER_CORE` per core, or workers x memory limit beyond its memory."""
    cores = os.cpu_count() or 1
    if workers > WORKERS_PER_CORE * cores:
        raise InvalidInputError(f"--workers {workers} is more than {WORKERS_PER_CORE} per core of this machine's "
                                f"{cores}; give at most {WORKERS_PER_CORE * cores} (each is a process), or join a "
                                "larger cluster with --scheduler")
    total, ram = workers * _parse_bytes(memory_limit), _machine_memory()
    if ram and total > ram:
        raise InvalidInputError(f"--workers {workers} x --memory-limit {memory_limit} = {total / 2**30:.1f} GiB is "
                                f"more than this machine's {ram / 2**30:.1f} GiB of memory; give fewer workers or a "
                                f"smaller --memory-limit (workers x limit <= {ram / 2**30:.1f} GiB), or join a "
                                "larger cluster with --scheduler")


def _machine_memory() -> int:
    """This machine's physical memory in bytes (0 where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _parse_bytes(text: str) -> int:
    from dask.utils import parse_bytes

    try:
        value = parse_bytes(text)
    except (ValueError, TypeError):
        value = 0
    if value <= 0:
        raise InvalidInputError(f"--memory-limit {text!r} is not a size; give e.g. 4GB or 512MiB")
    return int(value)


def _probe(scheduler: str) -> None:
    """Refuse a ``tcp://``/``tls://`` scheduler address nobody listens on, within :data:`CONNECT_SECONDS`."""
    parsed = urlparse(scheduler if "://" in scheduler else f"tcp://{scheduler}")
    if parsed.scheme not in ("tcp", "tls"):
        return  # ucx://, inproc://: Client's own timeout bounds them
    try:
        host, port = parsed.hostname or "", parsed.port or _DEFAULT_PORT
    except ValueError:
        raise InvalidInputError(f"--scheduler {scheduler} is not an address; give tcp://HOST:PORT") from None
    try:
        conn = socket.create_connection((host, port), timeout=CONNECT_SECONDS)
    except OSError as exc:
        why = f"no answer in {CONNECT_SECONDS} s" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise UnreachableHostError(f"--scheduler {scheduler}: cannot connect to {host}:{port} ({why}); start a Dask "
                                   f"scheduler there (dask scheduler --port {port}) or fix the address, or drop "
                                   "--scheduler to start a local cluster") from None
    with conn:
        why = _not_dask(conn) if parsed.scheme == "tcp" else None
    if why:
        raise UnreachableHostError(f"--scheduler {scheduler}: no Dask scheduler answered at {host}:{port} ({why}); "
                                   "is a Dask scheduler (not another service) listening there? Fix the address, or "
                                   "drop --scheduler to start a local cluster")


def _not_dask(conn: socket.socket) -> str | None:
    """Why the peer of ``conn`` is no Dask scheduler, or ``None`` when it opens as one. A Dask listener speaks
    first: its handshake message, framed by distributed's TCP prelude (total length, frame count)."""
    head = b""
    try:
        while len(head) < 16:
            got = conn.recv(16 - len(head))
            if not got:
                return "it closed the connection without a word"
            head += got
    except TimeoutError:
        return f"it said nothing in {CONNECT_SECONDS} s, where a Dask scheduler greets at once"
    except OSError as exc:
        return exc.strerror or str(exc)
    total, frames = struct.unpack("<QQ", head)
    if not (0 < frames <= 64 and 8 * (frames + 1) <= total <= 2**20):
        return "it answered in a protocol that is not Dask's"
    return None


def _join(scheduler: str) -> Any:
    """A Client of the running cluster at ``scheduler``; one line naming it if no Dask scheduler answers."""
    from distributed import Client

    try:
        return Client(scheduler, timeout=2 * CONNECT_SECONDS)
    except Exception as exc:  # noqa: BLE001  (another service there answers with anything: even MemoryError)
        detail = ("it answered in a protocol that is not Dask's" if isinstance(exc, MemoryError)  # a huge frame
                  else " ".join(f"{type(exc).__name__}: {exc}".split())[:200])
        raise UnreachableHostError(f"--scheduler {scheduler}: no Dask scheduler answered ({detail}); is a Dask "
                                   "scheduler (not another service) listening there? Fix the address, or drop "
                                   "--scheduler to start a local cluster") from None


def _check_reachable_dest(scheduler: str, dest: str) -> None:
    """A local-path DEST is refused when the scheduler runs on another host: its workers cannot write there."""
    if "://" in dest and not dest.startswith("file://"):
        return
    host = urlparse(scheduler if "://" in scheduler else f"tcp://{scheduler}").hostname or ""
    if host in _LOCAL_HOSTS or host in {socket.gethostname(), socket.getfqdn()}:
        return
    raise InvalidInputError(f"DEST {dest} is a local path, but --scheduler {scheduler} is on another host "
                            f"({host}), whose workers cannot write there; give an object-storage URL "
                            "(s3://bucket/name) or a path every worker shares, as a URL the workers reach")


@contextlib.contextmanager
def dask_client(args: argparse.Namespace) -> Iterator[Any]:
    """``None`` for ``--engine local``; else a Client of the cluster joined or started (closed at the end)."""
    if args.engine == "local":
        yield None
        return
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise MissingBackendError("--engine dask needs distributed: pip install 'graphstore[dask]'") from exc
    if not getattr(args, "verbose", False):  # distributed logs INFO lines of its own (scheduler, nanny) otherwise
        logging.getLogger("distributed").setLevel(logging.WARNING)
    if args.scheduler is not None:
        with _join(args.scheduler) as client:
            yield client
        return
    with LocalCluster(n_workers=args.workers or DEFAULT_WORKERS, threads_per_worker=1, processes=True,
                      memory_limit=args.memory_limit or DEFAULT_MEMORY_LIMIT) as cluster, Client(cluster) as client:
        print(f"dask dashboard: {cluster.dashboard_link} ({len(cluster.workers)} workers, pid {os.getpid()})",
              file=sys.stderr)
        yield client
