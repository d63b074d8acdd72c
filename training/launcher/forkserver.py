"""Ranks forked from one process that has already imported torch and PyG.

A rank's first seconds go to imports (torch, PyG and the trainer take several seconds of CPU each time);
N ranks on one host paid them N times, side by side on the same cores. The launcher starts one *fork
server* with the ranks' common environment; it imports those modules once, then forks each rank on
request (where those modules use numba, it also starts numba's code generator, which each rank's first
kernel would otherwise start again). A rank is forked twice (the middle process exits at once) so that
it is reparented to the launcher, which has made itself the subreaper of its descendants: the launcher
waits for its ranks and reads their exit codes as it does for processes it started itself.

A launcher that has imported those modules itself (``training.launch.main`` called from a Python process that
has, such as a driver of many jobs or this project's tests) forks the server from itself instead of starting it,
where ``GRAPHSTORE_FORK_FROM_LAUNCHER=1`` asks for it and it is safe (:func:`forks_here`): no other Python
thread, and started under the allocator and the library settings the ranks get, which an import reads once.
The ranks then start as copies of that process: its ``atexit`` handlers run in each of them as it exits (its
``weakref`` finalizers, such as the job folder's, do not).

The server refuses (the launcher then starts each rank as a fresh interpreter, as before) when its
imports fail, when they started CUDA (a forked child cannot use a CUDA context of its parent) or when
the launcher cannot become a subreaper. ``GRAPHSTORE_FORK_RANKS=0`` always starts fresh interpreters.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from graphstore.forking import FROM_LAUNCHER_ENV, fork_allowed, fork_from_launcher

_PR_SET_CHILD_SUBREAPER = 36
_SERVER_ENV = "GRAPHSTORE_FORK_SERVER"  # the server's parameters: [request fd, reply fd, preload, rank fds]
_MODULE = "training.launcher.forkserver"
JIT_MODULE = "graphstore_fork_server_jit"  # the module of the function _start_jit compiles


def _cmdline(argv: list[str]) -> bytes:
    """``argv`` as /proc/PID/cmdline holds it."""
    return b"".join(os.fsencode(a) + b"\0" for a in argv)


def _server_argv(length: int) -> list[str]:
    """The server's command line, padded with a last argument to ``length`` bytes where it is shorter."""
    argv = [sys.executable, "-m", _MODULE]
    pad = length - len(_cmdline(argv)) - 1
    return [*argv, "-" * pad] if pad >= 1 else argv


def _environ(env: dict[str, str]) -> bytes:
    return b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items())


# what the allocator, the libraries and the interpreter read from the environment as a process starts or as
# they are imported, and never again: a server forked from a process that imported the ranks' modules copies
# what these said when it started, so they must say the same for the ranks
_READ_AT_START = ("LD_PRELOAD", "MALLOC_CONF")
_READ_AT_START_PREFIXES = ("PYTHON", "NUMBA_", "TORCH_", "KMP_", "MKL_", "OPENBLAS_", "GOTO_")


def _started_under() -> dict[str, str] | None:
    """This process's environment as it started (``/proc/self/environ``), or None where it cannot be read."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def forks_here(preload: tuple[str, ...] | list[str], env: dict[str, str]) -> str | None:
    """Why this process cannot be the ranks' server, forked (None: it can). It can when its environment asks for
    it (``GRAPHSTORE_FORK_FROM_LAUNCHER=1``, :func:`graphstore.forking.fork_from_launcher`), it has imported every
    module of ``preload`` already, runs no other Python thread (a fork copies the calling thread only, and
    never a lock another one holds), has not started CUDA, and started under the values ``env`` (the ranks'
    environment) gives what is read once at start: the allocator (``LD_PRELOAD``, ``MALLOC_CONF``), and the
    ``PYTHON*``, ``NUMBA_*``, ``TORCH_*`` and BLAS settings. ``OMP_NUM_THREADS`` may differ: a rank sets its
    thread pools itself (:mod:`training.cluster.threads`)."""
    if not fork_from_launcher():
        return f"{FROM_LAUNCHER_ENV} is not 1"
    missing = [name for name in preload if name not in sys.modules] or ([] if preload else ["the ranks' modules"])
    if missing:
        return f"it has not imported {', '.join(missing)}"
    if threading.active_count() > 1:
        return f"it runs {threading.active_count() - 1} other thread(s)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "it started CUDA"
    started = _started_under()
    if started is None:
        return "its environment at start cannot be read"
    for key in sorted({*started, *env}):
        if key in _READ_AT_START or key.startswith(_READ_AT_START_PREFIXES):
            if started.get(key) != env.get(key):
                return f"it started with {key}={started.get(key)!r}, the ranks get {env.get(key)!r}"
    return None


def set_subreaper(on: bool) -> bool:
    """Make this process the subreaper of its descendants (``prctl``), or stop being one; whether it worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class ForkedRank:
    """A rank forked by the server and adopted by this process: the parts of ``subprocess.Popen`` the
    launcher uses (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not adopted (cannot happen once the server has reaped the middle process)
                if not os.path.exists(f"/proc/{self.pid}"):
                    self.returncode = 1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launcher's side: start the server for ranks running ``python COMMAND`` (``env``: what every rank
    shares; ``fds``: the ranks' stderr descriptors, kept open in the server) and ask it for ranks; ``start``
    answers None once it refused."""

    def __init__(self, command: list[str], env: dict[str, str], preload: tuple[str, ...], fds: list[int]) -> None:
        self.refusal: str | None = None
        self.proc: subprocess.Popen | ForkedRank | None = None
        self.forked = False  # whether the server is this process, forked (its imports done) rather than started
        if not set_subreaper(True):
            self.refusal = "this process cannot adopt the ranks (prctl PR_SET_CHILD_SUBREAPER failed)"
            return
        req_r, self._req = os.pipe()
        self._rep, rep_w = os.pipe()
        argv = _server_argv(len(_cmdline([sys.executable, *command])))
        why_not = forks_here(preload, env)
        self.forked = why_not is None
        import logging

        if why_not is not None and fork_from_launcher():  # asked for, and not done: -v says why
            logging.getLogger("graphstore").info("%s=1, but the rank server is started: %s", FROM_LAUNCHER_ENV,
                                                 why_not)
        try:
            if self.forked:
                self.proc = _fork_server(argv, env, (req_r, rep_w, list(preload), list(fds)))
                logging.getLogger("graphstore").info("the rank server is this process, forked: it has imported %s",
                                                     ", ".join(preload))
            else:
                # its parameters in its environment and its command line as long as a rank's, so that a rank can
                # show its own command line and environment in /proc (ps, psutil) over the server's
                server_env = {**env, _SERVER_ENV: json.dumps([req_r, rep_w, list(preload), list(fds)])}
                self.proc = subprocess.Popen(argv, env=server_env, pass_fds=(req_r, rep_w, *fds),
                                             start_new_session=True)
        except OSError as exc:
            self.refusal = f"the fork server did not start ({exc})"
            os.close(self._req)
            os.close(self._rep)
            return
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._replies = os.fdopen(self._rep, "r")
        self._ready = False

    def start(self, argv: list[str], env: dict[str, str], stderr_fd: int) -> ForkedRank | None:
        """Fork a rank running ``python ARGV`` with ``env`` and ``stderr_fd`` as its stderr, or None."""
        if self.refusal is not None or self.proc is None:
            return None
        if not self._ready:
            reply = self._read()
            if reply.get("ready") is not True:
                return self._refuse(reply.get("refused", "it ended before it was ready"))
            self._ready = True
        try:
            os.write(self._req, (json.dumps({"argv": argv, "env": env, "stderr": stderr_fd}) + "\n").encode())
        except OSError as exc:
            return self._refuse(f"it stopped taking requests ({exc})")
        reply = self._read()
        if "pid" not in reply:
            return self._refuse(reply.get("refused", "it ended without forking the rank"))
        return ForkedRank(int(reply["pid"]))

    def _read(self) -> dict[str, Any]:
        line = self._replies.readline()  # the server answers or ends (EOF); a rank would wait as long on imports
        try:
            return json.loads(line) if line else {}
        except ValueError:
            return {}

    def _refuse(self, why: str) -> None:
        self.refusal = why
        import logging

        logging.getLogger("graphstore").info("ranks start as fresh interpreters: the fork server refused (%s)", why)
        self.close()
        return None

    def close(self, kill: bool = False) -> None:
        """No more ranks: the server exits (the ranks it forked are this process's children by now); ``kill``:
        at once (Ctrl-C while it imports)."""
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        try:
            os.close(self._req)  # EOF: the server's loop ends
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._replies.close()
        self.proc = None


def _fork_server(argv: list[str], env: dict[str, str], params: tuple[int, int, list[str], list[int]]) -> ForkedRank:
    """The server forked from this process (see :func:`forks_here`): what the started one would be (own
    session, ``env``, its command line where it fits, only its descriptors) with the imports done already."""
    req_r, rep_w, preload, fds = params
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedRank(pid)
    code = 1
    try:
        os.setsid()
        keep = {0, 1, 2, req_r, rep_w, *fds}
        for name in os.listdir("/proc/self/fd"):  # the launcher's other descriptors (pipes, logs) stay its own
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        _drop_exit_finalizers()
        os.environ.clear()
        os.environ.update(env)
        _retitle(_cmdline(argv), _environ(env))
        code = _serve(req_r, rep_w, preload, fds)
    finally:
        os._exit(code)


def _drop_exit_finalizers() -> None:
    """In a server forked from the launcher: the launcher's ``weakref`` finalizers (its job folder's removal,
    its files' closing) are its own, and must not run when a rank forked from here exits."""
    import weakref

    registry = getattr(weakref.finalize, "_registry", {})
    for finalizer in list(registry):
        finalizer.atexit = False


def reap_orphans(known: dict[int, Any]) -> None:
    """Reap descendants that were orphaned to this subreaper (a rank's helpers outliving it), leaving the
    processes in ``known`` (pid -> object with ``poll``) to their owners' ``poll``."""
    for _ in range(64):
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        owner = known.get(info.si_pid)
        if owner is not None:
            owner.poll()
            if owner.returncode is None:  # another owner (a Popen's own wait) will reap it
                return
        else:
            try:
                os.waitpid(info.si_pid, 0)
            except ChildProcessError:
                return


def prefork_samplers(count: int) -> None:
    """A rank's ``count`` sampler processes (``--loader-workers``) forked now, before it starts a thread, so
    that they need not import torch and PyG again (:func:`sampling.loader.sampler_processes.prefork`);
    ``GRAPHSTORE_FORK_RANKS=0`` spawns them as fresh interpreters, as it starts the ranks."""
    if count and fork_allowed():
        from sampling.loader.sampler_processes import prefork

        prefork(count)


# ---- the server process ------------------------------------------------------------------------------------


def _serve(req_fd: int, rep_fd: int, preload: list[str], fds: list[int]) -> int:
    """Import ``preload``, say ready (or why not), then fork a rank per request line until the launcher closes."""
    reply = os.fdopen(rep_fd, "w", buffering=1)
    try:
        for name in preload:
            importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - any failure: the ranks start fresh and meet it themselves
        reply.write(json.dumps({"refused": f"importing {name} failed: {type(exc).__name__}: {exc}"}) + "\n")
        return 0
    cuda = "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized()
    if cuda or _maps_cuda_driver():
        reply.write(json.dumps({"refused": "its imports started CUDA, which a forked rank could not use"}) + "\n")
        return 0
    _start_jit()
    reply.write(json.dumps({"ready": True}) + "\n")
    with os.fdopen(req_fd, "r") as requests:
        for line in requests:
            request = json.loads(line)
            reply.write(json.dumps({"pid": _fork(request, (req_fd, rep_fd, *fds))}) + "\n")
    return 0


def _start_jit() -> None:
    """Start numba's code generator here, once, where the preloaded modules use numba: a rank's first kernel
    (even one loaded from the cache) otherwise starts it, every rank again. The function compiled is a
    module's of its own (``JIT_MODULE``, kept in ``sys.modules``): not a project kernel, so no rank counts it
    among its compiles."""
    numba = sys.modules.get("numba")
    if numba is None or JIT_MODULE in sys.modules:  # none, or started already (a server forked from a warm one)
        return
    import types

    module = types.ModuleType(JIT_MODULE)
    exec("def started(n):\n    return n + 1\n", module.__dict__)  # noqa: S102 - a constant source
    try:
        module.started = numba.njit(module.started)
        module.started(1)
    except Exception:  # noqa: BLE001 - a rank would meet the same failure at its first kernel, and name it
        return
    sys.modules[JIT_MODULE] = module


def _maps_cuda_driver() -> bool:
    try:
        with open("/proc/self/maps") as fh:
            return any("libcuda.so" in line for line in fh)
    except OSError:
        return False


def _fork(request: dict[str, Any], inherited: tuple[int, ...]) -> int:
    """Fork twice; the grandchild becomes the rank, the middle process sends its PID and exits."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        code = 0
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _become_rank(request, inherited, os.getppid())  # never returns
            os.write(w, str(pid).encode())
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        got = fh.read()
    os.waitpid(middle, 0)  # the rank is the launcher's child from here on
    return int(got)


def _become_rank(request: dict[str, Any], inherited: tuple[int, ...], middle: int) -> None:
    """In the grandchild: what a fresh ``python ARGV`` would be (own session, stderr, environment, argv, a
    fresh NumPy seed), once the launcher has adopted it; exits like the interpreter would."""
    run_to_exit(lambda: _rank(request, inherited, middle))


def _rank(request: dict[str, Any], inherited: tuple[int, ...], middle: int) -> int:
    os.setsid()
    os.dup2(request["stderr"], 2)
    for fd in set(inherited):
        try:
            os.close(fd)
        except OSError:
            pass
    os.environ.clear()
    os.environ.update(request["env"])
    _retitle(_cmdline([sys.executable, *request["argv"]]), _environ(request["env"]))
    import tempfile

    tempfile.tempdir = None  # read TMPDIR again
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # a fresh interpreter seeds from the OS; a fork would copy the server's
    deadline = time.monotonic() + 10.0
    while os.getppid() == middle and time.monotonic() < deadline:  # the launcher adopts it as the middle exits
        time.sleep(0.001)
    return _run(request["argv"])


def run_to_exit(body: Any) -> None:
    """Run ``body()`` (returning an exit code) as the interpreter runs a program, and end this process with its
    code: a ``SystemExit`` as the interpreter reads it, any other exception's traceback on stderr and 1, the
    ``atexit`` handlers (``weakref`` finalizers too) run and the streams flushed; never returns."""
    code = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _retitle(cmdline: bytes, environ: bytes) -> None:
    """Show ``cmdline`` and ``environ`` in /proc/self (what ps and psutil read) over the server's, where they
    fit in the memory the kernel shows (the server's own strings, copied by Python and glibc long ago)."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2:].split()  # fields[0] is field 3 (state) of proc(5)
        arg_start, arg_end, env_start, env_end = (int(fields[n - 3]) for n in (48, 49, 50, 51))
    except (OSError, ValueError, IndexError):
        return
    for start, end, data in ((arg_start, arg_end, cmdline), (env_start, env_end, environ)):
        if 0 < len(data) <= end - start:
            ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def _run(argv: list[str]) -> int:
    import runpy

    if argv[:1] != ["-m"] or len(argv) < 2:
        raise SystemExit(f"the fork server runs modules only (python -m NAME ...), not {argv!r}")
    import warnings

    spec = importlib.util.find_spec(argv[1])
    sys.argv = [spec.origin if spec and spec.origin else argv[1], *argv[2:]]
    # the module is imported already (preloaded); as under python -m, __main__ is a second copy of it
    warnings.filterwarnings("ignore", message=".* found in sys.modules after import of package", category=RuntimeWarning)
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    return 0


def exit_code(code: Any) -> int:
    """The exit status a ``SystemExit(code)`` gives the interpreter (a message: printed, and 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _req, _rep, _preload, _fds = json.loads(os.environ.pop(_SERVER_ENV))
    _code = _serve(_req, _rep, _preload, _fds)
    os._exit(_code)  # no interpreter teardown (seconds with torch loaded): the launcher waits for this exit
