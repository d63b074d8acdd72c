"""The ``graphstore`` command: ``ingest``, ``info``, ``verify``, ``plot``, and what other packages add (``warmup``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from graphstore.cli.args import Parser, integer, number
from graphstore.cli.dask_options import add_dask_arguments, check_dask_arguments, dask_client
from graphstore.cli.storage_options import (ChunkBar, add_storage_arguments, io_text, open_from_args, parse_parts,
                                    parse_storage_options)
from graphstore.errors import GraphstoreError
from graphstore.ingest.partition import METHODS, METIS_MAX_EDGES
from graphstore.ingest.sources import describe_schemes
from graphstore.ingest.chunk_writer import COMPRESSIONS
from graphstore.outputs import plots


class _Bars:
    """One tqdm bar per ingest stage, fed by the library's progress callback."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.bars = enabled, {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        bar = self.bars.get(stage)
        if bar is None:
            unit = {"partition": "step", "edges": "edge", "nodes": "node"}.get(stage, "it")
            bar = self.bars[stage] = tqdm(total=total, desc=stage, unit=unit, unit_scale=True, file=sys.stderr)
        if stage == "partition":
            bar.n = done
            bar.refresh()
            return
        if bar.n + done > bar.total or bar.total != total:  # a stage that runs again (rounds, levels)
            bar.reset(total=total)
        bar.update(done)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="graphstore", description="Partitioned Zarr graph datasets for GNN training")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)
    ing = sub.add_parser("ingest", help="partition a graph and write it as a dataset",
                         description=f"SOURCE is one of: {describe_schemes()}")
    ing.add_argument("source")
    ing.add_argument("dest", help="where the dataset goes: local or NFS path, file:// URL, or an fsspec URL "
                                  "(s3://bucket/name, gs://..., az://...)")
    ing.add_argument("--parts", type=integer(1), default=1, help="number of partitions (default 1)")
    ing.add_argument("--method", choices=METHODS, default="metis", help="partitioner (default metis)")
    ing.add_argument("--seed", type=integer(0, 2**63 - 1), default=0)
    ing.add_argument("--overwrite", action="store_true", help="replace an existing dataset at DEST")
    ing.add_argument("--parents", action="store_true",
                     help="create DEST's missing parent directories (without it a missing parent is refused)")
    ing.add_argument("--compression", choices=COMPRESSIONS, default="none",
                     help="none (memory-mapped hot path, default) or zstd (cold storage)")
    ing.add_argument("--halo-features", default="", metavar="NAMES",
                     help="comma-separated node attributes to replicate for halo nodes, or 'all'")
    ing.add_argument("--allow-nan", action="store_true", help="store NaN/inf features instead of refusing them")
    ing.add_argument("--chunk-mb", type=number(0, 1024, above=True), default=32, help="target chunk size in MB (default 32)")
    ing.add_argument("--metis-max-edges", type=integer(0), default=METIS_MAX_EDGES, metavar="M",
                     help="METIS partitions a uniform sample of at most M undirected edges, bounding its memory "
                          "(about 80 bytes per edge); 0 = all edges (default %(default)s)")
    ing.add_argument("--to-undirected", action="store_true", default=None, help="add the reverse of every edge")
    ing.add_argument("--link-split", metavar="TRAIN,VAL,TEST",
                     help="store a link split of one edge type, e.g. 0.8,0.1,0.1 (edge attribute link_split)")
    ing.add_argument("--link-split-by", choices=("random", "time"),
                     help="random (default; seeded by --seed) or time (global quantiles of the edge attribute time)")
    ing.add_argument("--edge-type", metavar="S,R,D", help="the edge type --link-split splits (S,R,D or R; default "
                                                           "the first)")
    ing.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_dask_arguments(ing)
    add_storage_arguments(ing, cache=False)
    info = sub.add_parser("info", help="describe a dataset")
    info.add_argument("dest")
    info.add_argument("--json", action="store_true")
    info.add_argument("--prefetch", metavar="PARTS", help="pull partitions ('all' or '0,2') into the local cache")
    info.add_argument("--io", action="store_true", help="report requests, bytes and cache hits/misses")
    info.add_argument("--plot", metavar="FILE", help="also draw nodes and edges per partition (by type), the balance "
                                                     "of each constraint and the edge cut into FILE (.png, .svg, "
                                                     f".pdf, ...; needs {plots.INSTALL})")
    add_storage_arguments(info)
    ver = sub.add_parser("verify", help="recompute every chunk checksum")
    ver.add_argument("dest")
    ver.add_argument("--json", action="store_true")
    ver.add_argument("--io", action="store_true", help="report requests, bytes and cache hits/misses")
    add_storage_arguments(ver)
    plot = sub.add_parser("plot", help="draw a training run's curves and time per epoch from its metrics JSON",
                          description="Draw the loss, accuracy/AUC per epoch and each epoch's seconds stacked by "
                                      "part from the JSON graphstore-train --metrics-out wrote "
                                      f"(needs {plots.INSTALL})")
    plot.add_argument("metrics", metavar="METRICS", help="the metrics JSON graphstore-train --metrics-out wrote")
    plot.add_argument("-o", "--output", metavar="FILE", help="the image to write, its format from the suffix (.png, "
                                                             ".svg, .pdf, ...; default: METRICS with .png)")
    return parser


def _run_ingest(ingest: Any, args: argparse.Namespace, bars: _Bars, client: Any) -> Any:
    return ingest(args.source, args.dest, num_parts=args.parts, method=args.method, seed=args.seed,
                  overwrite=args.overwrite, compression=args.compression, halo_features=args.halo_features,
                  allow_nan=args.allow_nan, chunk_mb=args.chunk_mb, to_undirected=args.to_undirected,
                  metis_max_edges=args.metis_max_edges or None,
                  storage_options=parse_storage_options(args.storage_option) or None, progress=bars,
                  link_split=args.link_split, link_split_by=args.link_split_by,
                  link_split_edge_type=args.edge_type.split(",") if args.edge_type else None,
                  engine=args.engine, client=client, parents=args.parents)


EXIT_TERMINATED = 75  # EX_TEMPFAIL: stopped by SIGTERM (a scheduler's preemption); rerun it later


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt is: every stage cleans up for both alike."""


@contextlib.contextmanager
def _terminate_interrupts() -> Iterator[None]:
    """SIGTERM (``kill``, a job scheduler) ends an ingest as Ctrl-C does: its claim and staging directory go."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: a second must not break the clean-up
        raise Terminated

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _ingest(args: argparse.Namespace) -> int:
    from graphstore.ingest import ingest

    check_dask_arguments(args)
    bars = _Bars(enabled=not args.json and sys.stderr.isatty())
    try:
        with _terminate_interrupts(), dask_client(args) as client:
            summary = _run_ingest(ingest, args, bars, client)
    finally:
        bars.close()
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
        return 0
    print(f"wrote {summary.dest}: {summary.num_parts} partition(s) by {summary.method} in {summary.seconds:.1f} s, "
          f"{summary.bytes_written / 1e6:.1f} MB")
    for p, (n, e) in enumerate(zip(summary.nodes_per_part, summary.edges_per_part)):
        print(f"  partition {p}: {n:,} nodes, {e:,} edges")
    print(f"  edge cut {100 * summary.edge_cut_fraction:.2f}% ({summary.edge_cut:,} edges), "
          f"balance nodes {summary.node_balance:.3f} edges {summary.edge_balance:.3f}"
          + (f" train nodes {summary.train_node_balance:.3f}" if summary.train_node_balance is not None else "")
          + (f" ({summary.rebalanced_nodes:,} nodes moved after METIS)" if summary.rebalanced_nodes else ""))
    for key, rec in summary.link_splits.items():
        print(f"  link split of {key} by {rec['by']}: train {rec['train']:,} val {rec['val']:,} test {rec['test']:,}")
    return 0


def _info_text(meta: dict[str, Any], url: str) -> str:
    lines = [f"{url}: graphstore format v{meta['format_version']}, dataset {meta['name']!r}, "
             f"{meta['num_parts']} partition(s)"]
    for nt in meta["node_types"]:
        attrs = ", ".join(f"{k} {v['dtype']}{list(v['shape'])}" for k, v in nt["attrs"].items())
        lines.append(f"  nodes {nt['name'] if nt['name'] is not None else '(homogeneous)'}: {nt['num_nodes']:,}"
                     f"  offsets {list(nt['offsets'])}  attrs: {attrs or '-'}")
    for et in meta["edge_types"]:
        name = tuple(et["name"]) if et["name"] is not None else "(homogeneous)"
        lines.append(f"  edges {name}: {et['num_edges']:,}  per partition {list(et['edges_per_part'])}"
                     f"  attrs: {', '.join(et['attrs']) or '-'}")
    q = meta["partitioning"]
    lines.append(f"  partitioning: {q['method']}, edge cut {100 * q['edge_cut_fraction']:.2f}%, balance nodes "
                 f"{q['node_balance']} edges {q['edge_balance']} train nodes {q.get('train_node_balance')}")
    lines.append(f"  splits: {meta['splits']}  stats: {meta['stats']}")
    for key, rec in meta.get("link_splits", {}).items():
        lines.append(f"  link split of {key}: by {rec['by']} {rec['fractions']}: train {rec['train']:,} "
                     f"val {rec['val']:,} test {rec['test']:,}")
    prov = meta["provenance"]
    lines.append(f"  source: {prov['source']}  written by graphstore {prov['tool_version']} at {prov['created']}")
    return "\n".join(lines)


def _refuse_inside_dataset(out: str, flag: str) -> None:
    """An image written inside a dataset's folder is lost when the dataset is replaced: refuse it."""
    from graphstore.errors import InvalidInputError
    from graphstore.storage.local import LocalLocation, is_dataset

    folder = os.path.dirname(os.path.realpath(out))
    while True:
        if os.path.isfile(os.path.join(folder, "zarr.json")) and is_dataset(LocalLocation(folder)):
            raise InvalidInputError(f"{flag} {out} is inside the dataset folder {folder}, which graphstore "
                                    "replaces whole; write the image outside it, e.g. "
                                    f"{os.path.join(os.path.dirname(folder), os.path.basename(out))}")
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def _info(args: argparse.Namespace) -> int:
    if args.plot:
        plots.check_output(args.plot, "--plot")  # matplotlib, the format and the directory: before any data is read
        _refuse_inside_dataset(args.plot, "--plot")
    ds = open_from_args(args)
    for part in parse_parts(args.prefetch, ds.num_parts) if args.prefetch else []:
        bar = ChunkBar(f"prefetch partition {part}", enabled=not args.json and sys.stderr.isatty())
        try:
            ds.prefetch(part, True, bar)
        finally:
            bar.close()
    meta = ds.metadata
    meta["bytes"] = sum(int(np.dtype(a.dtype).itemsize * math.prod(a.shape)) for a in ds.manifest.arrays.values())
    if args.io:
        meta["io"] = ds.io_stats()
    text = _info_text(meta, ds.url) + (f"\n{io_text(meta['io'])}" if args.io else "")
    print(json.dumps(meta, indent=2) if args.json else text)
    if args.plot:
        plots.plot_partitions(meta, args.plot, title=ds.url)
        print(f"wrote {args.plot}: nodes and edges of {ds.num_parts} partition(s), balance, edge cut",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _plot(args: argparse.Namespace) -> int:
    out = args.output or _image_next_to(args.metrics)
    plots.check_output(out, "graphstore plot")
    _refuse_inside_dataset(out, "output")
    doc = plots.load_metrics(args.metrics)
    plots.plot_metrics(doc, out)
    print(f"wrote {out}: loss, evaluation and seconds per epoch of {len(doc['epochs'])} epoch(s)")
    return 0


def _image_next_to(metrics: str) -> str:
    """``run/metrics.json`` -> ``run/metrics.png`` (never the metrics file itself)."""
    stem, suffix = os.path.splitext(metrics)
    return f"{stem}.png" if suffix.lower() != ".png" else f"{metrics}.png"


def _verify(args: argparse.Namespace) -> int:
    ds = open_from_args(args, check=False)  # a damaged dataset must still open here: verify lists every problem
    bar = ChunkBar("verify", enabled=not args.json and sys.stderr.isatty() and not ds.location.is_local)
    try:
        problems = ds.verify(bar)
    finally:
        bar.close()
    arrays, chunks = len(ds.manifest.arrays), sum(a.num_chunks for a in ds.manifest.arrays.values())
    if args.json:
        report = {"dataset": ds.url, "arrays": arrays, "chunks": chunks, "ok": not problems, "problems": problems}
        print(json.dumps({**report, "io": ds.io_stats()} if args.io else report, indent=2))
    elif problems:
        print(f"{ds.url}: {len(problems)} problem(s) in {arrays} arrays and {chunks} chunks:", *problems,
              sep="\n  ", file=sys.stderr)
        print("the dataset is damaged: re-ingest it (graphstore ingest SOURCE DEST --overwrite)", file=sys.stderr)
    else:
        print(f"{ds.url}: the metadata of all {arrays} arrays matches the manifest, and all {chunks} chunks match "
              "their checksums; labels, training nodes, features and topology hold what training needs")
    if args.io and not args.json:
        print(io_text(ds.io_stats()))
    return 1 if problems else 0


COMMANDS_ENTRY_POINT = "graphstore.commands"  # subcommands of the layers above (warmup: sampling.warmup.runner:register)


def entry_points(group: str) -> list[Any]:
    """The entry points of ``group`` of every installed copy of every distribution, the first of each name.

    ``importlib.metadata.entry_points`` reads one copy per distribution, the first on ``sys.path``: in a
    checkout that is a stale ``graphstore.egg-info`` of an earlier build whenever the current directory
    is the checkout (``python -m``, pytest), which would hide what the installed copy declares."""
    from importlib import metadata

    found: dict[str, Any] = {}
    for dist in metadata.distributions():
        for entry in dist.entry_points.select(group=group):
            found.setdefault(entry.name, entry)
    return list(found.values())


def _plugin_commands(parser: argparse.ArgumentParser, argv: list[str], builtin: set[str]
                     ) -> dict[str, Callable[[argparse.Namespace], int]]:
    """The subcommands installed packages add: each ``graphstore.commands`` entry point is a function
    ``register(subparsers)`` that adds its parser and returns its handler. Loaded only when the command
    is not a built-in one (they import torch; ``graphstore ingest`` must not wait for it)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in builtin:
        return {}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    handlers = {}
    for entry in entry_points(COMMANDS_ENTRY_POINT):
        if entry.name in builtin:
            continue
        try:
            handlers[entry.name] = entry.load()(sub)
        except ImportError as exc:  # e.g. an install without torch: the others still work
            if entry.name == command:
                raise
            logging.getLogger(__name__).debug("graphstore %s is unavailable: %s", entry.name, exc)
    return handlers


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``graphstore`` console script."""
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {"ingest": _ingest, "info": _info, "verify": _verify,
                                                                "plot": _plot}
    try:
        parser = _parser()
        handlers.update(_plugin_commands(parser, sys.argv[1:] if argv is None else argv, set(handlers)))
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad flag (one line already printed) or --help
        return exc.code if isinstance(exc.code, int) else 2
    except ImportError as exc:  # the package of a command named on the command line cannot load
        print(f"graphstore: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return handlers[args.command](args)
    except BrokenPipeError:  # output piped into `head` and the like
        return 0
    except (GraphstoreError, ImportError, OSError) as exc:  # OSError: one the library did not name (a bug)
        if args.verbose:
            traceback.print_exc()
        print(f"graphstore {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"graphstore {args.command}: terminated (SIGTERM); nothing was committed, and a rerun starts afresh",
              file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"graphstore {args.command}: interrupted; nothing was committed", file=sys.stderr)
        return 130


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, (GraphstoreError, ImportError)) else f"{type(exc).__name__}: {text}"


if __name__ == "__main__":
    sys.exit(main())
