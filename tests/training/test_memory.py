"""A rank's peak resident set per epoch (reset between epochs) and the memory record every rank reports."""

from __future__ import annotations

import mmap
import sys

import pytest

from training.report.memory import PeakMeter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM: Linux only")


def _touch(size: int) -> mmap.mmap:
    block = mmap.mmap(-1, size)  # anonymous pages, outside malloc: unmapped on close whatever the allocator does
    for offset in range(0, size, 4096):
        block[offset] = 1
    return block


def test_the_peak_covers_a_spike_and_restarts_on_reset():
    meter = PeakMeter()
    meter.reset()
    base = meter.peak_bytes()
    block = _touch(256 * 2**20)
    block.close()
    spiked = meter.peak_bytes()
    assert spiked >= base + 250 * 2**20, (base, spiked)  # the spike is remembered after it is gone
    meter.reset()
    assert meter.since == "epoch"
    assert meter.peak_bytes() < spiked - 200 * 2**20  # a new epoch's peak does not inherit the old spike
