"""The command lines of tools/: graphstore's one-line parser and flag types, a dataset-path type, and the
runner that turns a refused input into one line (exit 2) instead of a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the checkout's packages

from graphstore.cli.args import Parser, integer, number, size  # noqa: E402

__all__ = ["Parser", "count", "counts", "dataset", "integer", "number", "positive", "run", "size", "fanout", "parser"]

count = integer(1)  # a positive count: --repeats, --batches, --nodes, --parts, ...
positive = number(0, above=True)  # a positive finite number: seconds, milliseconds, megabytes


def parser(description: str, **kwargs: Any) -> Parser:
    """A tool's parser: a bad flag is one line naming it, exit 2 (``--help`` keeps the usage)."""
    return Parser(prog=f"tools/{os.path.basename(sys.argv[0] or 'tool')}", description=description, **kwargs)


def dataset(raw: str) -> str:
    """An argparse type: a graphstore dataset that exists (a local path; a URL is checked when opened)."""
    if "://" in raw and not raw.startswith("file://"):
        return raw
    path = raw.removeprefix("file://")
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{raw}: no such dataset; give a dataset graphstore ingest wrote")
    if not os.path.isfile(os.path.join(path, "zarr.json")):
        raise argparse.ArgumentTypeError(f"{raw} is not a graphstore dataset (no zarr.json); give a dataset "
                                         "graphstore ingest wrote")
    return raw


def fanout(raw: str) -> str:
    """An argparse type: neighbours per hop, ``10,5`` (each a positive integer, or -1 for all), kept as written."""
    try:
        hops = [int(h) for h in raw.split(",")]
    except ValueError:
        hops = []
    if not hops or any(h == 0 or h < -1 for h in hops):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a fanout; give neighbours per hop, e.g. 10,5 (-1: all)")
    return raw


def counts(raw: str) -> str:
    """An argparse type: comma-separated positive integers (``1,2,4``), kept as written."""
    try:
        values = [int(v) for v in raw.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a list of counts; give positive integers, e.g. 1,2,4")
    return raw


def run(main: Callable[[], int | None]) -> int:
    """``main()``'s exit code; a graphstore error (a bad dataset, a refused ingest) as one line, exit 2,
    and Ctrl-C as exit 130."""
    from graphstore.errors import GraphstoreError

    name = f"tools/{os.path.basename(sys.argv[0] or 'tool')}"
    try:
        return main() or 0
    except GraphstoreError as exc:
        print(f"{name}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
