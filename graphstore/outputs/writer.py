"""Add derived per-node arrays (inference outputs) to an existing dataset: every part written, then one commit."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np
import zarr

from graphstore.dataset import layout
from graphstore.dataset.opened import Dataset, read_manifest
from graphstore.errors import (CorruptDatasetError, DatasetExistsError, InvalidInputError, PartitionIndexError,
                               UnknownAttributeError)
from graphstore.ingest.source import SUPPORTED_DTYPES
from graphstore.ingest.chunk_writer import ArrayWriter, ChecksumStore, chunk_rows_for
from graphstore.dataset.manifest import ArrayInfo, AttrSchema, Manifest, NodeTypeInfo, OutputInfo
from graphstore.storage.local import Location, open_location
from graphstore.dataset.types import NodeType

__all__ = ["OutputSpec", "OutputWriter"]

logger = logging.getLogger(__name__)

_RESERVED = layout.TOPOLOGY | {layout.ORIG_ID, layout.HALO_IDS}
_CHUNK_BYTES = 32 << 20  # ingest's default, for manifests that do not record theirs


@dataclass(frozen=True)
class OutputSpec:
    """One derived node attribute: its ``name``, ``node_type``, the shape of one row and its dtype."""

    name: str
    node_type: NodeType = None
    row_shape: tuple[int, ...] = ()
    dtype: str = "float32"
    description: str = ""  # what produced it (model, checkpoint, run); stored in the manifest

    def __post_init__(self) -> None:
        layout.check_attr_name(self.name, "the output")
        if self.name in _RESERVED:
            raise InvalidInputError(f"output name {self.name!r} is reserved for graphstore's own arrays "
                                    f"({sorted(_RESERVED)}); choose another name")
        try:
            dtype = np.dtype(self.dtype)
        except TypeError:
            dtype = None
        if dtype not in SUPPORTED_DTYPES:
            allowed = sorted(d.name for d in SUPPORTED_DTYPES)
            raise InvalidInputError(f"output {self.name!r}: dtype {self.dtype!r} cannot be stored; use one of "
                                    f"{allowed}")
        shape = (self.row_shape,) if isinstance(self.row_shape, (int, np.integer)) else tuple(self.row_shape)
        if any(not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1 for n in shape):
            raise InvalidInputError(f"output {self.name!r}: row_shape {self.row_shape!r} is not a shape; give "
                                    "positive ints, e.g. (128,) for 128-dimensional embeddings, () for scalars")
        object.__setattr__(self, "dtype", dtype.name)
        object.__setattr__(self, "row_shape", tuple(int(n) for n in shape))


class _PartWriter(ArrayWriter):
    """An :class:`ArrayWriter` into an existing dataset: the same store, chunking and checksums, but the
    root group (holding the manifest) is left as it is until :meth:`OutputWriter.commit`."""

    def __init__(self, location: Location, chunk_bytes: int) -> None:
        # deliberately not ArrayWriter.__init__: that creates the root group, replacing the dataset
        self.location, self.compression, self.chunk_bytes = location, "none", chunk_bytes
        self.bytes_written = self.read_back = 0
        self._store = ChecksumStore(location.zarr_store(read_only=False))

    def remove(self, path: str) -> None:
        """Delete the array at ``path`` and its chunks (absent is fine)."""
        parent, name = path.rsplit("/", 1)

        def remove() -> None:
            del zarr.open_group(self._store, path=parent, mode="r+")[name]

        self._guard(f"removing {path}", remove)


class OutputWriter:
    """Adds node attribute ``name`` (e.g. final-layer embeddings) to the existing dataset at ``dataset_or_url``.

    Each process calls :meth:`write_part` for the partitions it owns (any number of processes and
    machines at once); then one process calls :meth:`commit` with every part's :class:`ArrayInfo`.
    Until the commit the dataset opens exactly as before: the new arrays are in no manifest. After
    it, ``fs[node_type, name, ids]`` serves the rows like any node attribute, from local disk or
    object storage, and ``orig_id`` maps them back to input IDs. The writer pickles (no open clients).

    ``overwrite=True`` replaces an earlier output of the same name: its arrays are rewritten in place,
    so readers that open the dataset between :meth:`write_part` and :meth:`commit` see them changed.
    Attributes written by ingest are never replaced. Commits of different outputs to one dataset must
    not overlap in time (each rewrites the manifest it read).

    Examples
    --------
    >>> writer = OutputWriter("s3://bucket/cora", "emb", row_shape=(64,), storage_options=opts)  # doctest: +SKIP
    >>> info = writer.write_part(rank, model_outputs)  # on every rank, for its partition  # doctest: +SKIP
    >>> infos = gather_to_rank0(rank, info)  # your process group's gather  # doctest: +SKIP
    >>> if rank == 0:
    ...     writer.commit(infos)  # doctest: +SKIP
    >>> fs, _ = graphstore.open_dataset("s3://bucket/cora", opts).partition(0)  # doctest: +SKIP
    >>> fs[None, "emb", None].shape  # doctest: +SKIP
    torch.Size([1354, 64])
    """

    def __init__(self, dataset_or_url: Dataset | str | os.PathLike[str] | Location, name: str,
                 node_type: NodeType = None, row_shape: tuple[int, ...] = (), dtype: str = "float32",
                 storage_options: dict[str, Any] | None = None, overwrite: bool = False,
                 description: str = "") -> None:
        self.spec = OutputSpec(name, node_type, row_shape, dtype, description)
        self.overwrite = overwrite
        given = dataset_or_url.location if isinstance(dataset_or_url, Dataset) else dataset_or_url
        self.location = open_location(given, storage_options)
        current = read_manifest(self.location)
        # the partition book the rows are computed in: the opened dataset's, else the stored one
        self.manifest = dataset_or_url.manifest if isinstance(dataset_or_url, Dataset) else current
        self.ntype = _node_type(self.manifest, node_type)
        self._check_current(current)
        self.chunk_bytes = int(self.manifest.storage.get("chunk_bytes", _CHUNK_BYTES))
        self._writer: _PartWriter | None = None

    def __repr__(self) -> str:
        return f"OutputWriter({self.location.url!r}, {self.spec.name!r}, node_type={self.spec.node_type!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_writer"] = None  # zarr stores and clients stay in their process; reopened lazily
        return state

    def path(self, part: int) -> str:
        """The array of partition ``part``: ``part_00000/nodes/<node type key>/<name>``."""
        return layout.node_array(part, self.ntype.key, self.spec.name)

    def write_part(self, part: int, rows: Any) -> ArrayInfo:
        """Write the rows of partition ``part``'s own nodes (one per node, in global-ID order).

        ``rows`` (numpy array or tensor) has ``offsets[part+1] - offsets[part]`` rows of ``row_shape``;
        it is cast to ``dtype`` when that loses no kind (float64 to float32, not float to int). Any
        uncommitted array left at the same path by an earlier attempt is replaced. Returns the array's
        :class:`ArrayInfo` (with per-chunk crc32 checksums) for :meth:`commit`.
        """
        if not isinstance(part, (int, np.integer)) or isinstance(part, bool) or not 0 <= part < self.manifest.num_parts:
            raise PartitionIndexError(f"partition {part!r} is out of range: {self.location.url} has "
                                      f"{self.manifest.num_parts} partitions (0..{self.manifest.num_parts - 1})")
        values = self._rows(int(part), rows)
        writer = self._part_writer()
        path = self.path(int(part))
        writer.remove(path)
        info = writer.write_array(path, values)
        logger.info("wrote %s (%d rows, %d chunks) to %s", path, len(values), info.num_chunks, self.location.url)
        return info

    def commit(self, infos: Mapping[int, ArrayInfo]) -> Manifest:
        """Record the output in the manifest: once, by one process, after every part is written.

        Checks that ``infos`` holds every partition's :class:`ArrayInfo` as :meth:`write_part` returned
        it and that each array is stored, re-reads the manifest, adds the attribute, its arrays and an
        ``outputs`` entry, and rewrites the root ``zarr.json`` as the last write (local: a temporary
        file renamed over it; object storage: one PUT). Returns the new manifest.
        """
        current = read_manifest(self.location)
        self._check_current(current)
        self._check_infos(infos)
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        manifest = _with_output(current, self.ntype, self.spec, infos, created)
        if self.location.local_root is not None:  # a rename is atomic there; elsewhere one PUT is
            _replace_root_metadata(self.location, self.location.local_root, manifest.to_json())
        else:
            self._part_writer().commit(manifest.to_json())
        logger.info("committed output %r of %r to %s", self.spec.name, self.ntype.name, self.location.url)
        return manifest

    # -- checks --

    def _check_current(self, current: Manifest) -> None:
        """Refuse a dataset re-ingested since the rows were computed, and a name taken there."""
        if _book(self.manifest, self.ntype.key) != _book(current, self.ntype.key):
            raise InvalidInputError(
                f"{self.location.url} was re-ingested after the rows of output {self.spec.name!r} were computed: "
                "its partitions no longer hold the same nodes; open the dataset again and recompute the output"
            )
        info = current.node_type(self.ntype.name)
        if self.spec.name not in info.attrs:
            return
        derived = any(o.name == self.spec.name and o.node_type == info.name for o in current.outputs)
        if not derived:
            raise DatasetExistsError(f"{info.name!r} of {self.location.url} already has attribute "
                                     f"{self.spec.name!r}, written by ingest (never replaced); choose another name")
        if not self.overwrite:
            raise DatasetExistsError(f"{info.name!r} of {self.location.url} already has output {self.spec.name!r}; "
                                     "pass overwrite=True to replace it, or choose another name")

    def _rows(self, part: int, rows: Any) -> np.ndarray:
        if hasattr(rows, "detach"):  # a torch tensor, possibly on a GPU or requiring grad
            rows = rows.detach().cpu().numpy()
        values = np.asarray(rows)
        count = self.ntype.offsets[part + 1] - self.ntype.offsets[part]
        where = f"output {self.spec.name!r}, partition {part}"
        if values.ndim == 0 or len(values) != count:
            got = "a scalar" if values.ndim == 0 else f"{len(values)} rows"
            raise InvalidInputError(
                f"{where}: got {got}, but the partition owns {count} nodes of {self.ntype.name!r} (global IDs "
                f"{self.ntype.offsets[part]}..{self.ntype.offsets[part + 1] - 1}); pass one row per owned node, "
                "in global-ID order")
        if values.shape[1:] != self.spec.row_shape:
            raise InvalidInputError(f"{where}: rows have shape {values.shape[1:]}, declared row_shape is "
                                    f"{self.spec.row_shape}; reshape the rows or declare their shape")
        if not np.can_cast(values.dtype, self.spec.dtype, "same_kind"):
            raise InvalidInputError(f"{where}: {values.dtype} rows cannot be stored as {self.spec.dtype} without "
                                    f"losing values; cast them first, or declare dtype={values.dtype.name!r}")
        return np.ascontiguousarray(values, dtype=self.spec.dtype)

    def _check_infos(self, infos: Mapping[int, ArrayInfo]) -> None:
        """Every partition's array, as write_part described it, and stored."""
        parts = range(self.manifest.num_parts)
        missing = [p for p in parts if p not in infos]
        extra = sorted(set(infos) - set(parts))
        if missing or extra:
            raise InvalidInputError(
                f"cannot commit output {self.spec.name!r}: " + (f"partition(s) {missing} have no ArrayInfo; "
                f"call write_part for them and pass every part's result" if missing else
                f"partition(s) {extra} are not in {self.location.url} (0..{len(parts) - 1}); drop them"))
        for part in parts:
            info = infos[part]
            count = self.ntype.offsets[part + 1] - self.ntype.offsets[part]
            shape = (count, *self.spec.row_shape)
            rows = chunk_rows_for(count, self.spec.row_shape, np.dtype(self.spec.dtype), self.chunk_bytes)
            checksums = info.checksums if isinstance(info, ArrayInfo) else ()
            expected = ArrayInfo(shape, self.spec.dtype, rows, "none", checksums)
            if info != expected or expected.num_chunks != -(-count // rows):
                raise InvalidInputError(f"cannot commit output {self.spec.name!r}: the ArrayInfo of partition {part} "
                                        f"({info!r}) is not what write_part of this output returns for it; pass "
                                        "write_part's result unchanged")
            last = (layout.chunk_key(self.path(part), info.num_chunks - 1, len(shape)) if info.num_chunks
                    else f"{self.path(part)}/{layout.ROOT_METADATA}")
            if not self.location.has(last):
                raise CorruptDatasetError(f"cannot commit output {self.spec.name!r}: {last} is missing from "
                                          f"{self.location.url}; call write_part({part}, rows) again")

    def _part_writer(self) -> _PartWriter:
        if self._writer is None:
            self._writer = _PartWriter(self.location, self.chunk_bytes)
        return self._writer


def _node_type(manifest: Manifest, ntype: NodeType) -> NodeTypeInfo:
    if ntype is None and manifest.is_hetero:
        known = [t.name for t in manifest.node_types]
        raise UnknownAttributeError(f"dataset {manifest.name!r} is heterogeneous: pass node_type, one of {known}")
    return manifest.node_type(ntype)


def _book(manifest: Manifest, key: str) -> tuple[Any, ...]:
    """What fixes which node each row is: the partition count, the node type's offsets and its orig_id arrays."""
    info = next((t for t in manifest.node_types if t.key == key), None)
    orig = tuple(manifest.arrays.get(layout.node_array(p, key, layout.ORIG_ID)) for p in range(manifest.num_parts))
    return manifest.num_parts, None if info is None else info.offsets, orig


def _with_output(current: Manifest, ntype: NodeTypeInfo, spec: OutputSpec, infos: Mapping[int, ArrayInfo],
                 created: str) -> Manifest:
    """``current`` plus the output: its schema in the node type, its arrays, its ``outputs`` entry."""
    schema = AttrSchema(spec.dtype, spec.row_shape)
    ntypes = tuple(replace(t, attrs={**t.attrs, spec.name: schema}) if t.key == ntype.key else t
                   for t in current.node_types)
    arrays = {**current.arrays, **{layout.node_array(p, ntype.key, spec.name): infos[p]
                                   for p in range(current.num_parts)}}
    entry = OutputInfo(spec.name, ntype.name, created, spec.description)
    outputs = tuple(o for o in current.outputs if (o.name, o.node_type) != (spec.name, ntype.name)) + (entry,)
    return replace(current, node_types=ntypes, arrays=arrays, outputs=outputs)


def _replace_root_metadata(location: Location, root: str, manifest_json: dict[str, Any]) -> None:
    """Put ``manifest_json`` into the root ``zarr.json`` under ``root`` by renaming a complete new file over it."""
    doc = location.read_json(layout.ROOT_METADATA)
    doc.setdefault("attributes", {})[layout.MANIFEST_ATTR] = manifest_json
    final = os.path.join(root, *layout.ROOT_METADATA.split("/"))
    tmp = f"{final}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
