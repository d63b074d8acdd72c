"""Command-line options for datasets on object storage: ``--storage-option``, the cache, the I/O report."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from graphstore.cli.args import size
from graphstore.errors import ConfigError

_FLOAT = re.compile(r"^-?[0-9]+\.[0-9]*$")


def add_storage_arguments(parser: argparse.ArgumentParser, cache: bool = True) -> None:
    """``--storage-option KEY=VALUE`` (repeatable) and, for readers, ``--cache-dir`` / ``--cache-max-bytes`` /
    ``--offline``."""
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an fsspec option for remote URLs, repeatable; nested keys with dots "
                             "(client_kwargs.endpoint_url=http://...), values true/false/null/numbers/JSON")
    if cache:
        parser.add_argument("--cache-dir", default=None,
                            help="local chunk cache of remote datasets (default $GRAPHSTORE_CACHE_DIR or "
                                 "~/.cache/graphstore)")
        parser.add_argument("--cache-max-bytes", type=size, default=None, metavar="SIZE",
                            help="cache size limit, e.g. 50GB (default $GRAPHSTORE_CACHE_MAX_BYTES or none); "
                                 "least recently used chunks are evicted")
        # the same as --storage-option offline=true, so every command passing storage options on honours it
        parser.add_argument("--offline", dest="storage_option", action="append_const", const="offline=true",
                            help="never contact the store: serve a remote dataset from the cache alone, as last "
                                 "read from the store (a read needing a chunk it lacks is refused). Without it, an "
                                 "unreachable store falls back to the cache by itself; --storage-option "
                                 "offline=false never does")


def parse_storage_options(pairs: list[str]) -> dict[str, Any]:
    """``["anon=true", "client_kwargs.endpoint_url=http://x"]`` → ``{"anon": True, "client_kwargs": {...}}``.

    Error messages name keys, never values (they may be credentials).

    Examples
    --------
    >>> parse_storage_options(["anon=true", "client_kwargs.endpoint_url=http://127.0.0.1:9000"])
    {'anon': True, 'client_kwargs': {'endpoint_url': 'http://127.0.0.1:9000'}}
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip() or "" in key.split("."):
            shown = key if sep else "(no '=')"
            raise ConfigError(f"--storage-option {shown} is not KEY=VALUE; write e.g. --storage-option anon=true")
        node = out
        *parents, leaf = key.strip().split(".")
        for name in parents:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--storage-option {key}: {name} is set to a value, so it cannot hold {leaf}")
        if leaf in node:
            raise ConfigError(f"--storage-option {key} is given twice; give it once")
        node[leaf] = _value(raw)
    return out


def _value(raw: str) -> Any:
    text = raw.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() in ("null", "none"):
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text.startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return raw


def open_from_args(args: argparse.Namespace, check: bool = True) -> Any:
    """The dataset at ``args.dest`` with the storage and cache options of the command line (``check``: see
    :func:`~graphstore.dataset.opened.open_dataset`)."""
    from graphstore import open_dataset

    return open_dataset(args.dest, parse_storage_options(args.storage_option) or None, cache_dir=args.cache_dir,
                        cache_max_bytes=args.cache_max_bytes, check=check)


def io_text(stats: dict[str, Any]) -> str:
    """The I/O counters of a dataset as a few readable lines (totals, then every array that did I/O)."""
    lines = [f"io: {stats['requests']:,} requests, {stats['bytes'] / 1e6:.1f} MB fetched, {stats['hits']:,} cache "
             f"hits, {stats['misses']:,} misses, {stats['retries']:,} retries, {stats['wait_seconds']:.2f} s waiting"]
    for path, row in stats["arrays"].items():
        lines.append(f"  {path}: {row['requests']:,} requests, {row['bytes'] / 1e6:.2f} MB, {row['hits']:,} hits, "
                     f"{row['misses']:,} misses")
    return "\n".join(lines)


class ChunkBar:
    """A tqdm bar fed by ``progress(done, total)`` callbacks (created at the first call; off when not a tty)."""

    def __init__(self, desc: str, enabled: bool) -> None:
        self.desc, self.enabled = desc, enabled
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=self.desc, unit="chunk", file=sys.stderr)
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def parse_parts(spec: str, num_parts: int) -> list[int]:
    """``all`` or ``0,2`` → partition indices (checked against ``num_parts``)."""
    if spec == "all":
        return list(range(num_parts))
    try:
        parts = [int(p) for p in spec.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"--prefetch {spec!r} is not 'all' or comma-separated partition numbers") from None
    bad = [p for p in parts if not 0 <= p < num_parts]
    if bad or not parts:
        raise ConfigError(f"--prefetch {spec!r}: partitions must be in 0..{num_parts - 1}")
    return parts
