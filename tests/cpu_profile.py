"""An opt-in pytest plugin: each test's CPU seconds and wall seconds, one tab-separated line per test appended
to ``$CPU_PROFILE_OUT``: node ID, wall, own CPU, CPU of the child processes it waited for (ranks included), and
the CPU of every process the test process started, waited for or not (ranks forked by a fork server, daemons).

    CPU_PROFILE_OUT=/tmp/cpu.tsv bash tools/test.sh -p tests.cpu_profile

The last column comes from a cgroup v1 ``cpuacct`` group of its own that each test process joins (as root,
where the hierarchy is mounted at /sys/fs/cgroup/cpuacct); it is empty elsewhere. At the end the processes
still in the group go back to the root group and the group is removed. On a machine whose cores are all
busy, CPU seconds say what a test costs the suite better than its wall time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

_CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_group: Path | None = None


def pytest_configure(config):
    global _group
    if os.environ.get("CPU_PROFILE_OUT") and _group is None:
        _group = _join()


def pytest_unconfigure(config):
    global _group
    if _group is not None:
        _leave(_group)
        _group = None


def _join() -> Path | None:
    """This process in a cpuacct group of its own (its later children start there), or None where it cannot."""
    if os.geteuid() != 0 or not (_CPUACCT / "cgroup.procs").exists():
        return None
    group = _CPUACCT / f"graphstore-cpuprof-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return None
    return group


def _leave(group: Path) -> None:
    """Every process still in ``group`` back to the root group, then the group removed."""
    for _ in range(3):
        try:
            pids = (group / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            try:
                (_CPUACCT / "cgroup.procs").write_text(pid)
            except OSError:  # gone meanwhile
                pass
        try:
            group.rmdir()
            return
        except OSError:  # a process started meanwhile: move it too
            time.sleep(0.1)


def _usage() -> float | None:
    if _group is None:
        return None
    try:
        return int((_group / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = os.environ.get("CPU_PROFILE_OUT")
    before, start, group_before = os.times(), time.monotonic(), _usage()
    yield
    if not out:
        return
    after, group_after = os.times(), _usage()
    own = (after.user - before.user) + (after.system - before.system)
    children = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    group = f"{group_after - group_before:.2f}" if group_before is not None and group_after is not None else ""
    with open(out, "a") as fh:
        fh.write(f"{item.nodeid}\t{time.monotonic() - start:.2f}\t{own:.2f}\t{children:.2f}\t{group}\n")
