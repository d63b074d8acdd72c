"""What the benchmarks share: the machine they ran on and the seed of their draws (printed first), and their input datasets."""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import sys
from typing import Any

import numpy as np


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM, the versions that decide the speed of the code measured, and the load
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
            "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def describe(info: dict[str, Any], seed: int) -> str:
    """``machine()`` and the seed as one line, printed at the top of a benchmark's output."""
    return (f"machine: {info['cpu']}, {info['logical_cores']} logical / {info['physical_cores']} physical cores "
            f"({info['usable_cores']} usable), {info['ram_gib']} GiB RAM, {info['os']}; Python {info['python']}, "
            f"torch {info['torch']}, numpy {info['numpy']}, numba {info['numba']}; load average "
            f"{info['load_average_1min']} at start; seed {seed} "
            f"(pass --seed {seed} to draw the same IDs again)")


def add_seed_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=None,
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
