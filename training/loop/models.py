"""GraphSAGE, GIN and GAT as PyG builds them, run layer by layer over the nodes the next layer reads.

``graphstore-train``'s built-in models, and drop-ins for PyG's in a loop of your own: same constructor,
parameters and ``state_dict``; give ``forward`` the batch's per-hop counts to run in blocks::

    from training.loop.models import GraphSAGE

    model = GraphSAGE(in_channels, 128, num_layers=2, out_channels=classes)
    out = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                num_sampled_edges_per_hop=batch.num_sampled_edges)[: batch.batch_size]

A sampled batch lists its nodes hop by hop (the seeds first) and its edges hop by hop, each edge pointing
at a node of the hop before. Layer ``i`` of ``L`` needs outputs only for the nodes of the first ``L - i``
hops: they are a prefix of the batch's nodes, their incoming edges a prefix of its edges, and those edges'
sources the nodes of one hop more. PyG's ``trim_to_layer`` drops the outer hops layer by layer, but each
layer still computes an output row, with its dense transforms, for every node it keeps; the outermost
kept hop's rows are thrown away by the next layer. On a batch of fanout 10,5 that is five rows in six of
the first layer. Here each layer computes only its destination rows, as a bipartite block.

On CPU, GraphSAGE and GIN layers also aggregate by a sparse-dense product over the block's adjacency in
CSR form (``torch.sparse.mm``), instead of PyG's gather of one feature row per edge and scatter: the
first layer of a batch with wide features no longer allocates an edges-by-features tensor.

The seeds' outputs and every gradient are those of the untrimmed model (``tests/training/test_trim.py``);
only the dropout masks fall on fewer rows.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import models as pyg
from torch_geometric.nn.conv import GINConv, SAGEConv


class _Blocks:
    """``forward`` of a built-in :class:`~torch_geometric.nn.models.BasicGNN` that, given the batch's
    per-hop counts, runs layer by layer over bipartite blocks (see the module's docstring). Without the
    counts, or with inputs the blocks do not cover (edge weights or attributes, jumping knowledge, a
    normalisation that reads ``batch``), it is PyG's own ``forward``."""

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None,
                edge_attr: Tensor | None = None, batch: Tensor | None = None, batch_size: int | None = None,
                num_sampled_nodes_per_hop: list[int] | None = None,
                num_sampled_edges_per_hop: list[int] | None = None) -> Tensor:
        plain = (not isinstance(num_sampled_nodes_per_hop, (list, tuple))
                 or not isinstance(num_sampled_edges_per_hop, (list, tuple))
                 or edge_weight is not None or edge_attr is not None or self.jk_mode is not None
                 or self.supports_norm_batch or not isinstance(edge_index, Tensor) or edge_index.is_sparse
                 or len(num_sampled_nodes_per_hop) != self.num_layers + 1
                 or len(num_sampled_edges_per_hop) != self.num_layers)
        if plain:
            return super().forward(x, edge_index, edge_weight, edge_attr, batch, batch_size,  # type: ignore[misc]
                                   num_sampled_nodes_per_hop, num_sampled_edges_per_hop)
        layers = self.num_layers
        nodes = _prefix_sums(num_sampled_nodes_per_hop)  # nodes[h]: the nodes of hops 0..h-1
        edges = _prefix_sums(num_sampled_edges_per_hop)
        csr: _Adjacency | None = None  # built once, by the first layer that aggregates by a sparse product
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            dst, src, n_edges = nodes[layers - i], nodes[layers - i + 1], edges[layers - i]
            x = x[:src]
            if x.device.type == "cpu" and _sparse_ok(conv):
                csr = csr or _Adjacency(edge_index, nodes[layers], x.dtype)
                x = conv((x, x[:dst]), csr.block(dst, src))
            elif isinstance(conv, (SAGEConv, GINConv)):
                x = conv((x, x[:dst]), edge_index[:, :n_edges], size=(src, dst))
            else:  # GAT: one transform of every source row serves the destinations too; keep their rows only
                x = conv(x, edge_index[:, :n_edges])[:dst]
            if i < layers - 1:
                if self.act is not None and self.act_first:
                    x = self.act(x)
                x = norm(x)
                if self.act is not None and not self.act_first:
                    x = self.act(x)
                x = self.dropout(x)
        return self.lin(x) if hasattr(self, "lin") else x


def _prefix_sums(counts: list[int]) -> list[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + int(c))
    return out


def _sparse_ok(conv: Any) -> bool:
    """Whether ``conv`` computes the same by a sparse product: PyG's own SAGE and GIN layers (not a subclass,
    whose ``message`` may differ) aggregating by a mean or a sum where PyG itself would fuse them (``fuse``: no
    explain mode, one decomposed layer)."""
    return (type(conv) in (SAGEConv, GINConv) and conv.fuse and conv.aggr in ("mean", "sum", "add")
            and not conv.explain and conv.decomposed_layers == 1)


class _Adjacency:
    """A batch's edges as CSR rows of destinations (the batch's ``[2, E]`` ``edge_index``, source row first),
    built once; :meth:`block` is the ``dst x src`` adjacency of a layer as views of it."""

    def __init__(self, edge_index: Tensor, rows: int, dtype: torch.dtype) -> None:
        src, dst = edge_index[0], edge_index[1]
        if dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):  # samplers list edges by destination
            order = torch.argsort(dst, stable=True)
            src, dst = src[order], dst[order]
        self.ptr = torch._convert_indices_from_coo_to_csr(dst, rows, out_int32=False)
        self.src, self.dtype = src, dtype
        self.ones: Tensor | None = None

    def block(self, dst: int, src: int) -> Tensor:
        ptr = self.ptr[: dst + 1]
        n = int(ptr[-1])
        if self.ones is None:
            self.ones = torch.ones(self.src.numel(), dtype=self.dtype)
        with warnings.catch_warnings():  # torch warns once per process that sparse CSR is a beta feature
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(ptr, self.src[:n], self.ones[:n], (dst, src), check_invariants=False)


class GraphSAGE(_Blocks, pyg.GraphSAGE):
    """PyG's :class:`~torch_geometric.nn.models.GraphSAGE` (same parameters and state), run in blocks."""


class GIN(_Blocks, pyg.GIN):
    """PyG's :class:`~torch_geometric.nn.models.GIN` (same parameters and state), run in blocks."""


class GAT(_Blocks, pyg.GAT):
    """PyG's :class:`~torch_geometric.nn.models.GAT` (same parameters and state), run in blocks."""


MODELS = {"sage": GraphSAGE, "gin": GIN, "gat": GAT}  # graphstore-train's --model names
