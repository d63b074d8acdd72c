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
from graphstore import allocator
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
    env.pop("GRAPHSTORE_MALLOC", None)
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
    from graphstore import allocator

    stats = allocator.heap_stats()
    assert stats is not None and stats.in_use > 0
    import numpy as np

    block = np.ones(64 * 2**20 // 8)  # numpy allocates through malloc
    grown = allocator.heap_stats().in_use - stats.in_use
    del block
    assert grown >= 60 * 2**20, grown
