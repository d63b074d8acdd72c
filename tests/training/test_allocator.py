"""The allocator tuning: freed batch-sized blocks reused across threads, kept until released, and its stats.

Each case runs in a fresh process: the tuning is process-wide and must come before threads allocate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tuning: Linux only")

PROBE = """
import ctypes, json, os, sys, threading
from training.launcher import allocator
if sys.argv[1] == "tuned":
    allocator.keep_freed_memory()
elif sys.argv[1] == "per-thread-arenas":  # the tuning this project had before: thresholds only
    libc = ctypes.CDLL(None)
    libc.mallopt(-3, 1 << 30), libc.mallopt(-1, (1 << 31) - 1)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
SIZE = 40 << 20
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def used():
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)
    return block
def in_thread():  # like the prefetch thread: builds a batch that is freed later
    libc.free(used())
start = rss()
thread = threading.Thread(target=in_thread)
thread.start(); thread.join()
before = rss()
block = used()  # the training loop's next batch-sized block
out = {"grew": rss() - before}
libc.free(block)
out["kept"] = rss() - start
out["heap_free"] = allocator.heap_stats().free
out["released"] = allocator.release_freed()
out["after_release"] = rss() - start
out["heap_free_after"] = allocator.heap_stats().free
print(json.dumps(out))
"""


def _probe(mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("GRAPHSTORE_MALLOC", "LD_PRELOAD", "MALLOC_CONF"):  # glibc, whatever the caller runs under
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, timeout=120,
                         check=True)
    return json.loads(out.stdout)


def test_a_block_freed_by_one_thread_is_reused_by_another():
    mb = 2**20
    tuned = _probe("tuned")
    assert tuned["grew"] < 8 * mb, tuned  # the 40 MB the other thread freed were reused: no new pages
    old = _probe("per-thread-arenas")
    assert old["grew"] > 32 * mb, old  # each thread's arena kept its own: the same block twice


def test_freed_memory_is_kept_until_released():
    mb = 2**20
    got = _probe("tuned")
    assert got["kept"] > 32 * mb and got["heap_free"] > 32 * mb, got  # freed but resident, ready for reuse
    assert got["released"] and got["after_release"] < got["kept"] - 32 * mb, got
    assert got["heap_free_after"] < got["heap_free"] - 32 * mb, got


def test_stats_count_what_is_handed_out():
    from training.launcher import allocator

    stats = allocator.heap_stats()
    assert stats is not None and stats.in_use > 0
    import numpy as np

    block = np.ones(64 * 2**20 // 8)  # numpy allocates through malloc
    grown = allocator.heap_stats().in_use - stats.in_use
    del block
    assert grown >= 60 * 2**20, grown


JE_PROBE = """
import json, os, numpy as np
from training.launcher import allocator
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
out = {"name": allocator.name(), "conf": os.environ.get("MALLOC_CONF")}
block = np.ones(40 << 17)  # 40 MB, freed, then the next batch-sized block of the same size
del block
before = rss()
block = np.ones(40 << 17)
out["grew"] = rss() - before  # the freed pages were reused: no new ones
del block
stats = allocator.heap_stats()
out["heap_free"] = stats.free if stats else None
kept = rss()
out["released"] = allocator.release_freed()
out["dropped"] = kept - rss()
print(json.dumps(out))
"""


def _jemalloc() -> str:
    from training.launcher import allocator

    path = allocator.find_jemalloc({})  # where the tests look: the standard places
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs on a machine with jemalloc (tools/bootstrap.sh installs libjemalloc2): not found")
        pytest.skip("jemalloc is not installed here (apt install libjemalloc2)")
    return path


def test_ranks_run_under_jemalloc_that_keeps_and_releases_freed_pages():
    from training.launcher import allocator

    path = _jemalloc()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("GRAPHSTORE_MALLOC", "GRAPHSTORE_JEMALLOC", "LD_PRELOAD", "MALLOC_CONF"):
        env.pop(name, None)
    env = allocator.preload_env(env)
    assert env["LD_PRELOAD"] == path and env["MALLOC_CONF"] == allocator.JEMALLOC_CONF, env
    got = json.loads(subprocess.run([sys.executable, "-c", JE_PROBE], capture_output=True, text=True, env=env,
                                    timeout=120, check=True).stdout)
    mb = 2**20
    assert got["name"] == "jemalloc" and got["conf"] == allocator.JEMALLOC_CONF, got
    assert got["grew"] < 8 * mb, got  # a freed block's pages serve the next one (no page faults)
    assert got["heap_free"] > 32 * mb, got  # and are counted as kept
    assert got["released"] and got["dropped"] > 32 * mb, got  # until released


@pytest.mark.parametrize("mode", ["glibc", "default"])
def test_other_allocator_choices_preload_nothing(mode):
    from training.launcher import allocator

    env = {"GRAPHSTORE_MALLOC": mode, "LD_PRELOAD": "/lib/other.so"}
    assert allocator.preload_env(env) == env


def test_a_preload_of_the_user_is_kept_beside_jemalloc():
    from training.launcher import allocator

    path = _jemalloc()
    env = allocator.preload_env({"LD_PRELOAD": "/lib/other.so", "MALLOC_CONF": "narenas:2"})
    assert env["LD_PRELOAD"] == f"{path}:/lib/other.so" and env["MALLOC_CONF"] == "narenas:2", env
    env = allocator.preload_env({"LD_PRELOAD": path})  # the user's own preload gets our options
    assert env == {"LD_PRELOAD": path, "MALLOC_CONF": allocator.JEMALLOC_CONF}, env


def test_library_code_reads_an_unknown_choice_as_auto(monkeypatch, caplog):
    from training.launcher import allocator

    monkeypatch.setenv("GRAPHSTORE_MALLOC", "tcmalloc")
    assert allocator.tuned() == (not allocator.jemalloc_active())
    assert "GRAPHSTORE_MALLOC='tcmalloc'" in caplog.text


@pytest.mark.parametrize("env, words", [
    ({"GRAPHSTORE_MALLOC": "tcmalloc"}, ["GRAPHSTORE_MALLOC='tcmalloc'", "auto, jemalloc, glibc, default"]),
    ({"GRAPHSTORE_JEMALLOC": "/nonexistent/libjemalloc.so.2"}, ["is not a file", "unset it"]),
    ({"GRAPHSTORE_MALLOC": "jemalloc", "GRAPHSTORE_JEMALLOC": ""}, ["no libjemalloc.so.2 was found",
                                                                   "apt install libjemalloc2", "GRAPHSTORE_JEMALLOC"]),
])
def test_a_bad_allocator_choice_is_named_with_its_fix(env, words, monkeypatch):
    from training.launcher import allocator
    from graphstore.errors import InvalidInputError

    monkeypatch.setattr(allocator, "_JEMALLOC_DIRS", ())  # a machine without jemalloc
    with pytest.raises(InvalidInputError) as err:
        allocator.preload_env(env)
    assert all(w in str(err.value) for w in words), err.value


def test_a_rank_asked_for_jemalloc_without_it_stops_with_the_fix(monkeypatch):
    from training.launcher import allocator
    from graphstore.errors import InvalidInputError

    path = _jemalloc()
    if allocator.jemalloc_active():
        pytest.skip("this test process itself runs under jemalloc")
    monkeypatch.delenv("GRAPHSTORE_JEMALLOC", raising=False)
    monkeypatch.setenv("GRAPHSTORE_MALLOC", "jemalloc")
    with pytest.raises(InvalidInputError, match=f"LD_PRELOAD={path}"):
        allocator.check_rank()  # this test process runs under glibc
    monkeypatch.setenv("GRAPHSTORE_MALLOC", "auto")
    assert f"LD_PRELOAD={path}" in allocator.check_rank()


PROMPT_PROBE = """
import json
import numpy as np
from graphstore import heap
a = np.ones(64 << 17); del a  # 64 MB freed: kept
kept = heap.heap_stats().free
ok = heap.return_freed_promptly()
a = np.ones(64 << 17); del a  # freed again: handed back at once
print(json.dumps({"kept": kept, "ok": ok, "after": heap.heap_stats().free}))
"""


def test_a_rank_short_of_memory_hands_freed_memory_back_at_once():
    """Features larger than memory (training.loop.featurecache): jemalloc's decay goes to 0 in every arena."""
    from training.launcher import allocator

    _jemalloc()
    env = allocator.preload_env({k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
                                | {"PYTHONPATH": str(ROOT)})
    got = json.loads(subprocess.run([sys.executable, "-c", PROMPT_PROBE], capture_output=True, text=True, env=env,
                                    timeout=120, check=True).stdout)
    assert got["ok"] and got["kept"] > 32 * 2**20 and got["after"] < 8 * 2**20, got
