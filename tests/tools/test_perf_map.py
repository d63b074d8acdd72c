"""tools/perf_map.py names numba's cached kernels for perf, with each function the object code holds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.tools.conftest import ROOT, load_tool

KERNELS = """from numba import njit


@njit(cache=True)
def inner(n):  # recursive: LLVM keeps it a function of its own
    if n <= 1:
        return 1
    return n * inner(n - 1)


@njit(cache=True)
def outer(x):
    return inner(x) + inner(x + 1)
"""

PROFILED = f"""import json, os, sys
sys.path.insert(0, {str(ROOT / "tools")!r})
import perf_map
perf_map.install()
from probe.k import outer
outer(4)
path = perf_map.write(objects=sys.argv[1], packages=("probe",))
print(json.dumps([str(path), os.getpid()]))
"""


def test_a_cached_kernel_and_the_functions_it_calls_are_named(tmp_path):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__init__.py").write_text("")
    (tmp_path / "probe" / "k.py").write_text(KERNELS)
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", "from probe.k import outer; outer(4)"], cwd=tmp_path, check=True,
                   timeout=120, env=env)  # compiled and cached; the run below loads it from the cache
    out = subprocess.run([sys.executable, "-c", PROFILED, str(tmp_path / "objs")], cwd=tmp_path, check=True,
                         timeout=120, env=env, capture_output=True, text=True)
    path, pid = json.loads(out.stdout.strip().splitlines()[-1])
    try:
        rows = [line.split(" ", 2) for line in open(path).read().splitlines()]
    finally:
        import os

        os.unlink(path)
    assert path == f"/tmp/perf-{pid}.map"
    names = {name for _, _, name in rows}
    assert {"probe.k.outer", "probe.k.inner"} <= names, names  # the kernel, and a function it calls
    starts = sorted(int(a, 16) for a, _, _ in rows)
    assert all(int(size, 16) > 0 for _, size, _ in rows) and len(set(starts)) == len(starts)
    bases = json.loads((tmp_path / "objs" / "bases.json").read_text())
    assert len(bases) == 1 and all(base > 0 and length > 0 for base, length in bases.values())
    tool = load_tool("perf_map")
    elf = open(next(iter(bases)), "rb").read()
    assert {n for n in map(tool._readable, tool.functions(elf))} >= {"probe.k.outer", "probe.k.inner"}


def test_what_is_not_an_object_or_a_folder_it_wrote_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not an ELF64 object"):
        load_tool("perf_map").functions(b"#!/bin/sh\n")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "perf_map.py"), "lines", "perf.data", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"{tmp_path}: no bases.json; give the folder perf_map.write(objects=...) filled" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
