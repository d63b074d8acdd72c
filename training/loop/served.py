"""A session's loaders when sampler servers build the batches: seeds resolved on the servers, this rank's
share of them, and the served loaders (:mod:`sampling.remote.client`)."""

from __future__ import annotations

from typing import Any

import torch

from graphstore.errors import InvalidInputError
from sampling.graph.edgemask import MessageEdges
from sampling.remote.client import ServedLoader
from training.loop.session_loaders import MESSAGES, seed_mask


def _trainer_options(options: dict[str, Any]) -> dict[str, Any]:
    if options.pop("num_workers", 0):
        raise InvalidInputError("num_workers with sampler servers: the servers build the batches; give them sampler "
                                "processes with graphstore serve --loader-workers")
    if options.pop("filter_per_worker", False):
        raise InvalidInputError("filter_per_worker=True with sampler servers: the servers gather the features "
                                "with the sampling; drop it")
    return options


def served_node_loader(session: Any, num_neighbors: Any, input_nodes: Any, options: dict[str, Any]) -> ServedLoader:
    """``Session.loader`` over sampler servers."""
    seeds = node_seeds(session, input_nodes)
    return ServedLoader(session.servers, "node", num_neighbors, seeds, **_trainer_options(options))


def node_seeds(session: Any, input_nodes: Any) -> Any:
    """This rank's seeds: IDs as given, or its share of a mask's nodes over every partition (``None``: all)."""
    node_type, mask = seed_mask(session.dataset, input_nodes)
    if mask is not None and not isinstance(mask, str):
        return input_nodes
    answers = session.servers.ask_all("seeds", {"what": "node", "mask": mask, "node_type": node_type})
    every = torch.cat([tensors[0] for _, tensors in answers])
    mine = every[session.rank::session.world_size].clone()
    return (node_type, mine) if node_type is not None else mine


def served_link_loader(session: Any, num_neighbors: Any, split: str | None, edge_type: Any,
                       options: dict[str, Any]) -> ServedLoader:
    """``Session.link_loader`` over sampler servers: this rank's share of the stored split's links."""
    ds = session.dataset
    options = _trainer_options(options)
    if split is not None:
        info = ds.manifest.edge_type(edge_type) if edge_type is not None else ds.manifest.edge_types[0]
        index, extra = split_links(session, split, info.name, options.get("time_attr"))
        options = {"message_edges": MessageEdges(info.name, MESSAGES[split]), "exclude_seed_edges": True, **extra,
                   **options}
        seeds = (info.name, index) if ds.is_hetero else index
    else:
        seeds = options.pop("edge_label_index", None)
        if seeds is None:
            raise InvalidInputError("link_loader(split=None) needs edge_label_index (global IDs)")
    return ServedLoader(session.servers, "link", num_neighbors, seeds, **options)


def split_links(session: Any, split: str, edge_type: Any, time_attr: str | None,
                rule: Any = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This rank's share of a link split's links of ``edge_type`` (global IDs, ``[2, n]``), as the servers hold
    them, and ``edge_label_time`` when ``time_attr`` is an attribute of the edge type. The split is the
    stored one, or computed on the servers by ``rule`` (:class:`~graphstore.dataset.linksplit.LinkSplit`)."""
    from sampling.remote.specs import rule_out

    etype = list(edge_type) if isinstance(edge_type, tuple) else edge_type
    answers = session.servers.ask_all("seeds", {"what": "link", "split": split, "edge_type": etype,
                                                "time_attr": time_attr, "rule": rule_out(rule)})
    mine = slice(session.rank, None, session.world_size)
    index = torch.cat([tensors[0] for _, tensors in answers], dim=1)[:, mine].clone()
    extra = {}
    if answers and all(len(tensors) > 1 for _, tensors in answers):
        extra["edge_label_time"] = torch.cat([tensors[1] for _, tensors in answers])[mine].clone()
    return index, extra
