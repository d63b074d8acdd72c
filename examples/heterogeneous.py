"""Heterogeneous node classification with your own HeteroConv: papers by venue, over authors and fields.

    graphstore ingest synthetic-mag:papers=2000,features=16,classes=4 graphs/mag --parts 2
    graphstore-run --nproc 2 examples/heterogeneous.py graphs/mag
"""
import argparse

import torch
import torch.nn.functional as F
from torch_geometric.nn import HeteroConv, SAGEConv

from training import Session


class Net(torch.nn.Module):
    def __init__(self, edge_types, hidden, out_channels):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            HeteroConv({et: SAGEConv((-1, -1), hidden) for et in edge_types}, aggr="sum") for _ in range(2))
        self.out = torch.nn.Linear(hidden, out_channels)

    def forward(self, x, edge_index):
        for conv in self.convs:
            x = {k: F.relu(h) for k, h in conv(x, edge_index).items()}
        return self.out(x["paper"])


def inputs(batch):  # featureless node types get a constant input
    ones = {t: torch.ones(batch[t].num_nodes, 1, device=batch["paper"].y.device) for t in batch.node_types}
    return {t: batch[t].x.float() if "x" in batch[t] else ones[t] for t in batch.node_types}, batch.edge_index_dict


p = argparse.ArgumentParser()
p.add_argument("dataset")
p.add_argument("--epochs", type=int, default=3)
args = p.parse_args()

with Session(args.dataset, seed=0) as s:
    train = s.loader([10, 5], input_nodes=("paper", "train_mask"), batch_size=128, shuffle=True)
    test = s.loader([10, 5], input_nodes=("paper", "test_mask"), batch_size=512, even=False)
    net = Net(s.dataset.edge_types, 64, s.num_classes["paper"])
    with torch.no_grad():  # one forward pass sizes the lazy (-1) inputs before DDP copies the weights
        net(*inputs(next(iter(test))))
    model = s.ddp(net)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        model.train()
        for batch in train:
            batch = batch.to(s.device)
            opt.zero_grad()
            n = batch["paper"].batch_size
            loss = F.cross_entropy(model(*inputs(batch))[:n], batch["paper"].y[:n])
            loss.backward()
            opt.step()
        right = seen = 0
        with torch.no_grad():
            for batch in test:
                n = batch["paper"].batch_size
                right += int((net(*inputs(batch.to(s.device)))[:n].argmax(-1) == batch["paper"].y[:n]).sum())
                seen += n
        right, seen = s.all_reduce(torch.tensor([right, seen])).tolist()
        if s.rank == 0:
            print(f"epoch {epoch + 1} loss {loss.item():.4f} test_acc {right / max(seen, 1):.4f}", flush=True)
