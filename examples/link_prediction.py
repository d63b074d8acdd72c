"""Link prediction with your own encoder and decoder on the link split stored in the dataset.

    graphstore ingest synthetic:nodes=4000,features=16 graphs/links --parts 2 --link-split 0.8,0.1,0.1
    graphstore-run --nproc 2 examples/link_prediction.py graphs/links

Messages pass over training links only (and validation links when testing); a batch never holds
its own links or their reverses: no leak from the labels into the graph.
"""
import argparse

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv

from training import Session


class Model(torch.nn.Module):
    def __init__(self, in_channels, hidden):
        super().__init__()
        self.conv1, self.conv2 = SAGEConv(in_channels, hidden), SAGEConv(hidden, hidden)
        self.decoder = torch.nn.Sequential(torch.nn.Linear(2 * hidden, hidden), torch.nn.ReLU(),
                                           torch.nn.Linear(hidden, 1))  # an MLP over the pair

    def forward(self, batch):
        h = self.conv2(F.relu(self.conv1(batch.x.float(), batch.edge_index)), batch.edge_index)
        src, dst = batch.edge_label_index
        return self.decoder(torch.cat([h[src], h[dst]], -1)).view(-1)


@torch.no_grad()
def accuracy(s, model, loader):
    model.eval()
    right = seen = 0
    for batch in loader:
        batch = batch.to(s.device)
        right += int(((model(batch) > 0).float() == batch.edge_label).sum())
        seen += batch.edge_label.numel()
    right, seen = s.all_reduce(torch.tensor([right, seen])).tolist()
    return right / seen


p = argparse.ArgumentParser()
p.add_argument("dataset")
p.add_argument("--epochs", type=int, default=3)
args = p.parse_args()

with Session(args.dataset, seed=0) as s:
    train = s.link_loader([10, 5], split="train", batch_size=256, shuffle=True, neg_sampling="binary")
    test = s.link_loader([10, 5], split="test", batch_size=512, neg_sampling="binary", even=False)
    model = s.ddp(Model(s.num_features, 64))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        model.train()
        for batch in train:
            batch = batch.to(s.device)
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(batch), batch.edge_label)
            loss.backward()
            opt.step()
        acc = accuracy(s, model.module, test)
        if s.rank == 0:
            print(f"epoch {epoch + 1} loss {loss.item():.4f} test_acc {acc:.4f}", flush=True)
