"""The graph the kernels walk: CSC topology blocks, the arrays derived from them, the kernels' arguments, edge masks."""
