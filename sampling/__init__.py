"""Neighbor sampling over graphstore datasets (kernels, samplers, loaders, transport)."""

from __future__ import annotations

from sampling.loader.device_feed import DeviceFeeder
from sampling.graph.edgemask import MessageEdges
from sampling.loader.neighbor_loader import LinkNeighborLoader, NeighborLoader
from sampling.drivers.neighbor_sampler import NeighborSampler, SamplerConfig

__all__ = ["DeviceFeeder", "LinkNeighborLoader", "MessageEdges", "NeighborLoader", "NeighborSampler", "SamplerConfig"]
