"""Placement: ranks on the host's devices, any rank count over any partition count, refused at the door."""

from __future__ import annotations

import pytest

from graphstore.errors import InvalidInputError
from graphstore.dataset.rank_layout import RankLayout
from training.launcher import placement

# (partitions, ranks, each rank's partitions, each partition's ranks)
LAYOUTS = [
    (4, 1, [(0, 1, 2, 3)], [[0], [0], [0], [0]]),
    (4, 2, [(0, 1), (2, 3)], [[0], [0], [1], [1]]),
    (4, 3, [(0,), (1,), (2, 3)], [[0], [1], [2], [2]]),
    (2, 3, [(0,), (1,), (1,)], [[0], [1, 2]]),
    (2, 4, [(0,), (0,), (1,), (1,)], [[0, 1], [2, 3]]),
]


@pytest.mark.parametrize("parts,ranks,owns,served_by", LAYOUTS)
def test_any_rank_count_over_any_partition_count(parts, ranks, owns, served_by):
    layout = RankLayout(parts, ranks)
    assert [layout.parts_of(r) for r in range(ranks)] == owns
    assert [list(layout.ranks_of(p)) for p in range(parts)] == served_by
    for p in range(parts):  # every caller is answered by a rank serving the partition
        assert {layout.server(p, c) for c in range(ranks)} <= set(layout.ranks_of(p))
        assert sorted(layout.share(r, p) for r in layout.ranks_of(p)) == [(i, len(served_by[p]))
                                                                          for i in range(len(served_by[p]))]


# (--device, GPUs on the host, --nproc, partitions) -> local ranks, or the words of the refusal
PLACEMENTS = [
    ("auto", 1, None, 2, 1),  # one GPU, a 2-partition dataset: one rank owning both partitions
    ("auto", 0, None, 2, 2),  # no GPU: one CPU rank per partition, as before
    ("cpu", 4, 3, 2, 3),  # CPU ranks need no GPU each
    ("cuda", 2, 4, 2, "give --nproc 2 or fewer"),  # 2 GPUs and 4 ranks under nccl
    ("cuda", 2, None, 8, 2),  # 8 partitions on 2 GPUs: 2 ranks, 4 partitions each
    ("cuda", 0, None, 2, "no CUDA device"),
]


@pytest.mark.parametrize("device,gpus,nproc,parts,want", PLACEMENTS)
def test_local_ranks_fit_the_host(device, gpus, nproc, parts, want):
    def place():
        return placement.local_ranks(nproc, parts, placement.use_cuda(device, gpus), gpus)

    if isinstance(want, str):
        with pytest.raises(InvalidInputError, match=want):
            place()
    else:
        assert place() == want


def test_torchrun_local_rank_1_on_a_one_gpu_host_is_refused():
    from training.cluster.world import World

    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "29500"}
    world = World.from_env(env, use_cuda=True)
    assert world.device.index == 1
    with pytest.raises(InvalidInputError, match="local rank 1 has no GPU: this host has 1"):
        placement.check_local_rank(world.local_rank, True, gpus=1)
    placement.check_local_rank(0, True, gpus=1)
    placement.check_local_rank(1, False, gpus=0)  # --device cpu: no GPU needed


def test_device_cuda_without_cuda_ends_before_any_rank(tmp_path, capsys, monkeypatch):
    import graphstore
    from training import launch

    monkeypatch.setattr(placement, "gpu_count", lambda: 0)
    monkeypatch.setattr(launch, "launch_local", lambda *a, **k: pytest.fail("ranks were started"))
    graphstore.ingest("synthetic:nodes=300,avg_degree=4,features=4,classes=2,seed=0", tmp_path / "d", num_parts=2)
    assert launch.main([str(tmp_path / "d"), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda: this host has no CUDA device" in err[0], err
