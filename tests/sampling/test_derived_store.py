"""The stored derived arrays stay within their budget: least recently used entries go first, never one
being written or the one just stored; a process that finds its entry gone builds it again."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from graphstore.errors import ConfigError
from sampling.graph import derived


def _store(cache: str, name: str, nbytes: int = 1 << 20) -> tuple[np.ndarray, ...]:
    source = np.zeros(nbytes // 8, np.int64)  # a new array each call: the per-process memo misses
    return derived.derived(name, (source,), lambda: (np.full(nbytes // 8, 7, np.int64), np.arange(3)), 2,
                           origin=f"test|{name}", cache_dir=cache)


def _entries(cache: str) -> set[str]:
    return {n.split("-")[0] for n in os.listdir(os.path.join(cache, "derived")) if n.endswith("-0.npy")}


def test_the_least_recently_used_entries_go_when_a_new_one_passes_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(derived, "STORE_MIN_BYTES", 0)
    cache = str(tmp_path)
    for i, name in enumerate(("a", "b", "c")):
        _store(cache, name)
        first = next(p for p in (tmp_path / "derived").iterdir() if p.name.startswith(f"{name}-") and
                     p.name.endswith("-0.npy"))
        os.utime(first, (time.time() - 1000 + i, time.time() - 1000 + i))  # used in the order a, b, c
    assert _entries(cache) == {"a", "b", "c"}
    again = _store(cache, "a")  # read back from the cache: a is now the most recently used
    assert isinstance(again[0], np.memmap) and int(again[0][0]) == 7
    monkeypatch.setenv(derived.ENV_MAX_BYTES, str(int(3.5 * (1 << 20))))
    _store(cache, "d")
    assert _entries(cache) == {"a", "c", "d"}, "b, the least recently used, went; a was read since"
    assert not any(n.startswith("b-") for n in os.listdir(tmp_path / "derived")), "every file of b"
    rebuilt = _store(cache, "b")  # gone: built and stored again, evicting the next least recently used
    assert int(rebuilt[0][-1]) == 7 and _entries(cache) == {"a", "d", "b"}


def test_an_entry_being_written_and_the_one_just_stored_stay(tmp_path):
    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "w-1234-1.npy").write_bytes(b"x" * 4096)  # its first file not there yet: a writer at work
    (folder / "old-99-0.npy").write_bytes(b"x" * 4096)
    (folder / "new-77-0.npy").write_bytes(b"x" * 4096)
    stale = folder / "old-99-1.npy.tmp-1-2"
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 2 * 86400,) * 2)
    os.utime(folder / "new-77-0.npy", (time.time() - 5000,) * 2)  # older than "old": still kept, named keep
    assert derived.trim(str(folder), keep="new-77", limit=0) == ["old-99"]
    assert sorted(os.listdir(folder)) == ["new-77-0.npy", "w-1234-1.npy"]


def test_a_budget_that_is_not_a_size_is_named(monkeypatch):
    monkeypatch.setenv(derived.ENV_MAX_BYTES, "lots")
    with pytest.raises(ConfigError, match=r"\$GRAPHSTORE_DERIVED_MAX_BYTES 'lots' is not a size"):
        derived.max_bytes()
