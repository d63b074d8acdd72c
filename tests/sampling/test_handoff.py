"""A sampler process's batches in one reused block of shared memory (``sampling.loader.handoff``), on both sides."""

from __future__ import annotations

import torch
from torch_geometric.data import Data, HeteroData

from graphstore.dataset import rowmemory
from sampling.loader import handoff


def _batch() -> Data:
    return Data(x=torch.randn(50, 8), edge_index=torch.randint(0, 50, (2, 120)), n_id=torch.arange(50) * 3,
                y=torch.arange(50) % 4, batch_size=10)


def test_a_batch_crosses_as_places_in_the_block_and_is_copied_out_whole():
    want = _batch()
    slab = handoff.Slab(1 << 20)
    with rowmemory.rows_into(slab):
        x = rowmemory.empty((50, 8), torch.float32)  # as a feature store gathers
    x.copy_(want.x)
    batch = want.clone()
    batch.x = x
    packed = handoff.pack(batch, slab)
    assert all(isinstance(packed[k], handoff.InSlab) for k in ("x", "edge_index", "n_id", "y"))
    assert packed.x.start == 0, "the rows gathered into the block are not copied again"
    assert packed.batch_size == 10
    got = handoff.unpack(packed, slab.block, pinned=False)
    slab.reset()
    slab.take((slab.capacity // 4,), torch.float32).fill_(-1)  # the worker fills the block again
    for key in ("x", "edge_index", "n_id", "y"):
        assert torch.equal(got[key], want[key]) and got[key].dtype == want[key].dtype


def test_what_does_not_fit_travels_as_it_is_and_sizes_the_next_block():
    want = _batch()
    slab = handoff.Slab(1000)  # room for the 120 edges' 1,920 bytes? no; for n_id's 400 bytes, yes
    packed = handoff.pack(want.clone(), slab)
    assert isinstance(packed.edge_index, torch.Tensor) and isinstance(packed.x, torch.Tensor)
    assert isinstance(packed.n_id, handoff.InSlab)
    assert slab.wanted > slab.capacity
    assert handoff.wanted_block(slab.wanted) >= handoff.tensor_bytes(want)
    got = handoff.unpack(packed, slab.block, pinned=False)
    assert all(torch.equal(got[k], want[k]) for k in ("x", "edge_index", "n_id", "y"))


def test_hetero_batches_and_views_are_handed_over():
    want = HeteroData()
    want["paper"].x = torch.randn(6, 4)
    want["paper"].n_id = torch.arange(6)
    want["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1, 2], [3, 4, 5]])
    want["author"].x = torch.randn(10, 3)[::2]  # not contiguous: copied in
    slab = handoff.Slab(1 << 16)
    batch = handoff.pack(want.clone(), slab)
    assert isinstance(batch["author"].x, handoff.InSlab)
    got = handoff.unpack(batch, slab.block, pinned=False)
    assert torch.equal(got["author"].x, want["author"].x)
    assert torch.equal(got["paper", "cites", "paper"].edge_index, want["paper", "cites", "paper"].edge_index)
    assert isinstance(handoff.pack(want.clone(), None)["paper"].x, torch.Tensor)  # no block yet: as it is


def test_an_empty_tensor_crosses_as_it_is():
    """A batch whose rows of x all come from the device cache brings none of them (``--gpu-cache`` beside
    ``--loader-workers``): its empty x still arrives, with its shape and dtype (it was dropped)."""
    want = _batch()
    want.x = torch.zeros((0, 8), dtype=torch.float16)
    slab = handoff.Slab(1 << 20)
    packed = handoff.pack(want.clone(), slab)
    assert isinstance(packed.x, torch.Tensor) and isinstance(packed.n_id, handoff.InSlab)
    got = handoff.unpack(packed, slab.block, pinned=False)
    assert got.x.shape == (0, 8) and got.x.dtype == torch.float16
    assert torch.equal(got.n_id, want.n_id)
