"""The drivers that call the kernels: ``NeighborSampler``, the one-call batch driver, the per-hop driver, subgraphs."""
