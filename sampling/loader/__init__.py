"""PyG's loaders over the sampler: loader threads, seed order, sampler processes and their handoff, the GPU feed."""
