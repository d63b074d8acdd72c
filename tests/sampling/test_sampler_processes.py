"""Sampler processes beside a rank (``num_workers=N`` of the distributed loaders): the same batches as the
rank's own threads, remote calls relayed through the rank, a dead worker named."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import psutil
import pytest
import torch

from graphstore.errors import GraphstoreError, InvalidInputError
from sampling.distributed.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader
from sampling.loader.sampler_processes import SamplerProcessLost, late_context
from tests.conftest import running
from tests.sampling.test_loader_threads import _group, _view

pytestmark = pytest.mark.slow


def test_sampler_processes_give_the_batches_of_the_ranks_own_threads(graphs):
    g = graphs["dataset3"]
    runs, requests = [], []
    for workers in (0, 2):
        transport = _group(g.data)[0]
        node = DistributedNeighborLoader(g.data, [4, 3], transport, torch.arange(0, 120), batch_size=15, seed=3,
                                         shuffle=True, num_workers=workers)
        link = DistributedLinkNeighborLoader(g.data, [3, 2], transport, batch_size=50, seed=4, shuffle=True,
                                             neg_sampling=dict(mode="binary", amount=1), num_workers=workers)
        for loader in (node, link):
            loader.sampler.generator = torch.Generator().manual_seed(0)
        passes = [[_view(b) for b in loader] for loader in (node, link, node)]  # two passes of the node loader
        for b in node:
            assert np.allclose(b.x.numpy(), g.x[b.n_id.numpy()])  # remote rows, relayed, are the right rows
        runs.append(passes)
        requests.append(node.stats.snapshot()["requests"])
        if workers:
            assert transport.calls > 0 and node._pool.alive() == 2
            # this process runs threads, so the workers come from the fork server, not from a fork of it (or are
            # spawned: its children, where GRAPHSTORE_FORK_RANKS=0 asks for fresh interpreters)
            parents = {psutil.Process(w.process.pid).ppid() for w in (*node._pool._workers, *link._pool._workers)}
            spawned = late_context().get_start_method() == "spawn"
            assert len(parents) == 1 and (os.getpid() in parents) == spawned, parents
            node._pool.close()
            link._pool.close()
    assert runs[0] == runs[1] and len(runs[0][0]) == 8 and runs[0][0] != runs[0][2]
    assert requests[1] == requests[0] > 0  # the workers' remote requests are counted in the rank's stats


def test_late_sampler_processes_come_from_the_fork_server_unless_fresh_interpreters_are_asked_for():
    assert late_context({}).get_start_method() == "forkserver"
    assert late_context({"GRAPHSTORE_FORK_RANKS": "1"}).get_start_method() == "forkserver"
    assert late_context({"GRAPHSTORE_FORK_RANKS": "0"}).get_start_method() == "spawn"
    with pytest.raises(GraphstoreError, match=r"GRAPHSTORE_FORK_RANKS='yes': set it to 1 .* or 0 "):
        late_context({"GRAPHSTORE_FORK_RANKS": "yes"})  # the launcher's reading: not a fork server by default


def test_sampler_processes_forked_at_the_start_or_by_the_fork_server_give_the_same_batches_and_die_with_the_rank(graphs):
    import json
    import subprocess
    import sys

    from tests.training.conftest import ROOT

    done = subprocess.run([sys.executable, "-m", "tests.sampling.prefork_probe", str(graphs["dataset3"].data.url)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -signal.SIGKILL, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["forked"] == 2 and seen["again"] == 0
    assert seen["workers_forked"] == [True, True] and seen["worker_parents_are_this_process"]
    assert seen["comm"] == ["gs-sampler-0-0", "gs-sampler-0-1"]
    assert seen["same_batches"], "the forked workers' batches are the rank's own threads'"
    # a worker wanted once threads run comes from the fork server (a child of the rank), with the same batches
    late = seen["late"]
    assert not late["forked_at_start"] and not late["server_is_this_process"] and late["server_is_a_child"], late
    assert late["same_batches"]
    deadline = time.monotonic() + 15  # the rank died by SIGKILL: its fork server and that worker follow it
    while running(late["pids"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(late["pids"]), "a sampler process or the fork server outlived its rank"


def test_a_sampler_process_that_dies_is_named(graphs):
    g = graphs["dataset3"]
    loader = DistributedNeighborLoader(g.data, [4, 3], _group(g.data)[0], torch.arange(0, 120), batch_size=15,
                                       seed=3, num_workers=1)
    it = iter(loader)
    next(it)
    os.kill(loader._pool._workers[0].process.pid, signal.SIGKILL)
    with pytest.raises(SamplerProcessLost, match=r"sampler process 0 of rank 0 \(pid \d+\) died \(signal 9\)"):
        list(it)
    loader._pool.close()


@pytest.mark.parametrize("kwargs, words", [
    (dict(num_workers=-1), "num_workers=-1"),
    (dict(num_workers=2, loader_threads=2), "give one"),
    (dict(num_workers=2, persistent_workers=True), "persistent_workers is torch's worker option"),
])
def test_bad_worker_options_are_refused_by_name(graphs, kwargs, words):
    g = graphs["dataset3"]
    with pytest.raises(InvalidInputError, match=words):
        DistributedNeighborLoader(g.data, [4], _group(g.data)[0], torch.arange(10), batch_size=5, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_host_batches_from_sampler_processes_come_pinned(graphs):
    from sampling.loader.device_feed import is_pinned

    g = graphs["dataset3"]
    transport = _group(g.data)[0]
    kw = dict(batch_size=15, seed=3, shuffle=True, pin_memory=True)
    threads, loader = (DistributedNeighborLoader(g.data, [3, 3], transport, torch.arange(0, 60), num_workers=n, **kw)
                       for n in (0, 1))
    for one in (threads, loader):
        one.sampler.generator = torch.Generator().manual_seed(0)
    want = [_view(b) for b in threads]
    batches = list(loader)
    loader._pool.close()
    assert len(batches) == 4 and all(is_pinned(b) for b in batches), "the rank's loader threads pin each batch"
    assert [_view(b) for b in batches] == want
