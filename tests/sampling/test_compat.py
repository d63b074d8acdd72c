"""PyG compatibility of the loaders' arguments, each checked against an oracle from the raw edge list."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData

from graphstore.errors import InvalidInputError
from sampling import LinkNeighborLoader, NeighborLoader, NeighborSampler
from sampling.distributed.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.server import PartitionServer
from sampling.distributed.transport import LoopbackTransport

BACKENDS = ("data", "dataset1", "dataset3")


def _edges(batch, g) -> set[tuple[int, int, int]]:
    """(source, destination, edge ID) of a batch's edges, in the sampler's node IDs."""
    n_id, (row, col) = batch.n_id.numpy(), batch.edge_index.numpy()
    return set(zip(n_id[row].tolist(), n_id[col].tolist(), batch.e_id.tolist()))


def _induced_oracle(g, nodes: np.ndarray) -> set[tuple[int, int, int]]:
    inside = np.isin(g.src, nodes) & np.isin(g.dst, nodes)
    e = np.flatnonzero(inside)
    return set(zip(g.src[e].tolist(), g.dst[e].tolist(), e.tolist()))


@pytest.mark.parametrize("name", (*BACKENDS, "pair"))
def test_induced_is_every_edge_among_the_sampled_nodes(graphs, name):
    g = graphs[name]
    loader = NeighborLoader(g.data, [3, 2], subgraph_type="induced", batch_size=16, seed=1,
                            input_nodes=torch.arange(40))
    directional = NeighborLoader(g.data, [3, 2], batch_size=16, seed=1, input_nodes=torch.arange(40))
    for batch, plain in zip(loader, directional):
        assert torch.equal(batch.n_id, plain.n_id)  # the same nodes, as in PyG: only the edges differ
        got = _edges(batch, g)
        assert got == _induced_oracle(g, batch.n_id.numpy())
        assert len(got) > len(_edges(plain, g)) > 0
        if name.startswith("dataset"):  # a dataset's edge attributes follow the induced edges
            assert np.array_equal(batch.weight.numpy(), g.weight[batch.e_id.numpy()])
            assert np.array_equal(batch.edge_time.numpy(), g.edge_time[batch.e_id.numpy()])


def test_directed_false_is_induced_with_pygs_warning(graphs):
    g = graphs["data"]
    with pytest.warns(UserWarning, match="'directed' argument in 'NeighborLoader' is deprecated"):
        loader = NeighborLoader(g.data, [2], directed=False, batch_size=20, seed=3)
    batch = next(iter(loader))
    induced = next(iter(NeighborLoader(g.data, [2], subgraph_type="induced", batch_size=20, seed=3)))
    assert _edges(batch, g) == _edges(induced, g) == _induced_oracle(g, batch.n_id.numpy())
    plain = next(iter(NeighborLoader(g.data, [2], batch_size=20, seed=3)))
    assert _edges(batch, g) != _edges(plain, g)
    with pytest.warns(UserWarning, match="'directed' argument in 'LinkNeighborLoader' is deprecated"):
        link = LinkNeighborLoader(g.data, [2], directed=False, batch_size=20, seed=3)
    lb = next(iter(link))
    assert _edges(lb, g) == _induced_oracle(g, lb.n_id.numpy())


def test_induced_heterogeneous(tmp_path):
    from tests.conftest import small_hetero

    data, _ = small_hetero()
    batch = next(iter(NeighborLoader(data, [3, 2], input_nodes="paper", subgraph_type="induced", batch_size=8,
                                     seed=0)))
    for et in data.edge_types:
        src, dst = data[et].edge_index.numpy()
        s_ids, d_ids = batch[et[0]].n_id.numpy(), batch[et[2]].n_id.numpy()
        e = np.flatnonzero(np.isin(src, s_ids) & np.isin(dst, d_ids))
        row, col = batch[et].edge_index.numpy()
        got = set(zip(s_ids[row].tolist(), d_ids[col].tolist(), batch[et].e_id.tolist()))
        assert got == set(zip(src[e].tolist(), dst[e].tolist(), e.tolist())), et


@pytest.mark.parametrize("kwargs", [dict(disjoint=True), dict(time_attr="time", input_time=torch.zeros(400))])
def test_induced_refused_with_disjoint_at_construction(graphs, kwargs):
    with pytest.raises(InvalidInputError, match="induced.*disjoint"):
        NeighborLoader(graphs["data"].data, [2], subgraph_type="induced", batch_size=4, **kwargs)


@pytest.mark.parametrize("name", BACKENDS)
def test_bidirectional_keeps_edge_attributes(graphs, name):
    """Fanout -1: the directional edges plus their reverses, each with its edge's weight and time."""
    g = graphs[name]
    seeds = torch.arange(0, 30, 3)
    both = next(iter(NeighborLoader(g.data, [-1], subgraph_type="bidirectional", input_nodes=seeds,
                                    batch_size=len(seeds))))
    plain = next(iter(NeighborLoader(g.data, [-1], input_nodes=seeds, batch_size=len(seeds))))
    forward = {(s, d) for s, d, _ in _edges(plain, g)}
    expected = forward | {(d, s) for s, d in forward}
    got = _edges(both, g)
    assert {(s, d) for s, d, _ in got} == expected and len(got) == len(expected)
    for s, d, e in got:  # each edge is its edge ID's edge, or that edge reversed
        assert (g.src[e], g.dst[e]) in ((s, d), (d, s))
    e_id = both.e_id.numpy()  # in-memory Data: PyG gathers them by edge ID; datasets: by the edge locators
    assert np.array_equal(both.weight.numpy(), g.weight[e_id])
    assert np.array_equal(both.edge_time.numpy(), g.edge_time[e_id])
    assert len(e_id) > len(plain.e_id)


def test_is_sorted_skips_the_sort_and_checks_the_claim():
    # sorted by destination, not by source within a destination: the sort would reorder edges 0 and 1
    ei = torch.tensor([[3, 1, 2, 0, 4], [0, 0, 1, 2, 2]])
    data = Data(edge_index=ei, num_nodes=5)
    assert NeighborSampler(data, [-1], is_sorted=True).topology[None].blocks[0].eid.tolist() == [0, 1, 2, 3, 4]
    assert NeighborSampler(data, [-1]).topology[None].blocks[0].eid.tolist() == [1, 0, 2, 3, 4]
    a = next(iter(NeighborLoader(data, [-1], is_sorted=True, batch_size=5)))
    b = next(iter(NeighborLoader(data, [-1], batch_size=5)))
    assert sorted(a.e_id.tolist()) == sorted(b.e_id.tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(InvalidInputError, match="is_sorted=True but edge_index.*not sorted by destination"):
        NeighborLoader(Data(edge_index=ei.flip(1), num_nodes=5), [-1], is_sorted=True)


@pytest.mark.parametrize("name", ("dataset1", "pair"))
def test_is_sorted_refused_for_stored_graphs(graphs, name):
    with pytest.raises(InvalidInputError, match="is_sorted=True applies to an in-memory"):
        NeighborLoader(graphs[name].data, [2], is_sorted=True, input_nodes=torch.arange(4))
    with pytest.raises(InvalidInputError, match="is_sorted=True applies to an in-memory"):
        LinkNeighborLoader(graphs[name].data, [2], is_sorted=True, edge_label_index=torch.tensor([[0], [1]]))


@pytest.mark.parametrize("name", BACKENDS)
def test_seed_time_defaults_to_each_seeds_own_time(graphs, name):
    g = graphs[name]
    seeds = torch.arange(5, 45)
    loader = NeighborLoader(g.data, [-1], time_attr="time", input_nodes=seeds, batch_size=40)
    batch = next(iter(loader))
    assert np.array_equal(batch.seed_time.numpy(), g.node_time[seeds.numpy()])
    explicit = next(iter(NeighborLoader(g.data, [-1], time_attr="time", input_nodes=seeds, batch_size=40,
                                        input_time=torch.from_numpy(g.node_time[seeds.numpy()]))))
    assert _edges(batch, g) == _edges(explicit, g)
    # the oracle: per seed, every in-edge whose source is no later than the seed
    n_id, (row, col) = batch.n_id.numpy(), batch.edge_index.numpy()
    got = set(zip(batch.batch.numpy()[col].tolist(), n_id[row].tolist(), batch.e_id.tolist()))
    want = {(i, int(g.src[e]), int(e)) for i, s in enumerate(seeds.tolist())
            for e in np.flatnonzero(g.dst == s) if g.node_time[g.src[e]] <= g.node_time[s]}
    assert got == want


def test_seed_time_defaults_heterogeneous():
    data = HeteroData()
    data["a"].num_nodes, data["b"].num_nodes = 6, 4
    data["a"].time, data["b"].time = torch.tensor([5, 1, 9, 3, 7, 2]), torch.tensor([4, 0, 8, 6])
    data["a", "to", "b"].edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [0, 0, 2, 2, 3, 3, 1]])
    batch = next(iter(NeighborLoader(data, [-1], time_attr="time", input_nodes="b", batch_size=4)))
    assert batch["b"].seed_time.tolist() == [4, 0, 8, 6]
    src, dst = data["a", "to", "b"].edge_index.numpy()
    a_ids, (row, col) = batch["a"].n_id.numpy(), batch["a", "to", "b"].edge_index.numpy()
    got = {(int(a_ids[r]), int(c)) for r, c in zip(row, col)}  # seeds are b's nodes 0..3 in order
    want = {(int(s), int(d)) for s, d in zip(src, dst) if data["a"].time[s] <= data["b"].time[d]}
    assert got == want


def test_seed_time_needs_node_times_at_construction(graphs):
    data = graphs["data"].data
    with pytest.raises(InvalidInputError, match="not a node attribute of the seed type"):
        NeighborLoader(data, [2], time_attr="edge_time", batch_size=4)
    with pytest.raises(InvalidInputError, match="time_attr is set but edge_label_time is not"):
        LinkNeighborLoader(data, [2], time_attr="time", batch_size=4)
    with pytest.raises(InvalidInputError, match="edge_label_time is set but time_attr is not"):
        LinkNeighborLoader(data, [2], edge_label_time=torch.zeros(data.num_edges), batch_size=4)


def test_graph_without_edges_gives_isolated_seeds():
    data = Data(x=torch.randn(7, 3))
    batches = list(NeighborLoader(data, [2, 2], batch_size=3))
    assert [b.n_id.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert all(b.e_id.numel() == 0 and torch.equal(b.x, data.x[b.n_id]) for b in batches)
    hetero = HeteroData()
    hetero["a"].x = torch.randn(5, 2)
    batches = list(NeighborLoader(hetero, [2], input_nodes="a", batch_size=2))
    assert [b["a"].n_id.tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert all(torch.equal(b["a"].x, hetero["a"].x[b["a"].n_id]) for b in batches)


def test_options_conflicting_with_a_given_sampler_are_refused(graphs):
    data = graphs["data"].data
    sampler = NeighborSampler(data, [2], replace=True)
    NeighborLoader(data, [2], neighbor_sampler=sampler, replace=True)  # agrees: fine
    with pytest.raises(InvalidInputError, match="weight_attr='weight'.*conflicts with the neighbor_sampler"):
        NeighborLoader(data, [2], neighbor_sampler=sampler, weight_attr="weight")
    with pytest.raises(InvalidInputError, match="subgraph_type='induced'.*conflicts"):
        LinkNeighborLoader(data, [2], neighbor_sampler=sampler, subgraph_type="induced")


def _transports(ds):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    return transports


@pytest.mark.parametrize("kwargs", [dict(subgraph_type="induced"), dict(directed=False)])
def test_distributed_loaders_refuse_induced(graphs, kwargs):
    ds = graphs["dataset3"].data
    t = _transports(ds)[0]
    with pytest.raises(InvalidInputError, match="not supported by the distributed loaders"):
        DistributedNeighborLoader(ds, [2], t, torch.arange(4), **kwargs)
    with pytest.raises(InvalidInputError, match="not supported by the distributed loaders"):
        DistributedLinkNeighborLoader(ds, [2], t, **kwargs)


def test_distributed_bidirectional_keeps_edge_attributes(graphs):
    g = graphs["dataset3"]
    ds = g.data
    t = _transports(ds)[0]
    seeds = torch.arange(0, 20, 2)
    loader = DistributedNeighborLoader(ds, [-1], t, seeds, subgraph_type="bidirectional", batch_size=10, prefetch=0,
                                       layout=RankLayout(3, 3))
    batch = next(iter(loader))
    e_id = batch.e_id.numpy()
    assert np.array_equal(batch.weight.numpy(), g.weight[e_id])
    for s, d, e in _edges(batch, g):
        assert (g.src[e], g.dst[e]) in ((s, d), (d, s))
    forward = {(int(g.src[e]), int(g.dst[e])) for e in np.flatnonzero(np.isin(g.dst, seeds.numpy()))}
    assert {(s, d) for s, d, _ in _edges(batch, g)} == forward | {(d, s) for s, d in forward}


def test_induced_over_a_heterogeneous_dataset(tmp_path):
    import graphstore
    from graphstore.dataset.whole import DatasetFeatureStore
    from tests.conftest import small_hetero

    data, _ = small_hetero()
    graphstore.ingest(data, tmp_path / "ds", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "ds")
    orig = {t: DatasetFeatureStore(ds)[t, "orig_id", None].numpy() for t in ds.node_types}  # global -> input
    batch = next(iter(NeighborLoader(ds, [3, 2], input_nodes="paper", subgraph_type="induced", batch_size=8,
                                     seed=0)))
    for et in data.edge_types:
        src, dst = data[et].edge_index.numpy()
        s_ids, d_ids = orig[et[0]][batch[et[0]].n_id.numpy()], orig[et[2]][batch[et[2]].n_id.numpy()]
        e = np.flatnonzero(np.isin(src, s_ids) & np.isin(dst, d_ids))
        row, col = batch[et].edge_index.numpy()
        got = set(zip(s_ids[row].tolist(), d_ids[col].tolist(), batch[et].e_id.tolist()))
        assert got == set(zip(src[e].tolist(), dst[e].tolist(), e.tolist())), et
    cites = ("paper", "cites", "paper")
    assert torch.equal(batch[cites].edge_attr, data[cites].edge_attr[batch[cites].e_id])
    assert batch[cites].e_id.numel() > 0


def test_node_type_without_edges_can_be_seeded():
    data = HeteroData()
    data["a"].x, data["b"].x, data["lonely"].x = torch.randn(4, 2), torch.randn(3, 2), torch.randn(5, 2)
    data["a", "to", "b"].edge_index = torch.tensor([[0, 1, 3], [0, 2, 2]])
    batches = list(NeighborLoader(data, [2], input_nodes="lonely", batch_size=3))
    assert [b["lonely"].n_id.tolist() for b in batches] == [[0, 1, 2], [3, 4]]
    batch = next(iter(NeighborLoader(data, [-1], input_nodes="b", batch_size=3)))
    assert sorted(batch["a"].n_id.tolist()) == [0, 1, 3]
