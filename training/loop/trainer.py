"""The distributed training loop: data-parallel GNN training over a partitioned dataset, one rank each."""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from graphstore import jitcache
from graphstore.errors import InvalidInputError
from graphstore.storage.cache import parse_size
from sampling.distributed import wire
from sampling.loader.device_feed import DeviceFeeder
from training.launcher import allocator
from training.loop import checkpoint, evaluation, featurecache, resume
from training.cluster import preempt, process_groups
from training.loop.batches import PREFETCH, cycle, first_batch, mix, restart_streams, time_loader
from training.config import TrainConfig
from training.loop.inference import write_outputs
from training.report.memory import PeakMeter, compiled_per_rank, memory_per_rank
from training.report.records import gather_floats, reduce_record, wire_record, write_json
from training.loop.session import Session
from training.loop.tasks import make_task
from training.report.tensorboard import EpochWriter
from training.report.timing import LEGEND, Laps, Timers, timed_allreduce_hook
from training.cluster.world import World

logger = logging.getLogger(__name__)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """One rank: mounts its partition, serves it to peers, trains and evaluates, writes metrics (JSON, TensorBoard)."""

    def __init__(self, config: TrainConfig, world: World,
                 on_epoch: Callable[[dict[str, Any], int], None] | None = None) -> None:
        """``on_epoch(record, epochs)`` is called on rank 0 after every epoch (the CLI prints a line)."""
        self.config, self.world, self.on_epoch = config, world, on_epoch
        # the job itself (process groups, RPC, partition servers, watchdog, shutdown): the session a script holds
        self.session = Session(config.dataset, world=world, timeout=config.timeout, seed=config.seed,
                               storage_options=config.storage_options, cache_dir=config.cache_dir,
                               cache_max_bytes=config.cache_max_bytes, verify_reads=config.verify_reads,
                               threads=config.threads, loader_threads=config.loader_threads,
                               unmapped=config.unmapped, interface=config.interface, servers=config.servers,
                               feature_cache=config.feature_cache, loader_workers=config.loader_workers)
        self.timers, self.bytes = Timers(), Timers()  # bytes: gradient all-reduce
        self.peak = PeakMeter()
        self.stopped: preempt.Stopped | None = None  # set when the ranks stopped on SIGTERM
        self.device_cache: Any = None  # --gpu-cache (sampling.loader.gpu_cache.DeviceRowCache)
        self.board = EpochWriter(config.tensorboard, config.resume) if config.tensorboard and world.rank == 0 else None

    # what the tasks and inference read from the rank: the session's
    dataset = property(lambda self: self.session.dataset)
    layout = property(lambda self: self.session.layout)
    parts = property(lambda self: self.session.parts)
    transport = property(lambda self: self.session.transport)
    stats = property(lambda self: self.session.stats)
    threads = property(lambda self: self.session.threads)
    watchdog = property(lambda self: self.session.watchdog)
    _cpu_group = property(lambda self: self.session.cpu_group)
    servers = property(lambda self: self.session.servers)  # sampler servers build the batches (--servers)
    features = property(lambda self: self.session.features)  # --feature-cache, or features beyond RAM

    # -- set-up --

    def _loaders(self) -> dict[str, Any]:
        if self.config.infer_out:  # refused now, before any training is lost to the OOM killer
            from training.loop.inference import check_memory

            check_memory(self.dataset, tuple(self.parts), self.config.hidden, self.world.local_world_size,
                         self.config.model)
        out = self.task.loaders()
        if "train" not in out:
            raise InvalidInputError(f"{self.dataset.url} has no training split (train_mask) for --task {self.config.task}")
        if self.world.local_world_size > 1 and dist.is_initialized():  # every rank of the host has started, so
            dist.barrier(group=self._cpu_group)  # what they hold is counted before one sizes its cache (below)
        if self.features is not None and self.features.short:  # a memory limit binds: will a batch fit?
            c = self.config
            seeds, fanout = c.batch_size * self.task.seeds_per_example, tuple(c.fanout)
            ranks, workers = self.world.local_world_size, c.loader_workers
            ahead = featurecache.check_room(seeds, fanout, self.features.row_bytes, ranks,
                                            f"--batch-size {c.batch_size} --fanout {','.join(map(str, c.fanout))}",
                                            edge_rows=self.task.edge_rows, workers=workers)
            if workers:  # their batches are counted above; the cache in shared memory, read by them too
                featurecache.fill_what_is_left(self.features, ahead, seeds, fanout, ranks, 0, shared=True)
            elif getattr(out["train"], "prefetch_rows", None) is not None:  # batches ahead in threads: a cache beside
                ahead = featurecache.fill_what_is_left(self.features, ahead, seeds, fanout, ranks, PREFETCH)
            for loader in out.values():  # rows gathered ahead of the step: what the limit leaves beside the batches
                if getattr(loader, "prefetch_rows", None) is not None:
                    loader.prefetch_rows = ahead
        time_loader(out["train"], self.timers)
        if self.config.gpu_cache:
            self.device_cache = self._device_cache(out["train"].features)
            for loader in out.values():
                loader.features.device_cache = self.device_cache
        return out

    def _device_cache(self, store: Any) -> Any:
        """``--gpu-cache``: the rows of ``x`` this rank's partitions draw most, in device memory."""
        from sampling.loader.gpu_cache import DeviceRowCache

        target = getattr(self.task, "target", None)
        cache = DeviceRowCache.hottest(self.dataset, store, self.parts, parse_size(self.config.gpu_cache, "--gpu-cache"),
                                       self.world.device, node_type=target)
        if self.world.rank == 0:
            logger.warning("--gpu-cache: %d rows of x (%.1f MB) on %s", len(cache.ids), cache.nbytes / 1e6,
                           self.world.device)
        return cache

    def to_device(self, batch: Any) -> Any:
        """``batch`` on this rank's device (already there when a DeviceFeeder brought it), its cached
        feature rows filled in from the device cache."""
        batch = batch.to(self.world.device)
        return self.device_cache.assemble(batch) if self.device_cache is not None else batch

    def _model(self, batch: Any) -> torch.nn.Module:
        model = self.task.model().to(self.world.device)
        with torch.no_grad():  # materialise lazy parameters (to_hetero, -1 input sizes) before DDP
            self.task.step(model, self.to_device(batch))
        return model

    # -- the job --

    def run(self) -> list[dict[str, Any]]:
        """Join the job, train, and leave it (bounded, also after a failure); the epochs' records."""
        self.session.start()
        failure: BaseException | None = None
        try:
            return self._train()
        except Exception as exc:
            failure = self.session.explain(exc)
            if failure is exc:
                raise
            raise failure from exc
        finally:
            if self.board is not None:
                self.board.close()
            self.session.close(failure)

    def _train(self) -> list[dict[str, Any]]:
        c = self.config
        self.task = make_task(self)
        loaders = self._loaders()
        model, ddp, optimizer = self._build(loaders["train"])
        first, start, history, totals = self._resume(model, optimizer) if model is not None else (0, 0, [], None)
        where = first * 2**32 + start
        if _agree_max(where) != where or -_agree_max(-where) != where:
            raise InvalidInputError(
                f"--resume: ranks found different checkpoints in {c.checkpoint_dir} (rank {self.world.rank} would "
                f"start at epoch {first + 1}); --checkpoint-dir must be one path every rank sees (shared storage)")
        steps = _agree_max(len(loaders["train"]))
        plan = evaluation.EvalPlan(c.eval_every, c.eval_max_batches, c.epochs)
        for epoch in range(first, c.epochs):
            resume = (start, totals) if epoch == first else (0, None)
            try:
                history.append(self._run_epoch(epoch, loaders, steps, (model, ddp, optimizer), plan, resume, history))
            except preempt.Stopped as stopped:
                self.stopped = stopped
                return history
            self._after_epoch(epoch, model, optimizer, history)
            if epoch + 1 < c.epochs and preempt.agreed(self._cpu_group):  # asked during evaluation: epoch saved
                self.stopped = preempt.Stopped(epoch + 1, 0, self._checkpoint_path(epoch))
                return history
        if c.infer_out:
            write_outputs(self, model)
        return history

    def _identity(self) -> dict[str, Any]:
        """What a checkpoint of this job records of it, compared by ``--resume`` before any rank starts."""
        if not hasattr(self, "_job_identity"):
            self._job_identity = resume.identity(self.config, self.dataset, self.world.world_size)
        return self._job_identity

    def _checkpoint_path(self, epoch: int, step: int | None = None) -> str | None:
        """Where rank 0 wrote the checkpoint of ``epoch`` (and ``step``); ``None`` without --checkpoint-dir."""
        d = self.config.checkpoint_dir
        return os.path.join(d, checkpoint.file_name(epoch, step)) if d else None

    def _build(self, loader: Any) -> tuple[Any, Any, Any]:
        """The model, its DDP wrapper and the optimizer (``None`` each with ``--loader-only``), built on
        one batch; that batch (and numba's compilation on it) is charged to no epoch."""
        c, world = self.config, self.world
        _seed_everything(c.seed)  # the initial weights follow --seed (DDP then copies rank 0's to all)
        batch = first_batch(loader)
        if c.loader_only:
            return None, None, None
        model = self._model(batch)
        ddp = torch.nn.parallel.DistributedDataParallel(  # to_hetero models leave non-target outputs unused
            model, device_ids=[world.local_rank] if world.use_cuda else None,
            find_unused_parameters=self.dataset.is_hetero)
        ddp.register_comm_hook(None, timed_allreduce_hook(self.timers, self.bytes))
        return model, ddp, torch.optim.Adam(ddp.parameters(), lr=c.lr)

    def _run_epoch(self, epoch: int, loaders: dict[str, Any], steps: int, built: tuple[Any, Any, Any],
                   plan: evaluation.EvalPlan, resume: tuple[int, Any] = (0, None),
                   history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One epoch's training (or loader-only pass) from step ``resume[0]`` (with the loss and accuracy
        sums of the steps before, ``resume[1]``), its evaluation when due, and its record."""
        c, (model, ddp, optimizer) = self.config, built
        _seed_everything(c.seed * 100_003 + epoch * 1009 + self.world.rank)
        restart_streams(loaders, epoch, c.seed, self.world.rank)
        for counter in (self.timers, self.stats, self.transport.wire, self.bytes, self.features, self.device_cache):
            if counter is not None:
                counter.snapshot(reset=True)  # the model-building batch (and anything before) is no epoch's
        allocator.release_freed()  # what the last epoch freed goes back: an epoch's peak is its own
        self.peak.reset()
        compiled_before = jitcache.compile_counts()
        process_groups.set_stage("training")
        start_time = time.perf_counter()
        if ddp is None:
            record = self._loader_epoch(loaders["train"], steps, epoch)
        else:
            record = dict(zip(("loss", "train_acc"), self._epoch(ddp, optimizer, loaders["train"], steps, epoch,
                                                                 resume, history or [])))
        record = {"epoch": epoch + 1, **record, "train_seconds": round(time.perf_counter() - start_time, 3)}
        record["remote"] = self.stats.snapshot(reset=True)  # training steps only
        if self.device_cache is not None:  # training steps only: rows of every batch, hits and misses, all ranks
            snap = self.device_cache.snapshot(reset=True)
            counts = torch.tensor([snap["hits"], snap["misses"]], dtype=torch.float64)
            dist.all_reduce(counts)
            record["gpu_cache"] = {**snap, "hits": int(counts[0]), "misses": int(counts[1])}
        if self.features is not None:  # training steps only, all ranks
            record["features"] = self.features.epoch_record(self._cpu_group)
        record["wire"] = wire_record(self.transport.wire.snapshot(reset=True), self.bytes.snapshot())
        record["timing"] = {**self.timers.snapshot(), "remote_wait": record["remote"].pop("wait_seconds")}
        process_groups.set_stage("evaluation")
        kind = plan.kind(epoch) if model is not None else None
        record.update(evaluation.evaluate(self.task, model, loaders, kind, c.eval_max_batches))
        if kind is None and model is not None:
            record["next_evaluation"] = plan.next_after(epoch)
        record["epoch_seconds"] = round(time.perf_counter() - start_time, 3)
        record["remote_eval"] = self.stats.snapshot(reset=True)
        record["wire_eval"] = wire.totals(self.transport.wire.snapshot(reset=True))  # this rank's
        self.timers.snapshot()  # evaluation's sampling/feature time is not part of the training breakdown
        record["steps"] = steps
        record["memory_mb"] = memory_per_rank(self.dataset, self.peak)
        record["kernels_compiled"] = compiled_per_rank(compiled_before)
        record["allocator"] = allocator.name()  # what the memory figures were measured under
        return _per_step(reduce_record(record))

    def _epoch(self, ddp: torch.nn.Module, optimizer: Any, loader: Any, steps: int, epoch: int,
               resume: tuple[int, Any], history: list[dict[str, Any]]) -> tuple[float, float]:
        """Steps ``resume[0]`` to ``steps`` of the epoch. Dropout draws from a stream of each step's own,
        so a run resumed at a step goes on as an uninterrupted one does. At every step boundary the ranks
        agree whether to stop (SIGTERM) and save a checkpoint there, or every ``--checkpoint-every``."""
        laps = Laps(self.timers)  # the foreground parts, back to back from here: they add up to the epoch
        ddp.train()
        start, saved = resume
        totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, seen
        if saved is not None and self.world.rank == 0:  # the sums of the steps before, every rank's
            totals += saved
        bar = _bar(self.world.rank == 0 and self.config.progress, steps, f"epoch {epoch + 1}/{self.config.epochs}")
        bar.update(start)
        batches = DeviceFeeder(cycle(loader, steps, start), self.world.device)  # on CUDA: copied a step ahead
        try:
            for step in range(start, steps):
                if step > start:  # the ranks agree whether to stop (SIGTERM), or save
                    self._step_boundary(epoch, step, steps, ddp.module, optimizer, totals, history)
                    laps.mark("step_sync")
                batch = self.to_device(next(batches))
                laps.mark("data_wait")  # the first step's also starts the prefetcher
                torch.manual_seed(mix(self.config.seed, epoch, step, self.world.rank))
                laps.mark("step_sync")  # after the batch: a pass's start draws from the global generator
                optimizer.zero_grad()
                loss, correct, seen = self.task.step(ddp, batch)
                loss.backward()
                loss_sum = float(loss.detach()) * seen  # on CUDA this waits for backward: its time is here
                laps.mark("forward_backward")
                optimizer.step()
                totals += torch.tensor([loss_sum, correct, seen], dtype=torch.float64)
                bar.update(1)
                laps.mark("optimizer")
        finally:  # the prefetcher's last batch
            batches.close()
            bar.close()
            laps.mark("epoch_end")
        dist.all_reduce(totals)
        laps.mark("epoch_end")  # waiting for the slowest rank
        return round(float(totals[0] / max(totals[2], 1)), 5), round(float(totals[1] / max(totals[2], 1)), 5)

    def _step_boundary(self, epoch: int, step: int, steps: int, model: torch.nn.Module, optimizer: Any,
                       totals: torch.Tensor, history: list[dict[str, Any]]) -> None:
        """Before step ``step``: a checkpoint when due (``--checkpoint-every``) or asked for (SIGTERM, any
        rank), and :class:`preempt.Stopped` raised on every rank in the second case."""
        c = self.config
        stop = preempt.agreed(self._cpu_group)
        every = c.checkpoint_every  # counted over the run's steps: epoch e's step s is step e * steps + s
        due = bool(c.checkpoint_dir) and (stop or bool(every and (epoch * steps + step) % every == 0))
        path = None
        if due:
            with self.timers.time("checkpoint"):
                done = totals.clone()
                dist.all_reduce(done)  # the loss and accuracy sums so far, over every rank
                if self.world.rank == 0:
                    path = checkpoint.save(c.checkpoint_dir, epoch, model, optimizer,
                                           {"history": history, "totals": done}, step=step, identity=self._identity())
                dist.barrier(group=self._cpu_group)  # written before any rank goes on (or stops)
        if stop:
            raise preempt.Stopped(epoch, step, path or self._checkpoint_path(epoch, step))

    def _loader_epoch(self, loader: Any, steps: int, epoch: int) -> dict[str, Any]:
        """``--loader-only``: the epoch's batches taken as fast as the loader makes them, no model: the
        rate at which this rank could feed a model (``loader_batches_per_s``, every rank's)."""
        laps = Laps(self.timers)  # from the epoch's start, as in _epoch
        bar = _bar(self.world.rank == 0 and self.config.progress, steps, f"loader {epoch + 1}/{self.config.epochs}")
        batches = DeviceFeeder(cycle(loader, steps), self.world.device)
        started = time.perf_counter()
        for _ in range(steps):
            self.to_device(next(batches))
            bar.update(1)
            laps.mark("data_wait")
        rate = steps / max(time.perf_counter() - started, 1e-9)
        batches.close()  # the prefetcher's last batch, then waiting for the slowest rank
        bar.close()
        dist.barrier()
        laps.mark("epoch_end")
        return {"loader_batches_per_s": gather_floats(rate)}

    def _resume(self, model: torch.nn.Module, optimizer: Any) -> tuple[int, int, list[dict[str, Any]], Any]:
        """Where to go on (epoch, step), the history so far, and the sums of the epoch's steps before."""
        c = self.config
        if not (c.resume and c.checkpoint_dir):
            return 0, 0, [], None
        state = checkpoint.load_latest(c.checkpoint_dir)
        if state is None:
            logger.warning("--resume: no checkpoint in %s; starting at epoch 1", c.checkpoint_dir)
            return 0, 0, [], None
        first, step = checkpoint.restore(state, model, optimizer, lr=c.lr)
        if self.world.rank == 0:
            logger.warning("resumed from %s at epoch %d%s", c.checkpoint_dir, first + 1,
                           f", step {step + 1}" if step else "")
        return first, step, list(state["extra"].get("history", [])), state["extra"].get("totals")

    def _after_epoch(self, epoch: int, model: torch.nn.Module, optimizer: Any, history: list[dict]) -> None:
        c = self.config
        if self.world.rank == 0:
            if self.on_epoch is not None:
                self.on_epoch(history[-1], c.epochs)
            if self.board is not None:
                self.board.write(history[-1])
            if c.checkpoint_dir:
                checkpoint.save(c.checkpoint_dir, epoch, model, optimizer, {"history": history},
                                identity=self._identity())
            if c.metrics_out:
                config = {**asdict(c), "storage_options": sorted(c.storage_options)}  # keys only: no secrets
                write_json(c.metrics_out, {"config": config, "world_size": self.world.world_size,
                                           "num_parts": self.dataset.num_parts, "timing_parts": LEGEND,
                                           "threads": asdict(self.threads), "epochs": history})
        dist.barrier()


def _agree_max(value: int) -> int:
    """All ranks take the largest step count: ranks with fewer batches cycle their seeds (no hang)."""
    t = torch.tensor(value)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def _bar(enabled: bool, total: int, desc: str) -> Any:
    from tqdm import tqdm

    import sys

    tty = sys.stderr.isatty() or os.environ.get("GRAPHSTORE_STDERR_TTY") == "1"  # relayed by the launcher
    return tqdm(total=total, desc=desc, unit="batch", disable=not enabled or not tty, leave=False)


def _per_step(record: dict[str, Any]) -> dict[str, Any]:
    """Adds ``per_step``: seconds per training step waiting for data and computing (forward, backward,
    optimizer), per-rank means."""
    t, steps = record["timing"], max(1, record["steps"])
    compute = t.get("forward_backward", 0.0) + t.get("optimizer", 0.0)
    return {**record, "per_step": {"data_wait": round(t.get("data_wait", 0.0) / steps, 4),
                                   "compute": round(compute / steps, 4)}}
