"""What a training job is told (``TrainConfig``), and the checks that need nothing but the values."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphstore.storage.cache import parse_size
from graphstore.errors import InvalidInputError

MODELS = ("sage", "gcn", "gat", "gin")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything ``graphstore-train`` is told; validated before any process starts. Keyword arguments only
    (36 fields: a positional list would swap two floats without a word).

    Examples
    --------
    >>> TrainConfig(dataset="graphs/tiny", epochs=2, fanout=(10, 5)).model
    'sage'
    """

    dataset: str
    epochs: int = 3
    model: str = "sage"  # a built-in (MODELS) or MODULE:FACTORY, your own (training.loop.usercode)
    loss: str | None = None  # MODULE:FN, your own loss of a node batch's seeds (default: cross entropy)
    fanout: tuple[int, ...] = (15, 10)
    batch_size: int = 512
    hidden: int = 128
    lr: float = 0.003
    dropout: float = 0.5
    seed: int = 0
    checkpoint_dir: str | None = None
    resume: bool = False
    metrics_out: str | None = None
    timeout: float = 120.0
    cache_rows: int = 0
    progress: bool = True
    task: str = "node"
    target: str | None = None  # node type to classify (heterogeneous datasets); default: the labelled one
    time_attr: str | None = None  # temporal sampling (and, for links, a split in time) on this attribute
    infer_out: str | None = None  # after training, write every node's output as this new node attribute
    edge_type: tuple[str, ...] | None = None  # link task on a heterogeneous dataset (default: the first type)
    neg_sampling: str = "binary"  # link task: binary (AUC) or triplet (MRR)
    cache_dir: str | None = None  # chunk cache of a remote dataset (default $GRAPHSTORE_CACHE_DIR)
    cache_max_bytes: str | None = None
    interface: str | None = None  # network interface for gloo/TensorPipe (default: the route to MASTER_ADDR)
    storage_options: dict[str, Any] = field(default_factory=dict)
    verify_reads: bool = False  # check every local chunk's checksum when first read (--verify-reads)
    eval_every: int = 1  # evaluate after every N-th epoch (and always after the last)
    eval_max_batches: int = 0  # evaluations before the last: at most this many batches per rank and split (0 = all)
    threads: int | None = None  # torch threads per rank (default: usable cores / ranks on this host)
    loader_only: bool = False  # iterate the training loader without a model: the rate batches are produced
    checkpoint_every: int = 0  # also checkpoint every N training steps (0: at epoch ends only)
    device: str = "auto"  # auto (CUDA when the host has a GPU), cpu or cuda
    gpu_cache: str | None = None  # keep the hottest feature rows in device memory, up to this size (e.g. 2GB)
    feature_cache: str | None = None  # features beyond RAM: the hottest own rows of x in RAM up to this size
    unmapped: bool = False  # read the rank's partitions with pread, never mapped: memory flat as the graph grows
    loader_threads: int | None = None  # threads sampling and gathering batches per rank (default: cores / ranks)
    loader_workers: int = 0  # sampler processes beside each rank building its training batches (0: its threads)
    tensorboard: str | None = None  # rank 0 writes each epoch's scalars as TensorBoard event files here
    servers: str | None = None  # HOST:PORT of sampler servers (graphstore serve): the ranks open no partition

    def __post_init__(self) -> None:
        if self.model not in MODELS and not is_spec(self.model):
            raise InvalidInputError(f"--model {self.model!r} is not one of {MODELS}, nor MODULE:FACTORY")
        if self.loss is not None and not is_spec(self.loss):
            raise InvalidInputError(f"--loss {self.loss!r} is not MODULE:FN (e.g. mylosses:focal)")
        if self.loss is not None and self.task != "node":
            raise InvalidInputError("--loss replaces the node classification loss; --task link has its own (drop "
                                    "--loss)")
        for name in ("epochs", "batch_size", "hidden"):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.fanout or any(k == 0 or k < -1 for k in self.fanout):
            raise InvalidInputError(f"--fanout {self.fanout} must be positive per hop (or -1 for all), e.g. 15,10")
        if self.resume and not self.checkpoint_dir:
            raise InvalidInputError("--resume needs --checkpoint-dir")
        if self.task not in ("node", "link"):
            raise InvalidInputError(f"--task {self.task!r} is not one of ('node', 'link')")
        if self.neg_sampling not in ("binary", "triplet"):
            raise InvalidInputError(f"--neg-sampling {self.neg_sampling!r} is not binary or triplet")
        if self.device not in ("auto", "cpu", "cuda"):
            raise InvalidInputError(f"--device {self.device!r} is not one of auto, cpu, cuda")
        if self.timeout <= 0:
            raise InvalidInputError(f"--timeout must be > 0 seconds, got {self.timeout}")
        check_config(self)


def is_spec(text: Any) -> bool:
    """Whether ``text`` reads as ``MODULE:NAME`` (dotted module, Python names)."""
    if not isinstance(text, str) or text.count(":") != 1:
        return False
    module, name = text.split(":")
    return all(part.isidentifier() for part in module.split(".")) and name.isidentifier()


def check_config(c: TrainConfig) -> None:
    """Numbers finite and in range (the Python API's twin of the CLI's argparse types)."""
    _number("--lr", c.lr, low=0.0, above=True)
    _number("--dropout", c.dropout, low=0.0, high=1.0, below_high=True)
    _number("--timeout", c.timeout, low=0.0, above=True)
    if not isinstance(c.cache_rows, (int, np.integer)) or c.cache_rows < 0:
        raise InvalidInputError(f"--cache-rows must be an integer >= 0, got {c.cache_rows!r}")
    if not isinstance(c.seed, (int, np.integer)) or not 0 <= c.seed < 2**63:
        raise InvalidInputError(f"--seed must be an integer in [0, 2**63), got {c.seed!r}")
    for flag, value, low in (("--eval-every", c.eval_every, 1), ("--eval-max-batches", c.eval_max_batches, 0),
                             ("--threads", 1 if c.threads is None else c.threads, 1),
                             ("--loader-threads", 1 if c.loader_threads is None else c.loader_threads, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InvalidInputError(f"{flag} must be an integer >= {low}, got {value!r}")
    workers = c.loader_workers
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 0:
        raise InvalidInputError(f"--loader-workers must be an integer >= 0, got {workers!r}")
    if workers and c.loader_threads is not None and c.loader_threads > 1:
        raise InvalidInputError(f"--loader-workers {workers} and --loader-threads {c.loader_threads} both build batches "
                                "in parallel (sampler processes, or threads in the rank); give one of them")
    if c.servers is not None:
        _check_served(c)
    every = c.checkpoint_every
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 0:
        raise InvalidInputError(f"--checkpoint-every must be an integer >= 0 (steps), got {every!r}")
    if every and not c.checkpoint_dir:
        raise InvalidInputError("--checkpoint-every needs --checkpoint-dir (where the checkpoints go)")
    if c.loader_only and (c.infer_out or c.checkpoint_dir):
        flag = "--infer-out" if c.infer_out else "--checkpoint-dir"
        raise InvalidInputError(f"--loader-only trains no model, so {flag} has nothing to write; drop one of them")
    if c.task == "link" and c.target is not None:
        raise InvalidInputError("--target names the node type to classify (--task node); for --task link give "
                                "--edge-type instead")
    if c.task == "node" and c.edge_type is not None:
        raise InvalidInputError("--edge-type names the links to predict (--task link); --task node classifies "
                                "the node type given by --target")
    if c.task == "node" and c.neg_sampling != "binary":
        raise InvalidInputError(f"--neg-sampling {c.neg_sampling} picks negative links for --task link; --task node "
                                "has none: drop --neg-sampling, or add --task link")
    if c.gpu_cache is not None and (parse_size(c.gpu_cache, "--gpu-cache") or 0) <= 0:
        raise InvalidInputError(f"--gpu-cache {c.gpu_cache!r} is not a positive size; give e.g. 2GB, or leave it out")
    if c.feature_cache not in (None, "off") and (parse_size(c.feature_cache, "--feature-cache") or 0) < 0:
        raise InvalidInputError(f"--feature-cache {c.feature_cache!r} is not a size; give e.g. 512MB (0: no RAM cache, "
                                "off: never read through the disk path)")
    if c.gpu_cache is not None and c.cache_rows:
        raise InvalidInputError("--gpu-cache and --cache-rows both cache feature rows; give one of them")
    if c.gpu_cache is not None and c.task != "node":
        raise InvalidInputError("--gpu-cache caches node features x for --task node; drop it for --task link")
    if c.unmapped and (c.task != "node" or c.time_attr is not None):
        raise InvalidInputError("--unmapped samples uniformly; --task link (its link split) and --time-attr (temporal "
                                "sampling) read per-edge arrays it does not read yet: drop --unmapped for them")
    if c.tensorboard is not None and (not isinstance(c.tensorboard, str) or not c.tensorboard.strip()):
        raise InvalidInputError(f"--tensorboard {c.tensorboard!r} is not a directory path; give one, or leave it out")
    if c.cache_max_bytes is not None and (parse_size(c.cache_max_bytes, "--cache-max-bytes") or 0) <= 0:
        raise InvalidInputError(f"--cache-max-bytes {c.cache_max_bytes!r} is not a positive size; give e.g. 50GB, "
                                "or leave it out for no limit")


def _check_served(c: TrainConfig) -> None:
    """What a trainer of sampler servers cannot do: it holds no partition, and the servers sample."""
    held = {"--loader-workers": bool(c.loader_workers), "--gpu-cache": c.gpu_cache is not None,
            "--unmapped": c.unmapped, "--infer-out": bool(c.infer_out),
            "--feature-cache": c.feature_cache not in (None, "off")}
    for flag, given in held.items():
        if given:
            where = ("give the servers sampler processes with graphstore serve --loader-workers"
                     if flag == "--loader-workers" else "run it on ranks that hold partitions (without --servers)")
            raise InvalidInputError(f"{flag} with --servers: these ranks hold no partition and the sampler servers "
                                    f"sample and gather; {where}")


def _number(flag: str, value: Any, low: float, high: float | None = None, *, above: bool = False,
            below_high: bool = False) -> None:
    ok = isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if above else value >= low)
    ok = ok and (high is None or (value < high if below_high else value <= high))
    if not ok:
        bounds = f"{'(' if above else '['}{low:g}, {'' if high is None else f'{high:g}'}" + \
                 (")" if below_high or high is None else "]")
        raise InvalidInputError(f"{flag} {value!r} is out of range: give a finite number in {bounds}")
