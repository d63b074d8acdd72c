"""SIGTERM and Ctrl-C while METIS runs: one line, exit 75 / 130, no native crash, nothing left behind.

METIS installs its own SIGTERM handler while it runs (GKlib); a signal that reaches it crashes the process.
The fault is injected at a known point: ``graphstore ingest`` runs as a child whose ``pymetis.part_graph``
announces itself, then keeps METIS busy for a few seconds; the signal goes in while it is there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import graphstore

# the ingest, with pymetis.part_graph announcing itself and then repeating the real call for up to 8 s
_INGEST = textwrap.dedent("""
    import sys, time, pymetis
    real = pymetis.part_graph
    def busy(*args, **kwargs):
        print("in METIS", file=sys.stderr, flush=True)
        end = time.monotonic() + 8
        while True:
            result = real(*args, **kwargs)
            if time.monotonic() > end:
                return result
    pymetis.part_graph = busy
    from graphstore.cli.app import main
    sys.exit(main(sys.argv[1:]))
""")
SPEC = "synthetic:nodes=20000,avg_degree=10,seed=1"


@pytest.mark.parametrize("sig,code,words", [(signal.SIGTERM, 75, "graphstore ingest: terminated (SIGTERM)"),
                                            (signal.SIGINT, 130, "graphstore ingest: interrupted")],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_metis_runs_ends_in_one_line_and_leaves_nothing(tmp_path, sig, code, words):
    dest = tmp_path / "ds"
    # SIGINT at its default, as a terminal starts a command: where this suite runs as a background job, SIGINT
    # is ignored and the child would inherit that (Python then installs no KeyboardInterrupt handler)
    proc = subprocess.Popen([sys.executable, "-c", _INGEST, "ingest", SPEC, str(dest), "--parts", "4"],
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stderr.readline()  # blocks until METIS announces itself (or the ingest ends)
        assert "in METIS" in line, line + proc.stderr.read()
        proc.send_signal(sig)
        err = proc.stderr.read().strip()
        assert proc.wait(timeout=30) == code, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert err.splitlines() == [err] and words in err and "nothing was committed" in err, err
    assert os.listdir(tmp_path) == [], "the claim, the staging directory or DEST was left behind"
    graphstore.ingest(SPEC, dest, num_parts=2, method="random")  # nothing blocks a rerun
