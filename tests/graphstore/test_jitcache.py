"""Cached numba kernels are dropped when any source of the two packages changes (numba only checks the
file a kernel is defined in, so a kernel calling another file's kernel would run that file's old code)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from graphstore.jitcache import MARKER, drop_stale

REPO = Path(__file__).resolve().parents[2]


def _tree(base: Path) -> None:
    for name in ("graphstore", "sampling"):
        (base / name / "__pycache__").mkdir(parents=True)
        (base / name / "__init__.py").write_text("")


def test_cached_kernels_go_when_a_source_changes_and_stay_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    _tree(tmp_path)
    cached = [tmp_path / "sampling" / "__pycache__" / f"picks.f-1.py311.{ext}" for ext in ("nbi", "1.nbc")]
    for path in cached:
        path.write_bytes(b"x")
    assert drop_stale(tmp_path) == 2, "no marker yet: nothing cached can be trusted"
    assert not any(p.exists() for p in cached) and (tmp_path / "graphstore" / "__pycache__" / MARKER).is_file()
    for path in cached:
        path.write_bytes(b"x")
    assert drop_stale(tmp_path) == 0 and all(p.exists() for p in cached), "unchanged sources keep the cache"
    (tmp_path / "sampling" / "draws.py").write_text("X = 1\n")
    assert drop_stale(tmp_path) == 2 and not any(p.exists() for p in cached)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "elsewhere"))
    (tmp_path / "sampling" / "draws.py").write_text("X = 2\n")
    assert drop_stale(tmp_path) == 0, "a cache folder of the user's is theirs"


@pytest.mark.slow
def test_a_kernel_sees_the_new_code_of_a_kernel_it_calls_in_another_file(tmp_path):
    """End to end with numba: ``a.f`` calls ``b.g``; after ``b.py`` changes, ``f`` returns the new value."""
    _tree(tmp_path)
    (tmp_path / "sampling" / "a.py").write_text(textwrap.dedent("""
        from numba import njit
        from sampling.b import g

        @njit(cache=True)
        def f():
            return g()
    """))
    run = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(tmp_path)!r})
        from graphstore.jitcache import drop_stale
        drop_stale(Path({str(tmp_path)!r}))
        import sampling.a
        print(sampling.a.f())
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO)
    # no bytecode files: Python trusts a .pyc whose source has the same size and mtime in whole seconds, and
    # both versions of b.py are the same size, so a first run shorter than a second loaded the old g
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    results = []
    for value in (1, 2):
        (tmp_path / "sampling" / "b.py").write_text(f"from numba import njit\n\n\n@njit(cache=True)\ndef g():\n"
                                                    f"    return {value}\n")
        out = subprocess.run([sys.executable, "-c", run], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        results.append(int(out.stdout.split()[-1]))
    assert results == [1, 2], "the caller's cached code was used after its callee changed"
    assert list((tmp_path / "sampling" / "__pycache__").glob("a.f-*.nbi")), "the kernels are cached again"


NOTICE_RUN = textwrap.dedent("""
    import numpy as np
    from graphstore import jitcache
    from graphstore.storage import integrity
    jitcache.announce_compiles("graphstore", "seconds")
    integrity._range_kernel(np.arange(5), 10)
    integrity._csc_kernel(np.array([0, 1, 2]), np.array([0, 1]), 2)
    print(jitcache.compile_counts().compiled)
""")


def test_a_cold_cache_is_announced_once_and_a_warm_one_not_at_all(tmp_path):
    """Two small kernels of one module, compiled into an empty cache: one line; loaded from it: none."""
    from graphstore.jitcache import NOTICE_ENV

    env = {k: v for k, v in os.environ.items() if k not in (NOTICE_ENV, "LOCAL_RANK", "SLURM_LOCALID")}
    env.update(NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    runs = [subprocess.run([sys.executable, "-c", NOTICE_RUN], env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    notices = [line for line in runs[0].stderr.splitlines() if "compiling the graphstore kernels" in line]
    assert len(notices) == 1 and "graphstore warmup" in notices[0], runs[0].stderr
    assert runs[0].stdout.split()[-1] == "2", "two specialisations compiled"
    assert runs[1].stdout.split()[-1] == "0" and "compiling" not in runs[1].stderr, runs[1].stderr


def test_only_the_first_rank_of_a_host_warns(monkeypatch, caplog):
    import logging

    from graphstore import jitcache

    monkeypatch.setenv(jitcache.NOTICE_ENV, "1")  # restored afterwards: the notice sets it to 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    with caplog.at_level(logging.INFO, logger="graphstore.jitcache"):
        jitcache._notice("sampling", "about a minute")
        jitcache._notice("sampling", "about a minute")
    assert [r.levelno for r in caplog.records] == [logging.INFO], "rank 1: in its log, not on the terminal; once"


def test_the_sampling_kernels_announce_their_compiles():
    from graphstore import jitcache
    import sampling.kernels.hop_kernel  # noqa: F401

    assert "sampling" in jitcache._watch().announce


RACE_RUN = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from graphstore import jitcache
    from sampling.graph.derived import time_records
    open(f"{sys.argv[1]}.ready-{os.getpid()}", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[1]):  # the test's go: both processes call the kernel together
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.001)
    indptr, when = np.array([0, 2, 3]), np.array([5, 1, 4]) + 10**12
    src, eid = np.arange(3), np.arange(3)
    keys, pairs, order = np.empty(3, np.int32), np.empty(6, np.int32), np.empty(3, np.int32)
    time_records(indptr, when, src, eid, keys, pairs, order)
    print(jitcache.compile_counts().compiled, keys.tolist())
""")


@pytest.mark.slow
def test_processes_that_need_one_specialisation_at_once_compile_it_once(tmp_path):
    """Two processes on one empty cache call the same kernel at the same moment (a kernel of a second or
    more to compile, as ranks on a cold cache do): one compiles, the other waits for its claim and loads
    what it saved. Without the claims both compile."""
    from graphstore import jitcache
    from tests.conftest import started_together

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           jitcache.NOTICE_ENV: "0"}
    procs, outs = started_together([[sys.executable, "-c", RACE_RUN, str(tmp_path / "go")]] * 2, tmp_path / "go", 2,
                                   env=env, timeout=180)
    assert all(p.returncode == 0 for p in procs), outs
    counts = sorted(int(out.split()[0]) for out, _ in outs)
    assert counts == [0, 1], f"compiled per process: {counts} (one compiles, the other loads)"
    assert len({out.split(None, 1)[1] for out, _ in outs}) == 1, "the same result either way"
    assert list((tmp_path / "cache").rglob(f"*{jitcache.CLAIM_SUFFIX}")), "the claim is a file beside the cache"


def test_a_failed_compile_lets_the_waiting_processes_go_on():
    """A compile that raises releases its claim (numba's compile events), so another process waits for it
    no longer than the failure."""
    from numba.core import event

    from graphstore import jitcache

    cache = object()
    fd = os.open(os.devnull, os.O_RDONLY)
    jitcache._CLAIMS[(id(cache), ("int64",))] = fd
    dispatcher = type("D", (), {"_cache": cache, "py_func": _kernel_like})()
    failed = event.Event("numba:compile", event.EventStatus.END, {"dispatcher": dispatcher, "args": ("int64",)},
                         (ValueError, ValueError("typing failed"), None))
    watch = jitcache._Watch()  # not the process's own: its counts stay as they are
    watch._depth = 1
    watch.on_end(failed)
    assert (id(cache), ("int64",)) not in jitcache._CLAIMS
    with pytest.raises(OSError):
        os.fstat(fd)  # closed: its flock is gone
    fd = os.open(os.devnull, os.O_RDONLY)
    jitcache._CLAIMS[(id(cache), ("int64",))] = fd
    watch._depth = 1
    watch.on_end(event.Event("numba:compile", event.EventStatus.END, {"dispatcher": dispatcher, "args": ("int64",)}))
    assert jitcache._CLAIMS.pop((id(cache), ("int64",))) == fd, "compiled: the claim is held until it is saved"
    os.close(fd)


def _kernel_like():
    pass


_kernel_like.__module__ = "sampling.kernels.probe"
