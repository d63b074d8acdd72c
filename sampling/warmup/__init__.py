"""``graphstore warmup``: the runner and the warm-up groups of ``graphstore`` and ``sampling``."""
