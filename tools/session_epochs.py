"""A training loop of one's own, as a user writes it with ``training.Session``: node classification with PyG's
GraphSAGE (graphstore-train's default model, width and optimizer), writing each epoch's figures as
graphstore-train's metrics.json has them, for ``tools/bench_beyond_ram.py --cases session,session-page``.

Usage::

    graphstore-run --nproc 1 tools/session_epochs.py DATASET --out metrics.json [--epochs 3] [--fanout 10,5]
                   [--batch-size 1024] [--seed 0]

Per epoch: ``train_seconds``, ``steps``, the mean ``loss``, ``timing.data_wait`` (seconds the loop waited for
its next batch) and ``features`` (``Session.feature_stats()``: what the disk tier read, summed over the ranks).
No evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GraphSAGE

from benchinfo import Waited  # tools/, this script's folder
from training import Session


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dataset")
    p.add_argument("--out", required=True, help="where each epoch's figures are written (JSON, rewritten per epoch)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--fanout", default="10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    fanout = [int(k) for k in args.fanout.split(",")]
    with Session(args.dataset, seed=args.seed) as s:
        train = s.loader(fanout, input_nodes="train_mask", batch_size=args.batch_size, shuffle=True)
        model = s.ddp(GraphSAGE(s.num_features, 128, num_layers=len(fanout), out_channels=s.num_classes, dropout=0.5))
        opt = torch.optim.Adam(model.parameters(), lr=0.003)
        epochs = []
        for _ in range(args.epochs):
            epochs.append(_epoch(s, model, opt, train))
            if s.rank == 0:
                _write(args.out, {"epochs": epochs})


def _epoch(s: Session, model: torch.nn.Module, opt: torch.optim.Optimizer, train: object) -> dict:
    model.train()
    start = time.perf_counter()
    losses, steps = torch.zeros(2, dtype=torch.float64), 0
    batches = Waited(train)
    for batch in batches:
        batch = batch.to(s.device)
        opt.zero_grad()
        loss = F.cross_entropy(model(batch.x, batch.edge_index)[: batch.batch_size], batch.y[: batch.batch_size])
        loss.backward()
        opt.step()
        losses += torch.tensor([loss.item() * batch.batch_size, batch.batch_size], dtype=torch.float64)
        steps += 1
    seconds = time.perf_counter() - start
    total, seen = s.all_reduce(losses).tolist()
    return {"train_seconds": round(seconds, 3), "steps": steps, "loss": round(total / max(seen, 1), 5),
            "timing": {"data_wait": round(batches.seconds, 3)}, "features": s.feature_stats()}


def _write(path: str, record: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
