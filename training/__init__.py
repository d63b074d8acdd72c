"""Distributed GNN training over graphstore datasets (process groups, loops, launcher)."""
