"""Distributed layer-wise inference equals a single-process full-graph forward pass."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import traceback

import numpy as np
import pytest
import torch

import graphstore
from tests.conftest import join_spawned, spawn_ranks

pytestmark = [pytest.mark.distributed]


def _model(kind: str = "sage", seed: int = 0, out: int = 5, **options):
    from torch_geometric.nn import GAT, GIN, GraphSAGE

    torch.manual_seed(seed)
    return {"sage": GraphSAGE, "gin": GIN, "gat": GAT}[kind](8, 16, num_layers=3, out_channels=out, **options).eval()


# every layer projected first (SAGE's mean and sum, GIN; "wide": not its last layer, which widens 16 to 24) or
# reading its input's rows per batch (SAGE's max, GAT)
MODELS = {"mean": ("sage", {}), "sum": ("sage", {"aggr": "sum", "normalize": True}), "max": ("sage", {"aggr": "max"}),
          "gin": ("gin", {"train_eps": True}), "gat": ("gat", {}), "wide": ("sage", {"out": 24})}


def _worker(rank: int, world_size: int, rdzv: str, url: str, out_dir: str) -> None:
    try:
        from graphstore.dataset.rank_layout import RankLayout
        from sampling.distributed.server import PartitionServer
        from training.loop.inference import layerwise_inference
        from training.cluster.process_groups import start, stop
        from training.cluster.world import World

        transport = start(World(rank, world_size, rank, rdzv), timeout=60, use_rpc=True)
        ds = graphstore.open_dataset(url)
        PartitionServer(ds, rank).register(transport)
        layout = RankLayout(2, world_size)  # one rank: both partitions, joined
        spill = os.path.join(out_dir, f"spill{rank}")
        os.mkdir(spill)
        for name, (kind, options) in MODELS.items():
            model = _model(kind, **options)
            if kind == "gin":  # a learned eps, not 0: its own term counts
                for conv in model.convs:
                    conv.eps.data.fill_(0.3)
            for where in (None, spill):  # in memory; spilled to disk, every layer that can projected first
                out = layerwise_inference(model, ds, layout.parts_of(rank), transport, layout, kind, batch_size=64,
                                          spill=where)
                torch.save(out, f"{out_dir}/{name}{rank}{'s' if where else ''}.pt")
            assert os.listdir(spill) == []  # the spilled layers' files are gone
        _write_spilled(rank, world_size, ds, layout, transport, spill)
        torch.distributed.barrier()
        stop(transport, graceful=True)
        result = {"ok": True}
    except Exception:
        result = {"error": traceback.format_exc()}
    with open(f"{out_dir}/rank{rank}.json", "w") as fh:
        json.dump(result, fh)


def _write_spilled(rank: int, world_size: int, ds, layout, transport, spill: str) -> None:
    """graphstore-train's --infer-out (``write_outputs``) in a memory that its layers fit only spilled to disk:
    written into the dataset as ``spilled<world_size>``."""
    from types import SimpleNamespace

    from training.cluster.world import World
    from training.loop import featurecache, inference

    parts = tuple(layout.parts_of(rank))
    memory = inference.inference_bytes(ds, parts, 16, 64, projected=True, spilled=True)  # the smallest batches
    assert inference.plan(ds, parts, 16, memory, 0, True).spill is not None  # in memory it would not fit
    featurecache.memory_limit, inference.resident_bytes = (lambda ranks: memory), (lambda: 0)
    tempfile.tempdir = spill  # TMPDIR
    made = []

    class Counted(inference.SpillFile):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            made.append(self.path)

    inference.SpillFile = Counted
    config = SimpleNamespace(task="node", model="sage", hidden=16, infer_out=f"spilled{world_size}")
    trainer = SimpleNamespace(config=config, dataset=ds, parts=parts, layout=layout, transport=transport,
                              world=World(rank, world_size, rank, "file:///unused"), features=None)
    inference.write_outputs(trainer, _model("sage"))
    assert len(made) == 4 and os.listdir(spill) == []  # layers 0 and 1: own terms and outputs on disk, now gone


def test_layerwise_inference_matches_full_graph_forward(tmp_path):

    from graphstore.dataset.whole import DatasetFeatureStore, DatasetGraphStore
    from tests.conftest import small_graph

    source, _ = small_graph(n=500, e=4000, seed=11)
    graphstore.ingest(source, tmp_path / "ds", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "ds")
    x = DatasetFeatureStore(ds)[None, "x", None].float()
    src, dst = DatasetGraphStore(ds).get_edge_index(None, "coo")
    for world in (2, 1):  # a rank a partition, then one rank over both
        out = tmp_path / f"world{world}"
        out.mkdir()
        ctx = spawn_ranks(_worker, (world, f"file://{out}/rdzv", str(tmp_path / "ds"), str(out)), world)
        join_spawned(ctx, 120)
        for rank in range(world):
            got = json.loads((out / f"rank{rank}.json").read_text())
            assert "error" not in got, got.get("error")
        for name, (kind, options) in MODELS.items():  # projected first or not: the same outputs
            model = _model(kind, **options)
            if kind == "gin":
                for conv in model.convs:
                    conv.eps.data.fill_(0.3)
            with torch.no_grad():
                full = model(x, torch.stack([src, dst]))
            for spilled in ("", "s"):
                layered = torch.cat([torch.load(out / f"{name}{r}{spilled}.pt") for r in range(world)])
                assert layered.shape == full.shape
                assert torch.allclose(layered, full, atol=1e-5), (world, name, spilled,
                                                                  float((layered - full).abs().max()))
        written = DatasetFeatureStore(graphstore.open_dataset(tmp_path / "ds"))[None, f"spilled{world}", None]
        with torch.no_grad():  # write_outputs, its layers spilled, wrote the forward pass into the dataset
            assert torch.allclose(written, _model("sage")(x, torch.stack([src, dst])), atol=1e-5), world


def test_sage_and_gin_layers_project_first_and_the_others_read_x_per_batch():
    from torch_geometric.nn import MLP, GATConv, GINConv, SAGEConv

    from training.loop.inference import projects_first
    from training.loop.models import MODELS as BUILT_IN

    for kind in ("sage", "gin"):  # graphstore-train's
        assert projects_first(BUILT_IN[kind](8, 16, num_layers=2, out_channels=4).convs[0]), kind
    assert not projects_first(BUILT_IN["gat"](8, 16, num_layers=2, out_channels=4).convs[0])
    assert projects_first(GINConv(MLP([8, 4, 4])))
    assert projects_first(SAGEConv(8, 4, aggr="sum")) and projects_first(SAGEConv(8, 4, root_weight=False))
    assert not projects_first(SAGEConv(8, 4, aggr="max")) and not projects_first(SAGEConv(8, 4, project=True))
    assert not projects_first(GINConv(torch.nn.Linear(8, 4))) and not projects_first(GATConv(8, 4))


@pytest.mark.slow
def test_graphstore_train_writes_predictions_back(cora2, tmp_path):
    import shutil

    from tests.training.conftest import metrics, run_train

    ds_path = tmp_path / "cora"
    shutil.copytree(cora2, ds_path)
    out = run_train(ds_path, "--nproc", 2, "--epochs", 6, "--eval-every", 6, "--fanout", "10,10", "--batch-size", 32, "--lr", 0.01,
                    "--hidden", 64, "--infer-out", "logits", "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    ds = graphstore.open_dataset(ds_path)
    assert [o.name for o in ds.manifest.outputs] == ["logits"]
    assert ds.verify() == []
    from graphstore.dataset.whole import DatasetFeatureStore

    fs = DatasetFeatureStore(ds)
    logits, y, test = (fs[None, k, None] for k in ("logits", "y", "test_mask"))
    assert logits.shape == (2708, 7)
    accuracy = float((logits[test].argmax(-1) == y[test]).float().mean())
    from tests.conftest import features_only_accuracy

    baseline = features_only_accuracy(ds)  # the same split, features only: about 0.45
    assert accuracy >= max(0.75, baseline + 0.15), (accuracy, baseline)  # full neighbourhoods, as good as sampled
    orig = fs[None, "orig_id", None]
    assert sorted(orig.tolist()) == list(range(2708))  # rows map back to Cora's input IDs
    assert metrics(tmp_path / "m.json")["epochs"][-1]["test_acc"] > 0.7


def test_inference_that_cannot_fit_a_ranks_memory_is_refused_at_the_door(cora2, monkeypatch, tmp_path, caplog):
    """--infer-out holds a layer's input and outputs for the rank's nodes (float32, ``hidden`` wide), its CSC and
    a batch's rows, not x (read batch by batch): where that exceeds the rank's memory, its layers go to disk
    (TMPDIR), and where even that does not fit the trainer refuses before training (in one line naming both), not
    mid-write."""
    from graphstore.errors import InvalidInputError
    from training.loop import featurecache, inference

    ds = graphstore.open_dataset(cora2)
    node, edge = ds.manifest.node_types[0], ds.manifest.edge_types[0]
    nodes, edges = int(node.offsets[1] - node.offsets[0]), int(edge.edges_per_part[0])
    full = inference.inference_bytes(ds, (0,), hidden=64)
    assert inference.inference_bytes(ds, (0,), hidden=96) - full == 4 * nodes * 2 * 32  # a layer in and out
    batch = full - 4 * nodes * 2 * 64 - 16 * (nodes + 1 + edges)  # one batch: every own node's in-edges here
    assert batch == 4 * 1433 * (4 * min(nodes + edges, 2708) + 2 * edges) + 32 * edges  # rows and messages of x
    assert inference.batch_bytes(ds, (0,), 64, 4096) == batch
    assert inference.inference_bytes(ds, (0, 1), hidden=64) > full  # both partitions: more rows
    # batches shrink to fit an eighth of the memory (halved from 4,096 to at least 64)
    assert inference.inference_batch(ds, (0,), 64, 8 * batch) == 4096
    small = inference.inference_batch(ds, (0,), 64, 8 * batch - 1)
    assert small < 4096 and inference.batch_bytes(ds, (0,), 64, small) <= batch - 1
    assert inference.inference_batch(ds, (0,), 64, 1) == 64
    # layer 0 projected first (SAGE, GIN): a batch's rows and messages are 64 wide, not x's 1,433
    rows = min(nodes + edges, 2708)
    assert inference.batch_bytes(ds, (0,), 64, 4096, projected=True) == max(
        4 * 64 * (4 * rows + 2 * edges) + 32 * edges, 4 * nodes * (1433 + 2 * 64)) < batch
    need = inference.inference_bytes(ds, (0,), hidden=64, batch_size=64)  # with the smallest batches
    assert need < full
    spilled = inference.inference_bytes(ds, (0,), hidden=64, batch_size=64, spilled=True)
    assert need - spilled == 4 * nodes * 64  # spilled: one layer's projections held, not a layer in and out
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # TMPDIR, on a disk
    monkeypatch.setattr(featurecache, "memory_limit", lambda ranks: (2 * need - 2) // ranks)  # a host's share
    monkeypatch.setattr(inference, "resident_bytes", lambda: 0)
    inference.check_memory(ds, (0,), 64, local_ranks=1, model="gat")  # fits: nothing said (GAT reads x per batch)
    assert inference.plan(ds, (0,), 64, 2 * need - 2, 0, False).spill is None  # its layers in memory
    monkeypatch.setattr(inference, "resident_bytes", lambda: need)  # unless the rank holds as much already:
    with caplog.at_level(logging.WARNING, logger=inference.__name__):
        inference.check_memory(ds, (0,), 64, local_ranks=1, model="gat")  # then its layers go to disk
    assert f"will be written to {tmp_path}" in caplog.text
    assert inference.plan(ds, (0,), 64, 2 * need - 2, need, False) == inference.Plan(64, str(tmp_path), spilled)
    monkeypatch.setattr(inference, "resident_bytes", lambda: 2 * need - spilled)  # not even spilled
    with pytest.raises(InvalidInputError) as held:
        inference.check_memory(ds, (0,), 64, local_ranks=1, model="gat")
    assert f"beside the {(2 * need - spilled) / 1e9:.2f} GB the rank holds already" in str(held.value)
    assert f"or {spilled / 1e9:.2f} GB with its layers spilled to disk" in str(held.value)
    # after training (admitted at the door), a resident set that seems to leave room for neither: spilled, the lighter
    assert inference.plan(ds, (0,), 64, 2 * need - 2, 2 * need - spilled, False, refuse=False).spill == str(tmp_path)
    monkeypatch.setattr(inference, "resident_bytes", lambda: need - spilled)
    with pytest.raises(InvalidInputError) as caught:
        inference.check_memory(ds, (0,), 64, local_ranks=2, model="gat")  # two ranks share it: half each
    said = str(caught.value)
    assert said.startswith("--infer-out") and f"about {need / 1e9:.2f} GB" in said and "drop --infer-out" in said
    assert "\n" not in said
    inference.check_memory(ds, (0,), 64, local_ranks=2, model="sage")  # projected first: it fits there
    # where spilling cannot help: a temporary directory in memory, or a disk without room
    monkeypatch.setattr(inference, "resident_bytes", lambda: need)
    mounts = tmp_path / "mounts"  # the mount table, as /proc/self/mounts writes it: TMPDIR on a tmpfs
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {tmp_path} tmpfs rw,size=5m 0 0\n")
    monkeypatch.setattr(inference, "MOUNTS", str(mounts))
    with pytest.raises(InvalidInputError) as tmpfs:
        inference.check_memory(ds, (0,), 64, local_ranks=1, model="gat")
    assert f"its layers cannot go to disk: {tmp_path} is tmpfs, in memory" in str(tmpfs.value)
    assert str(tmpfs.value).endswith("or set TMPDIR to a disk with room") and "\n" not in str(tmpfs.value)
    assert inference.plan(ds, (0,), 64, 2 * need - 2, need, False, refuse=False).spill is None  # memory, then
    monkeypatch.setattr(inference, "MOUNTS", "/proc/self/mounts")
    assert inference.spill_refusal(str(tmp_path), 1 << 60).startswith(f"{tmp_path} has ")  # an exabyte: no room
