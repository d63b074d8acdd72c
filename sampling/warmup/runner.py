"""``graphstore warmup``: compile the numba kernels of every command and loader ahead of the first run.

numba compiles a kernel for each combination of argument types it is called with, and caches the
machine code on disk (``cache=True``; :mod:`graphstore.jitcache`). Left to itself that happens in a
user's first batch: a minute or more of silence. The warm-up runs the real code paths instead (ingest,
the samplers and loaders, the distributed sampler, the training tasks) on tiny graphs in a scratch
directory, so what it compiles is what the runs use. The groups it runs are found through the
``graphstore.warmup`` entry points (``training`` adds its own), and the command itself is a
``graphstore.commands`` entry point, so ``graphstore`` never imports the layers above it.

A warm-up that finds its stamp (:func:`graphstore.jitcache.warm_stamp`: same sources, numba, Python,
CPU and cache) does nothing; ``--force`` runs every group anyway (then each kernel loads from the cache).

numba compiles on one core. The groups run in several worker processes (``--jobs``: one per core and one
more), heaviest (``cost``) first, each worker taking the next group when it is done, all writing
the cache every run reads; a specialisation two of them need compiles once
(:func:`graphstore.jitcache._across_processes`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from graphstore import jitcache
from graphstore.cli.app import entry_points
from graphstore.errors import InvalidInputError

logger = logging.getLogger(__name__)

GROUPS_ENTRY_POINT = "graphstore.warmup"  # each: a function returning a list of Group
DESCRIPTION = ("Compile the numba kernels that ingest, the samplers and loaders and graphstore-train use, by "
               "running each on tiny graphs, so no run compiles them in its first batch. The machine code is "
               "cached beside the sources (or in NUMBA_CACHE_DIR) and kept until the sources, numba, Python or "
               "the CPU change; until then the command does nothing (--force runs it anyway). tools/bootstrap.sh "
               "runs it. The first time takes a few minutes.")


@dataclass(frozen=True)
class Group:
    """Code paths that share kernels, run on tiny graphs: ``run(workspace)``; ``order`` sorts the groups;
    ``cost``: about how long the group compiles on a cold cache (seconds of one core; only their order
    matters: the warm-up's processes take the heaviest groups first)."""

    name: str
    what: str
    run: Callable[[Workspace], None]
    order: int = 50
    cost: float = 10.0


class Workspace:
    """A scratch directory, and the tiny datasets the groups share (each written on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._datasets: dict[str, Any] = {}

    def dataset(self, name: str, write: Callable[[Path], None]) -> Any:
        """The dataset ``name``, written by ``write(dest)`` the first time, then opened."""
        if name not in self._datasets:
            import graphstore

            dest = self.path / name
            if not dest.exists():
                write(dest)
            self._datasets[name] = graphstore.open_dataset(str(dest))
        return self._datasets[name]


@dataclass
class GroupResult:
    name: str
    seconds: float
    compiled: int  # kernel specialisations compiled (numba's cache misses)
    compile_seconds: float
    error: str | None = None
    kernels: dict[str, list] = field(default_factory=dict)  # kernel -> [specialisations, seconds]


def groups() -> list[Group]:
    """Every warm-up group of the installed packages (``graphstore.warmup`` entry points), in order."""
    found: list[Group] = []
    for entry in entry_points(GROUPS_ENTRY_POINT):
        found.extend(entry.load()())
    if not found:
        raise InvalidInputError(f"no warm-up groups are installed (entry points {GROUPS_ENTRY_POINT!r}); "
                                "reinstall graphstore: pip install -e .")
    return sorted(found, key=lambda g: (g.order, g.name))


Progress = Callable[[Group, GroupResult | None], None]  # called as each group starts (None) and ends


def run_groups(chosen: list[Group], workspace: Workspace, progress: Progress | None = None) -> list[GroupResult]:
    """Run every group of ``chosen`` (a failing one is reported, the others still run)."""
    results = []
    quiet = [logging.getLogger(name) for name in ("graphstore", "sampling", "training", "torch_geometric")]
    levels = [log.level for log in quiet]
    if not logger.isEnabledFor(logging.INFO):  # tiny graphs make ingest warn (unbalanced parts): not the user's
        for log in quiet:
            log.setLevel(logging.ERROR)
    try:
        for group in chosen:
            if progress:
                progress(group, None)
            results.append(_run_group(group, workspace))
            if progress:
                progress(group, results[-1])
    finally:
        for log, level in zip(quiet, levels):
            log.setLevel(level)
    return results


def _run_group(group: Group, workspace: Workspace) -> GroupResult:
    """One group, timed, with the kernels it compiled; an error is kept in the result, not raised."""
    before, start, error = jitcache.compile_counts(), time.perf_counter(), None
    try:
        group.run(workspace)
    except Exception as exc:  # reported with the group's name; the rest still warms up
        logger.info("warm-up group %s failed", group.name, exc_info=True)  # the traceback with -v
        error = f"{type(exc).__name__}: {exc}"
    done = jitcache.compile_counts().since(before)
    return GroupResult(group.name, round(time.perf_counter() - start, 2), done.compiled, round(done.seconds, 2),
                       error, {k: [n, round(done.times[k], 2)] for k, n in done.names.most_common()})


def cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


PROCESS_BYTES = 2 * 2**30  # a worker at its peak: 2 workers running all 7 groups summed 3.6 GB of RSS


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_jobs(groups_: int) -> int:
    """The processes a warm-up of ``groups_`` groups runs in: one per core and one more, at most one per group,
    and as many as the available memory holds at ``PROCESS_BYTES`` each. A worker that needs a specialisation
    another one is compiling waits for it, idle: the extra worker keeps both cores of a 2-core machine
    compiling (``benchmarks/graphstore_warmup/``). One worker per group was slower on 2 cores than 2 workers
    taking the groups from the queue (2026-11-30)."""
    memory = available_memory()
    by_memory = groups_ if memory is None else memory // PROCESS_BYTES
    return max(1, min(groups_, cores() + 1, by_memory))


def warm_up(only: list[str] | None = None, force: bool = False, progress: Progress | None = None,
            jobs: int | None = None) -> dict[str, Any]:
    """Compile the kernels of every group (or of ``only``) unless the stamp says they are compiled, in
    ``jobs`` processes (default :func:`default_jobs`; 1: in this one).

    Returns the summary (``skipped``: the stamp held; ``groups``: each group's seconds and compiles;
    ``jobs``: the processes it ran in).

    Examples
    --------
    >>> from sampling.warmup.runner import warm_up
    >>> warm_up()["skipped"]  # doctest: +SKIP
    True
    """
    if jobs is not None and jobs < 1:
        raise InvalidInputError(f"--jobs {jobs}: the warm-up needs at least one process; give --jobs 1 or more")
    stamp = None if force or only else jitcache.warm_stamp()
    if stamp is not None:
        return {"skipped": True, "stamp": stamp, "groups": [], "compiled": 0, "seconds": 0.0, "failed": [],
                "jobs": 0}
    said = os.environ.get(jitcache.NOTICE_ENV)
    os.environ[jitcache.NOTICE_ENV] = "0"  # no compile notice: compiling is what was asked for
    try:
        return _warm_up(only, progress, jobs)
    finally:
        if said is None:
            os.environ.pop(jitcache.NOTICE_ENV, None)
        else:
            os.environ[jitcache.NOTICE_ENV] = said


def _warm_up(only: list[str] | None, progress: Progress | None, jobs: int | None) -> dict[str, Any]:
    """Run the groups (all, or ``only``) in scratch directories, in ``jobs`` processes (1: this one);
    stamp the cache when all of them ran."""
    key, chosen = jitcache.warm_key(), groups()
    if only:
        unknown = sorted(set(only) - {g.name for g in chosen})
        if unknown:
            raise InvalidInputError(f"--only {','.join(unknown)}: no such warm-up group; groups are "
                                    f"{', '.join(g.name for g in chosen)}")
        chosen = [g for g in chosen if g.name in only]
    start = time.perf_counter()
    jobs = min(len(chosen), default_jobs(len(chosen)) if jobs is None else jobs)
    if jobs > 1:
        results = _run_apart(chosen, jobs, progress is not None)
    else:
        with tempfile.TemporaryDirectory(prefix="graphstore-warmup-") as tmp:
            results = [asdict(r) for r in run_groups(chosen, Workspace(Path(tmp)), progress)]
    summary = {"skipped": False, "groups": results, "compiled": sum(r["compiled"] for r in results),
               "seconds": round(time.perf_counter() - start, 2), "failed": [r["name"] for r in results if r["error"]],
               "jobs": max(1, jobs)}
    if not only and not summary["failed"]:
        jitcache.mark_warm({"compiled": summary["compiled"], "seconds": summary["seconds"]}, key)
    return summary


def _run_apart(chosen: list[Group], jobs: int, progress: bool = True) -> list[dict[str, Any]]:
    """The groups in ``jobs`` worker processes (:func:`worker`), heaviest (``cost``) first: each worker is
    given its next group when it reports the last one, so none idles while groups wait. With ``progress``
    their progress lines go to this process's stderr. Returns every group's result, in ``chosen``'s order;
    a worker that ends before it reports fails its group, saying so, and the groups left go to the others."""
    import selectors

    queue = sorted(chosen, key=lambda g: -g.cost)
    results: dict[str, dict[str, Any]] = {}
    running: dict[Any, tuple[subprocess.Popen, Group]] = {}  # a worker's stdout -> the worker, its group
    chooser = selectors.DefaultSelector()

    def give(proc: subprocess.Popen) -> None:
        group = queue.pop(0)
        try:
            proc.stdin.write(group.name + "\n")
            proc.stdin.flush()
        except OSError:  # it ended meanwhile: the group goes back for another worker
            queue.insert(0, group)
            chooser.unregister(proc.stdout)
            return
        running[proc.stdout] = (proc, group)

    workers: list[subprocess.Popen] = []
    try:
        for _ in range(min(jobs, len(queue))):
            argv = [sys.executable, "-m", "sampling.warmup.worker", *([] if progress else ["--quiet"])]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            workers.append(proc)
            chooser.register(proc.stdout, selectors.EVENT_READ)
            give(proc)
        while running:
            for key, _ in chooser.select():
                proc, group = running.pop(key.fileobj)
                line = proc.stdout.readline()
                try:
                    results[group.name] = json.loads(line)
                except ValueError:  # it ended: no more groups for it
                    chooser.unregister(proc.stdout)
                    proc.stdin.close()
                    code = proc.wait()
                    results[group.name] = asdict(GroupResult(
                        group.name, 0.0, 0, 0.0, f"its warm-up process ended with code {code} before it reported"))
                    continue
                if queue:
                    give(proc)
                else:
                    chooser.unregister(proc.stdout)
                    proc.stdin.close()  # the worker ends
        for group in queue:  # every worker ended early
            results[group.name] = asdict(GroupResult(group.name, 0.0, 0, 0.0, "not run: every warm-up process ended"))
    finally:  # interrupted: no process keeps compiling behind the user's back
        chooser.close()
        for proc, _ in running.values():
            proc.kill()
        for proc in workers:
            try:
                proc.wait(timeout=60)  # told to end (stdin closed) or killed
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None and not pipe.closed:
                    pipe.close()
    return [results[g.name] for g in chosen]


def worker(argv: list[str] | None = None) -> int:
    """A warm-up worker (``python -m sampling.warmup.worker [--quiet]``): runs each group named on a line of
    stdin, in one workspace, answers each with its result (one JSON line on stdout) and says its progress
    on stderr unless ``--quiet``; ends at the end of stdin."""
    quiet = "--quiet" in (sys.argv[1:] if argv is None else argv)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # whatever a group prints goes to stderr, not in the answers
    sys.stdout = sys.stderr
    by_name = {g.name: g for g in groups()}
    with tempfile.TemporaryDirectory(prefix="graphstore-warmup-") as tmp:
        workspace = Workspace(Path(tmp))
        for line in sys.stdin:
            [result] = run_groups([by_name[line.strip()]], workspace, None if quiet else _progress)
            answers.write(json.dumps(asdict(result)) + "\n")
            answers.flush()
    return 0


# -- the command --------------------------------------------------------------------------------------------


def register(sub: Any) -> Callable[[argparse.Namespace], int]:
    """Add ``warmup`` to the ``graphstore`` command's subcommands; returns its handler."""
    cmd = sub.add_parser("warmup", help="compile the numba kernels ahead of the first run (once per installation)",
                         description=DESCRIPTION)
    cmd.add_argument("--force", action="store_true", help="run every group even when the kernels are compiled")
    cmd.add_argument("--only", metavar="GROUPS", help="comma-separated groups to run (see --list)")
    cmd.add_argument("--list", action="store_true", help="list the groups and exit")
    cmd.add_argument("--json", action="store_true", help="print the summary as JSON (the progress lines go to stderr)")
    cmd.add_argument("--jobs", type=int, metavar="N",
                     help="processes to run the groups in (default: one per core and one more, at most one per "
                          "group; 1 runs them in this one)")
    return _command


def _command(args: argparse.Namespace) -> int:
    if args.list:
        for group in groups():
            print(f"{group.name:12s} {group.what}")
        return 0
    only = [g for g in args.only.split(",") if g] if args.only else None
    summary = warm_up(only, args.force, _progress, args.jobs)  # progress on stderr, --json or not
    if args.json:
        print(json.dumps(summary, indent=2))
    elif summary["skipped"]:
        print(f"graphstore warmup: nothing to compile: the warm-up of {summary['stamp'].get('at', '?')} covers these "
              f"sources (cache {jitcache.cache_location()}; --force runs it again)")
    else:
        failed = f", {len(summary['failed'])} group(s) failed: {', '.join(summary['failed'])}" if summary["failed"] \
            else ""
        apart = f" in {summary['jobs']} processes" if summary["jobs"] > 1 else ""
        print(f"graphstore warmup: {summary['compiled']} kernel specialisation(s) compiled in "
              f"{summary['seconds']:.1f} s ({len(summary['groups'])} groups{apart}; cache {jitcache.cache_location()})"
              f"{failed}")
    return 1 if summary.get("failed") else 0


def _progress(group: Group, result: GroupResult | None) -> None:
    if result is None:
        print(f"warmup: {group.name:12s} {group.what} ...", file=sys.stderr, flush=True)
        return
    state = f"FAILED: {result.error}" if result.error else f"{result.compiled} kernel(s) compiled"
    print(f"warmup: {group.name:12s} {result.seconds:.1f} s, {state}", file=sys.stderr, flush=True)

