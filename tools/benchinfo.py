"""What the benchmarks share: the machine they ran on and the seed of their draws (printed first), their input
datasets, and the JSON record each run leaves under ``benchmarks/`` (read by ``tools/report.py``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import secrets
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks"
# Every record has these keys; tools/report.py and tests/tools check them.
RECORD_KEYS = ("benchmark", "config", "command", "commit", "date", "machine", "parameters", "figures", "provenance")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    """``name, memory`` of each NVIDIA GPU as ``nvidia-smi`` lists it (torch-free); empty without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM, GPUs, the versions that decide the speed of the code measured, and the load
    average when the run started (other work on the machine skews every figure)."""
    import sys
    from importlib.metadata import version

    import psutil

    torch = sys.modules.get("torch")  # not imported here: an ingest benchmark's process tree stays torch-free
    return {"cpu": _cpu_model(), "logical_cores": os.cpu_count(), "physical_cores": psutil.cpu_count(logical=False),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "ram_gib": round(psutil.virtual_memory().total / 2**30, 1), "os": platform.platform(),
            "python": platform.python_version(), "torch": version("torch"), "numpy": np.__version__,
            "numba": version("numba"), "torch_threads": torch.get_num_threads() if torch else None,
            "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "gpus": _gpus(), "reclaim": reclaim()}


def reclaim(root: str = "/sys/kernel/mm/damon/admin/kdamonds") -> str | None:
    """Proactive reclaim running on this machine, in words (``None``: none found): a DAMON scheme that pages
    out memory idle for a while drops a dataset's pages between runs, so the next process reads them from disk
    again, and figures of separate processes differ by more than the change measured."""
    from pathlib import Path

    found = []
    for kdamond in sorted(Path(root).glob("[0-9]*")):
        try:
            if (kdamond / "state").read_text().strip() != "on":
                continue
            for context in sorted((kdamond / "contexts").glob("[0-9]*")):
                aggr_us = int((context / "monitoring_attrs/intervals/aggr_us").read_text())
                for scheme in sorted((context / "schemes").glob("[0-9]*")):
                    if (scheme / "action").read_text().strip() == "pageout":
                        idle = int((scheme / "access_pattern/age/min").read_text()) * aggr_us / 1e6
                        found.append(f"DAMON pages out memory idle {idle:g} s or more")
        except (OSError, ValueError):
            continue
    return "; ".join(found) or None


def describe(info: dict[str, Any], seed: int) -> str:
    """``machine()`` and the seed as one line, printed at the top of a benchmark's output."""
    return (f"machine: {info['cpu']}, {info['logical_cores']} logical / {info['physical_cores']} physical cores "
            f"({info['usable_cores']} usable), {info['ram_gib']} GiB RAM, {info['os']}; Python {info['python']}, "
            f"torch {info['torch']}, numpy {info['numpy']}, numba {info['numba']}; load average "
            f"{info['load_average_1min']} at start; GPU: {', '.join(info.get('gpus') or []) or 'none'}; "
            + (f"reclaim: {info['reclaim']} (compare runs within one process); " if info.get("reclaim") else "")
            + f"seed {seed} (pass --seed {seed} to draw the same IDs again)")


def add_seed_argument(parser: argparse.ArgumentParser) -> None:
    from graphstore.cli.args import integer

    parser.add_argument("--seed", type=integer(0, 2**63 - 1), default=None,
                        help="seed of the random IDs/seeds (default: a fresh one, printed); every repeat draws anew")


def start(args: argparse.Namespace, as_json: bool) -> dict[str, Any]:
    """Fix the run's seed (fresh unless ``--seed``) and print the machine first (stderr under --json,
    where it also goes into the JSON). Returns ``{"machine": ..., "seed": ...}``."""
    if args.seed is None:
        args.seed = secrets.randbits(32)
    info = machine()
    print(describe(info, args.seed), file=sys.stderr if as_json else sys.stdout, flush=True)
    return {"machine": info, "seed": args.seed}


def rng(seed: int, *keys: int) -> np.random.Generator:
    """An independent generator per (seed, repeat, ...): every repeat draws fresh IDs, and every
    variant measured within a repeat can be given the same ones (a paired comparison)."""
    return np.random.default_rng([seed, *keys])


def ingested(root: Any, spec: str, parts: int) -> Any:
    """The dataset ``spec`` in ``parts`` partitions under ``root/parts<parts>``, ingested on first use and
    reused by later runs (a benchmark times training, not the ingest)."""
    from pathlib import Path

    import graphstore
    from graphstore.errors import DatasetNotFoundError

    dest = Path(root) / f"parts{parts}"
    try:
        graphstore.open_dataset(dest)
    except DatasetNotFoundError:
        print(f"ingesting {spec} into {parts} partition(s) at {dest}", file=sys.stderr)
        graphstore.ingest(spec, dest, num_parts=parts, parents=True)
    return dest


def rank_processes(launcher_pid: int) -> list:
    """The ranks a ``graphstore-train`` launcher started (its children running ``--rank-from-env``: not the fork
    server they came from, nor a rank's lifetime guard, a shell the launcher adopts when its rank has ended), as
    ``psutil.Process``; empty once the launcher is gone."""
    import psutil

    ranks = []
    try:
        children = psutil.Process(launcher_pid).children()
    except psutil.Error:
        return []
    for child in children:
        try:
            if "--rank-from-env" in child.cmdline():
                ranks.append(child)
        except psutil.Error:
            continue
    return ranks


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a command a benchmark runs: this checkout first on ``PYTHONPATH`` (the code measured),
    the caller's own entries after it (packages installed beside, e.g. a lent machine's wheels), and ``extra``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


class Waited:
    """Iterates ``items``, adding up in ``seconds`` the time spent waiting for each next one (a loader's data
    wait, as the loop that consumes it sees it)."""

    def __init__(self, items: Any) -> None:
        self.items, self.seconds = items, 0.0

    def __iter__(self) -> Any:
        import time

        items = iter(self.items)
        while True:
            asked = time.perf_counter()
            item = next(items, None)
            self.seconds += time.perf_counter() - asked
            if item is None:
                return
            yield item


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    """``--record DIR`` / ``--no-record``: where the run's JSON record goes (default: the repo's benchmarks/)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--record", type=Path, metavar="DIR", default=None,
                       help=f"write the run's JSON record under DIR/<benchmark>/ (default: {RECORDS})")
    group.add_argument("--no-record", action="store_true", help="write no record of this run")


def commit() -> str | None:
    """``git rev-parse HEAD`` of this checkout, plus ``+dirty`` when a tracked file differs from it
    (``git describe --dirty``'s rule: untracked files, such as records not yet committed, do not count);
    None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=60)
        changed = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if changed.returncode != 0 or changed.stdout.strip() else "")


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: paths and other objects as text, NaN and infinities as None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def make_record(benchmark: str, args: argparse.Namespace, result: dict[str, Any],
                config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of one run: ``result`` is what the benchmark prints under ``--json`` (with the ``machine``
    and ``seed`` of ``start``); ``config`` names the configuration whose newest record the report shows."""
    skip = {"json", "record", "no_record"}
    return {"benchmark": benchmark, "config": _plain(config or {}), "command": list(sys.orig_argv),
            "commit": commit(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": _plain(result.get("machine") or machine()),
            "parameters": _plain({k: v for k, v in vars(args).items() if k not in skip}),
            "figures": _plain({k: v for k, v in result.items() if k not in ("machine", "seed")}),
            "provenance": None}


def write_record(record: dict[str, Any], root: Path = RECORDS) -> Path:
    """Write ``record`` as ``root/<benchmark>/<UTC date>-<short commit>[-n].json`` (n = 2, 3, ... when the name
    is taken), atomically: a ``.partial`` file, then a hard link that fails rather than replace a record."""
    folder = Path(root) / record["benchmark"]
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{record['date'][:10]}-{(record['commit'] or 'unknown')[:7]}"
    partial = folder / f".{stem}.{os.getpid()}.partial"
    partial.write_text(json.dumps(record, indent=1) + "\n")
    try:
        for n in range(1, 10_000):
            path = folder / (f"{stem}.json" if n == 1 else f"{stem}-{n}.json")
            try:
                os.link(partial, path)
                return path
            except FileExistsError:
                continue
        raise FileExistsError(f"{folder}: 9,999 records named {stem}-n.json already; remove some or pass --record DIR")
    finally:
        partial.unlink(missing_ok=True)


def record(benchmark: str, args: argparse.Namespace, result: dict[str, Any],
           config: dict[str, Any] | None = None) -> Path | None:
    """Record the run (called by every ``tools/bench_*.py`` once its figures are printed) under ``--record DIR``
    or the repo's benchmarks/; nothing with ``--no-record``. A run under pytest without ``--record`` writes
    nothing either (smoke runs on tiny inputs must never land among the real records). Says where on stderr."""
    if args.no_record:
        return None
    if args.record is None and "PYTEST_CURRENT_TEST" in os.environ:
        print("record: not written (a run under pytest writes a record only with --record DIR)", file=sys.stderr)
        return None
    root = args.record or RECORDS
    try:
        path = write_record(make_record(benchmark, args, result, config), root)
    except OSError as exc:  # the figures are printed already: say why no record, do not lose the run's exit code
        print(f"record: not written under {root} ({exc}); pass --record DIR to write it elsewhere", file=sys.stderr)
        return None
    print(f"record: {path}", file=sys.stderr, flush=True)
    return path
