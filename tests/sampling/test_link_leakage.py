"""No link a batch scores and no held-out link is in a training batch's subgraph: one process and 2 ranks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from graphstore.dataset.linksplit import LinkSplit, assign
from sampling import LinkNeighborLoader, MessageEdges, NeighborSampler
from tests.conftest import join_spawned, spawn_ranks
from tests.sampling.conftest import serve_and_run


def _raw(n: int = 400, pairs: int = 3000, seed: int = 0) -> dict[str, np.ndarray]:
    """Undirected pairs stored both ways, one time per pair (so temporal subgraphs are not empty)."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, n, pairs), rng.integers(0, n, pairs)
    t = rng.integers(1, 1000, pairs)
    return dict(src=np.concatenate([a, b]), dst=np.concatenate([b, a]), time=np.concatenate([t, t]),
                x=rng.standard_normal((n, 8)).astype(np.float32), n=np.array(n))


def _ingest(raw: dict, dest, parts: int) -> graphstore.Dataset:
    from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable

    source = GraphSource({None: NodeTable(int(raw["n"]), {"x": ArrayRows(raw["x"])})},
                         {None: EdgeTable(raw["src"], raw["dst"], {"time": ArrayRows(raw["time"])})}, name="links")
    graphstore.ingest(source, dest, num_parts=parts, link_split=(0.6, 0.2, 0.2), seed=1)
    return graphstore.open_dataset(dest)


class Oracle:
    """The raw edge list in the dataset's global IDs, and the split by the ingest rule (computed here)."""

    def __init__(self, raw: dict, ds: graphstore.Dataset) -> None:
        from graphstore.dataset.whole import DatasetFeatureStore

        order = DatasetFeatureStore(ds)[None, "orig_id", None].numpy()
        to_global = np.empty_like(order)
        to_global[order] = np.arange(len(order))
        self.src, self.dst = to_global[raw["src"]], to_global[raw["dst"]]
        self.time = raw["time"]
        self.split, _ = assign(raw["src"], raw["dst"], None, LinkSplit((0.6, 0.2, 0.2), seed=1), True)
        self.n = len(order)

    def links(self, split: int) -> torch.Tensor:
        sel = self.split == split
        return torch.from_numpy(np.stack([self.src[sel], self.dst[sel]]))

    def violations(self, batch, allowed: tuple[int, ...], triplet: bool, temporal: bool) -> dict[str, int]:
        """Counts of sampled edges that are held out, that join a scored pair, or that are not earlier."""
        e = batch.e_id.numpy()
        s, d = self.src[e], self.dst[e]
        keys = set((np.minimum(s, d) * self.n + np.maximum(s, d)).tolist())
        n_id = batch.n_id.numpy()
        if triplet:
            pos = np.stack([n_id[batch.src_index.numpy()], n_id[batch.dst_pos_index.numpy()]])
        else:
            pos = n_id[batch.edge_label_index.numpy()][:, batch.edge_label.numpy() == 1]
        scored = set((np.minimum(pos[0], pos[1]) * self.n + np.maximum(pos[0], pos[1])).tolist())
        out = {"held_out": int((~np.isin(self.split[e], allowed)).sum()), "scored": len(keys & scored),
               "edges": len(e)}
        if temporal:  # subgraph b belongs to link b % L (PyG's seed order: src, dst(, negatives))
            limit = (batch.seed_time if triplet else batch.edge_label_time).numpy()
            sub = batch.batch.numpy()[batch.edge_index[1].numpy()] % len(limit)
            out["not_earlier"] = int((self.time[e] >= limit[sub]).sum())
        return out


def _loader(ds, oracle: Oracle, mode: str, temporal: bool, leak_free: bool = True):
    links = oracle.links(0)
    extra = {}
    if temporal:
        extra = dict(time_attr="time", edge_label_time=torch.from_numpy(oracle.time[oracle.split == 0]))
    if leak_free:
        extra.update(message_edges=MessageEdges(allowed=(0,)), exclude_seed_edges=True)
    return LinkNeighborLoader(ds, [10, 10], edge_label_index=links, batch_size=64, shuffle=True, seed=0,
                              neg_sampling=dict(mode=mode, amount=1 if mode == "binary" else 3), **extra)


@pytest.fixture(scope="module")
def linked(tmp_path_factory):
    raw = _raw()
    ds = _ingest(raw, tmp_path_factory.mktemp("links") / "ds", parts=2)
    return raw, ds, Oracle(raw, ds)


@pytest.mark.parametrize("mode", ["binary", "triplet"])
@pytest.mark.parametrize("temporal", [False, True])
def test_train_batches_hold_no_scored_and_no_held_out_link(linked, mode, temporal):
    _, ds, oracle = linked
    totals: dict[str, int] = {}
    for i, batch in enumerate(_loader(ds, oracle, mode, temporal)):
        for k, v in oracle.violations(batch, (0,), mode == "triplet", temporal).items():
            totals[k] = totals.get(k, 0) + v
        if i == 15:
            break
    assert totals["edges"] > 1000, totals  # the subgraphs are not empty
    assert totals["held_out"] == 0 and totals["scored"] == 0 and totals.get("not_earlier", 0) == 0, totals


@pytest.mark.parametrize("temporal", [False, True])
def test_the_checker_finds_the_leak_of_pyg_default_sampling(linked, temporal):
    """Without the mask and the exclusion (PyG's defaults) the same checks fail: they can catch a leak."""
    _, ds, oracle = linked
    batch = next(iter(_loader(ds, oracle, "binary", temporal, leak_free=False)))
    found = oracle.violations(batch, (0,), False, temporal)
    assert found["held_out"] > 0 and found["scored"] > 0, found
    if temporal:
        assert found["not_earlier"] > 0, found  # PyG samples time <= edge_label_time: the link itself


def test_the_mask_is_applied_by_the_kernel_and_fanouts_count_admitted_edges(linked):
    _, ds, oracle = linked
    seeds = torch.arange(0, oracle.n, 7)
    for allowed in [(0,), (0, 1)]:
        admitted = np.isin(oracle.split, allowed) & np.isin(oracle.dst, seeds.numpy())
        full = NeighborSampler(ds, [-1], message_edges=MessageEdges(allowed=allowed))
        out = full.sample_from_nodes(NodeSamplerInput(None, seeds))
        assert sorted(out.edge.tolist()) == sorted(np.flatnonzero(admitted).tolist())
        degree = np.bincount(oracle.dst[admitted], minlength=oracle.n)[seeds.numpy()]
        capped = NeighborSampler(ds, [3], message_edges=MessageEdges(allowed=allowed), seed=0)
        out = capped.sample_from_nodes(NodeSamplerInput(None, seeds))
        counts = np.bincount(out.col.numpy(), minlength=len(seeds))[: len(seeds)]
        assert (counts == np.minimum(degree, 3)).all()  # 3 admitted edges whenever there are 3


@pytest.mark.parametrize("degree, admitted, k, replace", [
    (400, 0.8, 5, False),  # many edges a pick (a scan would draw by rejection)
    (400, 0.8, 5, True),
    (2000, 0.002, 3, False),  # 4 of 2,000 admitted (rejection draws would find too few)
    (40, 0.5, 5, False),  # few edges a pick
])
def test_masked_picks_are_uniform_over_the_admitted_edges(degree, admitted, k, replace):
    """A star's in-edges, some held out: every pick is an admitted edge, without replacement never twice in a
    subgraph, and every admitted edge is equally likely (chi-square), whichever way the node was drawn."""
    from scipy.stats import chisquare
    from torch_geometric.data import Data

    rng = np.random.default_rng(5)
    split = np.where(rng.random(degree) < admitted, 0, 1).astype(np.int8)
    split[:2] = 0  # at least two admitted
    data = Data(edge_index=torch.stack([torch.arange(1, degree + 1), torch.zeros(degree, dtype=torch.long)]),
                num_nodes=degree + 1, link_split=torch.from_numpy(split))
    sampler = NeighborSampler(data, [k], replace=replace, seed=3, message_edges=MessageEdges(allowed=(0,)))
    allowed = set(np.flatnonzero(split == 0).tolist())
    counts = dict.fromkeys(allowed, 0)
    for _ in range(6000 // k if len(allowed) > k else 20):
        edges = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0]))).edge.tolist()
        assert len(edges) == (k if replace or len(allowed) >= k else len(allowed)) and set(edges) <= allowed
        assert replace or len(set(edges)) == len(edges)
        for e in edges:
            counts[e] += 1
    observed = np.array(list(counts.values()))
    assert chisquare(observed).pvalue > 1e-3, observed  # about 19 picks expected of each admitted edge


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("links", [False, True])
def test_masked_picks_over_the_admitted_prefix_are_the_scans_picks(replace, links):
    """Over the packed pairs a masked pick draws from each destination's admitted edges placed first
    (``split_records``); without them (the int64 arrays) it scans the split bytes. With no node of 32 edges a
    pick (where the scan draws by rejection instead), the same seeds draw the same edges, nodes and CSC
    positions either way, a link batch's exclusion included."""
    from torch_geometric.data import Data
    from torch_geometric.sampler import EdgeSamplerInput

    from sampling.drivers.batch_driver import FastPath

    rng = np.random.default_rng(7)
    n, m = 300, 3000
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    split = rng.choice(3, m, p=(0.7, 0.2, 0.1)).astype(np.int8)
    data = Data(edge_index=torch.from_numpy(np.stack([src, dst])), num_nodes=n, link_split=torch.from_numpy(split))
    outs = []
    for packed in (True, False):
        sampler = NeighborSampler(data, [6, 4], replace=replace, seed=5, message_edges=MessageEdges(allowed=(0,)),
                                  exclude_seed_edges=links)
        fast = sampler.fast_path
        if not packed:
            sampler._fast_path = FastPath(sampler.topology[None], sampler.num_nodes, sampler._fanouts, replace,
                                          packed=False, variants=fast.variants)
        assert (sampler.fast_path.blocks.msort is not None) == packed, "the prefix records exactly over the pairs"
        sampler.fast_path.positions = True
        if links:
            out = sampler.sample_from_edges(EdgeSamplerInput(None, torch.from_numpy(src[:64]),
                                                             torch.from_numpy(dst[:64])))
        else:
            out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.arange(0, n, 3)))
        outs.append((out, out.edge_locator[None]()[1]))
    (a, pos_a), (b, pos_b) = outs
    assert a.row.numel() > 300 and (split[a.edge.numpy()] == 0).all()
    for name in ("node", "row", "col", "edge"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(pos_a, pos_b)  # the prefix positions translated to CSC ones


@pytest.mark.parametrize("packed", [True, False])
def test_a_node_with_no_admitted_edge_gets_none_with_replacement_too(packed):
    """With replacement, a node none of whose edges the mask admits gets no edge (``k`` draws of nothing once
    gave ``k`` copies of one of its held-out edges)."""
    from torch_geometric.data import Data

    from sampling.drivers.batch_driver import FastPath

    src, dst = torch.tensor([1, 2, 3, 4, 6, 7, 8, 9]), torch.tensor([0, 0, 0, 0, 5, 5, 5, 5])
    split = torch.tensor([1, 1, 2, 1, 0, 0, 0, 0], dtype=torch.int8)  # node 0: validation and test links only
    data = Data(edge_index=torch.stack([src, dst]), num_nodes=10, link_split=split)
    sampler = NeighborSampler(data, [3], replace=True, seed=0, message_edges=MessageEdges(allowed=(0,)))
    if not packed:
        sampler._fast_path = FastPath(sampler.topology[None], sampler.num_nodes, sampler._fanouts, True,
                                      packed=False, variants=sampler.fast_path.variants)
    for _ in range(5):
        out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([5, 0])))
        assert out.edge.numel() == 3 and (split[out.edge] == 0).all() and (out.col == 0).all()


@pytest.mark.parametrize("degree, admitted, k, replace", [
    (40, None, 5, False),  # the exclusion alone: a draw over every edge, its picks tested
    (40, None, 5, True),
    (40, 0.5, 5, False),  # a draw over the mask's candidates, its picks tested
    (400, 0.8, 5, False),  # rejection draws, each tested against both
    (6, None, 5, False),  # no more edges than picks once the link is out: a full scan
])
def test_a_link_batch_excludes_its_link_and_the_other_picks_stay_uniform(degree, admitted, k, replace):
    """A star's in-edges and a link batch of one of them: the link is never picked from the star (its draws are
    tested against the exclusion rather than every edge), and every other admitted edge is equally likely."""
    from scipy.stats import chisquare
    from torch_geometric.data import Data
    from torch_geometric.sampler import EdgeSamplerInput

    rng = np.random.default_rng(6)
    data = Data(edge_index=torch.stack([torch.arange(1, degree + 1), torch.zeros(degree, dtype=torch.long)]),
                num_nodes=degree + 1)
    options = {}
    allowed = set(range(1, degree))  # edge 0 is the batch's link (1 -> 0)
    if admitted is not None:
        split = np.where(rng.random(degree) < admitted, 0, 1).astype(np.int8)
        split[:2] = 0
        data.link_split = torch.from_numpy(split)
        options["message_edges"] = MessageEdges(allowed=(0,))
        allowed &= set(np.flatnonzero(split == 0).tolist())
    sampler = NeighborSampler(data, [k], replace=replace, seed=4, exclude_seed_edges=True, **options)
    counts = dict.fromkeys(allowed, 0)
    link = EdgeSamplerInput(None, torch.tensor([1]), torch.tensor([0]))
    for _ in range(6000 // k if len(allowed) > k else 20):
        edges = sampler.sample_from_edges(link).edge.tolist()
        assert len(edges) == (k if replace or len(allowed) >= k else len(allowed)) and set(edges) <= allowed
        assert replace or len(set(edges)) == len(edges)
        for e in edges:
            counts[e] += 1
    assert chisquare(np.array(list(counts.values()))).pvalue > 1e-3, counts


def test_message_edges_on_an_in_memory_graph_and_refusals():
    from torch_geometric.data import Data

    from graphstore.errors import InvalidInputError

    data = Data(edge_index=torch.tensor([[1, 2, 3], [0, 0, 0]]), num_nodes=4)
    data.link_split = torch.tensor([0, 1, 2], dtype=torch.int8)
    out = NeighborSampler(data, [-1], message_edges=MessageEdges(allowed=(0, 2))).sample_from_nodes(
        NodeSamplerInput(None, torch.tensor([0])))
    assert sorted(out.edge.tolist()) == [0, 2]
    with pytest.raises(InvalidInputError, match="split values"):
        MessageEdges(allowed=(3,))
    with pytest.raises(InvalidInputError, match="conflicts with the neighbor_sampler"):
        LinkNeighborLoader(data, [2], neighbor_sampler=NeighborSampler(data, [2]), exclude_seed_edges=True)


def test_a_node_loader_refuses_exclude_seed_edges(linked):
    from graphstore.errors import InvalidInputError
    from sampling.distributed.dist_loader import DistributedNeighborLoader
    from sampling.distributed.transport import LoopbackTransport

    _, ds, _ = linked
    transport = LoopbackTransport.group(2)[0]
    with pytest.raises(InvalidInputError, match="exclude_seed_edges is for link loaders"):
        DistributedNeighborLoader(ds, [2], transport, torch.arange(3), exclude_seed_edges=True)


def _rank(ds, transport, rank: int, world_size: int, raw_path: str) -> dict:
    """Training batches of one rank over RPC, checked against the raw edge list (``serve_and_run``'s body)."""
    from sampling.distributed.dist_loader import DistributedLinkNeighborLoader

    raw = dict(np.load(raw_path))
    oracle = Oracle(raw, ds)
    result = {"full_fanout_exact": _full_fanout_exact(ds, transport, oracle, rank, world_size)}
    own = (oracle.split == 0) & (ds.owner(oracle.dst, None) == rank)
    for mode in ("binary", "triplet"):
        for temporal in (False, True):
            extra = dict(time_attr="time", edge_label_time=torch.from_numpy(oracle.time[own])) if temporal else {}
            loader = DistributedLinkNeighborLoader(
                ds, [10, 10], transport, torch.from_numpy(np.stack([oracle.src[own], oracle.dst[own]])),
                batch_size=64, neg_sampling=dict(mode=mode, amount=1 if mode == "binary" else 3), seed=rank,
                message_edges=MessageEdges(allowed=(0,)), exclude_seed_edges=True, **extra)
            totals: dict[str, int] = {}
            for batch in loader:
                for k, v in oracle.violations(batch, (0,), mode == "triplet", temporal).items():
                    totals[k] = totals.get(k, 0) + v
            totals["requests"] = loader.stats.snapshot()["requests"]
            result[f"{mode}-{'temporal' if temporal else 'static'}"] = totals
    return result


def _full_fanout_exact(ds, transport, oracle: Oracle, rank: int, world_size: int) -> bool:
    """With fanout -1 the remote partition's server applies the mask: exactly the admitted in-edges."""
    from graphstore.dataset.rank_layout import RankLayout
    from sampling.distributed.dist_sampler import DistributedSampler

    seeds = np.arange(int(ds.node_offsets()[rank]), int(ds.node_offsets()[rank + 1]), 5)
    sampler = DistributedSampler(ds, [-1, -1], transport, RankLayout(ds.num_parts, world_size),
                                 message_edges=MessageEdges(allowed=(0, 1)))
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.from_numpy(seeds)))
    admitted = np.isin(oracle.split, (0, 1))
    hop1 = admitted & np.isin(oracle.dst, seeds)
    frontier = np.union1d(seeds, oracle.src[hop1])
    want = np.flatnonzero(admitted & np.isin(oracle.dst, frontier))
    return sorted(set(out.edge.tolist())) == sorted(want.tolist()) and sampler.stats.snapshot()["requests"] > 0


@pytest.mark.distributed
def test_two_ranks_over_rpc_hold_no_scored_and_no_held_out_link(tmp_path):

    raw = _raw(n=300, pairs=1500, seed=2)
    np.savez(tmp_path / "raw.npz", **raw)
    _ingest(raw, tmp_path / "ds", parts=2)
    ctx = spawn_ranks(serve_and_run, (2, f"file://{tmp_path}/rdzv", str(tmp_path / "ds"), str(tmp_path), _rank,
                                  str(tmp_path / "raw.npz")), 2)
    join_spawned(ctx, 240)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "error" not in got, f"rank {rank} failed:\n{got.get('error')}"
        assert got.pop("full_fanout_exact") is True
        assert set(got) == {"binary-static", "binary-temporal", "triplet-static", "triplet-temporal"}
        for name, totals in got.items():
            assert totals["edges"] > 500 and totals["requests"] > 0, (rank, name, totals)
            assert totals["held_out"] == 0 and totals["scored"] == 0, (rank, name, totals)
            assert totals.get("not_earlier", 0) == 0, (rank, name, totals)


def test_a_reverse_relation_is_masked_like_its_links(tmp_path):
    """rev_to edges b -> a carry messages only when the link a -> b is in an allowed split."""
    from torch_geometric.data import HeteroData

    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 60, 900), rng.integers(0, 80, 900)
    keep = rng.random(900) < 0.9  # some links have no reverse, and some reverse edges reverse no link
    data = HeteroData()
    data["a"].x, data["b"].x = torch.randn(60, 3), torch.randn(80, 3)
    data["a", "to", "b"].edge_index = torch.from_numpy(np.stack([a, b]))
    extra_b, extra_a = rng.integers(0, 80, 50), rng.integers(0, 60, 50)
    data["b", "rev_to", "a"].edge_index = torch.from_numpy(np.stack([np.concatenate([b[keep], extra_b]),
                                                                     np.concatenate([a[keep], extra_a])]))
    graphstore.ingest(data, tmp_path / "h", num_parts=2, link_split=(0.5, 0.25, 0.25), link_split_edge_type="to")
    ds = graphstore.open_dataset(tmp_path / "h")
    from graphstore.dataset.whole import DatasetFeatureStore

    glob = {}
    for t, n in (("a", 60), ("b", 80)):
        order = DatasetFeatureStore(ds)[t, "orig_id", None].numpy()
        glob[t] = np.empty(n, np.int64)
        glob[t][order] = np.arange(n)
    split, _ = assign(a, b, None, LinkSplit((0.5, 0.25, 0.25), seed=0), False)
    rev_src, rev_dst = data["b", "rev_to", "a"].edge_index.numpy()
    held = {(int(x), int(y)) for x, y, v in zip(a, b, split) if v != 0}  # duplicates share a split
    admitted = np.array([(int(d), int(s)) not in held for s, d in zip(rev_src, rev_dst)])
    seeds = torch.arange(60)
    sampler = NeighborSampler(ds, {("a", "to", "b"): [-1], ("b", "rev_to", "a"): [-1]},
                              message_edges=MessageEdges(("to",), allowed=(0,)))
    out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds, input_type="a"))
    got = sorted(out.edge[("b", "rev_to", "a")].tolist())
    assert got == sorted(np.flatnonzero(admitted).tolist())
    assert 0 < len(got) < len(rev_src)


@pytest.mark.parametrize("options", [
    {},  # the exclusion alone (tested on the picks)
    {"message_edges": MessageEdges(allowed=(0,))},  # masked: scans, and rejection draws at the hubs
    {"message_edges": MessageEdges(allowed=(0,)), "time_attr": "time"},  # over time-sorted edges
])
def test_a_link_batch_samples_the_same_whether_its_node_filter_holds_its_ends_or_every_node(monkeypatch, options):
    """Only a node the batch's filter holds tests its edges against the exclusion; an edge into any other node is
    never excluded, so a filter that holds every node (every node tested) gives the same samples."""
    from torch_geometric.data import Data
    from torch_geometric.sampler import EdgeSamplerInput

    from sampling.graph import edgemask

    rng = np.random.default_rng(11)
    n, e = 600, 12000
    dst = (rng.random(e) ** 3 * n).astype(np.int64)  # skewed: hubs with hundreds of edges draw by rejection
    data = Data(edge_index=torch.from_numpy(np.stack([rng.integers(0, n, e), dst])), num_nodes=n)
    data.link_split = torch.from_numpy(rng.choice(3, e, p=[0.8, 0.1, 0.1]).astype(np.int8))
    data.time = torch.from_numpy(rng.integers(0, 1000, e))
    train = np.flatnonzero(data.link_split.numpy() == 0)

    def batches() -> list[list[np.ndarray]]:
        sampler = NeighborSampler(data, [3, 2], seed=5, exclude_seed_edges=True, **options)
        out = []
        for i in range(6):
            links = rng_links[i]
            time = torch.full((len(links),), 700) if "time_attr" in options else None
            s = sampler.sample_from_edges(EdgeSamplerInput(None, data.edge_index[0, links], data.edge_index[1, links],
                                                           time=time))
            out.append([s.node.numpy(), s.row.numpy(), s.col.numpy(), s.edge.numpy()])
        return out

    rng_links = [rng.choice(train, 64, replace=False) for _ in range(6)]
    filtered = batches()
    every = np.full(1, np.iinfo(np.uint64).max, np.uint64)
    monkeypatch.setattr(edgemask, "node_filter", lambda nodes: every)
    monkeypatch.setattr(NeighborSampler, "_link_batch", lambda self, index, negatives: None)  # node_filter's path
    assert all(np.array_equal(a, b) for x, y in zip(filtered, batches()) for a, b in zip(x, y))
    for links, sample in zip(rng_links, filtered):  # and the links themselves are left out
        picked = set(sample[3].tolist())
        assert not picked & set(links.tolist())


def test_a_node_filter_holds_its_nodes_for_the_kernels_and_few_others():
    from sampling.graph.edgemask import node_filter
    from sampling.kernels.picks import _node_mode

    rng = np.random.default_rng(2)
    ends = rng.choice(10**9, 300, replace=False)
    nodes = node_filter(ends)
    keys = np.zeros(1, np.int64)
    assert all(_node_mode(keys, nodes, 3, int(v)) == 3 for v in ends)
    others = np.setdiff1d(rng.integers(0, 10**9, 20000), ends)
    held = sum(_node_mode(keys, nodes, 3, int(v)) != 0 for v in others)
    assert held < 0.08 * len(others)  # about 1 in 32 expected
    assert _node_mode(None, None, 3, 5) == 0


@pytest.mark.parametrize("size", [0, 1, 5, 700])
def test_a_node_filter_sets_the_bit_of_each_node_and_no_other(size):
    from sampling.graph.edgemask import FILTER_BITS_PER_NODE, filter_bit, node_filter

    rng = np.random.default_rng(size)
    ends = rng.integers(0, 10**12, size)
    ends = np.concatenate([ends, ends[: size // 2]])  # repeats: their bits set once
    words = node_filter(ends)
    assert words.dtype == np.uint64 and len(words) == max(1, -(-FILTER_BITS_PER_NODE * len(ends) // 64))
    bits = np.zeros(64 * len(words), bool)
    bits[filter_bit(ends, 64 * len(words))] = True
    got = (words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)  # bit b of word w: node bit 64 w + b
    assert np.array_equal(got.ravel().astype(bool), bits)


@pytest.mark.parametrize("size", [0, 1, 2, 700])
def test_a_link_batchs_keys_and_ends_are_sorted_and_unique_as_numpy_gives_them(size):
    from sampling.graph.edgemask import exclusion, node_filter, sorted_unique

    rng = np.random.default_rng(size)
    values = rng.integers(-5, 40, size)  # many repeats
    got = sorted_unique(values)
    assert got.dtype == values.dtype and np.array_equal(got, np.unique(values))
    row, col = rng.integers(0, 50, size), rng.integers(0, 50, size)
    [(keys, mul, mode, nodes)] = exclusion([None], None, torch.from_numpy(row), torch.from_numpy(col), 50).values()
    assert np.array_equal(keys, np.unique(row * 50 + col)) and (mul, mode) == (50, 3)
    assert np.array_equal(nodes, node_filter(np.concatenate([row, col])))


@pytest.mark.parametrize("exclude", [False, True])
@pytest.mark.parametrize("negatives, labels", [(None, False), (None, True), ("binary", False), ("binary", True),
                                               ("triplet", False)])
def test_a_link_batch_made_in_one_kernel_call_samples_what_pygs_edge_sample_does(monkeypatch, exclude, negatives,
                                                                                 labels):
    """The negatives, seeds, exclusion and metadata of a homogeneous link batch (one kernel call) are those of PyG's
    ``edge_sample`` with :func:`~sampling.graph.edgemask.exclusion`: same samples, repeated ends and given
    negatives included."""
    from torch_geometric.data import Data
    from torch_geometric.sampler import EdgeSamplerInput, NegativeSampling

    rng = np.random.default_rng(3)
    n, e = 500, 8000
    src, dst = rng.integers(0, n, e), (rng.random(e) ** 2 * n).astype(np.int64)  # hubs: repeated ends
    data = Data(edge_index=torch.from_numpy(np.stack([src, dst])), num_nodes=n)
    neg = NegativeSampling(negatives, 2) if negatives else None

    def batches() -> list:
        sampler = NeighborSampler(data, [4, 3], seed=2, exclude_seed_edges=exclude)
        out = []
        for i in range(4):
            picked = np.random.default_rng(i).choice(e, 50, replace=False)
            row, col = data.edge_index[0, picked].clone(), data.edge_index[1, picked].clone()
            row[:5] = row[5]  # an end repeated
            label = torch.from_numpy((np.arange(50) % 3 != 0).astype(np.int64)) if labels else None
            torch.manual_seed(i)  # the negatives' draws
            s = sampler.sample_from_edges(EdgeSamplerInput(torch.arange(50) + i, row, col, label=label), neg)
            out.append([s.node, s.row, s.col, s.edge] + [torch.tensor([-1]) if m is None else m for m in s.metadata])
        return out

    fast = batches()
    monkeypatch.setattr(NeighborSampler, "_link_batch", lambda self, index, negatives: None)  # PyG's edge_sample
    general = batches()
    assert all(len(x) == len(y) and all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(fast, general))


def test_a_link_batchs_seeds_and_exclusion_in_one_call_and_the_ids_it_refuses():
    from graphstore.errors import NotOwnedError
    from sampling.graph.edgemask import exclusion, link_batch

    row, col = np.array([3, 7, 3]), np.array([9, 2, 9])
    seeds, inverse, (keys, words) = link_batch(np.concatenate([row, col]), (row, col), 10)
    assert seeds.tolist() == [2, 3, 7, 9] and inverse.tolist() == [1, 2, 1, 3, 0, 3]
    [(want_keys, _, _, want_words)] = exclusion([None], None, row, col, 10).values()
    assert np.array_equal(keys, want_keys) and np.array_equal(words, want_words)
    assert link_batch(np.array([2**31, 1]), None, 10) is None
    assert link_batch(np.array([-1, 1]), None, 10) is None
    assert link_batch(np.concatenate([row, col]), None, 10)[2] is None
    sampler = NeighborSampler(_tiny(), [2], exclude_seed_edges=True)
    from torch_geometric.sampler import EdgeSamplerInput

    for bad in (2**31, -3, 7):  # beyond what the kernel takes, negative, not a node: one line naming it
        with pytest.raises(NotOwnedError, match=rf"\[{bad}\] are outside \[0, 3\)"):
            sampler.sample_from_edges(EdgeSamplerInput(None, torch.tensor([bad]), torch.tensor([1])))


def _tiny():
    from torch_geometric.data import Data

    return Data(edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)
