"""A process that has imported what graphstore-train's ranks import, and forks one launcher per request.

The tests run dozens of graphstore-train and graphstore-run jobs. Started as ``python -m training.launch``
(or ``training.run``), each job's rank
server imports torch and PyG again (several seconds of CPU each). A launcher forked from this process has
them imported already, so it forks its rank server from itself
(:func:`training.launcher.forkserver.forks_here`); everything after that is the job as a user runs it.

This process is started under the environment the launcher gives its ranks (the allocator, the libraries'
settings), with a command line as long as a rank's and a long environment, so that the ranks forked from
it can show their own in ``/proc`` (:func:`training.launcher.forkserver._retitle`).

Protocol: one JSON line per job on stdin (``argv``, ``env``, ``cwd``, ``stdout``, ``stderr``: file paths);
on its standard output, ``{"ready": true}`` once, then per job ``{"pid": N}`` and ``{"code": N}``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

MODULES = ("training.launch", "training.run")  # the launchers it runs: graphstore-train, graphstore-run


def _launcher(request: dict, inherited: tuple[int, ...]) -> None:
    """In the forked child: ``python -m training.launch ARGV`` (or ``training.run``) with the request's
    environment, directory and output files; exits as the interpreter would."""
    from training.launcher import forkserver

    forkserver.run_to_exit(lambda: _launch(request, inherited))


def _launch(request: dict, inherited: tuple[int, ...]) -> int:
    from training.launcher import forkserver

    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    for fd in (null, *inherited):
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    import tempfile

    tempfile.tempdir = None  # read TMPDIR again
    sys.modules["numpy"].random.seed()  # as a fresh interpreter: from the OS
    argv = request["argv"]
    if argv[:1] != ["-m"] or argv[1:2] not in ([name] for name in MODULES):
        raise SystemExit(f"the zygote runs python -m {' or '.join(MODULES)} only, not {argv!r}")
    sys.path[0] = os.getcwd()  # as python -m has it
    return forkserver._run(argv)


def main() -> None:
    replies_fd = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # nothing this process imports may write into the replies
    os.close(null)
    replies = os.fdopen(replies_fd, "w", buffering=1)
    from training.launch import RANK_IMPORTS
    from training.launcher import forkserver

    for name in (*RANK_IMPORTS, *MODULES, "training"):  # what graphstore-train's and graphstore-run's ranks import
        importlib.import_module(name)
    forkserver._start_jit()
    replies.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _launcher(request, (replies_fd,))  # never returns
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
