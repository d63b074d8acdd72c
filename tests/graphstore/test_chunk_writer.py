"""What an ingest's array writer asks of its store: on object storage every call is a request."""

from __future__ import annotations

from collections import Counter

import numpy as np
import zarr
from zarr.storage import WrapperStore

from graphstore.ingest.chunk_writer import ArrayWriter
from graphstore.storage.local import LocationWrapper, open_location


class _CountingStore(WrapperStore):  # type: ignore[type-arg]
    def __init__(self, store, calls: Counter) -> None:
        super().__init__(store)
        self.calls = calls

    def _with_store(self, store):
        return type(self)(store, self.calls)

    async def get(self, key, *args, **kwargs):
        self.calls["get"] += 1
        return await self._store.get(key, *args, **kwargs)

    async def exists(self, key):
        self.calls["exists"] += 1
        return await self._store.exists(key)

    async def set(self, key, value):
        self.calls["set"] += 1
        await self._store.set(key, value)

    async def set_if_not_exists(self, key, value):
        self.calls["set_if_not_exists"] += 1
        await self._store.set_if_not_exists(key, value)

    async def delete(self, key):
        self.calls["delete"] += 1
        await self._store.delete(key)

    async def delete_dir(self, prefix):
        self.calls["delete_dir"] += 1
        await self._store.delete_dir(prefix)

    def list_prefix(self, prefix):
        self.calls["list"] += 1
        return self._store.list_prefix(prefix)

    def list_dir(self, prefix):
        self.calls["list"] += 1
        return self._store.list_dir(prefix)


class _Counting(LocationWrapper):
    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.calls: Counter = Counter()

    def zarr_store(self, read_only: bool = True):
        return _CountingStore(super().zarr_store(read_only), self.calls)


def test_an_ingest_writer_stores_each_array_as_its_documents_and_chunks_and_asks_nothing(tmp_path):
    location = _Counting(open_location(str(tmp_path / "ds")))
    writer = ArrayWriter(location, chunk_bytes=4096)  # clears the location: the root group
    location.calls.clear()
    x = np.arange(3000, dtype=np.float32).reshape(1500, 2)  # 3 chunks of 512 rows
    writer.write_array("part_00000/nodes/x", x)
    # the two parent groups' documents, the array's, its 3 chunks: no read, no listing, no delete
    assert location.calls == Counter(set=6)
    writer.write_array("part_00000/nodes/y", np.arange(10))
    assert location.calls == Counter(set=8)  # its parents are stored already: its document and one chunk
    group = zarr.open_group(tmp_path / "ds", mode="r")
    assert np.array_equal(group["part_00000/nodes/x"][:], x) and list(group["part_00000/nodes/y"][:]) == list(range(10))
    assert set(group["part_00000"].group_keys()) == {"nodes"} and group.attrs.asdict() == {}  # the root is kept


def test_an_array_written_twice_by_one_writer_is_replaced_whole(tmp_path):
    location = _Counting(open_location(str(tmp_path / "ds")))
    writer = ArrayWriter(location, chunk_bytes=4096)
    writer.write_array("part_00000/nodes/x", np.ones((2000, 2), np.float32))  # 4 chunks
    location.calls.clear()
    writer.write_array("part_00000/nodes/x", np.zeros((600, 2), np.float32))  # 2 chunks: the old 3rd and 4th go
    assert location.calls["delete_dir"] == 1
    array = zarr.open_array(tmp_path / "ds" / "part_00000" / "nodes" / "x", mode="r")
    assert array.shape == (600, 2) and not array[:].any()
    assert sorted(p.name for p in (tmp_path / "ds" / "part_00000" / "nodes" / "x" / "c").iterdir()) == ["0", "1"]
