"""Server-client mode: sampler servers that hold the partitions, and the loaders of trainers that hold none."""
