"""A process that forks its sampler processes at its start (``prefork``), then builds a loader with two
workers and one without, then (threads running by now) one with a worker of its own, from the fork server:
prints what it saw as JSON (argv: the dataset's path), then dies by SIGKILL, closing nothing."""

import json
import os
import signal
import sys

import psutil

import torch

from sampling.loader import sampler_processes


def main() -> None:
    forked = sampler_processes.prefork(2)  # first: no thread runs yet

    import graphstore
    from sampling.distributed.dist_loader import DistributedNeighborLoader
    from tests.sampling.test_loader_threads import _group, _view

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
    late = DistributedNeighborLoader(ds, [4, 3], _group(ds)[0], torch.arange(0, 120), batch_size=15, seed=3,
                                     shuffle=True, num_workers=1)
    late.sampler.generator = torch.Generator().manual_seed(0)
    late_batches = [_view(b) for b in late]
    worker = late._pool._workers[0]
    server = psutil.Process(worker.process.pid).ppid()
    seen["late"] = {"forked_at_start": worker.forked, "server_is_this_process": server == os.getpid(),
                    "server_is_a_child": psutil.Process(server).ppid() == os.getpid(),
                    "same_batches": late_batches == passes[1], "pids": [worker.process.pid, server]}
    print(json.dumps(seen), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the rank dies without closing its loaders: nothing may outlive it


if __name__ == "__main__":  # a worker from the fork server imports this module again: only the rank runs it
    main()
