"""sampling.graph.topology.in_huge_pages: the topology of an in-memory graph is copied into memory advised
for huge pages; the copy must be the same array, writable, and small arrays are left alone."""

from __future__ import annotations

import numpy as np

from sampling.graph.topology import in_huge_pages


def test_a_large_array_is_copied_whole_and_stays_writable():
    a = np.arange(3 << 20, dtype=np.int32).reshape(-1, 2)  # 12 MiB
    b = in_huge_pages(a)
    assert b is not a and b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)
    b[0, 0] = -1  # the kernels get writable arrays
    assert a[0, 0] == 0


def test_a_small_array_is_left_as_it_is():
    a = np.arange(1000, dtype=np.int64)
    assert in_huge_pages(a) is a
