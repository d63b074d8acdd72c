"""The distributed training loop: data-parallel GNN training over a partitioned dataset, one rank each."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

import graphstore
from graphstore.errors import InvalidInputError
from sampling import wire
from sampling.distributed import PartitionServer, RankLayout, RemoteStats
from training import checkpoint
from training import process
from training.config import MODELS, TrainConfig
from training.process import PeerFailure, Watchdog, start, stop
from training.tasks import make_task
from training.timing import LEGEND, Timers, timed_allreduce_hook
from training.world import World

logger = logging.getLogger(__name__)
_HANDLER_STAGES = {"sample": "sampling", "gather": "feature fetch", "edge_attr": "edge-attribute fetch"}


def _is_collective(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a gloo collective (DDP's gradient all-reduce, a metrics all-reduce)."""
    text = str(exc).lower()
    return any(w in text for w in ("gloo", "allreduce", "all_reduce", "collective", "barrier"))


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """One rank: mounts its partition, serves it to peers, trains and evaluates, writes metrics."""

    def __init__(self, config: TrainConfig, world: World,
                 on_epoch: Callable[[dict[str, Any], int], None] | None = None) -> None:
        """``on_epoch(record, epochs)`` is called on rank 0 after every epoch (the CLI prints a line)."""
        self.config, self.world, self.on_epoch = config, world, on_epoch
        self.dataset = graphstore.open_dataset(config.dataset, config.storage_options or None,
                                               cache_dir=config.cache_dir, cache_max_bytes=config.cache_max_bytes,
                                               verify_reads=config.verify_reads)
        self.layout = RankLayout(self.dataset.num_parts, world.world_size)
        self.part = self.layout.part_of(world.rank)
        for etype in self.dataset.edge_types:  # damaged topology ends this rank before it talks to peers
            self.dataset.topology(self.part, etype)
        self.timers, self.stats, self.bytes = Timers(), RemoteStats(), Timers()  # bytes: gradient all-reduce
        self.transport = None
        self.watchdog: Watchdog | None = None

    # -- set-up --

    def _loaders(self) -> dict[str, Any]:
        out = self.task.loaders()
        if "train" not in out:
            raise InvalidInputError(f"{self.dataset.url} has no training split (train_mask) for --task {self.config.task}")
        _time_loader(out["train"], self.timers)
        return out

    def _model(self, first_batch: Any) -> torch.nn.Module:
        model = self.task.model().to(self.world.device)
        with torch.no_grad():  # materialise lazy parameters (to_hetero, -1 input sizes) before DDP
            self.task.step(model, first_batch.to(self.world.device))
        return model

    # -- the job --

    def run(self) -> list[dict[str, Any]]:
        c = self.config
        self.transport = start(self.world, c.timeout, use_rpc=self.dataset.num_parts > 1, interface=c.interface)
        # bookkeeping collectives use CPU tensors: a gloo group for them when the default is nccl
        self._cpu_group = dist.new_group(backend="gloo") if self.world.use_cuda else None
        self.watchdog = Watchdog(self.world, limit=c.timeout)
        graceful = False
        try:
            PartitionServer(self.dataset, self.part).register(self.transport)
            history = self._train()
            process.set_stage("shutdown")
            dist.monitored_barrier(group=self._cpu_group, timeout=_td(c.timeout), wait_all_ranks=True)
            graceful = True
            return history
        except Exception as exc:
            raise self._explain(exc) from exc
        finally:
            self.watchdog.stop()
            if not graceful:  # leaving a failed job must be bounded too, whatever the peers do
                process.exit_after(15.0, f"graphstore-train rank {self.world.rank}: shutdown after the failure "
                                         f"did not finish within 15 s; exiting")
            stop(self.transport, graceful=graceful)

    def _explain(self, exc: Exception) -> Exception:
        """The failure as one error naming this rank, the lost rank and its host, and the stage."""
        from graphstore.errors import GraphstoreError
        from sampling.transport import PeerError

        me = f"rank {self.world.rank} at {process.HOSTS.get(self.world.rank, '?')}"
        if isinstance(exc, PeerError) and "did not answer" in str(exc):
            peer = getattr(exc, "peer", None)
            where = _HANDLER_STAGES.get(getattr(exc, "handler", ""), process.stage())
            lost = process.describe([peer]) if peer is not None else "a peer"
            return PeerFailure(f"{me}: lost {lost} during {where}: {exc}")
        if isinstance(exc, (GraphstoreError, PeerFailure)):
            return exc  # names its problem already (bad input, a damaged dataset, a peer's error)
        dead = self.watchdog.stalled_ranks() if self.watchdog else []
        who = f"lost {process.describe(dead)}" if dead else "a peer or collective failed"
        where = f"the {process.stage()} all-reduce" if _is_collective(exc) else process.stage()
        return PeerFailure(f"{me}: {who} during {where}: {type(exc).__name__}: {exc}")

    def _train(self) -> list[dict[str, Any]]:
        c, world = self.config, self.world
        self.task = make_task(self)
        loaders = self._loaders()
        _seed_everything(c.seed)  # the initial weights follow --seed (DDP then copies rank 0's to all)
        model = self._model(_first_batch(loaders["train"]))
        ddp = torch.nn.parallel.DistributedDataParallel(  # to_hetero models leave non-target outputs unused
            model, device_ids=[world.local_rank] if world.use_cuda else None,
            find_unused_parameters=self.dataset.is_hetero)
        ddp.register_comm_hook(None, timed_allreduce_hook(self.timers, self.bytes))
        optimizer = torch.optim.Adam(ddp.parameters(), lr=c.lr)
        first, history = self._resume(model, optimizer)
        if _agree_max(first) != first or -_agree_max(-first) != first:
            raise InvalidInputError(
                f"--resume: ranks found different checkpoints in {c.checkpoint_dir} (rank {world.rank} would "
                f"start at epoch {first + 1}); --checkpoint-dir must be one path every rank sees (shared storage)")
        steps = _agree_max(len(loaders["train"]))
        for epoch in range(first, c.epochs):
            _seed_everything(c.seed * 100_003 + epoch * 1009 + world.rank)
            _restart_streams(loaders, epoch)
            self.timers.snapshot(reset=True)  # the model-building batch (and anything before) is no epoch's
            self.stats.snapshot(reset=True)
            self.transport.wire.snapshot(reset=True)  # the model-building batch's requests are no epoch's
            self.bytes.snapshot(reset=True)
            process.set_stage("training")
            start_time = time.perf_counter()
            loss, train_acc = self._epoch(ddp, optimizer, loaders["train"], steps, epoch)
            record = {"epoch": epoch + 1, "loss": loss, "train_acc": train_acc,
                      "train_seconds": round(time.perf_counter() - start_time, 3)}
            record["remote"] = self.stats.snapshot(reset=True)  # training steps only
            record["wire"] = _wire_record(self.transport.wire.snapshot(reset=True), self.bytes.snapshot())
            record["timing"] = {**self.timers.snapshot(), "remote_wait": record["remote"].pop("wait_seconds")}
            process.set_stage("evaluation")
            record.update({f"{k}_{self.task.metric}": self.task.evaluate(model, loaders[k])
                           for k in ("val", "test") if k in loaders})
            record["epoch_seconds"] = round(time.perf_counter() - start_time, 3)
            record["remote_eval"] = self.stats.snapshot(reset=True)
            record["wire_eval"] = wire.totals(self.transport.wire.snapshot(reset=True))  # this rank's
            self.timers.snapshot()  # evaluation's sampling/feature time is not part of the training breakdown
            record["steps"] = steps
            record["memory_mb"] = _memory_per_rank(self.dataset)
            history.append(_reduce_record(record))
            self._after_epoch(epoch, model, optimizer, history)
        if c.infer_out:
            self._write_inference(model)
        return history

    def _write_inference(self, model: torch.nn.Module) -> None:
        """Layer-wise inference over full neighbourhoods; each partition's outputs written into the
        dataset by its first rank, committed to the manifest by rank 0 once all are written."""
        from graphstore.outputs import OutputWriter
        from training.inference import layerwise_inference

        if self.config.task != "node" or self.dataset.is_hetero:
            raise InvalidInputError("--infer-out supports homogeneous node classification in this version")
        start_time = time.perf_counter()
        out = layerwise_inference(model, self.dataset, self.part, self.transport, self.layout, self.config.model)
        writer = OutputWriter(self.dataset, self.config.infer_out, row_shape=tuple(out.shape[1:]),
                              description=f"graphstore-train {self.config.model} outputs")
        info = writer.write_part(self.part, out.numpy()) if self.world.rank in self.layout.ranks_of(self.part)[:1] else None
        gathered: list[Any] = [None] * self.world.world_size
        dist.all_gather_object(gathered, (self.part, info))
        if self.world.rank == 0:
            writer.commit({p: i for p, i in gathered if i is not None})
            logger.warning("wrote %s for %d nodes into %s in %.1f s", self.config.infer_out,
                           self.dataset.num_nodes(), self.dataset.url, time.perf_counter() - start_time)
        dist.barrier()

    def _epoch(self, ddp: torch.nn.Module, optimizer: Any, loader: Any, steps: int, epoch: int) -> tuple[float, float]:
        ddp.train()
        totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, seen
        bar = _bar(self.world.rank == 0 and self.config.progress, steps, f"epoch {epoch + 1}/{self.config.epochs}")
        batches = _cycle(loader, steps)
        for _ in range(steps):
            with self.timers.time("data_wait"):
                batch = next(batches).to(self.world.device)
            with self.timers.time("forward_backward"):
                optimizer.zero_grad()
                loss, correct, seen = self.task.step(ddp, batch)
                loss.backward()
            with self.timers.time("optimizer"):
                optimizer.step()
            totals += torch.tensor([float(loss.detach()) * seen, correct, seen], dtype=torch.float64)
            bar.update(1)
        with self.timers.time("epoch_end"):  # the prefetcher's last batch, then waiting for the slowest rank
            batches.close()
            bar.close()
            dist.all_reduce(totals)
        return round(float(totals[0] / max(totals[2], 1)), 5), round(float(totals[1] / max(totals[2], 1)), 5)

    def _resume(self, model: torch.nn.Module, optimizer: Any) -> tuple[int, list[dict[str, Any]]]:
        c = self.config
        if not (c.resume and c.checkpoint_dir):
            return 0, []
        state = checkpoint.load_latest(c.checkpoint_dir)
        if state is None:
            logger.warning("--resume: no checkpoint in %s; starting at epoch 1", c.checkpoint_dir)
            return 0, []
        first = checkpoint.restore(state, model, optimizer)
        if self.world.rank == 0:
            logger.warning("resumed from %s at epoch %d", c.checkpoint_dir, first + 1)
        return first, list(state["extra"].get("history", []))

    def _after_epoch(self, epoch: int, model: torch.nn.Module, optimizer: Any, history: list[dict]) -> None:
        c = self.config
        if self.world.rank == 0:
            if self.on_epoch is not None:
                self.on_epoch(history[-1], c.epochs)
            if c.checkpoint_dir:
                checkpoint.save(c.checkpoint_dir, epoch, model, optimizer, {"history": history})
            if c.metrics_out:
                config = {**asdict(c), "storage_options": sorted(c.storage_options)}  # keys only: no secrets
                _write_json(c.metrics_out, {"config": config, "world_size": self.world.world_size,
                                            "num_parts": self.dataset.num_parts, "timing_parts": LEGEND,
                                            "epochs": history})
        dist.barrier()


def _wire_record(per_peer: dict[str, Any], counts: dict[str, float]) -> dict[str, Any]:
    """Every rank's RPC bytes per peer and kind, its gradient all-reduce bytes, and totals over ranks
    (``bytes``: each call counted once, at its caller, request plus response)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (per_peer, int(counts.get("allreduce", 0))))
    total: dict[str, int] = {}
    for peers, _ in gathered:
        for kind, value in wire.totals(peers).items():
            total[kind] = total.get(kind, 0) + value
    allreduce = [a for _, a in gathered]
    return {"bytes": {**total, "allreduce": sum(allreduce)}, "per_rank": [p for p, _ in gathered],
            "allreduce_per_rank": allreduce}


def _td(seconds: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=seconds)


def _agree_max(value: int) -> int:
    """All ranks take the largest step count: ranks with fewer batches cycle their seeds (no hang)."""
    t = torch.tensor(value)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def _restart_streams(loaders: dict[str, Any], epoch: int) -> None:
    """Each loader's sampling streams as a function of the epoch, so a resumed run draws what an
    uninterrupted one would (local sampling; a remote partition's server draws from its own stream)."""
    for loader in loaders.values():
        sampler = getattr(loader, "node_sampler", None) or getattr(loader, "link_sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(1000 * (epoch + 1))


def _first_batch(loader: Any) -> Any:
    """One batch to build the model from; its prefetcher is closed, so nothing samples on into epoch 1."""
    iterator = iter(loader)
    try:
        return next(iterator)
    finally:
        if hasattr(iterator, "close"):
            iterator.close()


def _cycle(loader: Any, steps: int) -> Any:
    """``steps`` batches from ``loader``, starting it again when it runs out; closes its prefetcher."""
    produced = 0
    while produced < steps:
        iterator = iter(loader)
        try:
            for batch in iterator:
                yield batch
                produced += 1
                if produced == steps:
                    return
        finally:
            if hasattr(iterator, "close"):
                iterator.close()
        if produced == 0:
            raise InvalidInputError("this rank has no training seeds; use fewer ranks or re-ingest with fewer parts")


def _time_loader(loader: Any, timers: Timers) -> None:
    """Record sampling and feature-fetch seconds (spent in the prefetch thread) for the timing breakdown."""
    collate, filter_fn = loader.collate_fn, loader.filter_fn

    def timed_collate(index: Any) -> Any:
        with timers.time("sampling"):
            return collate(index)

    def timed_filter(out: Any) -> Any:
        with timers.time("feature_fetch"):
            return filter_fn(out)

    loader.collate_fn, loader.filter_fn = timed_collate, timed_filter


def _reduce_record(record: dict[str, Any]) -> dict[str, Any]:
    """Timings as the mean over ranks; remote counters (training and evaluation) summed over ranks."""
    world = dist.get_world_size()
    record = {**record, "remote_eval": {k: v for k, v in record["remote_eval"].items() if k != "wait_seconds"}}
    keys = sorted(record["timing"]) + [f"remote.{k}" for k in sorted(record["remote"])]
    keys += [f"remote_eval.{k}" for k in sorted(record["remote_eval"])]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, keys)  # a timer may have fired on some ranks only
    union = sorted(set().union(*gathered))
    def value(key: str) -> float:
        group, _, name = key.partition(".")
        return float(record[group].get(name, 0)) if name else float(record["timing"].get(key, 0.0))

    values = torch.tensor([value(k) for k in union], dtype=torch.float64)
    dist.all_reduce(values)
    out = {**record, "timing": {}, "remote": {}, "remote_eval": {}}
    for key, v in zip(union, values):
        group, _, name = key.partition(".")
        if name:
            out[group][name] = round(float(v), 4)
        else:
            out["timing"][key] = round(float(v) / world, 4)
    return out


def _memory_per_rank(dataset: Any) -> dict[str, list[float]]:
    """Every rank's resident memory (MB): ``rss``; ``anon`` (private heap: copies would land here);
    ``dataset_rss``/``dataset_pss``, the dataset's memory-mapped pages resident in this rank and its
    proportional share of them (ranks mapping the same pages split them: one copy in the page cache)."""
    import psutil

    proc = psutil.Process()
    mine = {"rss": proc.memory_info().rss, "anon": 0, "dataset_rss": 0, "dataset_pss": 0}
    root = str(getattr(dataset.location, "root", "") or "")
    try:
        with open("/proc/self/status") as fh:
            mine["anon"] = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssAnon:"))
        for m in proc.memory_maps(grouped=True):
            if root and m.path.startswith(root):
                mine["dataset_rss"] += m.rss
                mine["dataset_pss"] += getattr(m, "pss", m.rss)
    except (OSError, StopIteration, psutil.Error):
        pass  # not Linux: only rss is reported
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {k: [round(g[k] / 2**20, 1) for g in gathered] for k in mine}


def _bar(enabled: bool, total: int, desc: str) -> Any:
    from tqdm import tqdm

    import sys

    tty = sys.stderr.isatty() or os.environ.get("GRAPHSTORE_STDERR_TTY") == "1"  # relayed by the launcher
    return tqdm(total=total, desc=desc, unit="batch", disable=not enabled or not tty, leave=False)


def _write_json(path: str, doc: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.partial-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2)
    os.replace(tmp, path)
