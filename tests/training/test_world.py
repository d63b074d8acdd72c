"""Rank facts from torchrun's, SLURM's and our launcher's environments."""

from __future__ import annotations

import pytest

from graphstore.errors import InvalidInputError
from graphstore.dataset.rank_layout import RankLayout
from training.cluster.world import World, _first_slurm_host


def test_torchrun_environment():
    w = World.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node0",
                        "MASTER_PORT": "29500"}, use_cuda=False)
    assert (w.rank, w.world_size, w.local_rank, w.init_method, w.master_addr) == (3, 4, 1, "env://", "node0")
    assert w.backend == "gloo" and str(w.device) == "cpu"


def test_cuda_pins_the_local_rank_and_mixes_backends():
    w = World.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_PORT": "1"}, use_cuda=True)
    assert str(w.device) == "cuda:1" and w.backend == "cpu:gloo,cuda:nccl"


def test_slurm_environment():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[07-10]",
           "SLURM_JOB_ID": "1234"}
    w = World.from_env(env, use_cuda=False)
    assert (w.rank, w.world_size, w.local_rank) == (5, 8, 1)
    assert w.init_method.startswith("tcp://gpu07:")


def test_our_launcher_environment_and_none():
    w = World.from_env({"GRAPHSTORE_RANK": "1", "GRAPHSTORE_WORLD_SIZE": "2",
                        "GRAPHSTORE_INIT_METHOD": "file:///tmp/x"}, use_cuda=False)
    assert (w.rank, w.world_size, w.init_method) == (1, 2, "file:///tmp/x")
    assert World.from_env({}, use_cuda=False) is None
    assert World.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, use_cuda=False) is None  # one task: launch


def test_bad_worlds_are_named():
    with pytest.raises(InvalidInputError, match="MASTER_PORT"):
        World.from_env({"RANK": "0", "WORLD_SIZE": "2"}, use_cuda=False)
    with pytest.raises(InvalidInputError, match="outside world size"):
        World(rank=2, world_size=2, local_rank=0, init_method="file:///x")
    with pytest.raises(InvalidInputError, match="must be >= 1"):
        RankLayout(num_parts=2, world_size=0)


def test_rank_layout_groups_consecutive_ranks():
    layout = RankLayout(num_parts=2, world_size=4)
    assert [layout.part_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert list(layout.ranks_of(1)) == [2, 3]
    assert {layout.server(1, caller) for caller in range(4)} == {2, 3}  # callers spread over the owners


def test_first_slurm_host_without_scontrol():
    assert _first_slurm_host("node[01-04],gpu7") == "node01"
    assert _first_slurm_host("solo") == "solo"
