"""Compare two commits' ``bench_variants`` records: each variant's sampled edges/s, ours over theirs, per shape.

Usage::

    python tools/compare_records.py BASELINE.json [BASELINE-2.json ...] --against NEW.json [NEW-2.json ...]

Records of the same command run from two checkouts, interleaved (baseline, new, baseline, new), so a
change in load moves both alike. For each variant, over the shapes (graph degrees, fanout, seed time) both
measured: the ratio of the new runs' mean edges/s to the baseline runs' mean, as min / median / max; and,
as the noise those ratios sit in, the same figures between a side's own runs (its second run over its first).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import toolargs


def rates(path: Path) -> dict[tuple[str, str], float]:
    doc = json.loads(path.read_text())
    shapes = doc.get("figures", doc).get("shapes")
    if doc.get("benchmark", "bench_variants") != "bench_variants" or not shapes:
        raise ValueError(f"{path}: not a bench_variants record (no shapes)")
    return {(r["shape"], r["variant"]): r["edges_per_s"] for r in shapes}


def spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def compare(baseline: list[dict], new: list[dict]) -> dict:
    shared = set.intersection(*(set(r) for r in baseline + new))
    ratios: dict[str, list[float]] = {}
    for key in sorted(shared):
        ratio = statistics.mean(r[key] for r in new) / statistics.mean(r[key] for r in baseline)
        ratios.setdefault(key[1], []).append(ratio)
    noise = {side: spread([runs[1][k] / runs[0][k] for k in shared])
             for side, runs in (("baseline", baseline), ("new", new)) if len(runs) > 1}
    return {"shapes": len(shared), "new_over_baseline": {v: {"shapes": len(r), **spread(r)} for v, r in ratios.items()},
            "second_run_over_first": noise}


def main() -> int:
    parser = toolargs.parser(__doc__.split("\n\n")[0])
    parser.add_argument("baseline", nargs="+", type=Path)
    parser.add_argument("--against", nargs="+", type=Path, required=True)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        out = compare([rates(p) for p in args.baseline], [rates(p) for p in args.against])
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"{exc}; give bench_variants records (benchmarks/bench_variants/*.json)")
    if not out["shapes"]:
        parser.error("the records share no shape; give records of the same command")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"new over baseline, mean edges/s per shape ({out['shapes']} shapes):")
    for variant, s in out["new_over_baseline"].items():
        print(f"  {variant:18s} {s['shapes']:3d} shapes  min {s['min']:.3f}  median {s['median']:.3f}  max {s['max']:.3f}")
    for side, s in out["second_run_over_first"].items():
        print(f"noise, {side}'s second run over its first: min {s['min']:.3f}  median {s['median']:.3f}  max {s['max']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
