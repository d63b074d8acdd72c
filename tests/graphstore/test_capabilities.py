"""Locations are asked what they can do, never what class they are: a new location type needs no edit elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

import graphstore
from graphstore.outputs import writer as outputs
from graphstore.errors import DatasetExistsError
from graphstore.ingest.dest import check_dest
from graphstore.outputs.writer import OutputWriter
from graphstore.storage.local import LocalLocation, LocationWrapper
from tests.conftest import small_graph


class DirLocation(LocationWrapper):
    """A location type the library has never seen: keys are files under a directory it names."""

    def __init__(self, root: str) -> None:
        super().__init__(LocalLocation(root))
        self.local_root = self.inner.root


@pytest.fixture
def dest(tmp_path):
    graphstore.ingest(small_graph(n=200, e=800)[0], tmp_path / "ds", num_parts=2, chunk_mb=0.01)
    return tmp_path / "ds"


def _commit_through(location, ds, monkeypatch) -> list[str]:
    """Commit a one-column output through ``location``; return the roots the rename path was given."""
    renamed: list[str] = []
    real = outputs._replace_root_metadata

    def spy(loc, root, manifest_json):
        renamed.append(root)
        real(loc, root, manifest_json)

    monkeypatch.setattr(outputs, "_replace_root_metadata", spy)
    writer = OutputWriter(location, "score")
    infos = {p: writer.write_part(p, np.full(ds.node_offsets()[p + 1] - ds.node_offsets()[p], p, np.float32))
             for p in range(ds.num_parts)}
    writer.commit(infos)
    return renamed


def test_a_new_location_with_a_local_root_commits_by_rename(dest, monkeypatch):
    ds = graphstore.open_dataset(dest)
    assert not isinstance(DirLocation(str(dest)), LocalLocation)
    assert _commit_through(DirLocation(str(dest)), ds, monkeypatch) == [str(dest)]
    scores = graphstore.open_dataset(dest).partition(1)[0][None, "score", None]
    assert scores.shape == (ds.node_offsets()[2] - ds.node_offsets()[1],) and bool((scores == 1).all())


def test_a_location_without_a_local_root_commits_through_zarr(dest, monkeypatch):
    ds = graphstore.open_dataset(dest)
    assert LocationWrapper(LocalLocation(str(dest))).local_root is None
    assert _commit_through(LocationWrapper(LocalLocation(str(dest))), ds, monkeypatch) == []
    scores = graphstore.open_dataset(dest).partition(0)[0][None, "score", None]
    assert scores.shape == (ds.node_offsets()[1],) and bool((scores == 0).all())


def test_ingest_destination_checks_follow_local_root(tmp_path):
    file = tmp_path / "a_file"
    file.write_text("mine")
    with pytest.raises(DatasetExistsError, match="is a file, not a directory"):
        check_dest(DirLocation(str(file)), overwrite=True)
    assert check_dest(LocationWrapper(LocalLocation(str(file))), overwrite=True) is False  # no local checks
    assert file.read_text() == "mine"


def test_ingest_into_a_new_location_with_a_local_root_is_staged(tmp_path, monkeypatch):
    from graphstore.ingest import pipeline

    staged: list[str] = []
    real = pipeline._ingest_staged

    def spy(source, location, options):
        staged.append(location.root)
        return real(source, location, options)

    monkeypatch.setattr(pipeline, "_ingest_staged", spy)
    graphstore.ingest(small_graph(n=100, e=300)[0], DirLocation(str(tmp_path / "ds")), num_parts=2)
    graphstore.ingest(small_graph(n=100, e=300)[0], LocationWrapper(LocalLocation(str(tmp_path / "in_place"))),
                      num_parts=2)
    assert staged == [str(tmp_path / "ds")]  # the wrapper without local_root was written in place
    for name in ("ds", "in_place"):
        assert graphstore.open_dataset(tmp_path / name).num_nodes() == 100
