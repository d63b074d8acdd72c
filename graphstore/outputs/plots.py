"""Pictures of a run and of a dataset: training curves and time per epoch from a metrics JSON, partition sizes."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from graphstore.errors import InvalidInputError, MissingBackendError, SourceNotFoundError

__all__ = ["INSTALL", "check_output", "load_metrics", "plot_metrics", "plot_partitions", "require"]

INSTALL = "pip install 'graphstore[plot]'"
# graphstore-train's foreground timers (training.report.timing.FOREGROUND), for metrics files that do not list them
_FOREGROUND = ("data_wait", "forward_backward", "optimizer", "step_sync", "epoch_end")
_METRICS = {"acc": "accuracy", "auc": "AUC", "mrr": "MRR"}
_SPLITS = ("train", "val", "test")
_SIZE = (15.0, 4.5)  # inches, at _DPI: 1500 x 450 pixels
_DPI = 100


def require(what: str = "plotting") -> None:
    """Raise :class:`MissingBackendError` with the pip command when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MissingBackendError(f"{what} needs matplotlib ({exc}); {INSTALL}") from exc


def load_metrics(path: str | os.PathLike) -> dict[str, Any]:
    """The metrics file ``graphstore-train --metrics-out`` wrote, checked to hold per-epoch records.

    Examples
    --------
    >>> import json, tempfile
    >>> path = tempfile.mktemp(suffix=".json")
    >>> _ = open(path, "w").write(json.dumps({"epochs": [{"epoch": 1, "loss": 0.5}]}))
    >>> load_metrics(path)["epochs"][0]["loss"]
    0.5
    """
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except FileNotFoundError as exc:
        raise SourceNotFoundError(f"METRICS {path}: no such file; give the file graphstore-train --metrics-out "
                                  "wrote") from exc
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        detail = (exc.strerror if isinstance(exc, OSError) and exc.strerror else
                  "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
        raise InvalidInputError(f"METRICS {path} cannot be read as JSON ({detail}); give the file "
                                "graphstore-train --metrics-out wrote") from exc
    epochs = doc.get("epochs") if isinstance(doc, dict) else None
    if not isinstance(epochs, list) or not epochs or not all(isinstance(e, dict) and "epoch" in e for e in epochs):
        raise InvalidInputError(f"METRICS {path} is not a graphstore-train metrics file (no list of epoch records "
                                "under 'epochs'); give the file graphstore-train --metrics-out wrote")
    problem = _shape_problem(doc)
    if problem:
        raise InvalidInputError(f"METRICS {path}: {problem}; give the file graphstore-train --metrics-out wrote")
    return doc


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shape_problem(doc: Mapping[str, Any]) -> str | None:
    """What in a metrics document the plot would choke on (a string where a number goes, a record of the
    wrong kind), named by its place; ``None`` when every field the plot reads has its type."""
    for key, kind in (("config", dict), ("timing_parts", dict)):
        if doc.get(key) is not None and not isinstance(doc[key], kind):
            return f"'{key}' is {type(doc[key]).__name__}, not an object"
    foreground = (doc.get("timing_parts") or {}).get("foreground")
    if foreground is not None and not (isinstance(foreground, list) and all(isinstance(p, str) for p in foreground)):
        return "'timing_parts.foreground' is not a list of names"
    if doc.get("world_size") is not None and not _is_number(doc["world_size"]):
        return f"'world_size' is {doc['world_size']!r}, not a number"
    for i, record in enumerate(doc["epochs"]):
        problem = _record_problem(record)
        if problem:
            return f"epoch record {i}: {problem}"
    return None


def _record_problem(record: Mapping[str, Any]) -> str | None:
    epoch = record["epoch"]
    if not _is_number(epoch) or epoch != epoch or abs(epoch) == float("inf"):
        return f"'epoch' is {epoch!r}, not a number"
    curves = [k for k in record if k == "loss" or any(k == f"{s}_{m}" for s in _SPLITS for m in _METRICS)]
    for key in curves:  # a curve skips an epoch without the value (null), never a string
        if record[key] is not None and not _is_number(record[key]):
            return f"{key!r} is {_short(record[key])}, not a number"
    numbers = {k: record[k] for k in ("train_seconds", "eval_seconds") if k in record}
    timing = record.get("timing", {})
    if not isinstance(timing, dict):
        return f"'timing' is {type(timing).__name__}, not an object of seconds"
    numbers.update({f"timing.{k}": v for k, v in timing.items()})
    rates = record.get("loader_batches_per_s", [])
    if not isinstance(rates, list):
        return f"'loader_batches_per_s' is {type(rates).__name__}, not a list of numbers"
    numbers.update({f"loader_batches_per_s[{i}]": v for i, v in enumerate(rates)})
    for key, value in numbers.items():
        if not _is_number(value):
            return f"{key!r} is {_short(value)}, not a number"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__} {text[:30]}..."


def plot_metrics(metrics: Mapping[str, Any], out: str | os.PathLike) -> str:
    """Draw a run's training curves (loss; accuracy, AUC or MRR per split) and each epoch's time, stacked
    by part (data wait, forward/backward, ...; evaluation on top), into ``out`` (format from its suffix).

    Examples
    --------
    >>> import tempfile
    >>> doc = {"epochs": [{"epoch": 1, "loss": 0.9, "val_acc": 0.6, "train_seconds": 2.0, "eval_seconds": 0.5,
    ...                    "timing": {"data_wait": 0.5, "forward_backward": 1.2}}]}
    >>> plot_metrics(doc, tempfile.mktemp(suffix=".png")).endswith(".png")
    True
    """
    fmt = check_output(out)
    epochs = list(metrics["epochs"])
    fig = _figure(3)
    loss_ax, metric_ax, time_ax = fig.axes
    _curves(loss_ax, metric_ax, epochs)
    parts = (metrics.get("timing_parts") or {}).get("foreground") or _FOREGROUND
    _time_bars(time_ax, epochs, parts)
    fig.suptitle(_run_title(metrics))
    return _save(fig, out, fmt)


def plot_partitions(meta: Mapping[str, Any], out: str | os.PathLike, title: str = "") -> str:
    """Draw a dataset's partitions: nodes and edges per partition (stacked by type), the balance of each
    constraint (largest partition over the mean) and the edge cut, into ``out``.

    ``meta`` is :attr:`graphstore.Dataset.metadata` (what ``graphstore info --json`` prints).

    Examples
    --------
    >>> import tempfile
    >>> meta = {"num_parts": 2, "node_types": [{"name": None, "offsets": [0, 5, 9]}],
    ...         "edge_types": [{"name": None, "edges_per_part": [20, 18]}],
    ...         "partitioning": {"edge_cut": 4, "edge_cut_fraction": 0.105, "node_balance": 1.11}}
    >>> plot_partitions(meta, tempfile.mktemp(suffix=".png")).endswith(".png")
    True
    """
    fmt = check_output(out)
    fig = _figure(4)
    nodes_ax, edges_ax, balance_ax, cut_ax = fig.axes
    parts = list(range(int(meta["num_parts"])))
    nodes = {_type_name(t["name"]): [b - a for a, b in zip(t["offsets"], t["offsets"][1:])]
             for t in meta["node_types"]}
    edges = {_type_name(t["name"]): list(t["edges_per_part"]) for t in meta["edge_types"]}
    q = meta.get("partitioning", {})
    _stacked(nodes_ax, parts, nodes, "nodes per partition", train=q.get("train_nodes_per_part"))
    _stacked(edges_ax, parts, edges, "edges per partition (into its nodes)")
    _balance(balance_ax, q, hetero=len(nodes) > 1)
    _edge_cut(cut_ax, q, sum(sum(v) for v in edges.values()))
    fig.suptitle(f"{title or meta.get('name', '')}: {len(parts)} partition(s) by {q.get('method', '?')}")
    return _save(fig, out, fmt)


# -- drawing --


def _figure(panels: int) -> Any:
    require()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)  # Agg: no display, no pyplot state shared with the caller
    fig.subplots(1, panels)
    return fig


def _curves(loss_ax: Any, metric_ax: Any, epochs: Sequence[Mapping[str, Any]]) -> None:
    """Loss per epoch on the left; ``<split>_<metric>`` per epoch on the right (only the epochs that have it)."""
    x = [e["epoch"] for e in epochs]
    loss_ax.set(title="training loss", xlabel="epoch")
    if any("loss" in e for e in epochs):
        loss_ax.plot(*_series(epochs, "loss"), marker="o", label="train loss")
    elif any("loader_batches_per_s" in e for e in epochs):  # --loader-only: no model, batches per second
        rates = [sum(e.get("loader_batches_per_s", [])) for e in epochs]
        loss_ax.plot(x, rates, marker="o", label="batches/s (all ranks)")
        loss_ax.set(title="loader rate (--loader-only)")
    for split in _SPLITS:
        for key, name in _METRICS.items():
            xs, ys = _series(epochs, f"{split}_{key}")
            if xs:
                metric_ax.plot(xs, ys, marker="o", label=f"{split} {name}")
    metric_ax.set(title="evaluation", xlabel="epoch")
    for ax in (loss_ax, metric_ax):
        ax.set_xticks(x if len(x) <= 20 else ax.get_xticks())
        if ax.has_data():
            ax.legend()
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)


def _series(epochs: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    got = [(e["epoch"], float(e[key])) for e in epochs if isinstance(e.get(key), (int, float))]
    return [a for a, _ in got], [b for _, b in got]


def _time_bars(ax: Any, epochs: Sequence[Mapping[str, Any]], parts: Sequence[str]) -> None:
    """Each epoch's seconds stacked: the training loop's parts, what is left of training, then evaluation;
    the data-wait share of training above each bar."""
    x = [e["epoch"] for e in epochs]
    stack: dict[str, list[float]] = {p: [float(e.get("timing", {}).get(p, 0.0)) for e in epochs] for p in parts}
    stack["other"] = [max(0.0, float(e.get("train_seconds", 0.0)) - sum(s[i] for s in stack.values()))
                      for i, e in enumerate(epochs)]
    stack["evaluation"] = [float(e.get("eval_seconds", 0.0)) for e in epochs]
    bottom = [0.0] * len(epochs)
    for part, seconds in stack.items():
        if any(seconds):
            ax.bar(x, seconds, bottom=bottom, label=part.replace("_", " "))
            bottom = [b + s for b, s in zip(bottom, seconds)]
    for i, e in enumerate(epochs):
        train = float(e.get("train_seconds", 0.0))
        if train > 0:
            share = float(e.get("timing", {}).get("data_wait", 0.0)) / train
            ax.annotate(f"{100 * share:.0f}%", (x[i], bottom[i]), ha="center", va="bottom", fontsize=8)
    ax.set(title="seconds per epoch", xlabel="epoch", ylabel="seconds, per-rank mean (% = data-wait share)")
    ax.set_xticks(x if len(x) <= 20 else ax.get_xticks())
    if ax.has_data():
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _stacked(ax: Any, parts: list[int], by_type: Mapping[str, list[int]], title: str,
             train: Sequence[int] | None = None) -> None:
    bottom = [0] * len(parts)
    for name, counts in by_type.items():
        ax.bar(parts, counts, bottom=bottom, label=name)
        bottom = [b + c for b, c in zip(bottom, counts)]
    if train:
        ax.bar(parts, list(train), width=0.4, fill=False, hatch="//", label="training nodes")
    ax.set(title=title, xlabel="partition")
    ax.set_xticks(parts if len(parts) <= 32 else ax.get_xticks())
    if len(by_type) > 1 or train:
        ax.legend(fontsize=8)


def _balance(ax: Any, q: Mapping[str, Any], hetero: bool) -> None:
    """Largest partition over the mean, per constraint the partitioner balanced (1.0: perfect)."""
    rows = [(label, q[key]) for key, label in (("node_balance", "nodes"), ("edge_balance", "edges"),
                                               ("train_node_balance", "training nodes")) if q.get(key) is not None]
    if hetero:
        rows += [(f"nodes {name}", value) for name, value in (q.get("node_type_balance") or {}).items()]
    if rows:
        values = [float(r[1]) for r in rows]
        bars = ax.barh([r[0] for r in rows], values)
        ax.bar_label(bars, fmt="%.3f", padding=2, fontsize=8)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlim(min(0.95, *values), max(values) + 0.25 * (max(values) - min(0.95, *values)))
        ax.invert_yaxis()
    else:
        ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set(title="balance: largest / mean")


def _edge_cut(ax: Any, q: Mapping[str, Any], total: int) -> None:
    cut, fraction = q.get("edge_cut"), q.get("edge_cut_fraction")
    if cut is None or fraction is None:
        ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
    else:
        inside = max(0, total - int(cut))
        ax.bar(["within partitions", "between (cut)"], [inside, int(cut)], color=["tab:green", "tab:red"])
        ax.annotate(f"{100 * float(fraction):.2f}%", (1, int(cut)), ha="center", va="bottom")
    ax.set(title="edge cut")


def _run_title(metrics: Mapping[str, Any]) -> str:
    config = metrics.get("config") or {}
    bits = [str(config[k]) for k in ("dataset", "model", "task") if config.get(k)]
    if metrics.get("world_size"):
        bits.append(f"{metrics['world_size']} rank(s)")
    return ", ".join(bits) or "graphstore-train"


def _type_name(name: Any) -> str:
    if name is None:
        return "all"
    return ",".join(map(str, name)) if isinstance(name, (list, tuple)) else str(name)


# -- the file --


def check_output(out: str | os.PathLike, what: str = "plotting") -> str:
    """The image format ``out``'s suffix names (``png`` without one), after checking that matplotlib loads,
    that it can write that format and that ``out``'s directory exists (before any work is done). ``what``
    names the feature in the line that says how to install matplotlib."""
    require(what)
    from matplotlib.backend_bases import FigureCanvasBase

    path = os.fspath(out)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InvalidInputError(f"output {path} is a directory; give a file path such as {path}/plot.png")
    if not os.path.isdir(folder):
        raise InvalidInputError(f"output {path}: the directory {folder} does not exist; create it or give "
                                "another path")
    fmt = os.path.splitext(path)[1][1:].lower() or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if fmt not in formats:
        raise InvalidInputError(f"output {path}: matplotlib cannot write .{fmt}; end the name with one of "
                                f"{', '.join('.' + f for f in sorted(formats))}")
    return fmt


def _save(fig: Any, out: str | os.PathLike, fmt: str) -> str:
    """Write the figure atomically (a partial file, then a rename): a failed write leaves no half image."""
    path = os.fspath(out)
    tmp = f"{path}.partial-{os.getpid()}"
    try:
        fig.savefig(tmp, format=fmt)
        os.replace(tmp, path)
    except OSError as exc:
        raise InvalidInputError(f"output {path} cannot be written ({exc.strerror or exc}); give a path you can "
                                "write") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
    return path
