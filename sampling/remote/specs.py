"""A served loader's arguments as they cross the wire: JSON fields and tensors, checked on both sides."""

from __future__ import annotations

from typing import Any

import torch

from graphstore.errors import InvalidInputError

# the loader arguments that sample (run on the servers); the rest (order, transform, pinning) stay with the trainer
SAMPLING = ("replace", "disjoint", "temporal_strategy", "time_attr", "weight_attr", "subgraph_type", "directed",
            "is_sorted", "seed", "edge_ids", "cache_rows", "exclude_seed_edges", "neg_sampling_ratio")
TENSORS = ("input_time", "edge_label", "edge_label_time")  # per seed: indexed by the trainer's seed positions
TRAINER = ("batch_size", "shuffle", "drop_last", "transform", "pin_memory", "loader_threads", "prefetch",
           "filter_per_worker", "num_workers")


def encode(kind: str, fanout: Any, seeds: Any, options: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """``kind`` ("node" or "link"), the fanout, the seeds and the sampling options as fields and tensors."""
    tensors: list[torch.Tensor] = []
    fields: dict[str, Any] = {"kind": kind, "fanout": _fanout_out(fanout), "options": {}, "tensors": {}}
    seed_type, ids = seeds if isinstance(seeds, tuple) else (None, seeds)
    fields["seed_type"] = list(seed_type) if isinstance(seed_type, tuple) else seed_type
    fields["tensors"]["seeds"] = _add(tensors, ids)
    for name, value in options.items():
        if value is None:
            continue
        if name in TENSORS:
            fields["tensors"][name] = _add(tensors, value)
        elif name == "neg_sampling":
            fields["options"][name] = {"mode": _mode(value), "amount": float(getattr(value, "amount", 1)
                                                                          if not isinstance(value, dict)
                                                                          else value.get("amount", 1))}
        elif name == "message_edges":
            etype = value.edge_type
            fields["options"][name] = {"edge_type": list(etype) if isinstance(etype, tuple) else etype,
                                       "allowed": list(value.allowed), "attr": value.attr,
                                       "rule": rule_out(value.rule)}
        elif name in SAMPLING:
            fields["options"][name] = getattr(value, "value", value)  # enums (subgraph_type) by value
        else:
            raise InvalidInputError(f"{name} cannot be sent to a sampler server")
    return fields, tensors


def decode(fields: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[str, Any, Any, dict[str, Any]]:
    """The server's side of :func:`encode`: kind, fanout, seeds (typed when the fields say so), options."""
    from sampling.graph.edgemask import MessageEdges

    kind = fields["kind"]
    if kind not in ("node", "link"):
        raise InvalidInputError(f"a trainer asked for a loader of kind {kind!r}; kinds: node, link")
    options: dict[str, Any] = {}
    for name, value in fields["options"].items():
        if name == "message_edges":
            etype = value["edge_type"]
            value = MessageEdges(tuple(etype) if isinstance(etype, list) else etype, tuple(value["allowed"]),
                                 rule=rule_in(value.get("rule")), attr=value["attr"])
        elif name not in SAMPLING and name != "neg_sampling":
            raise InvalidInputError(f"a trainer sent loader option {name!r}, which a sampler server does not take")
        options[name] = value
    for name, index in fields["tensors"].items():
        if name != "seeds":
            if name not in TENSORS:
                raise InvalidInputError(f"a trainer sent loader tensor {name!r}, which a sampler server does not take")
            options[name] = tensors[index]
    seeds = tensors[fields["tensors"]["seeds"]]
    seed_type = fields.get("seed_type")
    if seed_type is not None:
        seeds = (tuple(seed_type) if isinstance(seed_type, list) else seed_type, seeds)
    return kind, _fanout_in(fields["fanout"]), seeds, options


def rule_out(rule: Any) -> dict[str, Any] | None:
    """A :class:`~graphstore.dataset.linksplit.LinkSplit` (the split computed by ingest's rules) as JSON."""
    if rule is None:
        return None
    etype = rule.edge_type
    return {"fractions": list(rule.fractions), "by": rule.by, "seed": int(rule.seed), "time_attr": rule.time_attr,
            "edge_type": list(etype) if etype is not None else None}


def rule_in(value: dict[str, Any] | None) -> Any:
    """The server's side of :func:`rule_out` (checked as a rule the trainer made itself is)."""
    from graphstore.dataset.linksplit import LinkSplit

    if value is None:
        return None
    etype = value.get("edge_type")
    return LinkSplit(tuple(value["fractions"]), value["by"], tuple(etype) if etype is not None else None,
                     value["seed"], value["time_attr"])


def _add(tensors: list[torch.Tensor], value: Any) -> int:
    tensors.append(value if isinstance(value, torch.Tensor) else torch.as_tensor(value))
    return len(tensors) - 1


def _mode(value: Any) -> str:
    mode = value.get("mode") if isinstance(value, dict) else value.mode
    return getattr(mode, "value", mode)


def _fanout_out(fanout: Any) -> Any:
    if isinstance(fanout, dict):
        return [[list(k) if isinstance(k, tuple) else k, list(v)] for k, v in fanout.items()]
    return list(fanout)


def _fanout_in(value: Any) -> Any:
    if value and isinstance(value[0], list) and len(value[0]) == 2 and isinstance(value[0][1], list):
        return {tuple(k) if isinstance(k, list) else k: list(v) for k, v in value}
    return list(value)
