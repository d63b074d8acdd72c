"""Trimmed built-in models (PyG's trim_to_layer on our batches) give the untrimmed seed outputs."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from sampling import NeighborLoader
from training.loop.tasks import TRIMMED_MODELS, build_model, trim_arguments


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n = 600
    data = Data(x=torch.randn(n, 8, generator=gen), edge_index=torch.randint(0, n, (2, 5000), generator=gen))
    loader = NeighborLoader(data, [5, 4, 3], batch_size=32, input_nodes=torch.arange(64), seed=seed)
    return next(iter(loader))


@pytest.mark.parametrize("name", TRIMMED_MODELS)
def test_trimmed_model_gives_the_untrimmed_seed_outputs(name):
    torch.manual_seed(0)
    batch = _batch()
    model = build_model(name, 8, 16, 3, 3, 0.0).eval()
    trim = trim_arguments(name, batch)
    assert len(trim["num_sampled_nodes_per_hop"]) == 4 and len(trim["num_sampled_edges_per_hop"]) == 3
    assert trim["num_sampled_nodes_per_hop"][-1] > 0  # the outer hop exists, so trimming drops something
    seeds = batch.batch_size
    full = model(batch.x, batch.edge_index)
    trimmed = model(batch.x, batch.edge_index, **trim)
    assert trimmed.size(0) < full.size(0)  # the last layer ran over fewer nodes
    torch.testing.assert_close(trimmed[:seeds], full[:seeds], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", TRIMMED_MODELS)
def test_trimmed_gradients_match(name):
    torch.manual_seed(1)
    batch = _batch(seed=1)
    model = build_model(name, 8, 16, 3, 3, 0.0)
    grads = []
    for trim in ({}, trim_arguments(name, batch)):
        model.zero_grad()
        model(batch.x, batch.edge_index, **trim)[: batch.batch_size].square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_gcn_and_unsampled_batches_are_not_trimmed():
    batch = _batch()
    assert trim_arguments("gcn", batch) == {}  # GCN's normalisation reads source degrees: trimming changes it
    assert trim_arguments("sage", Data(x=batch.x, edge_index=batch.edge_index)) == {}
    model = build_model("gcn", 8, 16, 3, 3, 0.0).eval()
    full = model(batch.x, batch.edge_index)[: batch.batch_size]
    naive = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                  num_sampled_edges_per_hop=batch.num_sampled_edges)[: batch.batch_size]
    assert not torch.allclose(full, naive, atol=1e-4)  # why GCN is left out


def _rows_per_layer(model, batch, trim):
    rows = []
    hooks = [conv.register_forward_hook(lambda _m, _i, out: rows.append(out.size(0))) for conv in model.convs]
    try:
        out = model(batch.x, batch.edge_index, **trim)
    finally:
        for h in hooks:
            h.remove()
    return out, rows


@pytest.mark.parametrize("name", ["sage", "gin"])  # GAT transforms every source row anyway, and keeps the first
def test_each_layer_computes_only_the_rows_the_next_layer_reads(name):
    batch = _batch()
    model = build_model(name, 8, 16, 3, 3, 0.0).eval()
    nodes = batch.num_sampled_nodes
    out, rows = _rows_per_layer(model, batch, trim_arguments(name, batch))
    # layer i of 3 writes the nodes of hops 0..2-i: PyG's trim_to_layer writes one hop more in each layer
    assert rows == [sum(nodes[:3]), sum(nodes[:2]), nodes[0]]
    assert out.size(0) == batch.batch_size


@pytest.mark.parametrize("name", TRIMMED_MODELS)
def test_sage_and_gin_aggregate_by_a_sparse_product_on_cpu(name):
    batch = _batch()
    model = build_model(name, 8, 16, 3, 3, 0.0).eval()
    calls = []
    for conv in model.convs:
        conv.message = lambda *a, _m=conv.message, **k: calls.append(1) or _m(*a, **k)
    out = model(batch.x, batch.edge_index, **trim_arguments(name, batch))
    assert len(calls) == (3 if name == "gat" else 0)  # no per-edge message: no edges-by-features tensor
    assert out.size(0) == batch.batch_size
    calls.clear()
    full = model(batch.x, batch.edge_index)  # untrimmed: PyG's own forward, one message per layer
    assert len(calls) == 3
    torch.testing.assert_close(out, full[: batch.batch_size], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", TRIMMED_MODELS)
def test_edges_out_of_destination_order_give_the_same_outputs(name):
    torch.manual_seed(2)
    batch = _batch(seed=2)
    model = build_model(name, 8, 16, 3, 3, 0.0).eval()
    trim = trim_arguments(name, batch)
    ordered = model(batch.x, batch.edge_index, **trim)
    bounds = [0, *torch.tensor(trim["num_sampled_edges_per_hop"]).cumsum(0).tolist()]
    order = torch.cat([lo + torch.randperm(hi - lo) for lo, hi in zip(bounds, bounds[1:])])  # shuffled in each hop
    edge_index = batch.edge_index[:, order]
    assert not bool((edge_index[1][1:] >= edge_index[1][:-1]).all())
    shuffled = model(batch.x, edge_index, **trim)
    torch.testing.assert_close(shuffled, ordered, rtol=1e-5, atol=1e-5)


def test_the_built_in_models_keep_pygs_parameters():
    from torch_geometric.nn.models import GAT, GIN, GraphSAGE

    for name, cls in (("sage", GraphSAGE), ("gin", GIN), ("gat", GAT)):
        ours = build_model(name, 8, 16, 3, 2, 0.0)
        assert isinstance(ours, cls)
        assert ours.state_dict().keys() == cls(8, 16, num_layers=2, out_channels=3).state_dict().keys()


@pytest.mark.parametrize("name", ["sage", "gat", "gcn"])
def test_a_link_model_encodes_once_and_in_blocks_down_to_its_seeds(name):
    """graphstore-train's link model: positives and negatives scored from one pass of the encoder, which runs
    in blocks down to the links' ends (hop 0) for the built-in SAGE/GAT/GIN; the same scores as PyG's forward."""
    from sampling import LinkNeighborLoader
    from training.loop.tasks import LinkModel

    torch.manual_seed(3)
    gen = torch.Generator().manual_seed(3)
    n = 600
    edge_index = torch.randint(0, n, (2, 5000), generator=gen)
    data = Data(x=torch.randn(n, 8, generator=gen), edge_index=edge_index)
    loader = LinkNeighborLoader(data, [5, 4], edge_label_index=edge_index[:, :64], batch_size=32,
                                neg_sampling=dict(mode="triplet", amount=3))
    batch = next(iter(loader))
    model = LinkModel(build_model(name, 16, 16, 16, 2, 0.0), {None: n}, {None: 8}, 16, None, name).eval()
    src, pos, neg = batch.src_index, batch.dst_pos_index, batch.dst_neg_index.reshape(-1)
    pairs = ((src, pos), (src.repeat_interleave(3), neg))
    rows = []
    hook = model.encoder.convs[-1].register_forward_hook(lambda _m, _i, out: rows.append(out.size(0)))
    got = model(batch, *pairs)
    hook.remove()
    assert len(rows) == 1  # one pass for both
    seeds = batch.num_sampled_nodes[0]
    assert rows[0] == (batch.num_nodes if name == "gcn" else seeds if name == "sage" else seeds + batch.num_sampled_nodes[1])
    h = model.encoder(model._input(None, batch), batch.edge_index)  # no counts: PyG's forward, untrimmed
    for (a, b), scores in zip(pairs, got):
        torch.testing.assert_close(scores, (h[a] * h[b]).sum(-1), rtol=1e-5, atol=1e-5)
    beyond = torch.tensor([seeds])  # a scored node past the seeds: PyG's forward, every node's row
    torch.testing.assert_close(model(batch, (beyond, beyond)), (h[beyond] * h[beyond]).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", TRIMMED_MODELS)
def test_on_a_gpu_the_models_in_blocks_give_the_cpu_outputs_and_gradients(name):
    """On CUDA the built-in models run in blocks through PyG's scatter path (the sparse product is the CPU's):
    the seeds' outputs and the gradients are the CPU's, trimmed and untrimmed. Run by tools/device_checks.sh."""
    torch.manual_seed(3)
    batch = _batch(seed=3)
    model = build_model(name, 8, 16, 3, 3, 0.0)
    trim = trim_arguments(name, batch)
    got = {}
    for device in ("cpu", "cuda"):
        for trimmed in (False, True):
            here, on = model.to(device), batch.clone().to(device)
            here.zero_grad()
            out = here(on.x, on.edge_index, **(trim if trimmed else {}))[: on.batch_size]
            out.square().sum().backward()
            got[device, trimmed] = (out.detach().cpu(), [p.grad.cpu() for p in here.parameters() if p.grad is not None])
    for trimmed in (False, True):
        (cpu_out, cpu_grads), (gpu_out, gpu_grads) = got["cpu", trimmed], got["cuda", trimmed]
        torch.testing.assert_close(gpu_out, cpu_out, rtol=1e-4, atol=1e-4)
        assert len(gpu_grads) == len(cpu_grads) > 0
        for a, b in zip(gpu_grads, cpu_grads):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
