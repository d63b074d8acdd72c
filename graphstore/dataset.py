"""An opened dataset: its manifest, the range partition book, its arrays, and its partitions' stores."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from graphstore import layout
from graphstore.arrays import ZarrRows, open_array
from graphstore.errors import CorruptDatasetError, DatasetNotFoundError, PartitionIndexError
from graphstore.types import EdgeType, NodeType
from graphstore.manifest import Manifest
from graphstore.storage import LocalLocation, open_location

if TYPE_CHECKING:
    from graphstore.stores import ZarrFeatureStore, ZarrGraphStore

logger = logging.getLogger(__name__)


class Dataset:
    """A graphstore dataset opened read-only. Arrays are mapped on first use; the object pickles.

    Examples
    --------
    >>> ds = open_dataset("/data/cora")  # doctest: +SKIP
    >>> feature_store, graph_store = ds.partition(0)  # doctest: +SKIP
    >>> feature_store[None, "x", None].shape  # doctest: +SKIP
    torch.Size([1354, 1433])
    """

    def __init__(self, location: LocalLocation, manifest: Manifest) -> None:
        self.location = location
        self.manifest = manifest
        self._arrays: dict[str, np.ndarray | ZarrRows] = {}

    def __repr__(self) -> str:
        return f"Dataset({self.url!r}, name={self.name!r}, num_parts={self.num_parts})"

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "manifest": self.manifest}  # mapped arrays are reopened lazily

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"], state["manifest"])  # type: ignore[misc]

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def num_parts(self) -> int:
        return self.manifest.num_parts

    @property
    def is_hetero(self) -> bool:
        return self.manifest.is_hetero

    @property
    def node_types(self) -> list[NodeType]:
        return [t.name for t in self.manifest.node_types]

    @property
    def edge_types(self) -> list[EdgeType]:
        return [t.name for t in self.manifest.edge_types]

    @property
    def metadata(self) -> dict[str, Any]:
        """The manifest as JSON, without the per-array table."""
        doc = self.manifest.to_json()
        doc.pop("arrays")
        return doc

    def num_nodes(self, ntype: NodeType = None) -> int:
        return self.manifest.node_type(ntype).num_nodes

    def node_offsets(self, ntype: NodeType = None) -> np.ndarray:
        """The range partition book: partition p owns global IDs ``[offsets[p], offsets[p+1])``."""
        return np.asarray(self.manifest.node_type(ntype).offsets, dtype=np.int64)

    def owner(self, ids: Any, ntype: NodeType = None) -> np.ndarray:
        """The partition owning each global node ID."""
        return np.searchsorted(self.node_offsets(ntype), np.asarray(ids), side="right") - 1

    def check_part(self, part: int) -> int:
        if not isinstance(part, (int, np.integer)) or isinstance(part, bool) or not 0 <= part < self.num_parts:
            raise PartitionIndexError(
                f"partition {part!r} is out of range: {self.url} has {self.num_parts} partitions "
                f"(0..{self.num_parts - 1})"
            )
        return int(part)

    def array(self, path: str) -> np.ndarray | ZarrRows:
        """A stored array by its layout path, mapped once per process."""
        found = self._arrays.get(path)
        if found is None:
            info = self.manifest.arrays.get(path)
            if info is None:
                raise CorruptDatasetError(f"{self.url}: array {path} is not in the manifest; re-ingest the dataset")
            found = self._arrays[path] = open_array(self.location, path, info)
        return found

    def has_array(self, path: str) -> bool:
        return path in self.manifest.arrays

    def partition(self, part: int) -> tuple[ZarrFeatureStore, ZarrGraphStore]:
        """The PyG ``(FeatureStore, GraphStore)`` pair serving partition ``part``."""
        from graphstore.stores import ZarrFeatureStore, ZarrGraphStore

        part = self.check_part(part)
        return ZarrFeatureStore(self, part), ZarrGraphStore(self, part)

    def verify(self, progress: Callable[[int, int], None] | None = None) -> list[str]:
        """Recompute every chunk checksum; return one message per damaged or missing chunk."""
        problems = []
        total = sum(info.num_chunks for info in self.manifest.arrays.values())
        done = 0
        for path, info in sorted(self.manifest.arrays.items()):
            for index, expected in enumerate(info.checksums):
                key = layout.chunk_key(path, index, len(info.shape))
                found = self.location.checksum(key)
                if found is None:
                    problems.append(f"{path}: chunk {index} ({key}) is missing")
                elif found != expected:
                    problems.append(f"{path}: chunk {index} ({key}) is corrupted (checksum {found}, expected {expected})")
                done += 1
                if progress:
                    progress(done, total)
        return problems


def open_dataset(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> Dataset:
    """Open the graphstore dataset at ``url`` (a local/NFS path or ``file://`` URL).

    Refuses a location without a complete manifest (an interrupted ingest) or with an unknown format
    version.

    Examples
    --------
    >>> import graphstore
    >>> ds = graphstore.open_dataset("/data/cora")  # doctest: +SKIP
    >>> ds.num_parts  # doctest: +SKIP
    2
    """
    location = open_location(url, storage_options)
    try:
        doc = location.read_json(layout.ROOT_METADATA)
    except (ValueError, OSError) as exc:
        raise CorruptDatasetError(f"{location.url}/{layout.ROOT_METADATA} is unreadable ({exc}); re-ingest") from exc
    if doc is None:
        raise DatasetNotFoundError(
            f"no graphstore dataset at {location.url}: {layout.ROOT_METADATA} is missing; check the path, "
            "or create the dataset with `graphstore ingest SOURCE DEST`"
        )
    manifest = doc.get("attributes", {}).get(layout.MANIFEST_ATTR) if isinstance(doc, dict) else None
    if manifest is None:
        raise DatasetNotFoundError(
            f"{location.url} is not a complete graphstore dataset: it has no manifest (an ingest into it was "
            "interrupted, or it is another Zarr group); run the ingest again with --overwrite"
        )
    return Dataset(location, Manifest.from_json(manifest, location.url))
