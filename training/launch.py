"""``graphstore-train``: one command for N local ranks; the same entry point runs under torchrun/srun."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict
from typing import Any

from training.launcher import allocator
from graphstore.cli.args import Parser, feature_cache, integer, number, size
from graphstore.cli.storage_options import add_storage_arguments, parse_storage_options
from graphstore.errors import GraphstoreError
from graphstore.forking import fork_allowed
from training.loop import checkpoint, featurecache
from training.launcher import checks, failures, forkserver, lifetime, placement
from training.cluster import preempt, threads
from training.report.timing import describe
from training.config import MODELS, TrainConfig
from training.cluster.world import World


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="graphstore-train", description="Train a GNN on a graphstore dataset")
    p.add_argument("dataset", help="dataset URL or path (the same on every machine)")
    p.add_argument("--nproc", type=integer(1, 1024), default=None,
                   help="local ranks to start, any number over any partition count (default: one per GPU on "
                        "CUDA, else the partition count)")
    p.add_argument("--device", choices=placement.DEVICES, default="auto",
                   help="auto (default: CUDA when this host has a GPU, one per rank), cpu or cuda")
    p.add_argument("--gpu-cache", type=size, metavar="SIZE",
                   help="keep the feature rows this rank samples most in device memory, up to SIZE (e.g. 2GB); "
                        "a hit is never read from host memory. On the CPU: a RAM cache of those rows")
    p.add_argument("--feature-cache", type=feature_cache, metavar="SIZE",
                   help="read this rank's own node features x through a RAM cache of its hottest rows, up to SIZE "
                        "(e.g. 512MB; 0: no cache), and parallel disk reads: for features larger than memory "
                        "(default: so when they exceed half of the rank's memory or cgroup limit, the cache sized "
                        "to what the memory leaves beside the batches; off: never)")
    p.add_argument("--unmapped", action="store_true",
                   help="read this rank's partitions (topology, features, labels) with pread instead of mapping "
                        "them, so its resident memory does not grow with the graph; a system call per read "
                        "(uniform node sampling only); features x larger than memory, or given --feature-cache, "
                        "go through the same disk reader as mapped ones")
    p.add_argument("--epochs", type=integer(1), default=3)
    p.add_argument("--model", type=_model, default="sage", metavar="{" + ",".join(MODELS) + "} or MODULE:FACTORY",
                   help="a built-in model, or your own: FACTORY(in_channels, out_channels, config) from MODULE "
                        "(importable, the current directory first) returns a torch module taking (x, edge_index); "
                        "heterogeneous datasets wrap it with to_hetero (default sage)")
    p.add_argument("--loss", metavar="MODULE:FN",
                   help="--task node: FN(out, y) returns the loss of a batch's seeds (default: cross entropy)")
    p.add_argument("--fanout", default="15,10", help="neighbours per hop, comma-separated (-1 = all)")
    p.add_argument("--batch-size", type=integer(1), default=512)
    p.add_argument("--hidden", type=integer(1), default=128)
    p.add_argument("--lr", type=number(0, above=True), default=0.003)
    p.add_argument("--dropout", type=number(0, 1, below=True), default=0.5, help="in [0, 1) (default 0.5)")
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=0)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir (at the exact step, when it was "
                        "written inside an epoch)")
    p.add_argument("--checkpoint-every", type=integer(0), default=0, metavar="N",
                   help="also checkpoint every N training steps (default 0: after each epoch only). SIGTERM "
                        "always checkpoints at the next step and exits with code 75")
    p.add_argument("--metrics-out", help="write per-epoch metrics (JSON) here")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="rank 0 writes each epoch's loss, accuracy/AUC, time breakdown, wire bytes and cache hits "
                        "as TensorBoard event files in DIR (needs pip install 'graphstore[tensorboard]')")
    p.add_argument("--timeout", type=number(0, above=True), default=120.0,
                   help="seconds before a silent peer or stuck collective ends the job (default 120)")
    p.add_argument("--cache-rows", type=integer(0), default=0, help="cache up to this many remote feature rows per rank")
    p.add_argument("--task", choices=("node", "link"), default="node",
                   help="node classification (default) or link prediction (AUC)")
    p.add_argument("--target", help="node type to classify in a heterogeneous dataset (default: the labelled one)")
    p.add_argument("--time-attr", help="temporal sampling on this node/edge attribute (links: split in time too)")
    p.add_argument("--edge-type", help="link task: the edge type, as src,rel,dst or rel (heterogeneous datasets)")
    p.add_argument("--neg-sampling", choices=("binary", "triplet"), default="binary",
                   help="link task negatives: binary (AUC, default) or triplet (5 per link, MRR)")
    p.add_argument("--infer-out", metavar="NAME",
                   help="after training, write every node's output into the dataset as node attribute NAME")
    p.add_argument("--interface", metavar="NAME",
                   help="network interface for gloo and RPC across hosts (default: the one on the route to "
                        "MASTER_ADDR; overrides GLOO_SOCKET_IFNAME/TP_SOCKET_IFNAME)")
    add_storage_arguments(p)
    p.add_argument("--verify-reads", action="store_true",
                   help="check every local chunk against its manifest checksum when first read (its cost: docs/performance.md)")
    p.add_argument("--eval-every", type=integer(1), default=1, metavar="N",
                   help="evaluate val and test after every N-th epoch (default 1); always after the last")
    p.add_argument("--eval-max-batches", type=integer(0), default=0, metavar="M",
                   help="evaluations before the last use at most M batches per rank and split (default 0: all); "
                        "the last epoch's evaluation is always complete")
    p.add_argument("--threads", type=integer(1, 4096), default=None, metavar="N",
                   help="torch threads per rank (default: usable cores / ranks on this host; see docs/training.md)")
    p.add_argument("--loader-threads", type=integer(1, 4096), default=None, metavar="N",
                   help="threads per rank sampling and gathering batches, in order (default: usable cores / ranks "
                        "on this host)")
    p.add_argument("--loader-workers", type=integer(0, 256), default=0, metavar="N",
                   help="sampler processes beside each rank building its training batches (sampling and feature "
                        "gather out of the rank's process, past its GIL; the same batches as its threads). Default "
                        "0: the rank's own loader threads")
    p.add_argument("--servers", metavar="HOST:PORT",
                   help="train from sampler servers (graphstore serve URL --address HOST:PORT): the ranks open no "
                        "partition and no file of the dataset; their batches, features included, are sampled on the "
                        "servers (default --nproc 1)")
    p.add_argument("--loader-only", action="store_true",
                   help="iterate the training loader with no model: batches/s per rank (the rate a model is fed)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _model(raw: str) -> str:
    """``--model``: a built-in name or ``MODULE:FACTORY`` (imported at the door, built in the ranks)."""
    if raw in MODELS or ":" in raw:
        return raw
    raise argparse.ArgumentTypeError(f"{raw!r} is not one of {', '.join(MODELS)}, nor MODULE:FACTORY (your own "
                                     "model, e.g. mymodels:build)")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    try:
        fanout = tuple(int(k) for k in args.fanout.split(","))
    except ValueError as exc:
        raise GraphstoreError(f"--fanout {args.fanout!r}: give integers per hop, e.g. 15,10") from exc
    return TrainConfig(dataset=args.dataset, epochs=args.epochs, model=args.model, loss=args.loss, fanout=fanout,
                       batch_size=args.batch_size, hidden=args.hidden, lr=args.lr, dropout=args.dropout,
                       seed=args.seed, checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                       metrics_out=args.metrics_out, timeout=args.timeout, cache_rows=args.cache_rows,
                       progress=not args.no_progress, task=args.task, target=args.target,
                       time_attr=args.time_attr, infer_out=args.infer_out,
                       edge_type=tuple(args.edge_type.split(",")) if args.edge_type else None,
                       neg_sampling=args.neg_sampling, storage_options=parse_storage_options(args.storage_option),
                       cache_dir=args.cache_dir, cache_max_bytes=args.cache_max_bytes, interface=args.interface,
                       verify_reads=args.verify_reads, eval_every=args.eval_every,
                       eval_max_batches=args.eval_max_batches, threads=args.threads, loader_only=args.loader_only,
                       checkpoint_every=args.checkpoint_every, device=args.device,
                       gpu_cache=args.gpu_cache, feature_cache=args.feature_cache, unmapped=args.unmapped,
                       loader_threads=args.loader_threads, loader_workers=args.loader_workers,
                       tensorboard=args.tensorboard, servers=args.servers)


def run_rank(config: TrainConfig, world: World) -> int:
    """Run this process's rank; exit code 0, 2 (bad input), 75 (stopped on SIGTERM, checkpoint written)
    or 1 (failure, named on stderr)."""
    from training.loop.trainer import Trainer  # PyG and the loaders: ranks only, not the launcher

    preempt.install()
    try:
        trainer = Trainer(config, world, on_epoch=print_epoch if world.rank == 0 else None)
        trainer.run()
        if trainer.stopped is not None:
            if world.rank == 0:
                print(trainer.stopped.line(config.checkpoint_dir), file=sys.stderr, flush=True)
            return preempt.EXIT_PREEMPTED
        return 0
    except Exception as exc:
        code = 2 if isinstance(exc, GraphstoreError) and not failures.is_echo(exc) else 1
        if not failures.record(world.rank, exc):  # under torchrun/srun: no launcher to summarise
            word = "error" if isinstance(exc, GraphstoreError) else "failed"
            print(f"graphstore-train rank {world.rank}: {word}: {exc}", file=sys.stderr, flush=True)
        return code


def print_epoch(r: dict[str, Any], epochs: int) -> None:
    """One line per epoch on rank 0: loss, metrics, seconds (and the evaluation's), the timing breakdown,
    remote requests, peak memory per rank and bytes on the wire."""
    keys = ("train_acc", "val_acc", "test_acc", "val_auc", "test_auc", "val_mrr", "test_mrr")
    accs = "  ".join(f"{k.replace('_', ' ')} {r[k]:.4f}" for k in keys if k in r)
    head = (f"loss {r['loss']:.4f}  {accs}" if "loss" in r else
            "loader only: " + ", ".join(f"{v:.2f}" for v in r.get("loader_batches_per_s", [])) + " batches/s per rank")
    print(f"epoch {r['epoch']}/{epochs}  {head}  {r['epoch_seconds']:.1f} s ({_eval_text(r)}), "
          f"{describe(r['timing'], r['train_seconds'])}  remote requests {int(r['remote'].get('requests', 0))}"
          f"{_peak_text(r)}{_wire_text(r)}{_gpu_cache_text(r)}{featurecache.text(r)}{_compiled_text(r)}", flush=True)


def _gpu_cache_text(r: dict[str, Any]) -> str:
    """``  gpu cache hits 81.2% (1.2M of 1.5M rows)`` (this rank's training batches), or nothing."""
    got = r.get("gpu_cache")
    if not got:
        return ""
    total = got["hits"] + got["misses"]
    return f"  gpu cache hits {100 * got['hits'] / max(total, 1):.1f}% ({got['hits']:,} of {total:,} rows)"


def _eval_text(r: dict[str, Any]) -> str:
    """``evaluation 3.2 s`` (``, subset`` when capped), or when it was skipped and when it comes next."""
    kind = r.get("evaluation", "full")
    if kind == "none":
        nxt = r.get("next_evaluation")
        return "no evaluation" + (f", next after epoch {nxt}" if nxt else "")
    return f"evaluation {r.get('eval_seconds', 0.0):.1f} s" + (", subset" if kind == "subset" else "")


def _peak_text(r: dict[str, Any]) -> str:
    """``  peak RSS/rank GiB: 2.31, 2.27`` (this epoch, evaluation included)."""
    peaks = r.get("memory_mb", {}).get("peak_rss")
    return ("  peak RSS/rank GiB: " + ", ".join(f"{p / 1024:.2f}" for p in peaks)) if peaks else ""


def _compiled_text(r: dict[str, Any]) -> str:
    """``  kernels compiled/rank: 9, 9 (41.0 s)`` when a rank compiled sampling kernels in this epoch, or nothing."""
    got = r.get("kernels_compiled", {})
    if not any(got.get("epoch", [])):
        return ""
    return ("  kernels compiled/rank: " + ", ".join(str(n) for n in got["epoch"])
            + f" ({max(got['seconds']):.1f} s; `graphstore warmup` compiles them ahead of time)")


def _wire_text(r: dict[str, Any]) -> str:
    """``  wire MB: neighbours 1.2, rows 3.4, allreduce 5.6`` (all ranks), or nothing without counts."""
    got = r.get("wire", {}).get("bytes", {})
    return ("  wire MB: " + ", ".join(f"{k} {v / 1e6:.2f}" for k, v in sorted(got.items()))) if got else ""


def launch_local(config: TrainConfig, nproc: int, grace: float) -> int:
    """Start ``nproc`` ranks of ``graphstore-train`` on this machine; the job's exit code."""

    def write_config(tmp: str) -> dict[str, str]:
        config_file = os.path.join(tmp, "config.json")  # private to this user (mkdtemp is 0700)
        with open(config_file, "w") as fh:
            json.dump(asdict(config), fh)
        return {"GRAPHSTORE_CONFIG_FILE": config_file}

    return run_ranks(["-m", "training.launch", "--rank-from-env"], nproc, grace,
                     threads.choose(config.threads, nproc).threads, write_config, "graphstore-train",
                     preload=RANK_IMPORTS)


# what a rank of graphstore-train imports before it trains (forkserver: once per job, not once per rank)
RANK_IMPORTS = ("torch", "torch_geometric", "training.launch", "training.loop.trainer")


def run_ranks(command: list[str], nproc: int, grace: float, omp_threads: int, job_env: Any,
              prog: str, preload: tuple[str, ...] = ()) -> int:
    """Start ``nproc`` ranks on this machine, each ``python COMMAND`` (file rendezvous: no ports guessed),
    watch them, and stop all of them when one fails; ``job_env(job_dir)`` adds to their environment.
    ``preload``: modules every rank imports, imported once by a fork server that forks the ranks.
    Returns the job's exit code."""
    with tempfile.TemporaryDirectory(prefix=lifetime.JOB_DIR_PREFIX) as tmp:
        extra = job_env(tmp)
        scratch = os.path.join(tmp, "tmp")  # every rank's temporary files (PyG's generated modules, ...)
        os.mkdir(scratch)
        procs, logs, envs, fds = [], [], [], []
        base = allocator.preload_env(dict(os.environ))  # jemalloc where the machine has it (training.launcher.allocator)
        for rank in range(nproc):
            envs.append({**base, "GRAPHSTORE_RANK": str(rank), "GRAPHSTORE_WORLD_SIZE": str(nproc),
                         lifetime.LAUNCHER_PID_ENV: str(os.getpid()), lifetime.JOB_DIR_ENV: tmp,
                         "GRAPHSTORE_INIT_METHOD": f"file://{tmp}/rendezvous", "TMPDIR": scratch, "TEMP": scratch,
                         "TMP": scratch, failures.ERROR_FILE_ENV: os.path.join(tmp, f"rank{rank}.error.json"),
                         "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),  # RPC echoes: in the log
                         "GRAPHSTORE_STDERR_TTY": "1" if sys.stderr.isatty() else "0",  # rank 0's bar, via the relay
                         **extra,  # OpenMP/BLAS pools sized like torch's (training.cluster.threads)
                         "OMP_NUM_THREADS": str(omp_threads)})
            # every rank's stderr goes to the job's log; rank 0's also reaches the terminal (progress, warnings)
            relay = failures.StderrRelay(os.path.join(tmp, "rank0.stderr"), start=False) if rank == 0 else None
            stderr = relay.write_fd if relay else open(os.path.join(tmp, f"rank{rank}.stderr"), "w")
            logs.append(relay or stderr)
            fds.append(stderr if isinstance(stderr, int) else stderr.fileno())
        # one process imports torch and PyG once and forks the ranks (training.launcher.forkserver); where it
        # refuses, a rank is a fresh interpreter. Either way a session of its own: the terminal's Ctrl-C reaches
        # the launcher only, which stops them
        server = forkserver.ForkServer(command, envs[0], preload, fds) if preload and fork_allowed(base) else None
        logs[0].start()  # after the server: where this process has imported the ranks' modules, it forks it
        try:
            for rank in range(nproc):
                forked = server.start(command, envs[rank], fds[rank]) if server is not None else None
                procs.append(forked or subprocess.Popen([sys.executable, *command], env=envs[rank], stderr=fds[rank],
                                                        start_new_session=True))
        except BaseException:
            if server is not None:
                server.close(kill=True)
            _stop_all(procs, wait=0.0)
            raise
        finally:
            if server is not None:
                server.close()
        term = _Terminate(procs)
        previous = signal.signal(signal.SIGTERM, term)  # scancel / kill / preemption: checkpoint, then stop
        try:
            return _supervise(procs, grace, tmp, logs[0], term, prog, adopted=server is not None)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the clean-up
            print(f"{prog}: interrupted (Ctrl-C); stopped every rank", file=sys.stderr, flush=True)
            _stop_all(procs, wait=0.0)
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
            _stop_all(procs)
            for fh in logs:
                fh.close()
            if server is not None:
                forkserver.reap_orphans({})
                forkserver.set_subreaper(False)


class _Terminate:
    """The launcher's SIGTERM handler: passes SIGTERM on to the ranks (they checkpoint at the next step
    and exit 75) and kills those still running ``limit`` seconds later."""

    def __init__(self, procs: list[subprocess.Popen], limit: float = 25.0) -> None:
        self.procs, self.limit, self.deadline = procs, limit, None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + self.limit
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def overdue(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


def _stop_all(procs: list[subprocess.Popen], wait: float = 10.0) -> None:
    """Terminate ranks still running (kill them at once when ``wait`` is 0), then kill those that are
    still there after ``wait`` seconds: no rank outlives the launcher."""
    for p in procs:
        if p.poll() is None:
            p.kill() if wait <= 0 else p.terminate()
    deadline = time.monotonic() + wait
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _supervise(procs: list[subprocess.Popen], grace: float, job_dir: str, relay: failures.StderrRelay,
               term: _Terminate | None = None, prog: str = "graphstore-train", adopted: bool = False) -> int:
    """Wait for the ranks. After the first failure, stop the others at once (1 s) when the failed rank
    named its own error; give peers time to say what they saw when it only echoed a peer's failure
    (``grace``) or died without a word (at most 15 s). One line sums up a failure. ``adopted``: this process
    is its descendants' subreaper (forked ranks), and reaps those orphaned to it."""
    failed: dict[int, int] = {}
    stopped: set[int] = set()
    deadline = None
    ok = (0, preempt.EXIT_PREEMPTED)
    while any(p.poll() is None for p in procs):
        if not relay.failed.is_set() and any(failures.kind(job_dir, r) == "cause" for r in range(len(procs))):
            relay.failed.set()  # a rank named its own error and is on its way out: its peers' echoes stay in the log
        for rank, p in enumerate(procs):
            if p.poll() not in (None, *ok) and rank not in failed:
                relay.failed.set()
                failed[rank] = p.returncode
                wait = {"cause": 1.0, "echo": grace, "silent": min(grace, 15.0)}[failures.kind(job_dir, rank)]
                deadline = min(deadline or math.inf, time.monotonic() + wait)
        if (deadline and time.monotonic() > deadline) or (term is not None and term.overdue()):
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    stopped.add(rank)
                    p.kill()
        if adopted:
            forkserver.reap_orphans({p.pid: p for p in procs})
        time.sleep(0.2)
    codes = {rank: p.returncode for rank, p in enumerate(procs)}
    if any(c not in ok for c in codes.values()):
        relay.failed.set()
    relay.close()  # rank 0's last words: shown after a success, kept in the log after a failure
    if all(c in ok for c in codes.values()):
        return preempt.EXIT_PREEMPTED if preempt.EXIT_PREEMPTED in codes.values() else 0
    line, code = failures.summarize(job_dir, codes, stopped)
    print(line.replace("graphstore-train:", f"{prog}:", 1), file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``graphstore-train`` (and of each rank the local launcher starts)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--rank-from-env"]:
        config = TrainConfig(**_config_env())
        world = World.from_env(use_cuda=placement.use_cuda(config.device, placement.gpu_count()))
        forkserver.prefork_samplers(config.loader_workers)
        lifetime.watch_launcher(world.rank)
        logging.basicConfig(level=logging.WARNING, format=f"rank {world.rank}: %(levelname)s %(message)s")
        warnings.filterwarnings("ignore", message="You are using a Backend")  # torch's own object collectives
        lifetime.leave(run_rank(config, world))
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # a bad flag (one line already printed) or --help
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        config = config_from_args(args)
        gpus = placement.gpu_count()
        cuda = placement.use_cuda(config.device, gpus)
        world = World.from_env(use_cuda=cuda)
        if world is not None:  # under torchrun or srun: this process is one rank
            placement.check_local_rank(world.local_rank, cuda, gpus)
            forkserver.prefork_samplers(config.loader_workers)
            # one job per checkpoint directory: rank 0 holds the claim for the job
            with checkpoint.claimed(config.checkpoint_dir) if world.rank == 0 else contextlib.nullcontext():
                code = run_rank(config, world)
            lifetime.leave(code)
        nproc = _check_job(config, args.nproc, cuda, gpus)
        with checkpoint.claimed(config.checkpoint_dir):
            return launch_local(config, nproc, grace=config.timeout + 15)
    except GraphstoreError as exc:
        print(f"graphstore-train: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("graphstore-train: interrupted (Ctrl-C) before any rank started", file=sys.stderr)
        return 130


def _config_env() -> dict[str, Any]:
    with open(os.environ["GRAPHSTORE_CONFIG_FILE"]) as fh:
        doc = json.load(fh)
    doc["fanout"] = tuple(doc["fanout"])
    if doc.get("edge_type"):
        doc["edge_type"] = tuple(doc["edge_type"])
    return doc


def _check_job(config: TrainConfig, nproc: int | None, cuda: bool, gpus: int) -> int:
    """Everything checkable before ranks start: outputs, the dataset's chunk files and task; the rank count
    (any count over any partition count, but no more ranks than GPUs on CUDA)."""
    import graphstore

    checks.check_outputs(config)
    for flag, spec in (("--model", config.model), ("--loss", config.loss)):
        if spec and ":" in spec:  # your own code: imported here, so a typo is one line before any rank starts
            from training.loop.usercode import load

            load(spec, flag)
    allocator.preload_env(dict(os.environ))  # raises with the fix for a bad GRAPHSTORE_MALLOC/GRAPHSTORE_JEMALLOC
    fork_allowed()  # and for a bad GRAPHSTORE_FORK_RANKS
    if config.servers is not None:  # the servers hold the dataset; the ranks check what they are sent
        from sampling.remote.client import parse_address

        parse_address(config.servers)
        return placement.local_ranks(nproc, 1, cuda, gpus)
    ds = graphstore.open_dataset(config.dataset, config.storage_options or None, cache_dir=config.cache_dir)
    checks.check_dataset(config, ds)
    ranks = placement.local_ranks(nproc, ds.num_parts, cuda, gpus)
    for line in checks.check_resume(config, ds, ranks):  # a checkpoint of another job: refused here
        print(f"graphstore-train: {line}", file=sys.stderr)
    return ranks


if __name__ == "__main__":
    sys.exit(main())
