"""An opt-in pytest plugin: each test's CPU seconds (its own and those of the child processes it waited for,
ranks included) and wall seconds, one tab-separated line per test appended to ``$CPU_PROFILE_OUT``.

    CPU_PROFILE_OUT=/tmp/cpu.tsv bash tools/test.sh -p tests.cpu_profile

On a machine whose cores are all busy, CPU seconds say what a test costs the suite better than its wall time.
"""

from __future__ import annotations

import os
import time

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = os.environ.get("CPU_PROFILE_OUT")
    before, start = os.times(), time.monotonic()
    yield
    if not out:
        return
    after = os.times()
    own = (after.user - before.user) + (after.system - before.system)
    children = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    with open(out, "a") as fh:
        fh.write(f"{item.nodeid}\t{time.monotonic() - start:.2f}\t{own:.2f}\t{children:.2f}\n")
