"""A shuffled pass's seed order: torch's order, for any seed count, without a Python int per seed held."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler
from torch_geometric.data import Data

from sampling import NeighborLoader
from sampling.loader.seed_order import CHUNK, ShuffledOrder


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("n, num_samples", [(1, None), (7, None), (CHUNK + 5, None), (100, 250), (100, 300)])
def test_same_order_as_torch(n, num_samples):
    ours = ShuffledOrder(range(n), num_samples=num_samples, generator=_gen(n))
    theirs = RandomSampler(range(n), num_samples=num_samples, generator=_gen(n))
    assert list(ours) == list(theirs)
    assert list(ours) == list(theirs)  # the next pass too: the generator moved on the same way


def test_without_a_generator_draws_as_torch_from_the_global_one():
    torch.manual_seed(5)
    theirs = list(RandomSampler(range(50)))
    torch.manual_seed(5)
    assert list(ShuffledOrder(range(50))) == theirs


def test_replacement_is_torchs():
    ours = ShuffledOrder(range(20), replacement=True, num_samples=70, generator=_gen(1))
    assert list(ours) == list(RandomSampler(range(20), replacement=True, num_samples=70, generator=_gen(1)))


def test_a_pass_holds_no_python_int_per_seed():
    n = 1_000_000
    order = iter(ShuffledOrder(range(n), generator=_gen(0)))
    before = sys.getallocatedblocks()
    next(order)
    assert sys.getallocatedblocks() - before < 2 * CHUNK  # torch's sampler: about n more blocks


def test_loader_shuffles_in_torchs_order_through_one_shared_sampler():
    g = torch.Generator().manual_seed(0)
    data = Data(x=torch.randn(60, 4, generator=g), edge_index=torch.randint(0, 60, (2, 300), generator=g),
                num_nodes=60)
    loader = NeighborLoader(data, [2], input_nodes=torch.arange(60), batch_size=16, shuffle=True)
    assert type(loader.sampler) is ShuffledOrder and loader.batch_sampler.sampler is loader.sampler
    loader.sampler.generator = _gen(3)  # as training.loop.batches.restart_streams reseeds each pass
    torch.manual_seed(9)  # the iterator's base seed draws from the global generator
    seeds = torch.cat([b.n_id[:b.batch_size] for b in loader]).tolist()
    assert seeds == list(RandomSampler(range(60), generator=_gen(3)))
    plain = NeighborLoader(data, [2], input_nodes=torch.arange(60), batch_size=16)
    assert type(plain.sampler) is SequentialSampler


def test_a_seeded_loader_shuffles_the_same_passes_whatever_else_drew_from_torch():
    """``seed=`` with ``shuffle=True`` fixes the seed order too (its own generator, not torch's global one, which
    the model, other loaders or a different process draw from); ``generator=`` given keeps the caller's."""
    g = torch.Generator().manual_seed(0)
    data = Data(x=torch.randn(60, 4, generator=g), edge_index=torch.randint(0, 60, (2, 300), generator=g),
                num_nodes=60)

    def passes(**options):
        loader = NeighborLoader(data, [2], input_nodes=torch.arange(60), batch_size=16, shuffle=True, **options)
        out = []
        for _ in range(2):
            torch.rand(7)  # someone else draws from the global generator between passes
            out.append([b.n_id.tolist() for b in loader])
        return out

    torch.manual_seed(1)
    first = passes(seed=4)
    torch.manual_seed(2)
    assert passes(seed=4) == first and first[0] != first[1]  # the same passes, each pass its own order
    assert passes(seed=5)[0] != first[0]
    given = NeighborLoader(data, [2], input_nodes=torch.arange(60), batch_size=16, shuffle=True, seed=4,
                           generator=_gen(8))
    torch_order = DataLoader(range(60), batch_size=16, shuffle=True, generator=_gen(8))  # the generator kept
    assert torch.cat([b.n_id[:b.batch_size] for b in given]).tolist() == torch.cat(list(torch_order)).tolist()
