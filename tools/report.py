"""Render the benchmark tables of docs/performance.md from the JSON records under benchmarks/.

Usage::

    python tools/report.py                                  # the generated section, on stdout
    python tools/report.py --write docs/performance.md      # replace the section between the markers
    python tools/report.py --check docs/performance.md      # exit 1 (one line) when that section is stale
    python tools/report.py --write README.md                # the README's one table, between its markers
    python tools/report.py --records DIR ...                # records from DIR instead of benchmarks/

For each benchmark, and each configuration of it (the ``config`` a run names, e.g. the graph), the newest
record's figures become a table, with its command, commit, machine, date, provenance and file under it.
The README holds one table of its own, between its own markers: the newest run of the sampling variants
against pyg-lib, without commit or file names (the README links this page for those).
Nothing here measures anything: every figure comes from a record a benchmark wrote (``tools/benchinfo.py``,
``record``) or one transcribed from an earlier README, whose ``provenance`` says so; a record run from a
tree with uncommitted changes (a lent machine's copy) names them in its ``provenance`` ("ran from a working
tree of ...").
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
README_BEGIN, README_END = "<!-- report:readme:begin -->", "<!-- report:readme:end -->"
README_BENCH = "bench_variants"  # the README's table: its newest record run against pyg-lib (config pyg_lib)
README_ANCHOR = "docs/performance.md#sampling-variants-against-the-plain-path-bench_variants"
README_SKIP = ("hetero",)  # sampled on a synthetic-mag graph of its own, not the table's graph
RECORD_KEYS = ("benchmark", "config", "command", "commit", "date", "machine", "parameters", "figures", "provenance")
# Page order; a benchmark not listed follows, by name.
ORDER = ("bench_sampler", "bench_variants", "bench_loader", "bench_train", "bench_cluster", "bench_store",
         "bench_remote", "bench_beyond_ram", "bench_disk_reads", "bench_rank_memory",
         "bench_unmapped", "bench_ingest", "graphstore_ingest", "bench_partition", "bench_verify",
         "bench_trim", "bench_launch",
         "graphstore_warmup")
TITLES = {"bench_sampler": "Sampling throughput", "bench_variants": "Sampling variants against the plain path",
          "bench_loader": "Loader threads", "bench_train": "Distributed training",
          "bench_cluster": "Several hosts on the network-namespace rig", "bench_store": "Feature gather from the store",
          "bench_remote": "Object storage through the chunk cache",
          "bench_beyond_ram": "Features larger than memory: one rank in a cgroup limit",
          "bench_disk_reads": "A batch's feature rows off the disk: io_uring against threads",
          "bench_rank_memory": "A rank's memory as the graph grows",
          "bench_unmapped": "What unmapping a rank's dataset pages would cost the sampler",
          "bench_ingest": "Ingest: local and Dask engines",
          "graphstore_ingest": "Ingest of a products-shaped graph", "bench_partition": "METIS balance",
          "bench_verify": "What checking costs", "bench_trim": "Trimming layers: trim_to_layer and blocks",
          "bench_launch": "Starting ranks: forked from one server or fresh interpreters",
          "graphstore_warmup": "Compiling the kernels ahead of time"}
# Columns shown for row tables whose rows nest more than fits a page (dotted paths; the record keeps the rest).
VIEWS = {
    ("bench_train", "runs"): ["ranks", "parts", "steps", "train_seconds_median", "train_seconds", "data_wait_per_step",
                              "compute_per_step", "remote_requests_per_step", "peak_rss_mb_largest",
                              "peak_growth_after_epoch_2", "test_acc", "loader_only.loader_batches_per_s",
                              "inference.nodes_per_s"],
    ("bench_train", "variants"): ["variant", "train_seconds_median", "speed_vs_first", "runs.0.data_wait_per_step",
                                  "runs.0.compute_per_step", "peak_rss_mb_largest", "runs.0.peak_growth_after_epoch_2",
                                  "runs.0.allocator", "runs.0.loader_batches_per_s"],
    ("bench_cluster", "rows"): ["hosts", "link", "epoch_seconds", "train_seconds", "mb_per_host", "sampling",
                                "features", "compute", "speed_vs_loopback"],
    ("bench_variants", "shapes"): ["shape", "variant", "edges_per_s", "ratio_to_plain", "ratio_to_eligible_plain",
                                   "ratio_to_memory", "ratio_to_pyg_lib", "ratio_with_2_threads"],
    ("bench_launch", "rows"): ["ranks", "mode", "jobs", "wall_seconds", "wall_vs_fresh", "cpu_seconds", "cpu_vs_fresh",
                               "first_epoch_seconds", "first_epoch_vs_fresh"],
    ("bench_remote", "gathers"): ["batch", "id_range_share", "chunks_touched", "cold_ms", "cold_requests",
                                  "ideal_cold_ms", "cold_vs_ideal", "reopen_ms", "warm_ms", "local_ms", "warm_vs_local",
                                  "ram_ms"],
}


class RecordError(ValueError):
    """A record that cannot be read or lacks a key every record has."""


def load(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every record under ``root/<benchmark>/*.json`` (files starting with a dot are writes in progress)."""
    out = []
    for path in sorted(Path(root).glob("*/*.json")):
        if path.name.startswith("."):
            continue
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RecordError(f"{path}: not a readable JSON record ({exc}); fix or remove it") from exc
        missing = [k for k in RECORD_KEYS if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise RecordError(f"{path}: record lacks {missing}; every record has {list(RECORD_KEYS)}")
        out.append((path, rec))
    return out


def _when(path: Path, rec: dict[str, Any]) -> tuple[datetime, int]:
    """Sort key: the record's date, then its ``-n`` suffix (a later record of the same day and commit)."""
    parts = path.stem[11:].split("-")
    n = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    when = datetime.fromisoformat(rec["date"])
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)), n


def newest(records: list[tuple[Path, dict[str, Any]]]) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """Per benchmark, the newest record of each configuration, newest configuration first."""
    best: dict[tuple[str, str], tuple[Path, dict[str, Any]]] = {}
    for path, rec in records:
        key = (rec["benchmark"], json.dumps(rec["config"], sort_keys=True))
        if key not in best or _when(path, rec) > _when(*best[key]):
            best[key] = (path, rec)
    by_bench: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for (bench, _), item in best.items():
        by_bench.setdefault(bench, []).append(item)
    for items in by_bench.values():
        items.sort(key=lambda item: (_when(*item), str(item[0])), reverse=True)
    return dict(sorted(by_bench.items(), key=lambda kv: (ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER), kv[0])))


def fmt(value: Any) -> str:
    """A table cell: strings as recorded, numbers rounded for reading (the record keeps them whole)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1e6:
            return f"{value / 1e6:.2f} M"
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"
    if isinstance(value, list):
        return "; ".join(fmt(v) for v in value) if any(isinstance(v, list) for v in value) else \
            ", ".join(fmt(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {fmt(v)}" for k, v in value.items())
    return str(value).replace("|", "\\|").replace("\n", " ")


def _get(row: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if isinstance(row, list) and part.lstrip("-").isdigit() and -len(row) <= int(part) < len(row):
            row = row[int(part)]
        elif isinstance(row, dict) and part in row:
            row = row[part]
        else:
            return None
    return row


def table(rows: list[dict[str, Any]], columns: list[str] | None = None, first: str | None = None) -> list[str]:
    """A markdown table of ``rows``; columns: ``columns`` (paths) if given, else every key whose values are
    not objects, in order of appearance. ``first``: the header of a leading column of row names."""
    if columns is None:
        columns = []
        for row in rows:
            columns += [k for k, v in row.items() if k not in columns and k != first and not isinstance(v, dict)]
    columns = [c for c in columns if any(_get(r, c) is not None for r in rows)]
    head = ([first] if first is not None else []) + columns
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = ([fmt(row[first])] if first is not None else []) + [fmt(_get(row, c)) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_figures(bench: str, figures: dict[str, Any]) -> list[str]:
    """Tables for a record's figures: lists of rows, objects of rows, objects of the same shape side by side
    (one row each), and a last table of every single figure."""
    out: list[str] = []
    scalars: list[tuple[str, Any]] = []
    shapes: dict[tuple[str, ...], list[str]] = {}
    for key, value in figures.items():
        if isinstance(value, dict) and value and not any(isinstance(v, dict) for v in value.values()):
            shapes.setdefault(tuple(value), []).append(key)
    grouped = {k for keys in shapes.values() if len(keys) > 1 for k in keys}
    done: set[str] = set()
    for key, value in figures.items():
        if key == "notes" or key in done:
            continue
        caption = [] if key == "rows" else [f"*{key}*", ""]
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            view = VIEWS.get((bench, key))
            if view and sum(any(_get(r, c) is not None for r in value) for c in view) < len(view) / 2:
                view = None  # rows of another shape (e.g. transcribed with the README's columns): show them all
            out += caption + table(value, view) + [""]
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            out += caption + table([{"": k, **v} for k, v in value.items()], first="") + [""]
        elif key in grouped:
            keys = next(ks for ks in shapes.values() if key in ks)
            done.update(keys)
            inner = list(figures[key])
            if len(inner) > len(keys):  # a few objects of many entries (rate, ratio per variant): a row per entry
                out += table([{"": i, **{k: figures[k][i] for k in keys}} for i in inner], first="") + [""]
            else:
                out += table([{"": k, **figures[k]} for k in keys], first="") + [""]
        elif isinstance(value, dict):
            scalars += [(f"{key}.{k}", v) for k, v in value.items()]
        else:
            scalars.append((key, value))
    if scalars:
        out += table([{"figure": k, "value": v} for k, v in scalars]) + [""]
    notes = figures.get("notes") or []
    for note in [notes] if isinstance(notes, str) else notes:
        out += [f"Note: {note}", ""]
    return out


def _machine(m: dict[str, Any]) -> str:
    if m.get("description"):
        text = m["description"]
    else:
        gpus = m.get("gpus")
        text = (f"{m.get('cpu', '?')}, {m.get('logical_cores', '?')} logical / {m.get('physical_cores', '?')} physical "
                f"cores ({m.get('usable_cores', '?')} usable), {m.get('ram_gib', '?')} GiB RAM, "
                f"GPU: {', '.join(gpus) if gpus else 'none'}; {m.get('os', '?')}; Python {m.get('python', '?')}, "
                f"torch {m.get('torch', '?')}, numpy {m.get('numpy', '?')}, numba {m.get('numba', '?')}")
    load = m.get("load_average_1min")
    return (text + (f"; load average {load} at start" if load is not None else "")
            + (f"; {m['reclaim']}" if m.get("reclaim") else ""))


def _commit(commit: str | None) -> str:
    if not commit:
        return "not recorded"
    sha, _, dirty = commit.partition("+")
    return f"`{sha[:10]}`" + (" with uncommitted changes" if dirty else "")


def render_record(path: Path, rec: dict[str, Any], root: Path) -> list[str]:
    cmd = rec["command"]
    cmd = shlex.join(cmd) if isinstance(cmd, list) else str(cmd)
    lines = render_figures(rec["benchmark"], rec["figures"])
    lines += [f"- command: `{cmd}`", f"- commit: {_commit(rec['commit'])}", f"- machine: {_machine(rec['machine'])}",
              f"- date: {rec['date']}"]
    if rec["provenance"]:
        lines.append(f"- provenance: {rec['provenance']}")
    lines += [f"- record: `{root.name}/{path.relative_to(root).as_posix()}`", ""]
    return lines


def render(root: Path) -> str:
    """The generated section: every benchmark's newest figures per configuration, as markdown."""
    root = Path(root)
    lines = [f"<!-- generated by tools/report.py from {root.name}/; edit the records, not this section -->", ""]
    for bench, items in newest(load(root)).items():
        lines += [f"### {TITLES[bench]} (`{bench}`)" if bench in TITLES else f"### `{bench}`", ""]
        for path, rec in items:
            if len(items) > 1 or rec["config"]:
                conf = ", ".join(f"{k}={' '.join(map(str, v)) if isinstance(v, list) else v}"
                                 for k, v in rec["config"].items()) or "default"
                lines += [f"#### {conf}", ""]
            lines += render_record(path, rec, root)
    return "\n".join(lines).rstrip() + "\n"


def _ratio(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "" if value is None else f"{value:.{digits}f}{unit}"


def render_readme(root: Path) -> str:
    """The README's one table: per variant, the newest ``bench_variants`` run against pyg-lib (ours and
    pyg-lib's sampled edges/s and their ratios), and one line saying what was run where and when; with a
    matrix record, each variant's worst shape (a variant only the matrix measured: a row of that alone)."""
    runs = [(p, r) for p, r in load(Path(root)) if r["benchmark"] == README_BENCH and r["config"].get("pyg_lib")]
    if not runs:
        raise RecordError(f"{root}: no {README_BENCH} record run with --pyg-lib; the README's table needs one")
    path, rec = max(runs, key=lambda item: (_when(*item), str(item[0])))
    fig, machine = rec["figures"], rec["machine"]
    rates = fig["edges_per_s"]
    matrix = _newest_matrix(root)
    worst = matrix[1]["figures"]["worst"] if matrix else {}
    lines = ["| variant | ours (M edges/s) | pyg-lib (M edges/s) | ours / pyg-lib | ours / our plain "
             "| dataset / in memory |" + (" worst shape: ours / our plain |" if worst else ""),
             "|---|---|---|---|---|---|" + ("---|" if worst else "")]
    for name in (k for k in rates if "@" not in k and k not in README_SKIP):
        pyg = rates.get(f"{name}@pyg-lib")
        w = worst.get(name)
        lines.append(f"| `{name}` | {rates[name] / 1e6:.1f} | {'' if pyg is None else f'{pyg / 1e6:.2f}'} "
                     f"| {_ratio(fig.get('ratio_to_pyg_lib', {}).get(name), 1, '×')} "
                     f"| {_ratio(fig.get('ratio_to_plain', {}).get(name))} "
                     f"| {_ratio(fig.get('ratio_to_memory', {}).get(name))} |"
                     + ((f" {w['ratio_to_plain']:.2f} ({w['shape']}) |" if w else " |") if worst else ""))
    for name, w in worst.items():  # a variant the matrix measured and the pyg-lib run did not: its worst shape
        if name not in rates and name not in README_SKIP:
            lines.append(f"| `{name}` |  |  |  |  |  | {w['ratio_to_plain']:.2f} ({w['shape']}) |")
    cmd = _command(rec)
    graph, fanout = fig.get("graph", {}), ", ".join(map(str, fig.get("fanout", [])))
    lines += ["", f"One thread, a random graph of {graph.get('nodes', 0):,} nodes and {graph.get('edges', 0):,} edges, "
              f"fanout [{fanout}], batches of {fig.get('batch_size', 0):,}: ours samples it as a one-partition "
              f"dataset, pyg-lib {fig.get('pyg_lib', {}).get('version', '')} in memory, passes interleaved "
              f"(`{shlex.join(cmd)}`; {machine.get('cpu', '?')}, {machine.get('usable_cores', '?')} cores, "
              f"{rec['date'][:10]}). Every benchmark's newest figures, with commands and records: "
              f"[docs/performance.md]({README_ANCHOR})."]
    return "\n".join(lines + _worst_caption(matrix)) + "\n"


def _command(rec: dict[str, Any]) -> list[str]:
    return rec["command"][1:] if isinstance(rec["command"], list) else [str(rec["command"])]


def _newest_matrix(root: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest ``bench_variants`` record that measured a matrix of workload shapes (``figures.worst``)."""
    runs = [(p, r) for p, r in load(Path(root)) if r["benchmark"] == README_BENCH and r["figures"].get("worst")]
    return max(runs, key=lambda item: (_when(*item), str(item[0]))) if runs else None


def _worst_caption(matrix: tuple[Path, dict[str, Any]] | None) -> list[str]:
    """What the README's last column comes from: the matrix record's shapes, command, machine and date."""
    if matrix is None:
        return []
    rec = matrix[1]
    fig, machine = rec["figures"], rec["machine"]
    times = ", ".join(f"{k} {'-'.join(f'{v:,}' for v in sorted(set(t)))}" for k, t in fig.get("seed_times", {}).items())
    return ["", f"Worst shape: each variant's lowest ratio to our plain path over a matrix of workload shapes "
            f"(degrees/fanout[/seed time]: {', '.join(fig.get('degrees', []))} degrees, fanouts "
            f"{'; '.join(str(f) for f in fig.get('fanouts', []))}, seed times {times} of edge times in "
            f"[0, 1,000,000); {fig.get('graph', {}).get('nodes', 0):,} nodes, {fig.get('graph', {}).get('edges', 0):,} "
            f"edges, one-partition datasets; `{shlex.join(_command(rec))}`; {machine.get('cpu', '?')}, "
            f"{machine.get('usable_cores', '?')} cores, {rec['date'][:10]})."]


def _split(text: str, where: Path, begin: str = BEGIN, end_marker: str = END) -> tuple[str, str, str]:
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < start:
        raise RecordError(f"{where}: no '{begin}' ... '{end_marker}' markers; add them where the tables belong")
    return text[:start + len(begin)], text[start + len(begin):end], text[end:]


def splice(text: str, section: str, where: Path, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the part between the markers ``begin`` and ``end`` replaced by ``section``."""
    head, _, tail = _split(text, where, begin, end)
    return f"{head}\n{section}{tail}"


def refresh(text: str, root: Path, where: Path) -> str:
    """``text`` with every generated part it has markers for rendered afresh: the page's section
    (``BEGIN``/``END``) and the README's table (``README_BEGIN``/``README_END``)."""
    parts = [(BEGIN, END, render), (README_BEGIN, README_END, render_readme)]
    present = [(b, e, fn) for b, e, fn in parts if b in text]
    if not present:
        raise RecordError(f"{where}: no '{BEGIN}' ... '{END}' or '{README_BEGIN}' ... '{README_END}' markers; "
                          "add them where the tables belong")
    for begin, end, fn in present:
        text = splice(text, fn(root), where, begin, end)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=ROOT / "benchmarks", help="the records' folder")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", type=Path, metavar="FILE",
                      help="replace FILE's generated parts (the page's section, the README's table)")
    mode.add_argument("--check", type=Path, metavar="FILE", help="exit 1 when FILE's generated parts are stale")
    args = parser.parse_args(argv)
    try:
        if args.write is None and args.check is None:
            sys.stdout.write(render(args.records))
            return 0
        target = args.write or args.check
        text = target.read_text()
        fresh = refresh(text, args.records, target)
    except (RecordError, OSError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    if args.check is not None:
        if fresh != text:
            print(f"{target}: the generated section is stale; run tools/report.py --write {target}", file=sys.stderr)
            return 1
        return 0
    if fresh != text:
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(fresh)
        partial.replace(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
