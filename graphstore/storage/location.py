"""The location interface: where the keys of one dataset live, and how its URL is shown without secrets."""

from __future__ import annotations

import json
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

__all__ = ["Location", "OnRetry", "redact_url"]

_USERINFO = re.compile(r"(?<=://)[^/@?#\s]*@")
_QUERY = re.compile(r"(://[^\s?]*)\?[^\s]*")
OnRetry = Callable[[BaseException], None]


def redact_url(url: str) -> str:
    """``url`` without credentials: userinfo (``user:secret@``) and query strings (signed URLs) removed.

    Examples
    --------
    >>> redact_url("https://me:hunter2@example.com/data?sig=abc")
    'https://example.com/data?<redacted>'
    """
    return _QUERY.sub(r"\1?<redacted>", _USERINFO.sub("", url))


class Location(ABC):
    """Where the keys of one dataset live (``zarr.json``, ``part_00000/.../c/0``); duck-typed by readers.

    Readers and writers choose their path by capability, never by class: ``is_local`` says whether
    chunks have files that can be memory-mapped in place (other locations are read through the local
    chunk cache); ``local_root`` is the directory whose files are the keys, where a writer can replace
    a file atomically by renaming (``None``: write through :meth:`zarr_store`). ``url`` never holds
    credentials.
    """

    url: str
    is_local: bool = False
    local_root: str | None = None

    @abstractmethod
    def read_bytes(self, key: str) -> bytes | None:
        """The stored bytes of ``key``, or ``None`` if there is no such key."""

    def read_json(self, key: str) -> Any:
        raw = self.read_bytes(key)
        return None if raw is None else json.loads(raw)

    def checksum(self, key: str) -> str | None:
        """``crc32:<hex>`` of the stored bytes of ``key``; ``None`` if absent."""
        raw = self.read_bytes(key)
        return None if raw is None else f"crc32:{zlib.crc32(raw):08x}"

    @abstractmethod
    def download(self, key: str, dest: str, on_retry: OnRetry | None = None) -> int | None:
        """Copy ``key`` into the local file ``dest``; return its size, or ``None`` if there is no such key."""

    @abstractmethod
    def exists(self) -> bool:
        """Whether anything is stored at the root."""

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether nothing is stored at the root."""

    @abstractmethod
    def has(self, key: str) -> bool:
        """Whether ``key`` is stored, or any key below it."""

    @abstractmethod
    def zarr_store(self, read_only: bool = True) -> Any:
        """A ``zarr.abc.store.Store`` over the root."""

    @abstractmethod
    def remove_key(self, key: str) -> None:
        """Delete one key (absent is fine)."""

    @abstractmethod
    def remove(self) -> None:
        """Delete everything under the root (absent is fine)."""

    def local_file(self, key: str) -> str | None:
        """The local file holding ``key`` (memory-mappable), or ``None``."""
        return None

    def keys(self) -> list[str] | None:
        """Every key stored under the root (``/``-separated), or ``None`` where this location cannot list."""
        return None

    def check_container(self) -> None:
        """Raise if the root cannot be written at all (e.g. its bucket does not exist)."""

    def storage_error(self, exc: BaseException, action: str) -> BaseException:
        """``exc`` (raised while ``action``) as the graphstore error users should see."""
        return exc
