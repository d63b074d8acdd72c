"""Where ingest stages run: in this process (:class:`LocalEngine`) or on a Dask cluster (:class:`DaskEngine`).

A stage is a pure function applied to a list of items (chunks, parts); an engine only decides
where each call runs. Shared inputs (a partition map, say) are passed as keyword arguments:
the Dask engine sends each once, as a task of its own, instead of once per task.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from graphstore.heap import release_freed
from graphstore.errors import GraphstoreError, IngestStageError, InvalidInputError, MissingBackendError
from graphstore.ingest.budget import Budget, dask_budget, local_budget
from graphstore.ingest.chunks import forget_process_caches

logger = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]
ENGINES = ("local", "dask")


class Engine(Protocol):
    """Runs ``fn(item, **shared)`` for every item of one stage and returns the results in item order."""

    name: str

    def map(self, stage: str, fn: Callable[..., Any], items: Sequence[Any], progress: Progress | None = None,
            weights: Sequence[int] | None = None, **shared: Any) -> list[Any]: ...

    def budget(self) -> Budget: ...


def release_stage_memory() -> None:
    """What every process that ran a stage drops after it: the source's per-process tables (rebuilt by the
    next stage that reads the source) and the heap freed during the stage, which glibc keeps unless asked.
    Per-node arrays of one stage (coarsening levels, say) are then gone by the next."""
    forget_process_caches()
    release_freed()


def _tick(progress: Progress | None, stage: str, index: int, weights: Sequence[int] | None, count: int) -> None:
    """Report item ``index`` done: its weight (edges, rows) of the stage's total, or 1 of ``count``."""
    if progress:
        progress(stage, weights[index] if weights else 1, sum(weights) if weights else count)


class LocalEngine:
    """The trivial serial executor: every stage runs here, in item order."""

    name = "local"

    def map(self, stage: str, fn: Callable[..., Any], items: Sequence[Any], progress: Progress | None = None,
            weights: Sequence[int] | None = None, **shared: Any) -> list[Any]:
        out, started = [], time.perf_counter()
        release_freed()  # what this process freed preparing the stage (see release_stage_memory)
        for index, item in enumerate(items):
            out.append(fn(item, **shared))
            _tick(progress, stage, index, weights, len(items))
        release_stage_memory()
        logger.debug("ingest stage %s: %d task(s) in %.2f s", stage, len(items), time.perf_counter() - started)
        return out

    def budget(self) -> Budget:
        """Half of the memory this machine has available now (tasks run one at a time, here)."""
        return local_budget()


class _Shared:
    """One shared input, held whole by one task's result and passed to every task of a stage."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _call(fn: Callable[..., Any], item: Any, **shared: _Shared) -> Any:
    return fn(item, **{k: v.value for k, v in shared.items()})


class DaskEngine:
    """Submits each stage's calls to a ``distributed.Client``; a task whose worker dies is retried.

    A task that still fails (its worker died more often than the scheduler allows, or it raised)
    ends the stage with :class:`IngestStageError` naming the stage, the item and the worker.
    """

    name = "dask"

    def __init__(self, client: Any, retries: int = 1) -> None:
        try:
            from distributed import Client
        except ImportError as exc:  # pragma: no cover - dask is a declared extra
            raise MissingBackendError("--engine dask needs distributed: pip install 'graphstore[dask]'") from exc
        if not isinstance(client, Client):
            raise InvalidInputError(f"client={client!r} is not a distributed.Client; pass "
                                    "distributed.Client(...) or use engine='local'")
        self.client, self.retries = client, retries
        # shared inputs of a few MB (one value per node) are expected, and the client warns about them from
        # its event-loop thread, where a catch_warnings() around submit() does not reach: filter the message
        warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning,
                                module="distributed.client")

    def map(self, stage: str, fn: Callable[..., Any], items: Sequence[Any], progress: Progress | None = None,
            weights: Sequence[int] | None = None, **shared: Any) -> list[Any]:
        from distributed import as_completed

        token = uuid.uuid4().hex[:8]
        release_freed()  # what the client freed preparing the stage: not held while the workers run it
        # one task per shared input (not scatter): a result lost with its worker is recomputed
        scattered = {k: self.client.submit(_Shared, v, key=f"shared-{stage}-{k}-{token}", pure=False)
                     for k, v in shared.items()}
        logger.info("ingest stage %s: %d task(s) on the Dask cluster at %s", stage, len(items),
                    self.client.scheduler.address)
        futures = [self.client.submit(_call, fn, item, **scattered, key=f"{stage}-{token}-{i}", retries=self.retries,
                                      pure=False) for i, item in enumerate(items)]
        started = time.perf_counter()
        try:
            for future in as_completed(futures):
                if future.status != "finished":
                    self._raise(stage, futures.index(future), future)
                _tick(progress, stage, futures.index(future), weights, len(items))
            out = self.client.gather(futures)
            logger.debug("ingest stage %s: %d task(s) in %.2f s", stage, len(items), time.perf_counter() - started)
            return out
        finally:
            self.client.cancel(futures + list(scattered.values()))
            release_stage_memory()  # here, and on every worker (one that died meanwhile is skipped)
            with contextlib.suppress(Exception):
                self.client.run(release_stage_memory, on_error="ignore")

    def budget(self) -> Budget:
        """From the smallest ``memory_limit`` of the cluster's workers."""
        return dask_budget(self.client)

    def _raise(self, stage: str, index: int, future: Any) -> None:
        """Wait for a future that did not finish cleanly; raise what ended it, named (a lost result that
        the scheduler recomputes returns normally)."""
        from distributed import KilledWorker

        try:
            future.result()
        except KilledWorker as exc:
            worker = getattr(exc.last_worker, "address", exc.last_worker)
            raise IngestStageError(f"ingest stage {stage!r}, task {index}: worker {worker} died while running it "
                                   f"(retried {self.retries} time(s)); give the workers more memory "
                                   "(--memory-limit) or rerun") from exc
        except GraphstoreError:
            raise  # bad input found by a worker: the same error the local engine raises
        except Exception as exc:
            raise IngestStageError(f"ingest stage {stage!r}, task {index} failed on a worker: "
                                   f"{type(exc).__name__}: {exc}") from exc

def engine_for(engine: str, client: Any = None) -> Engine:
    """The engine ``ingest(engine=..., client=...)`` asked for, validated before any work starts."""
    if engine not in ENGINES:
        raise InvalidInputError(f"engine={engine!r} is not one of {ENGINES}; pass --engine local|dask")
    if engine == "local":
        if client is not None:
            raise InvalidInputError("client= is given but engine='local' runs in this process; pass "
                                    "engine='dask' to use the client, or drop client")
        return LocalEngine()
    if client is None:
        raise InvalidInputError("engine='dask' needs client=distributed.Client(...) (the CLI starts a "
                                "LocalCluster for --engine dask); or use engine='local'")
    return DaskEngine(client)
