"""Neighbor sampling over graphstore datasets (kernels, samplers, loaders, transport)."""
