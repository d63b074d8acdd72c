"""A rank started by the local launcher lives no longer than the launcher (it watches its parent), and
leaves the launcher its last words (an error file) even when it ends with ``os._exit``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from typing import NoReturn

LAUNCHER_PID_ENV = "GRAPHSTORE_LAUNCHER_PID"  # set by graphstore-train for the ranks it starts
JOB_DIR_ENV = "GRAPHSTORE_JOB_DIR"  # the launcher's temporary directory (rendezvous, config, rank output)
JOB_DIR_PREFIX = "graphstore-train-"  # the launcher's job directory; only such a directory is ever removed
ERROR_FILE_ENV = "GRAPHSTORE_ERROR_FILE"  # where a rank started by the local launcher records its error
EXIT_ORPHANED = 4
_WATCHING: list[str] = []  # the launcher this process watches, once it does


def watch_launcher(rank: int, interval: float = 0.5) -> bool:
    """When this rank's launcher dies (even by ``kill -9``), end this rank within about ``interval``
    seconds and remove the launcher's temporary directory, which nobody else is left to remove.

    A thread polls the parent's PID: unlike a signal handler, it runs while the main thread is inside
    a long C call (a collective, a kernel). Returns whether there is a launcher to watch.
    """
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher:
        return False
    if _WATCHING:  # already watched (a session started by a rank that watches too)
        return True
    _WATCHING.append(launcher)
    pid, job_dir = int(launcher), os.environ.get(JOB_DIR_ENV)
    if os.getppid() != pid:  # gone before this rank started
        _orphaned(rank, pid, job_dir)

    def run() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != pid:
                _orphaned(rank, pid, job_dir)

    threading.Thread(target=run, daemon=True, name="graphstore-launcher-watch").start()
    _backstop(rank, pid, job_dir)
    return True


# The backstop: a shell that needs no GIL. While this rank's parent is the launcher it sleeps; when the rank is
# gone it ends; when the launcher is gone and the rank still runs BACKSTOP_SECONDS later (the watch thread
# above could not get the GIL: a long compile or C call, a loaded machine), it kills the rank and removes the
# launcher's directory. Its stderr is the rank's: for rank 0 a pipe to the dead launcher, so it ignores SIGPIPE
# and kills before it speaks. $1 rank PID, $2 launcher PID, $3 job directory (may be empty), $4 rank number.
BACKSTOP_SECONDS = 2
_BACKSTOP = r"""
trap '' PIPE
parent() { line=; read -r line 2>/dev/null < "/proc/$1/stat"; set -- ${line##*") "}; ppid=${2:-}; }
while parent "$1"; [ "$ppid" = "$2" ]; do sleep 0.5; done
[ -d "/proc/$1" ] || exit 0
sleep %d
[ -d "/proc/$1" ] || exit 0
kill -KILL "$1"
echo "graphstore-train rank $4: the launcher (pid $2) is gone and the rank did not stop; killed it" >&2
case "$(basename "$3")" in %s*) rm -rf "$3" ;; esac
""" % (BACKSTOP_SECONDS, JOB_DIR_PREFIX)


def _backstop(rank: int, launcher: int, job_dir: str | None) -> None:
    """Start the shell of :data:`_BACKSTOP` beside this rank (Linux: it reads ``/proc``); best effort."""
    if not os.path.isdir(f"/proc/{os.getpid()}") or shutil.which("sh") is None:
        return
    try:
        _BACKSTOPS.append(subprocess.Popen(
            ["sh", "-c", _BACKSTOP, "graphstore-backstop", str(os.getpid()), str(launcher), job_dir or "", str(rank)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True))
    except OSError:
        pass


_BACKSTOPS: list[subprocess.Popen] = []  # held: it ends after this rank does, never to be waited for here


def leave(code: int) -> NoReturn:
    """End a rank the launcher started, its work done, with ``code``: Python's exit handlers run and its
    output is flushed, then the process ends without tearing the interpreter down. At teardown a native
    thread left by torch's RPC or process group could abort a rank whose job had succeeded (``terminate
    called without an active exception``, SIGABRT: one rank in about one of eight jobs of the sampler-process
    test, never outside pytest); there is nothing left to tear down that the job needs."""
    import atexit
    import logging
    import sys

    try:
        atexit._run_exitfuncs()  # weakref finalizers too (a loader's sampler processes are stopped)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def say(line: str) -> None:
    """Write ``line`` straight to stderr (no buffers to flush) on the way to ``os._exit``. Never raises: rank 0's
    stderr is a pipe to the launcher, broken once the launcher is dead, and saying why a rank stops must not
    keep it alive (a CI run had rank 0 alive 18 s after kill -9)."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass


def _orphaned(rank: int, pid: int, job_dir: str | None) -> None:
    say(f"graphstore-train rank {rank}: the launcher (pid {pid}) is gone; stopping this rank")
    if job_dir and os.path.basename(job_dir).startswith(JOB_DIR_PREFIX):
        shutil.rmtree(job_dir, ignore_errors=True)
    os._exit(EXIT_ORPHANED)


def record_message(rank: int, message: str) -> None:
    """Record ``message`` as this rank's error (a watchdog's verdict: it names the cause) unless the rank
    already recorded one; used on the way to ``os._exit``, so it never raises."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path or os.path.exists(path):
        return
    message = message.removeprefix("graphstore-train ")
    doc = {"rank": rank, "time": time.time(), "type": "PeerFailure", "message": " ".join(message.split()),
           "input": False, "echo": False, "traceback": message + "\n", "said_by": rank}
    try:
        with open(path, "w") as fh:
            json.dump(doc, fh)
    except OSError:
        pass
