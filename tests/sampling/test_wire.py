"""Bytes on the wire: payload sizes, per-peer/per-kind counters, and exact row bytes of a distributed loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphstore

from sampling.distributed.dist_loader import DistributedNeighborLoader
from sampling.distributed.server import PartitionServer
from sampling.distributed.transport import LoopbackTransport
from sampling.distributed.wire import (Packed, WireStats, answer_edges, pack, pack_sample, payload_bytes, place_sample,
                                      totals, unpack, unpack_into)


def test_payload_bytes_counts_arrays_tensors_strings_and_scalars():
    assert payload_bytes(np.zeros((3, 5), np.float32)) == 60
    assert payload_bytes(torch.zeros(7, dtype=torch.int64)) == 56
    assert payload_bytes(("abc", None, [torch.ones(2), {"k": 1}])) == 3 + 8 + 8 + 1 + 8
    assert payload_bytes(b"\x00" * 9) == 9
    assert payload_bytes(Packed(5, np.zeros(10, np.uint16), "<i8")) == 8 + 20 + 1


@pytest.mark.parametrize("values, width", [
    (np.array([1000, 1003, 1001]), np.uint8),  # offsets from the minimum: one byte each
    (np.arange(70_000) + 10**9, np.uint32),
    (np.array([-5, 60_000]), np.uint16),
    (np.array([-2**63, 2**63 - 1]), np.uint64),  # the full int64 range wraps and unwraps exactly
    (np.arange(6, dtype=np.int32).reshape(2, 3), np.uint8),
    (np.array([7, -3, 2**31 - 1], np.int32), np.uint32),  # int32 through the kernels' pass, negative base
    (np.arange(40)[::2] - 4, np.uint8),  # not contiguous: numpy's passes
    (np.zeros(0, np.int64), np.uint8),
])
def test_pack_is_lossless_and_narrow(values, width):
    for given in (values, torch.from_numpy(values)):
        packed = pack(given)
        assert packed.values.dtype == width
        back = unpack(packed)
        assert type(back) is type(given) and back.dtype == given.dtype and back.shape == given.shape
        assert (np.asarray(back) == values).all()


@pytest.mark.parametrize("values", [np.array([7, 3, 2**40]), np.array([-4, 9], np.int32), np.zeros(0, np.int64),
                                    np.array([-2**63, 2**63 - 1])])
def test_unpack_into_writes_what_unpack_returns(values):
    for given in (pack(values), values, None):
        out = np.full(len(values) + 2, 99, np.int64)
        unpack_into(given, out[1:-1])
        assert out[0] == out[-1] == 99  # nothing outside its place is written
        assert out[1:-1].tolist() == ([-1] * len(values) if given is None else values.tolist())
    with pytest.raises(ValueError, match="3 values for 2 places"):
        unpack_into(pack(np.array([1, 2, 3])), np.empty(2, np.int64))


def test_a_sampling_answer_carries_its_edges():
    col, columns = np.array([0, 0, 2]), (np.array([5, 6, 7]), np.array([1, 2, 3]), np.array([0, 1, 2]))
    answer = pack_sample(col, 3, columns, 0, (9, 9, 9))
    assert answer_edges(answer) == 3 and answer[2] is None and answer[3] is None
    assert unpack(answer[0]).tolist() == [2, 0, 1] and unpack(answer[1]).tolist() == [5, 6, 7]


@pytest.mark.parametrize("top", [200, 60_000, 2**31, 2**40])  # source IDs, edge IDs, positions of 1, 2, 4, 8 bytes
@pytest.mark.parametrize("returns", [0, 1, 2, 3])
@pytest.mark.parametrize("fanout", [3, 300])  # counts of 1 and 2 bytes
def test_a_sampling_answer_is_placed_exactly_where_its_nodes_were_asked(top, returns, fanout):
    rng = np.random.default_rng(top + returns)
    counts = rng.integers(0, fanout + 1, 40)
    counts[5] = fanout
    col = np.repeat(np.arange(40), counts)
    columns = tuple(rng.integers(0, top + 1, len(col)) for _ in range(3))
    answer = pack_sample(col, 40, columns, returns, (top, top, top))
    assert all(isinstance(a, Packed) for a in answer[:2])
    assert answer[0].values.dtype.itemsize == (1 if fanout < 256 else 2)
    assert answer[1].values.dtype.itemsize == {200: 1, 60_000: 2, 2**31: 4, 2**40: 8}[top]
    positions = rng.permutation(100)[:40]
    out = [np.full(len(col) + 2, 99, np.int64) for _ in range(4)]
    assert place_sample(answer, positions, 7, *(o[1:-1] for o in out))
    assert all(o[0] == o[-1] == 99 for o in out)  # nothing outside its places is written
    assert out[0][1:-1].tolist() == (np.repeat(positions, counts) + 7).tolist()
    assert out[1][1:-1].tolist() == columns[0].tolist()
    for sent, o, column in ((returns & 1, out[2], columns[1]), (returns & 2, out[3], columns[2])):
        assert o[1:-1].tolist() == (column.tolist() if sent else [-1] * len(col))


def test_a_damaged_answer_is_not_placed():
    col, columns = np.array([0, 0, 1]), (np.array([5, 6, 7]), np.array([1, 2, 3]), np.array([0, 1, 2]))
    answer = pack_sample(col, 2, columns, 3, (9, 9, 9))
    places = lambda n: [np.zeros(n, np.int64) for _ in range(4)]  # noqa: E731
    assert place_sample(answer, np.array([4, 9]), 0, *places(3))
    assert not place_sample(answer, np.array([4, 9, 1]), 0, *places(3))  # counts for 2 nodes, 3 asked
    assert not place_sample(answer, np.array([4, 9]), 0, *places(4))  # counts summing to 3, 4 places
    short = (answer[0], answer[1], pack(np.array([1, 2])), answer[3])  # 2 edge IDs for 3 edges
    assert not place_sample(short, np.array([4, 9]), 0, *places(3))
    plain = (np.array([2, 1]), np.array([5, 6, 7]), None, np.array([0, 1, 2]))  # unpacked columns: numpy's passes
    out = places(3)
    assert place_sample(plain, np.array([4, 9]), 1, *out)
    assert [o.tolist() for o in out] == [[5, 5, 10], [5, 6, 7], [-1, -1, -1], [0, 1, 2]]
    assert not place_sample((np.array([2, 2]),) + plain[1:], np.array([4, 9]), 1, *places(3))


def test_a_column_beyond_its_top_is_packed_by_its_span_and_arrives_exact():
    col, columns = np.array([0, 1, 1]), (np.array([5, 2**40, 7]), np.array([1, 2, 3]), np.array([0, 1, 2]))
    answer = pack_sample(col, 2, columns, 3, (255, 255, 255))
    assert answer[1].base == 5 and answer[1].values.dtype == np.uint64
    out = [np.zeros(3, np.int64) for _ in range(4)]
    assert place_sample(answer, np.array([0, 1]), 0, *out)
    assert out[1].tolist() == [5, 2**40, 7] and out[0].tolist() == [0, 1, 1]


def test_pack_leaves_floats_bytes_and_uint64_alone():
    for value in (np.ones(3, np.float32), torch.ones(2), np.zeros(4, np.uint8), np.array([2**64 - 1], np.uint64), 7):
        assert pack(value) is value and unpack(value) is value


def test_counters_are_per_peer_and_kind_and_reset():
    stats = WireStats()
    stats.add(1, "sample", 100, 400)
    stats.add(1, "sample", 10, 40)
    stats.add(2, "gather", 8, 800)
    snap = stats.snapshot(reset=True)
    assert snap == {"1": {"neighbours": {"sent": 110, "received": 440, "calls": 2}},
                    "2": {"rows": {"sent": 8, "received": 800, "calls": 1}}}
    assert totals(snap) == {"neighbours": 550, "rows": 808}
    assert stats.snapshot() == {}


def test_loopback_call_counts_request_and_response_bytes():
    a, b = LoopbackTransport.group(2)
    b.register("gather", lambda ids: torch.zeros((len(ids), 4), dtype=torch.float32))
    a.call(1, "gather", torch.arange(10)).result()
    assert a.wire.snapshot() == {"1": {"rows": {"sent": 80, "received": 160, "calls": 1}}}
    assert b.wire.snapshot() == {}, "the callee does not count: each call is counted once, at its caller"


@pytest.fixture(scope="module")
def ds(graphs):
    return graphs["dataset3"].data


def test_row_bytes_are_the_packed_remote_rows_of_the_batches(ds, graphs):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    loader = DistributedNeighborLoader(ds, [4, 4], transports[0], torch.arange(0, 60), batch_size=30, prefetch=0)
    want_ids = want_rows = int64_rows = 0
    for batch in loader:  # one request per remote owner per batch, in n_id order (no cache, no halo replicas)
        owners = ds.owner(batch.n_id.numpy())
        for part in set(owners.tolist()) - {0}:
            sel = torch.from_numpy(owners == part)
            want_ids += payload_bytes(pack(batch.n_id[sel]))
            want_rows += sum(payload_bytes(pack(batch[k][sel])) for k in ("x", "y", "time", "orig_id"))
            int64_rows += int(sel.sum()) * 40  # x (4 float32), y, time and orig_id as int64
    snap = transports[0].wire.snapshot()
    assert set(snap) == {"1", "2"} and all("neighbours" in k and "rows" in k for k in snap.values())
    assert sum(k["rows"]["received"] for k in snap.values()) == want_rows
    calls = sum(k["rows"]["calls"] for k in snap.values())
    # a request: the node type (None), the attribute names, the packed IDs
    assert sum(k["rows"]["sent"] for k in snap.values()) == want_ids + calls * (8 + len("xytimeorig_id"))
    assert want_rows < 0.8 * int64_rows, "labels, times and IDs travel narrower than int64"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """3 partitions, no edge attributes: sampling answers need no positions."""
    from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable

    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 300, 2400), rng.integers(0, 300, 2400)
    source = GraphSource({None: NodeTable(300, {"x": ArrayRows(rng.standard_normal((300, 2)).astype(np.float32))})},
                         {None: EdgeTable(src, dst, {})})
    dest = tmp_path_factory.mktemp("plain") / "ds"
    graphstore.ingest(source, dest, num_parts=3)
    return graphstore.open_dataset(dest), src, dst


def _run(ds, **options):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    loader = DistributedNeighborLoader(ds, [5, 5], transports[0], torch.arange(0, 60), batch_size=20, prefetch=0,
                                       seed=3, **options)
    return list(loader), transports[0].wire.snapshot()


def test_edge_ids_are_sent_only_when_the_batch_carries_them(plain):
    plain = plain[0]
    with_ids, wire_with = _run(plain)
    without, wire_without = _run(plain, edge_ids=False)
    assert all("e_id" in b for b in with_ids) and not any("e_id" in b for b in without)
    for a, b in zip(with_ids, without, strict=True):  # same samples: only the edge IDs are left out
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
    edges = sum(int(((b.n_id[b.edge_index[1]] >= plain.node_offsets()[1])).sum()) for b in with_ids)
    got = sum(k["neighbours"]["received"] for k in wire_with.values())
    lean = sum(k["neighbours"]["received"] for k in wire_without.values())
    # a packed edge ID per remote edge (2 bytes: < 65,536 edges), its header (9) instead of None (8) per answer
    calls = sum(k["neighbours"]["calls"] for k in wire_with.values())
    assert edges and got - lean == 2 * edges + calls, (got, lean, edges, calls)


def test_remote_edge_ids_unpack_to_the_input_edges(plain):
    ds, src, dst = plain
    batches, _ = _run(ds)
    orig = torch.cat([ds.partition(p)[0][None, "orig_id", None] for p in range(ds.num_parts)]).numpy()
    remote = 0
    for batch in batches:
        e_id, (row, col) = batch.e_id.numpy(), batch.n_id[batch.edge_index].numpy()
        assert (src[e_id] == orig[row]).all() and (dst[e_id] == orig[col]).all()
        remote += int((col >= ds.node_offsets()[1]).sum())
    assert remote, "some edges were sampled on other partitions"


def test_edge_attributes_come_without_e_id_and_equal_those_with_it(ds):
    """dataset3 has edge attributes: positions (and edge IDs, to locate them) still travel, packed."""
    with_ids, _ = _run(ds)
    without, wire = _run(ds, edge_ids=False)
    assert not any("e_id" in b for b in without)
    for a, b in zip(with_ids, without, strict=True):
        assert torch.equal(a.edge_index, b.edge_index)
        assert torch.equal(a.edge_time, b.edge_time) and torch.equal(a.weight, b.weight)
        assert a.edge_time.dtype == torch.int64
    assert sum(k["edge_attrs"]["calls"] for k in wire.values() if "edge_attrs" in k) > 0


def test_edge_ids_must_be_a_bool(plain):
    from graphstore.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="edge_ids='no' given to the distributed sampler"):
        _run(plain[0], edge_ids="no")


def test_a_servers_pick_counts_are_bincount_in_any_order():
    from sampling.distributed.wire import _counts

    rng = np.random.default_rng(0)
    for col in (np.sort(rng.integers(0, 50, 400)), rng.integers(0, 50, 400), np.zeros(0, np.int64),
                np.array([3, 3, 1, 3])):  # in request order (a node's picks contiguous), shuffled, none, runs apart
        assert _counts(col, 60).tolist() == np.bincount(col, minlength=60).tolist()


def test_packing_within_known_bounds_is_exact_and_falls_back_to_the_span_outside_them():
    values = np.array([5, 70_000, 0, 69_999], np.int64)
    inside = pack(values, (0, 99_999))
    assert isinstance(inside, Packed) and inside.values.dtype == np.uint32 and inside.base == 0
    assert unpack(inside).tolist() == values.tolist()
    narrow = pack(values - 70_000 + 200, (-69_800, 200))  # a range of 70,000: uint32 whatever the values
    assert unpack(narrow).tolist() == (values - 70_000 + 200).tolist()
    wrong = pack(np.array([3, 2**40, -7], np.int64), (0, 255))  # a bound the values break: packed by span
    assert wrong.base == -7 and unpack(wrong).tolist() == [3, 2**40, -7]
    assert pack(np.zeros(0, np.int64), (0, 9)).values.size == 0
    assert pack(np.array([1, 2], np.int32), (0, 9)).dtype == "<i4"  # not int64: pack's own rules


def test_every_width_packs_and_unpacks_in_one_specialisation():
    """The widths a graph's size picks (uint32 IDs above 65,536 nodes) run the kernels the warm-up compiled on its
    tiny graphs (uint8), not one compiled at the first batch."""
    from sampling.distributed import wire

    for top in (200, 60_000, 2**31, 2**40):
        values = np.array([0, top // 3, top], np.int64)
        assert unpack(pack(values)).tolist() == values.tolist() == unpack(pack(values, (0, top))).tolist()
        out = np.empty(3, np.int64)
        unpack_into(pack(values), out)
        assert out.tolist() == values.tolist()
    assert len(wire._narrow_raw.signatures) == len(wire._widen_raw.signatures) == 1
