"""Whether this project's processes may be forked: ranks from the launcher's fork server, sampler processes
from Python's (one reading of ``GRAPHSTORE_FORK_RANKS`` for both; torch-free, so every layer may ask)."""

from __future__ import annotations

import os
import sys

from graphstore.errors import GraphstoreError

FORK_RANKS_ENV = "GRAPHSTORE_FORK_RANKS"  # 1 (the default): fork from a server that imported once; 0: fresh


def fork_allowed(env: dict[str, str] | None = None) -> bool:
    """Whether ranks and sampler processes may be forked from a server (``GRAPHSTORE_FORK_RANKS`` unset or
    1, on Linux) rather than started as fresh interpreters (0, or not Linux). Any other value is refused in
    one line that names both."""
    env = os.environ if env is None else env
    raw = env.get(FORK_RANKS_ENV, "1").strip()
    if raw not in ("0", "1"):
        raise GraphstoreError(f"{FORK_RANKS_ENV}={raw!r}: set it to 1 (fork ranks and sampler processes from one "
                              "server, the default) or 0 (start each as a fresh interpreter)")
    fork_from_launcher(env)  # checked at the same door
    return raw == "1" and sys.platform.startswith("linux")


FROM_LAUNCHER_ENV = "GRAPHSTORE_FORK_FROM_LAUNCHER"  # 1: a launcher that imported the ranks' modules forks their server


def fork_from_launcher(env: dict[str, str] | None = None) -> bool:
    """Whether a launcher may fork the ranks' server from itself where it has imported their modules already
    (``GRAPHSTORE_FORK_FROM_LAUNCHER=1``, set by a process that runs many jobs, such as this project's test
    suite): the server, and so each rank, then starts as a copy of that process. Unset or 0: the launcher
    starts the server as a fresh interpreter. Any other value is refused in one line that names both."""
    env = os.environ if env is None else env
    raw = env.get(FROM_LAUNCHER_ENV, "0").strip()
    if raw not in ("0", "1"):
        raise GraphstoreError(f"{FROM_LAUNCHER_ENV}={raw!r}: set it to 1 (a launcher that has imported the ranks' "
                              "modules forks their server from itself) or 0 (it starts the server, the default)")
    return raw == "1"
