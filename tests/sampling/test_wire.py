"""Bytes on the wire: payload sizes, per-peer/per-kind counters, and exact row bytes of a distributed loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sampling.dist_loader import DistributedNeighborLoader
from sampling.distributed import PartitionServer
from sampling.transport import LoopbackTransport
from sampling.wire import WireStats, payload_bytes, totals


def test_payload_bytes_counts_arrays_tensors_strings_and_scalars():
    assert payload_bytes(np.zeros((3, 5), np.float32)) == 60
    assert payload_bytes(torch.zeros(7, dtype=torch.int64)) == 56
    assert payload_bytes(("abc", None, [torch.ones(2), {"k": 1}])) == 3 + 8 + 8 + 1 + 8
    assert payload_bytes(b"\x00" * 9) == 9


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


def test_row_bytes_received_equal_the_remote_rows_of_the_batches(ds, graphs):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    loader = DistributedNeighborLoader(ds, [4, 4], transports[0], torch.arange(0, 60), batch_size=30, prefetch=0)
    lo, hi = ds.node_offsets()[0:2]
    remote_rows, row_bytes = 0, set()
    for batch in loader:
        n_id = batch.n_id.numpy()
        remote_rows += int(((n_id < lo) | (n_id >= hi)).sum())
        row_bytes.add(sum(batch[k][0].numel() * batch[k].element_size() for k in ("x", "y", "time", "orig_id")))
    (row_bytes,) = row_bytes  # x (4 float32), y, time and orig_id (int64): 40 bytes a node
    snap = transports[0].wire.snapshot()
    assert set(snap) == {"1", "2"} and all("neighbours" in k and "rows" in k for k in snap.values())
    received_rows = sum(k["rows"]["received"] for k in snap.values())
    sent_ids = sum(k["rows"]["sent"] for k in snap.values())
    # rows requested by ID (int64) and answered with the node's attributes (no halo replicas in this dataset)
    assert received_rows == remote_rows * row_bytes, (received_rows, remote_rows, row_bytes)
    assert sent_ids >= remote_rows * 8
