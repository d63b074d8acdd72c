"""Every error graphstore raises, each subclassing the nearest builtin exception."""

from __future__ import annotations


class GraphstoreError(Exception):
    """Base class of all graphstore errors."""


class InvalidInputError(GraphstoreError, ValueError):
    """The graph handed to ingest is malformed (bad IDs, shapes, values)."""


class SourceNotFoundError(GraphstoreError, FileNotFoundError):
    """An ingest source, or a file it needs, does not exist or cannot be read."""


class UnknownSourceError(GraphstoreError, ValueError):
    """The SOURCE string names a scheme graphstore does not know."""


class DatasetExistsError(GraphstoreError, FileExistsError):
    """The ingest destination already holds data and ``overwrite`` was not given."""


class DatasetNotFoundError(GraphstoreError, FileNotFoundError):
    """No complete graphstore dataset at the given location."""


class FormatVersionError(GraphstoreError, ValueError):
    """The dataset was written in a format version this graphstore cannot read."""


class CorruptDatasetError(GraphstoreError, OSError):
    """A chunk or array of the dataset is missing, truncated or fails its checksum."""


class PartitionIndexError(GraphstoreError, IndexError):
    """A partition index outside ``[0, num_parts)``."""


class NotOwnedError(GraphstoreError, KeyError):
    """Node IDs asked of a partition that neither owns nor replicates them."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownAttributeError(GraphstoreError, KeyError):
    """A node/edge type or attribute name the dataset does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnsupportedLocationError(GraphstoreError, ValueError):
    """A URL scheme or option graphstore cannot use."""


class MissingBackendError(GraphstoreError, ImportError):
    """The optional package that serves a URL scheme (s3fs, gcsfs, adlfs) is not installed."""


class StorageError(GraphstoreError, OSError):
    """A storage operation failed (after retrying transient errors)."""


class StorageNotFoundError(GraphstoreError, FileNotFoundError):
    """The bucket or container of a remote URL does not exist (or is invisible to these credentials)."""


class StoragePermissionError(GraphstoreError, PermissionError):
    """Access to a remote URL was refused: wrong or missing credentials, or a policy denies it."""


class ConfigError(GraphstoreError, ValueError):
    """An option (cache, retry, storage) has a value graphstore cannot use."""


class RowIndexError(GraphstoreError, IndexError):
    """A row index outside an array's bounds."""


class UnreachableHostError(GraphstoreError, ConnectionError):
    """Another host of a job (its master, a peer) cannot be reached from this one."""


class IngestStageError(GraphstoreError, RuntimeError):
    """An ingest stage failed on an engine's worker (named with the worker and the stage)."""


class IngestClaimedError(GraphstoreError, FileExistsError):
    """Another ingest holds the claim on the destination, or took this ingest's claim while it ran."""
