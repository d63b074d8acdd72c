"""Where ingest may write: a dataset, an empty or missing directory, or nothing at all (refused)."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from graphstore.dataset import layout
from graphstore.errors import DatasetExistsError, StorageNotFoundError, StoragePermissionError
from graphstore.storage.local import Location, is_dataset

logger = logging.getLogger(__name__)
_PATH_SCHEMES = ("npz", "planetoid", "ogb", "parquet")


@dataclass(frozen=True)
class DestState:
    """What ``inspect_dest`` found: whether a dataset is to be replaced, and the fingerprint of what is there."""

    replacing: bool
    fingerprint: str  # "" nothing there; else the checksum of its root metadata (see fingerprint())


def check_dest(location: Location, overwrite: bool, data: Any = None, parents: bool = False) -> bool:
    """Refuse a DEST holding anything but a graphstore dataset; return whether there is one to replace."""
    return inspect_dest(location, overwrite, data, parents).replacing


def inspect_dest(location: Location, overwrite: bool, data: Any = None, parents: bool = False) -> DestState:
    """Refuse a DEST holding anything but a graphstore dataset; say whether there is one to replace.

    A file at DEST (above all the SOURCE itself), a DEST inside the SOURCE or holding it, a DEST whose
    parent cannot be written, and a local DEST whose parent directory is missing (unless ``parents``)
    are refused before anything is read or written.
    """
    if location.local_root is not None:
        _check_local(location.local_root, data, parents)
    location.check_container()
    seen = fingerprint(location)
    return DestState(_replacing(location, overwrite), seen)


def fingerprint(location: Location) -> str:
    """``""`` when nothing is at DEST, else the checksum of its root metadata: it changes when a dataset
    appears, is replaced or is removed, so the commit can tell that DEST is still what was checked."""
    if not location.exists() or location.is_empty():
        return ""
    return location.checksum(layout.ROOT_METADATA) or "no root metadata"


def check_unchanged(location: Location, seen: str) -> None:
    """Raise if DEST is no longer what ``inspect_dest`` saw (another writer, not taking the claim, wrote it)."""
    now = fingerprint(location)
    if now != seen:
        before, after = ("a dataset" if fp else "nothing" for fp in (seen, now))
        raise DatasetExistsError(
            f"DEST {location.url} changed while this ingest ran (it held {before}, now "
            f"{'a different dataset' if seen and now else after}, written by something that does not take the "
            "ingest claim); it was left as it is and nothing was committed: check it, then rerun (with "
            "--overwrite to replace it)"
        )


def _replacing(location: Location, overwrite: bool) -> bool:
    if not location.exists() or location.is_empty():
        return False
    if not is_dataset(location):
        raise DatasetExistsError(
            f"{location.url} exists and is not a graphstore dataset; refusing to write there (even with "
            "--overwrite, so nothing of yours is deleted): choose a new or empty directory"
        )
    doc = location.read_json(layout.ROOT_METADATA)
    if isinstance(doc, dict) and layout.MANIFEST_ATTR not in doc.get("attributes", {}):
        _refuse_foreign(location)
        logger.info("%s holds an interrupted ingest (no manifest); replacing it", location.url)
        return True
    if not overwrite:
        raise DatasetExistsError(f"{location.url} already holds a dataset; pass --overwrite (overwrite=True) to replace it")
    _refuse_foreign(location)
    return True


# the keys graphstore writes in a dataset: the root metadata, and a partition's Zarr metadata and chunks
_OURS = re.compile(r"zarr\.json|part_\d{5}(/[^/]+)*/(zarr\.json|c(/\d+)+)")


def foreign_keys(location: Location) -> list[str]:
    """The keys in a dataset that graphstore did not write (a user's plot, notes, a copied file)."""
    return [key for key in location.keys() or [] if not _OURS.fullmatch(key)]


def _refuse_foreign(location: Location) -> None:
    """Replacing a dataset deletes its folder: refuse while it holds a file graphstore did not write."""
    foreign = foreign_keys(location)
    if foreign:
        more = f" and {len(foreign) - 1} other file(s)" if len(foreign) > 1 else ""
        raise DatasetExistsError(
            f"{location.url} holds {foreign[0]!r}{more} that graphstore did not write; replacing the dataset "
            "would delete it, so nothing was changed: move it out of the dataset folder, then rerun"
        )


def source_path(data: Any) -> str | None:
    """The local file or directory a SOURCE string reads (``npz:PATH`` ...), or ``None``."""
    if not isinstance(data, (str, os.PathLike)):
        return None
    scheme, sep, rest = os.fspath(data).partition(":")
    if not sep or scheme not in _PATH_SCHEMES or not rest or "://" in rest:  # a URL is no local path
        return None
    return os.path.realpath(os.path.expanduser(rest))


def _check_local(root: str, data: Any, parents: bool) -> None:
    if os.path.lexists(root) and not os.path.isdir(root):
        raise DatasetExistsError(
            f"DEST {root} is a file, not a directory; refusing to write there (nothing of yours is moved or "
            "replaced): give a new or empty directory as DEST"
        )
    src = source_path(data)
    if src is not None:
        real = os.path.realpath(root)
        if real == src or _inside(real, src) or _inside(src, real):
            raise DatasetExistsError(
                f"DEST {root} overlaps the SOURCE {src} (the same path, or one inside the other); the dataset "
                "must go elsewhere: give a DEST outside the source"
            )
    _check_writable(root, parents)


def _inside(path: str, parent: str) -> bool:
    return path.startswith(parent.rstrip(os.sep) + os.sep)


def _check_writable(root: str, parents: bool) -> None:
    """Ingest writes beside DEST (a hidden sibling, renamed into place): its parent must be writable, and
    exist unless ``parents`` (a mistyped mount path must not land on the root disk)."""
    parent = os.path.dirname(root.rstrip(os.sep)) or os.sep
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise DatasetExistsError(f"DEST {root}: {existing} is a file, so no directory can be made there; "
                                 "choose another DEST")
    if existing != parent and not parents:
        raise StorageNotFoundError(f"DEST {root}: its parent directory {parent} does not exist (a mistyped path "
                                   "or a disk not mounted?); create it first, or pass --parents (parents=True) "
                                   "to have ingest create it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StoragePermissionError(
            f"DEST {root}: cannot write in {existing} (permission denied; ingest writes beside DEST and renames "
            "into place); choose a DEST in a directory you can write, or fix its permissions"
        )
