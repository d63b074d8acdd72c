"""A failed job in one line: each rank records its error, the launcher names the first cause and the log."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import traceback

from graphstore.errors import GraphstoreError
from training.launcher.lifetime import ERROR_FILE_ENV  # where a rank started by the local launcher records its error

LOG_DIR_ENV = "GRAPHSTORE_LOG_DIR"  # where the launcher keeps a failed job's log (default: the temp dir)


def is_echo(exc: BaseException) -> bool:
    """Whether ``exc`` only reports another rank's failure (an RPC error, a dead peer, a broken collective)."""
    from sampling.distributed.transport import PeerError
    from training.cluster.process_groups import PeerFailure

    return isinstance(exc, (PeerError, PeerFailure, ConnectionError)) or "RPC" in str(exc)


def record(rank: int, exc: BaseException) -> bool:
    """Write ``exc`` and its traceback to this rank's error file; ``False`` when there is none to write to."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return False
    doc = {"rank": rank, "time": time.time(), "type": type(exc).__name__, "message": " ".join(str(exc).split()),
           "input": isinstance(exc, GraphstoreError) and not is_echo(exc), "echo": is_echo(exc),
           "traceback": "".join(traceback.format_exception(exc)), "said_by": rank}
    origin = _handler_failure(exc)
    if origin is not None:  # a peer's handler named the cause (damaged data, bad input): credit the peer
        peer, failed = origin
        doc.update(message=" ".join(failed.message.split()), input=True, echo=False, said_by=peer,
                   traceback=doc["traceback"] + f"--- raised in rank {peer}'s handler\n{failed.traceback}")
    with open(path, "w") as fh:
        json.dump(doc, fh)
    return True


def kind(job_dir: str, rank: int) -> str:
    """How a rank that exited with an error left it: ``cause`` (it recorded an error of its own),
    ``echo`` (it recorded another rank's failure as it saw it) or ``silent`` (no record: a signal)."""
    path = os.path.join(job_dir, f"rank{rank}.error.json")
    try:
        with open(path) as fh:
            return "echo" if json.load(fh).get("echo") else "cause"
    except (OSError, ValueError):
        return "silent"


def _handler_failure(exc: BaseException) -> tuple[int, object] | None:
    """``(peer, HandlerFailed)`` when ``exc`` (or its cause) is a peer handler's own named error."""
    from sampling.distributed.transport import RemoteHandlerError

    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, RemoteHandlerError) and exc.failed.named:
            return exc.peer, exc.failed
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def summarize(job_dir: str, codes: dict[int, int], stopped: set[int]) -> tuple[str, int]:
    """The one line naming the first cause of a failed job, and the job's exit code.

    The cause is the earliest error that is not an echo of another rank's failure; else a rank that
    died without a word (a signal), with what its peers saw; else the earliest echo. Every rank's
    traceback and stderr go to one log file, named in the line.
    """
    records = []
    for rank in sorted(codes):
        path = os.path.join(job_dir, f"rank{rank}.error.json")
        if os.path.exists(path):
            with open(path) as fh:
                records.append(json.load(fh))
    log = _keep_log(job_dir, codes, records, stopped)
    causes = sorted((r for r in records if not r["echo"]), key=lambda r: r["time"])
    silent = sorted((r for r, c in codes.items() if c != 0 and r not in stopped
                     and not any(x["rank"] == r for x in records)), key=lambda r: (codes[r] >= 0, r))  # signals first
    echoes = sorted((r for r in records if r["echo"]), key=lambda r: r["time"])
    if causes:
        first = causes[0]
        line, code = f"rank {first.get('said_by', first['rank'])}: {first['message']}", 2 if first["input"] else 1
    elif silent:
        line = f"rank {silent[0]} exited with {describe_code(codes[silent[0]])}"
        seen = [(r, _last_line(job_dir, r)) for r in silent[1:]]
        seen = [(r, text) for r, text in seen if text]
        if echoes:
            line += f"; rank {echoes[0]['rank']}: {echoes[0]['message']}"
        elif seen:
            line += f"; rank {seen[0][0]} said: {seen[0][1]}"
        code = 1
    elif echoes:
        line, code = f"rank {echoes[0]['rank']}: {echoes[0]['message']}", 1
    else:
        failed = [f"{r} ({describe_code(c)})" for r, c in sorted(codes.items()) if c != 0]
        line, code = f"failed ranks: {', '.join(failed)}", 1
    return f"graphstore-train: error: {_short(line)} (tracebacks and rank output: {log})", code


def _keep_log(job_dir: str, codes: dict[int, int], records: list[dict], stopped: set[int]) -> str:
    """Where the job's log was kept: ``$GRAPHSTORE_LOG_DIR``, else (unset, or it cannot be written) the
    job's temp dir, saying so; a log that cannot be written anywhere is said too, never raised over the
    rank's error."""
    fallback = os.path.dirname(job_dir)
    chosen = os.environ.get(LOG_DIR_ENV) or fallback
    try:
        return _write_log(chosen, job_dir, codes, records, stopped)
    except OSError as exc:
        why = f"{LOG_DIR_ENV}={chosen} cannot be written ({exc.strerror or exc})"
    if chosen != fallback:
        try:
            return f"{_write_log(fallback, job_dir, codes, records, stopped)}; {why}, so it went to the temp dir"
        except OSError:
            pass
    return f"none kept: {why}"


def _last_line(job_dir: str, rank: int) -> str:
    """The last non-empty line a rank wrote to stderr (e.g. a watchdog's verdict), or ``""``."""
    path = os.path.join(job_dir, f"rank{rank}.stderr")
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as fh:
        lines = [line.strip() for line in fh.read().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _short(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _write_log(directory: str, job_dir: str, codes: dict[int, int], records: list[dict], stopped: set[int]) -> str:
    """Concatenate every rank's error and stderr into one file in ``directory``, outside the job directory
    (which goes); a partial file is removed when the write fails."""
    path = os.path.join(directory, f"graphstore-train-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    try:
        _write_ranks(path, job_dir, codes, records, stopped)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    return path


def _write_ranks(path: str, job_dir: str, codes: dict[int, int], records: list[dict], stopped: set[int]) -> None:
    with open(path, "w") as out:
        for rank in sorted(codes):
            how = " (stopped by the launcher after another rank failed)" if rank in stopped else ""
            out.write(f"=== rank {rank}: {describe_code(codes[rank])}{how}\n")
            for r in records:
                if r["rank"] == rank:
                    out.write(r["traceback"])
            stderr = os.path.join(job_dir, f"rank{rank}.stderr")
            if os.path.exists(stderr):
                with open(stderr, errors="replace") as fh:
                    out.write(f"--- rank {rank} stderr\n{fh.read()}")


class StderrRelay:
    """Rank 0's stderr: kept in the job's log and shown on the launcher's terminal about a second late,
    so progress and warnings still reach the user, but what a rank prints as a job fails (RPC echoes of
    another rank's error) stays in the log instead of burying the one line that names the cause."""

    def __init__(self, log_path: str, delay: float = 1.0, start: bool = True) -> None:
        import threading

        self.read_fd, self.write_fd = os.pipe()
        self.delay, self.failed = delay, threading.Event()
        self._log = open(log_path, "wb")
        self._thread = threading.Thread(target=self._run, daemon=True, name="graphstore-stderr-relay")
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start relaying (``start=False`` defers it: the launcher may fork its rank server first, which it
        does only while no other thread runs)."""
        if self._thread.ident is None and self.write_fd >= 0:
            self._thread.start()

    def _run(self) -> None:
        import select
        import sys

        pending: list[tuple[float, bytes]] = []
        done = False
        while not done or pending:
            if not done and select.select([self.read_fd], [], [], 0.1)[0]:
                chunk = os.read(self.read_fd, 65536)
                done = not chunk
                if chunk:
                    self._log.write(chunk)
                    pending.append((time.monotonic(), chunk))
            elif done:
                time.sleep(0.05)
            while pending and (done or time.monotonic() - pending[0][0] >= self.delay):
                _, chunk = pending.pop(0)
                if not self.failed.is_set():
                    sys.stderr.buffer.write(chunk)
                    sys.stderr.flush()
        self._log.close()
        os.close(self.read_fd)

    def close(self) -> None:
        """After the rank has exited: forward (or, once failed, drop) what is left, and stop. Idempotent."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1
            if self._thread.ident is not None:
                self._thread.join(timeout=5)
            else:  # never started: nothing was relayed
                self._log.close()
                os.close(self.read_fd)
