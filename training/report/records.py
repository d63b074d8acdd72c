"""An epoch's record as every rank agrees on it: timings averaged, counters summed, bytes per peer; the JSON file."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.distributed as dist

from sampling.distributed import wire


def wire_record(per_peer: dict[str, Any], counts: dict[str, float]) -> dict[str, Any]:
    """Every rank's RPC bytes per peer and kind, its gradient all-reduce bytes, and totals over ranks
    (``bytes``: each call counted once, at its caller, request plus response)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (per_peer, int(counts.get("allreduce", 0))))
    total: dict[str, int] = {}
    for peers, _ in gathered:
        for kind, value in wire.totals(peers).items():
            total[kind] = total.get(kind, 0) + value
    allreduce = [a for _, a in gathered]
    return {"bytes": {**total, "allreduce": sum(allreduce)}, "per_rank": [p for p, _ in gathered],
            "allreduce_per_rank": allreduce}


def reduce_record(record: dict[str, Any]) -> dict[str, Any]:
    """Timings as the mean over ranks; remote counters (training and evaluation) summed over ranks."""
    world = dist.get_world_size()
    record = {**record, "remote_eval": {k: v for k, v in record["remote_eval"].items() if k != "wait_seconds"}}
    keys = sorted(record["timing"]) + [f"remote.{k}" for k in sorted(record["remote"])]
    keys += [f"remote_eval.{k}" for k in sorted(record["remote_eval"])]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, keys)  # a timer may have fired on some ranks only
    union = sorted(set().union(*gathered))

    def value(key: str) -> float:
        group, _, name = key.partition(".")
        return float(record[group].get(name, 0)) if name else float(record["timing"].get(key, 0.0))

    values = torch.tensor([value(k) for k in union], dtype=torch.float64)
    dist.all_reduce(values)
    out = {**record, "timing": {}, "remote": {}, "remote_eval": {}}
    for key, v in zip(union, values):
        group, _, name = key.partition(".")
        if name:
            out[group][name] = round(float(v), 4)
        else:
            out["timing"][key] = round(float(v) / world, 4)
    return out


def gather_floats(value: float) -> list[float]:
    """``value`` from every rank, in rank order."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, float(value))
    return [round(float(v), 3) for v in gathered]


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically (a partial file, then a rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.partial-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2)
    os.replace(tmp, path)
