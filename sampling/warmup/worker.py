"""A worker process of a parallel ``graphstore warmup``: ``sampling.warmup.runner.worker``."""

import sys

from sampling.warmup.runner import worker

if __name__ == "__main__":
    sys.exit(worker())
