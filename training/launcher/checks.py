"""Check a training job at the door, before any rank starts: numbers, outputs, this host, the dataset, the task."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import TYPE_CHECKING

import numpy as np

from graphstore.errors import DatasetExistsError, InvalidInputError
from graphstore.dataset import trainable
from training.loop import checkpoint, resume
from training.config import TrainConfig, check_config

if TYPE_CHECKING:
    from graphstore.dataset.opened import Dataset
    from graphstore.dataset.manifest import AttrSchema, EdgeTypeInfo, NodeTypeInfo

__all__ = ["check_config", "check_dataset", "check_host", "check_outputs", "check_resume"]

_SELF_LOOP_MODELS = ("gcn", "gat")  # PyG's to_hetero refuses their layers (add_self_loops) on bipartite edge types


def check_outputs(c: TrainConfig) -> None:
    """``--checkpoint-dir``, ``--metrics-out`` and ``--tensorboard`` can be written (tried, not guessed from
    permission bits; ``--tensorboard`` also needs its optional package),
    ``--resume`` finds a readable pointer, and this host's settings hold (:func:`check_host`).

    Directories created to try them are removed again. Under torchrun/srun call it from one process:
    peers trying the same new directory at once could remove it under each other.
    """
    if c.checkpoint_dir:
        _writable_dir("--checkpoint-dir", c.checkpoint_dir)
        _try_writing("--checkpoint-dir", c.checkpoint_dir, c.checkpoint_dir)
        if c.resume:
            _check_resume(c.checkpoint_dir)
    if c.metrics_out:
        path = os.path.abspath(os.path.expanduser(c.metrics_out))
        if os.path.isdir(path):
            raise InvalidInputError(f"--metrics-out {c.metrics_out} is a directory; give a file path")
        _writable_dir("--metrics-out", os.path.dirname(path), creates=False)
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise InvalidInputError(f"--metrics-out {c.metrics_out}: the file cannot be written (permissions)")
        _try_writing("--metrics-out", c.metrics_out, os.path.dirname(path))
    if c.tensorboard:
        from training.report.tensorboard import require

        require()  # the optional extra, named with its pip command
        _writable_dir("--tensorboard", c.tensorboard)
        _try_writing("--tensorboard", c.tensorboard, c.tensorboard)
    check_host(c)  # launch.py calls check_outputs first: this host's facts are found there too


def check_host(c: TrainConfig) -> None:
    """What this host must have for the ranks it starts: the ``--interface`` (with an address)."""
    if c.interface is not None:
        from training.launcher import netif

        netif.check_interface(c.interface)


def _writable_dir(flag: str, directory: str, creates: bool = True) -> None:
    path = os.path.abspath(os.path.expanduser(directory))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or (existing == path and not os.path.isdir(path)):
        raise InvalidInputError(f"{flag} {directory}: {existing} is a file, not a directory; give another path")
    if existing != path and not creates:
        raise InvalidInputError(f"{flag}: the directory {path} does not exist; create it or give another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{flag} {directory}: {existing} cannot be written (permission denied); "
                                "give a directory you can write")


def _try_writing(flag: str, given: str, directory: str) -> None:
    """Create ``directory`` (and missing parents) as the job will, create and delete a file in it, then
    remove the directories made here. ``os.access`` trusts permission bits, which /proc, read-only
    mounts and full disks do not follow (and root passes every ``os.access``)."""
    path = os.path.abspath(os.path.expanduser(directory))
    missing, parent = [], path
    while not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    created: list[str] = []
    try:
        for new in reversed(missing):
            with contextlib.suppress(FileExistsError):  # made by someone else meanwhile: not ours to remove
                os.mkdir(new)
                created.append(new)
        fd, probe = tempfile.mkstemp(prefix=".graphstore-train-probe-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        failed = exc.filename if exc.filename in missing else path
        raise InvalidInputError(f"{flag} {given}: {failed} cannot be created or written "
                                f"({exc.strerror or exc}); give a directory you can write") from exc
    finally:
        for new in reversed(created):
            with contextlib.suppress(OSError):
                os.rmdir(new)


def _check_resume(directory: str) -> None:
    """``--resume`` reads ``latest.json`` (training.loop.checkpoint's pointer to the newest file): it must parse
    and name a file of this directory, one that begins as a PyTorch file does. No pointer is fine (the job
    starts at epoch 1). :func:`check_resume` reads the checkpoint itself once the dataset is open."""
    path = checkpoint.latest_path(directory)
    if path is not None:
        checkpoint.sniff(path)


def check_resume(c: TrainConfig, ds: Dataset, world_size: int) -> list[str]:
    """``--resume``: the newest checkpoint is one of ours and was written by this job (dataset, task, model
    shape, batch size, and for a checkpoint inside an epoch the rank count); refused in one line otherwise.
    Returns what to say once: a changed ``--lr``/``--epochs`` (applied), another rank count.

    Examples
    --------
    >>> for line in check_resume(config, ds, world_size=2):  # doctest: +SKIP
    ...     print(f"graphstore-train: {line}", file=sys.stderr)
    """
    if not (c.resume and c.checkpoint_dir):
        return []
    path = checkpoint.latest_path(c.checkpoint_dir)
    if path is None:
        return []
    return resume.compare(path, checkpoint.read(path), resume.identity(c, ds, world_size))


def check_dataset(c: TrainConfig, ds: Dataset) -> None:
    """The dataset can serve this job: chunk files present and whole, the cache options fit its location,
    features of width > 0, the task's labels (read from the stored arrays: inside ``[0, classes)`` on every
    split node, a class count a model can hold, a training node) or edges there, the model fits its types,
    ``--time-attr`` and ``--infer-out`` too."""
    ds.check_chunk_files()
    _check_cache(c, ds)
    _check_features(ds)
    if c.task == "link":
        _check_links(c, ds)
    else:
        _check_labels(c, ds)
    _check_model(c, ds)
    _check_time_attr(c, ds)
    _check_infer_out(c, ds)


def _check_cache(c: TrainConfig, ds: Dataset) -> None:
    """Cache flags do nothing for a local dataset (refused); for a remote one the cache directory is tried."""
    given = [flag for flag, value in (("--cache-dir", c.cache_dir), ("--cache-max-bytes", c.cache_max_bytes))
             if value is not None]
    if ds.location.is_local:
        if given:
            verb, it = ("do", "them") if len(given) > 1 else ("does", "it")
            raise InvalidInputError(f"{' and '.join(given)} {verb} nothing for the local dataset {ds.url} (only "
                                    f"remote datasets' chunks are cached); remove {it}")
        return
    from graphstore.storage.cache import ENV_DIR, CacheConfig

    config = CacheConfig(directory=c.cache_dir, max_bytes=c.cache_max_bytes)  # names a bad $GRAPHSTORE_CACHE_*
    flag = "--cache-dir" if c.cache_dir else f"${ENV_DIR}" if os.environ.get(ENV_DIR) else "--cache-dir (default)"
    _try_writing(flag, config.directory, config.directory)


def _check_links(c: TrainConfig, ds: Dataset) -> None:
    info = _link_type(c, ds)
    if info.num_edges == 0:
        with_edges = [t.name for t in ds.manifest.edge_types if t.num_edges]
        raise InvalidInputError(f"--task link: edge type {info.name!r} has no edges; pick one with edges "
                                f"(--edge-type, one of {with_edges})")


def _check_labels(c: TrainConfig, ds: Dataset) -> None:
    labelled = [t for t in ds.manifest.node_types if {"y", "train_mask"} <= set(t.attrs)]
    if c.target is not None:
        if not any(t.name == c.target for t in labelled):
            raise InvalidInputError(f"--target {c.target!r} has no y/train_mask; node types with labels: "
                                    f"{[t.name for t in labelled]}")
        labelled = [t for t in labelled if t.name == c.target]
    elif not labelled:
        raise InvalidInputError(f"{ds.url} has no node type with y and train_mask to classify (--task node)")
    for info in labelled:
        dtype = np.dtype(info.attrs["y"].dtype)
        if dtype.kind not in "iu":
            raise InvalidInputError(f"{ds.url}: labels y of {info.name or 'the nodes'} are {dtype}, not integer "
                                    "class IDs; re-ingest them as integers (y.astype(np.int64))")
        if np.dtype(info.attrs["train_mask"].dtype) != np.bool_:
            raise InvalidInputError(f"{ds.url}: train_mask of {info.name or 'the nodes'} is "
                                    f"{info.attrs['train_mask'].dtype}, not bool; re-ingest it as bool")
    # the type trained (--target, else the first labelled one), from its stored arrays; a remote dataset's are
    # left to `graphstore verify` (reading them here would fill the chunk cache before the job starts)
    for info in labelled[:1] if ds.location.is_local else []:
        problems = trainable.label_problems(ds, info)
        if problems:
            raise InvalidInputError(f"{ds.url}: {problems[0]}; `graphstore verify {ds.url}` lists every problem")


def _check_features(ds: Dataset) -> None:
    """Features of width > 0 on every node type that has them (the model's input layer)."""
    for info in ds.manifest.node_types:
        problem = trainable.feature_problem(info)
        if problem:
            raise InvalidInputError(f"{ds.url}: {problem}")


def _check_model(c: TrainConfig, ds: Dataset) -> None:
    """What building the model on the first batch would refuse (nothing is built with ``--loader-only``)."""
    if c.loader_only:
        return
    bipartite = [t.name for t in ds.manifest.edge_types if t.src != t.dst]
    if ds.is_hetero and c.model in _SELF_LOOP_MODELS and bipartite:
        raise InvalidInputError(f"--model {c.model} cannot train on {ds.url}: PyG's to_hetero refuses its layers "
                                f"(they add self-loops) on edges between different node types, such as "
                                f"{bipartite[0]}; use --model sage or gin")
    if c.task == "node" and not ds.is_hetero and "x" not in ds.manifest.node_types[0].attrs:
        raise InvalidInputError(f"{ds.url} has no node features x for --task node to classify from; re-ingest "
                                "with features, or train --task link (it learns an embedding per node)")


def _check_time_attr(c: TrainConfig, ds: Dataset) -> None:
    """``--time-attr`` names an attribute holding one integer per row, where the task takes seed times."""
    name, m = c.time_attr, ds.manifest
    if not name:
        return
    holders = [(_node_name(t), t.attrs[name]) for t in m.node_types if name in t.attrs]
    holders += [(_edge_name(t), t.attrs[name]) for t in m.edge_types if name in t.attrs]
    if not holders:
        usable = sorted({a for t in (*m.node_types, *m.edge_types) for a, s in t.attrs.items() if _is_time(s)})
        hint = (f"its attributes with one integer per row: {usable}" if usable else
                "it has no integer attribute to take times from; re-ingest with one, or drop --time-attr")
        raise InvalidInputError(f"--time-attr {name!r} is no node or edge attribute of {ds.url}; {hint}")
    for where, schema in holders:
        if not _is_time(schema):
            shape = f"[{', '.join(map(str, schema.shape))}]" if schema.shape else ""
            raise InvalidInputError(f"--time-attr {name!r} is {schema.dtype}{shape} on {where} of {ds.url}, not one "
                                    "integer per row (temporal sampling compares int64 times); re-ingest it as "
                                    "integers, e.g. seconds as times.astype(np.int64), or give another attribute")
    _check_time_seeds(c, ds, name)


def _check_time_seeds(c: TrainConfig, ds: Dataset, name: str) -> None:
    """Seeds take their time from their own node (``--task node``) or link (``--task link``)."""
    if c.task == "node":
        target = _target(c, ds)
        if name not in target.attrs:
            raise InvalidInputError(f"--time-attr {name!r} is no node attribute of {_node_name(target)}: --task node "
                                    "samples each seed at its own node's time; give a node attribute of the seeds' "
                                    "type, or drop --time-attr")
        return
    info = _link_type(c, ds)
    if name not in info.attrs:  # node times alone: PyG's negative sampling needs each link's own time
        raise InvalidInputError(f"--time-attr {name!r} is no attribute of {_edge_name(info)}: --task link samples "
                                "each link at its own edge time; give an attribute of that edge type, or drop "
                                "--time-attr")


def _check_infer_out(c: TrainConfig, ds: Dataset) -> None:
    """What writing ``--infer-out NAME`` after training would refuse (training.loop.inference, graphstore.outputs.writer)."""
    name, m = c.infer_out, ds.manifest
    if not name:
        return
    from graphstore.outputs.writer import OutputSpec
    from training.loop.inference import EXACT_MODELS

    if c.task != "node" or ds.is_hetero:
        what = "--task link" if c.task != "node" else f"the heterogeneous {ds.url}"
        raise InvalidInputError(f"--infer-out writes outputs of homogeneous node classification only, not of "
                                f"{what}; drop --infer-out")
    if c.model not in EXACT_MODELS:
        raise InvalidInputError(f"--infer-out with --model {c.model}: exact inference supports {EXACT_MODELS} "
                                f"({c.model}'s normalisation needs global degrees); pick one of them, or drop "
                                "--infer-out")
    try:
        OutputSpec(name)
    except InvalidInputError as exc:
        raise InvalidInputError(f"--infer-out {name!r}: {exc}") from exc
    info = m.node_types[0]
    if name in info.attrs:
        earlier = next((o for o in m.outputs if (o.name, o.node_type) == (name, info.name)), None)
        if earlier is None:
            raise DatasetExistsError(f"--infer-out {name!r}: {ds.url} already has node attribute {name!r}, written "
                                     "by ingest (never replaced); choose another name")
        raise DatasetExistsError(f"--infer-out {name!r}: {ds.url} already has output {name!r} (written "
                                 f"{earlier.created}), and graphstore-train does not replace outputs; choose "
                                 "another name")


def _link_type(c: TrainConfig, ds: Dataset) -> EdgeTypeInfo:
    """The edge type ``--task link`` predicts: ``--edge-type``, else the first."""
    from graphstore.errors import UnknownAttributeError

    if not c.edge_type:
        return ds.manifest.edge_types[0]
    try:
        return ds.manifest.edge_type(c.edge_type)
    except UnknownAttributeError as exc:
        fix = f"{exc}" if ds.is_hetero else f"{ds.url} is homogeneous (one edge type): drop --edge-type"
        raise UnknownAttributeError(f"--edge-type {','.join(c.edge_type)}: {fix}") from exc


def _target(c: TrainConfig, ds: Dataset) -> NodeTypeInfo:
    """The node type ``--task node`` classifies (after :func:`_check_labels`)."""
    labelled = [t for t in ds.manifest.node_types if {"y", "train_mask"} <= set(t.attrs)]
    return next(t for t in labelled if c.target is None or t.name == c.target)


def _is_time(schema: AttrSchema) -> bool:
    return np.dtype(schema.dtype).kind in "iu" and not tuple(schema.shape)


def _node_name(info: NodeTypeInfo) -> str:
    return f"node type {info.name!r}" if info.name is not None else "the nodes"


def _edge_name(info: EdgeTypeInfo) -> str:
    return f"edge type {info.name!r}" if info.name is not None else "the edges"
