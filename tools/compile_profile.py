"""Where numba's compile time goes: each kernel's own compile seconds, its callees' compiles subtracted.

Usage::

    NUMBA_CACHE_DIR=$(mktemp -d) python tools/compile_profile.py [--groups memory,distributed] [--top 30] [--json]

Runs the named ``graphstore warmup`` groups (default: all, in the warm-up's order) in this one process and
listens to numba's compile events. A kernel compiles its callees inside its own compile, so the seconds a
kernel took with them (``with callees``) overlap; ``own`` subtracts the compiles that started inside it, so
the ``own`` column sums to the whole. Give an empty ``NUMBA_CACHE_DIR`` for a cold cache: a kernel loaded from
the cache sends no event. With a warm one the table is empty.
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import toolargs


class Profile:
    """A numba ``numba:compile`` listener: per function (``module.qualname``), its specialisations compiled,
    the seconds with its callees' compiles, and its own."""

    def __init__(self) -> None:
        self.count: collections.Counter = collections.Counter()
        self.total: collections.Counter = collections.Counter()
        self.own: collections.Counter = collections.Counter()
        self._stack: list[list[Any]] = []

    def on_start(self, ev: Any) -> None:
        func = ev.data["dispatcher"].py_func
        self._stack.append([f"{func.__module__}.{func.__qualname__}", time.perf_counter(), 0.0])

    def on_end(self, ev: Any) -> None:
        name, start, inner = self._stack.pop()
        took = time.perf_counter() - start
        self.count[name] += 1
        self.total[name] += took
        self.own[name] += took - inner
        if self._stack:
            self._stack[-1][2] += took

    def listener(self) -> Any:
        from numba.core import event

        outer = self

        class _Listener(event.Listener):
            def on_start(self, ev: Any) -> None:
                outer.on_start(ev)

            def on_end(self, ev: Any) -> None:
                outer.on_end(ev)

        return _Listener()

    def rows(self, top: int | None = None) -> list[dict[str, Any]]:
        return [{"function": name, "own_s": round(own, 2), "with_callees_s": round(self.total[name], 2),
                 "specialisations": self.count[name]} for name, own in self.own.most_common(top)]


def profile_groups(names: list[str] | None) -> tuple[Profile, dict[str, float]]:
    """Run the warm-up groups ``names`` (all when None) under a :class:`Profile`; with each group's seconds."""
    from numba.core import event

    from graphstore.errors import InvalidInputError
    from sampling.warmup import runner

    groups = {g.name: g for g in runner.groups()}
    unknown = [n for n in names or [] if n not in groups]
    if unknown:
        raise InvalidInputError(f"--groups: no warm-up group {', '.join(map(repr, unknown))}; give some of "
                                f"{', '.join(groups)}")
    profile, seconds = Profile(), {}
    listener = profile.listener()
    event.register("numba:compile", listener)
    try:
        with tempfile.TemporaryDirectory(prefix="compile-profile-") as scratch:
            workspace = runner.Workspace(Path(scratch))
            for name in names or list(groups):
                start = time.perf_counter()
                groups[name].run(workspace)
                seconds[name] = round(time.perf_counter() - start, 2)
    finally:
        event.unregister("numba:compile", listener)
    return profile, seconds


def main() -> int:
    parser = toolargs.parser(__doc__.split("\n\n")[0])
    parser.add_argument("--groups", help="comma-separated warm-up groups (default: all; graphstore warmup --list)")
    parser.add_argument("--top", type=toolargs.count, default=30, help="functions to list (default 30)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = [n for n in args.groups.split(",") if n] if args.groups else None
    profile, seconds = profile_groups(names)
    rows = profile.rows(args.top)
    if args.json:
        print(json.dumps({"groups": seconds, "own_s_total": round(sum(profile.own.values()), 2), "functions": rows}))
        return 0
    for name, took in seconds.items():
        print(f"group {name:12s} {took:8.1f} s")
    print(f"{'own s':>8} {'with callees':>12} {'specs':>5}  function")
    for row in rows:
        print(f"{row['own_s']:8.1f} {row['with_callees_s']:12.1f} {row['specialisations']:5d}  {row['function']}")
    print(f"{sum(profile.own.values()):8.1f} in all")
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
