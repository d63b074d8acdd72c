"""Distributed sampling: the rank layout, remote hops and rows, what a rank serves, transport and wire."""
