"""``graphstore-run``: a training script of your own on N local ranks, with ``graphstore-train``'s lifetime
guarantees; each rank runs the script with a ``training.Session`` joining the job from the environment."""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from graphstore.cli.args import Parser, feature_cache, integer, number
from graphstore.errors import GraphstoreError
from graphstore.forking import fork_allowed
from training.launcher import failures, forkserver, lifetime, placement
from training.cluster.world import DEVICE_ENV, FEATURE_CACHE_ENV, LOADER_WORKERS_ENV, SERVERS_ENV, TIMEOUT_ENV

_RANK_FLAG = "--graphstore-rank"  # how the launcher starts a rank: python -m training.run --graphstore-rank SCRIPT ...


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="graphstore-run", description="Run a training script on N local ranks, each with a "
               "training.Session (the same script runs unchanged under torchrun or srun)",
               epilog="Everything after SCRIPT goes to the script.")
    p.add_argument("--nproc", type=integer(1, 1024), default=None,
                   help="local ranks to start (default: one per GPU on CUDA, else 1)")
    p.add_argument("--device", choices=placement.DEVICES, default="auto",
                   help="what Session.device is: auto (default: CUDA when this host has a GPU, one per rank), cpu "
                        "or cuda")
    p.add_argument("--timeout", type=number(0, above=True), default=120.0,
                   help="seconds before a silent peer, stuck collective or missing loader ends the job (default "
                        "120); after a rank fails, its peers are stopped within it")
    p.add_argument("--servers", metavar="HOST:PORT",
                   help="what Session's servers default to: train from sampler servers (graphstore serve URL "
                        "--address HOST:PORT), the ranks opening no file of the dataset")
    p.add_argument("--loader-workers", type=integer(0, 256), default=None, metavar="N",
                   help="what Session's loader_workers defaults to: sampler processes beside each rank (default 0)")
    p.add_argument("--feature-cache", type=feature_cache, metavar="SIZE",
                   help="what Session's feature_cache defaults to: each rank's own x read from disk with direct I/O, "
                        "its hottest rows in RAM up to SIZE (0: no cache); default: so when x exceeds half of the "
                        "rank's memory or cgroup limit, the cache sized to what the memory leaves beside the batches; "
                        "off: never")
    p.add_argument("script", help="the training script (a Python file)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``graphstore-run`` (and of each rank it starts)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_RANK_FLAG]:
        lifetime.leave(run_script(argv[1], argv[2:]))
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    from training.launch import run_ranks

    try:
        script = _check_script(args.script)
        if args.servers is not None:
            from sampling.remote.client import parse_address

            parse_address(args.servers)
            if args.loader_workers:
                raise GraphstoreError(f"--loader-workers {args.loader_workers} with --servers: the sampler servers "
                                      "build the batches; give them processes with graphstore serve --loader-workers")
            if args.feature_cache not in (None, "off"):
                raise GraphstoreError(f"--feature-cache {args.feature_cache} with --servers: the sampler servers read "
                                      "the features; leave it out")
        fork_allowed()  # a bad GRAPHSTORE_FORK_RANKS: one line here
        gpus = placement.gpu_count()
        cuda = placement.use_cuda(args.device, gpus)
        nproc = args.nproc if args.nproc is not None else (max(1, gpus) if cuda else 1)
        if cuda and nproc > gpus:
            placement.local_ranks(nproc, 1, cuda, gpus)  # refuses, naming what to change
    except GraphstoreError as exc:
        print(f"graphstore-run: error: {exc}", file=sys.stderr)
        return 2
    from training.cluster import threads

    def job_env(job_dir: str) -> dict[str, str]:
        env = {DEVICE_ENV: args.device, TIMEOUT_ENV: str(args.timeout)}
        if args.servers is not None:
            env[SERVERS_ENV] = args.servers
        if args.loader_workers is not None:
            env[LOADER_WORKERS_ENV] = str(args.loader_workers)
        if args.feature_cache is not None:
            env[FEATURE_CACHE_ENV] = args.feature_cache
        return env

    return run_ranks(["-m", "training.run", _RANK_FLAG, script, *args.args], nproc, args.timeout + 15,
                     threads.choose(None, nproc).threads, job_env, "graphstore-run",
                     preload=("torch", "torch_geometric", "training.run", "training"))


def _check_script(path: str) -> str:
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise GraphstoreError(f"script {path!r} {what}: give the path of a Python file, e.g. graphstore-run --nproc 2 "
                              "train.py")
    return os.path.abspath(path)


def run_script(script: str, args: list[str]) -> int:
    """One rank: the script as ``__main__`` (its folder first on ``sys.path``, as ``python SCRIPT`` has it);
    an exception that escapes it is recorded for the launcher's one line and ends the rank with exit 1."""
    rank = int(os.environ.get("GRAPHSTORE_RANK", "0"))
    lifetime.watch_launcher(rank)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return forkserver.exit_code(exc.code)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        _record_once(rank, exc)
        raise
    return 0


def _record_once(rank: int, exc: BaseException) -> None:
    """Record ``exc`` as this rank's error unless the session already did (it may have explained it)."""
    path = os.environ.get(lifetime.ERROR_FILE_ENV)
    if path and not os.path.exists(path):
        failures.record(rank, exc)


if __name__ == "__main__":
    sys.exit(main())
