"""Count the kernel specialisations numba's cache holds for a checkout, per kernel, or compare two checkouts.

Usage::

    python tools/kernel_cache.py [CHECKOUT] [--against OTHER] [--json]

A kernel's cache index (``__pycache__/<module>.<kernel>-<line>.pyX.nbi``, or under ``NUMBA_CACHE_DIR``)
lists one entry per argument types it was compiled for. Run after ``graphstore warmup`` in each checkout to
see that a change compiles the same specialisations (a refactor of the kernels' arguments should not add
any); ``--against`` prints each kernel whose count differs, and both totals per package. A kernel renamed
shows as one count moving from one name to the other.
"""

from __future__ import annotations

import collections
import json
import pickle
import sys
from pathlib import Path

import toolargs


def specialisations(checkout: Path) -> dict[str, int]:
    """``{"package/module.kernel": entries}`` of every cache index under ``checkout`` (its ``.venv`` aside)."""
    counts: collections.Counter[str] = collections.Counter()
    for index in sorted(checkout.rglob("__pycache__/*.nbi")):
        if ".venv" in index.relative_to(checkout).parts:
            continue
        with open(index, "rb") as fh:
            pickle.load(fh)  # the numba version that wrote it
            _, overloads = pickle.loads(fh.read())  # numba's own files, written by this checkout's runs
        module = index.parent.parent.relative_to(checkout)
        counts[f"{module}/{index.name.rsplit('-', 1)[0]}"] += len(overloads)
    return dict(counts)


def totals(counts: dict[str, int]) -> dict[str, int]:
    out: collections.Counter[str] = collections.Counter()
    for name, n in counts.items():
        out[name.split("/", 1)[0]] += n
    return dict(sorted(out.items()))


def main() -> int:
    parser = toolargs.parser(__doc__.split("\n\n")[0])
    parser.add_argument("checkout", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--against", default=None, help="another checkout to compare with")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for path in filter(None, (args.checkout, args.against)):
        if not Path(path).is_dir():
            parser.error(f"{path}: no such checkout; give a directory holding graphstore/ and sampling/")
    ours = specialisations(Path(args.checkout))
    other = specialisations(Path(args.against)) if args.against else None
    if args.json:
        print(json.dumps({"checkout": args.checkout, "totals": totals(ours), "kernels": ours,
                          **({"against": args.against, "against_totals": totals(other), "against_kernels": other}
                             if other is not None else {})}, indent=2))
        return 0
    for package, n in totals(ours).items():
        print(f"{package}: {n} specialisations" + (f" (against {totals(other).get(package, 0)})" if other else ""))
    if other is None:
        for name, n in sorted(ours.items()):
            print(f"  {name}: {n}")
        return 0
    for name in sorted(set(ours) | set(other)):
        if ours.get(name, 0) != other.get(name, 0):
            print(f"  {name}: {ours.get(name, 0)} (against {other.get(name, 0)})")
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
