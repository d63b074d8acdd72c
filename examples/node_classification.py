"""Node classification with your own model, loop and evaluation; SIGTERM saves and exits 75, --resume goes on.

    graphstore-run --nproc 2 examples/node_classification.py graphs/tiny    # or --device cuda: the same on GPUs
    torchrun --standalone --nproc-per-node 2 examples/node_classification.py graphs/tiny
"""
import argparse

import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphConv

from training import Session


class Net(torch.nn.Module):
    def __init__(self, in_channels, hidden, out_channels):
        super().__init__()
        self.conv1, self.conv2 = GraphConv(in_channels, hidden), GraphConv(hidden, out_channels)

    def forward(self, x, edge_index):
        x = F.dropout(F.relu(self.conv1(x, edge_index)), p=0.5, training=self.training)
        return self.conv2(x, edge_index)


@torch.no_grad()
def accuracy(s, model, loader):
    model.eval()
    right = seen = 0
    for batch in loader:  # this rank's own test nodes; the ranks add up their counts
        batch = batch.to(s.device)
        pred = model(batch.x, batch.edge_index)[: batch.batch_size].argmax(-1)
        right, seen = right + int((pred == batch.y[: batch.batch_size]).sum()), seen + batch.batch_size
    right, seen = s.all_reduce(torch.tensor([right, seen])).tolist()
    return right / seen


p = argparse.ArgumentParser()
p.add_argument("dataset")
p.add_argument("--epochs", type=int, default=5)
p.add_argument("--batch-size", type=int, default=128)
p.add_argument("--checkpoint", default="node.ckpt")
p.add_argument("--resume", action="store_true")
args = p.parse_args()

with Session(args.dataset, seed=0) as s:
    train = s.loader([10, 5], input_nodes="train_mask", batch_size=args.batch_size, shuffle=True)
    test = s.loader([10, 5], input_nodes="test_mask", batch_size=512, even=False)  # this rank's own, once each
    model = s.ddp(Net(s.num_features, 64, s.num_classes))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    epoch, totals = 0, torch.zeros(2)
    if args.resume:
        state = s.load(args.checkpoint)
        model.module.load_state_dict(state["model"]), opt.load_state_dict(state["opt"])
        epoch, totals = state["epoch"], state["totals"] * (s.rank == 0)
    while epoch < args.epochs:
        model.train()
        for batch in train:
            batch = batch.to(s.device)
            opt.zero_grad()
            out = model(batch.x, batch.edge_index)[: batch.batch_size]
            loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            opt.step()
            totals += torch.tensor([loss.item() * batch.batch_size, batch.batch_size])
            if s.should_stop:  # SIGTERM: every rank saves at this step (the state is rank 0's: sums reduced)
                s.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch,
                        "totals": s.all_reduce(totals.clone())}, args.checkpoint)
                break
        else:  # a whole pass: evaluate, then the next epoch
            loss_sum, seen = s.all_reduce(totals.clone()).tolist()
            acc = accuracy(s, model.module, test)
            if s.rank == 0:
                print(f"epoch {epoch + 1} loss {loss_sum / seen:.5f} test_acc {acc:.4f}", flush=True)
            epoch, totals = epoch + 1, torch.zeros(2)
            continue
        break  # stopped: leaving the session ends the job with exit code 75
