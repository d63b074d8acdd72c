"""PyG's loader-argument rules, applied when a loader is built: deprecations, conflicts and refusals."""

from __future__ import annotations

import warnings
from typing import Any

from graphstore.errors import InvalidInputError

# the loader arguments that configure the sampler, with their defaults (both loaders, as in PyG)
SAMPLER_DEFAULTS = {"replace": False, "disjoint": False, "temporal_strategy": "uniform", "time_attr": None,
                    "weight_attr": None, "subgraph_type": "directional", "is_sorted": False, "seed": None,
                    "message_edges": None, "exclude_seed_edges": False}


def resolve_subgraph_type(subgraph_type: Any, directed: bool, loader: str) -> Any:
    """PyG's deprecated ``directed=False`` means ``subgraph_type='induced'`` (with PyG's warning)."""
    if not isinstance(directed, bool):
        raise InvalidInputError(f"{loader}(directed={directed!r}): give True or False (deprecated in PyG; use "
                                "subgraph_type='induced' instead of directed=False)")
    if directed:
        return subgraph_type
    warnings.warn(f"The usage of the 'directed' argument in '{loader}' is deprecated. Use "
                  "`subgraph_type='induced'` instead.", stacklevel=3)
    return "induced"


def check_given_sampler(sampler: Any, options: dict[str, Any], loader: str) -> None:
    """With ``neighbor_sampler=`` given, a sampler option passed to the loader too must agree with the
    sampler's own (PyG would silently use the sampler's; here the conflict is refused)."""
    config = getattr(sampler, "config", sampler)  # ours keeps its options in .config, PyG's on itself
    for name, value in options.items():
        value = getattr(value, "value", value)
        if value == SAMPLER_DEFAULTS[name]:
            continue
        own = getattr(config, name, None) if name != "seed" else getattr(sampler, "_seed", None)
        own = getattr(own, "value", own)
        if own != value:
            raise InvalidInputError(
                f"{loader}({name}={value!r}) conflicts with the neighbor_sampler passed, which has {name}={own!r}: "
                f"configure the sampler (NeighborSampler(..., {name}=...)) and drop {name} here"
            )


def check_link_time(time_attr: Any, edge_label_time: Any, loader: str) -> None:
    """PyG's ``LinkNeighborLoader`` rule, at construction: ``time_attr`` and ``edge_label_time`` together."""
    if (edge_label_time is None) != (time_attr is None):
        have, missing = ("edge_label_time", "time_attr") if time_attr is None else ("time_attr", "edge_label_time")
        raise InvalidInputError(
            f"{loader}: {have} is set but {missing} is not; temporal link sampling needs both (time_attr names "
            "the node/edge time attribute, edge_label_time gives each seed link its time)"
        )


def check_node_seed_time(sampler: Any, input_type: Any, loader: str) -> None:
    """``time_attr`` without ``input_time``: PyG takes each seed's own time, which only node times give."""
    if input_type not in sampler.node_time:
        raise InvalidInputError(
            f"{loader}: time_attr {sampler.config.time_attr!r} is not a node attribute of the seed type "
            f"{input_type!r}, so seeds have no time of their own: pass input_time"
        )
