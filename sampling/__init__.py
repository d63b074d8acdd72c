"""Neighbor sampling over graphstore datasets (kernels, samplers, loaders, transport)."""

from __future__ import annotations

from sampling.device import DeviceFeeder
from sampling.edgemask import MessageEdges
from sampling.loader import LinkNeighborLoader, NeighborLoader
from sampling.sampler import NeighborSampler, SamplerConfig

__all__ = ["DeviceFeeder", "LinkNeighborLoader", "MessageEdges", "NeighborLoader", "NeighborSampler", "SamplerConfig"]
