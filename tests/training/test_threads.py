"""Threads per rank: the usable cores shared among a host's ranks, SLURM's share, and the --threads override."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.training.conftest import ROOT
from training.cluster.threads import choose, usable_cores
from training.cluster.world import World


@pytest.mark.parametrize("cores,ranks,threads", [(8, 2, 4), (8, 3, 2), (2, 2, 1), (2, 4, 1), (16, 1, 16)])
def test_cores_divided_among_the_ranks_of_a_host(cores, ranks, threads):
    choice = choose(None, ranks, env={}, cores=cores)
    assert (choice.threads, choice.source) == (threads, "cores / local ranks")
    assert f"{cores} usable cores / {ranks} ranks" in choice.describe()


def test_override_and_slurm_share_win_and_omp_num_threads_does_not():
    assert choose(3, 2, env={"SLURM_CPUS_PER_TASK": "6"}, cores=8).threads == 3  # --threads wins over all
    slurm = choose(None, 2, env={"SLURM_CPUS_PER_TASK": "6"}, cores=8)
    assert (slurm.threads, slurm.source) == (6, "SLURM_CPUS_PER_TASK")
    assert choose(None, 2, env={"OMP_NUM_THREADS": "1"}, cores=8).threads == 4  # torchrun's blanket 1 is ignored


def test_usable_cores_follow_a_cgroup_quota(tmp_path):
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")  # 1.5 CPUs
    affinity = len(os.sched_getaffinity(0))
    assert usable_cores(str(quota)) == min(affinity, 2)
    quota.write_text("max 100000\n")
    assert usable_cores(str(quota)) == affinity
    assert usable_cores(str(tmp_path / "absent")) == affinity


def test_local_ranks_from_each_launcher():
    ours = World.from_env({"GRAPHSTORE_RANK": "0", "GRAPHSTORE_WORLD_SIZE": "3",
                           "GRAPHSTORE_INIT_METHOD": "file:///tmp/x"}, use_cuda=False)
    torchrun = World.from_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                               "MASTER_PORT": "1"}, use_cuda=False)
    slurm = World.from_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)",
                            "SLURM_JOB_NODELIST": "n1", "MASTER_ADDR": "n1"}, use_cuda=False)
    assert (ours.local_world_size, torchrun.local_world_size, slurm.local_world_size) == (3, 4, 2)


def test_a_rank_applies_its_choice():
    """In a fresh process (torch's thread count is process-wide): the choice becomes torch's."""
    code = ("import torch; from training.cluster.threads import choose, apply; apply(choose(None, 1, env={}, cores=3)); "
            "print(torch.get_num_threads()); apply(choose(2, 1)); print(torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, check=True)
    assert out.stdout.split() == ["3", "2"]


def test_loader_threads_default_to_the_ranks_share_and_reach_the_loaders():
    from types import SimpleNamespace

    from graphstore.errors import InvalidInputError
    from training.config import TrainConfig
    from training.launch import _parser, config_from_args
    from training.loop.tasks import _loader_options
    from training.cluster.threads import loader_threads

    assert loader_threads(None, 2, env={}, cores=8) == 4 and loader_threads(None, 4, env={}, cores=2) == 1
    assert loader_threads(3, 2, env={}, cores=8) == 3  # --loader-threads wins
    assert config_from_args(_parser().parse_args(["/data/x", "--loader-threads", "3"])).loader_threads == 3
    with pytest.raises(InvalidInputError, match="--loader-threads"):
        TrainConfig(dataset="/data/x", loader_threads=0)
    world = SimpleNamespace(rank=0, local_world_size=1, use_cuda=False)
    host = SimpleNamespace(config=TrainConfig(dataset="/data/x", loader_threads=2), layout=None, stats=None, world=world)
    assert _loader_options(host, "train")["loader_threads"] == 2
    host.config = TrainConfig(dataset="/data/x")
    assert _loader_options(host, "train")["loader_threads"] == choose(None, 1).threads
