"""A process that forks its sampler processes at its start (``prefork``), then builds a loader with two
workers and one without: prints what it saw as JSON (argv: the dataset's path)."""

import json
import os
import sys

import psutil

import torch

from sampling.loader import sampler_processes

forked = sampler_processes.prefork(2)  # first: no thread runs yet

import graphstore  # noqa: E402
from sampling.distributed.dist_loader import DistributedNeighborLoader  # noqa: E402
from tests.sampling.test_loader_threads import _group, _view  # noqa: E402

ds = graphstore.open_dataset(sys.argv[1])
again = sampler_processes.prefork(2)  # two wait already: none more
passes = []
for workers in (2, 0):
    loader = DistributedNeighborLoader(ds, [4, 3], _group(ds)[0], torch.arange(0, 120), batch_size=15, seed=3,
                                       shuffle=True, num_workers=workers)
    loader.sampler.generator = torch.Generator().manual_seed(0)
    passes.append([_view(b) for b in loader])
    if workers:
        pool = loader._pool._workers
        seen = {"forked": forked, "again": again, "workers_forked": [w.forked for w in pool],
                "worker_parents_are_this_process": all(psutil.Process(w.process.pid).ppid() == os.getpid()
                                                       for w in pool),
                "comm": [open(f"/proc/{w.process.pid}/comm").read().strip() for w in pool]}
        loader._pool.close()
seen["same_batches"] = passes[0] == passes[1] and len(passes[0]) == 8
print(json.dumps(seen))
