"""Helpers for training on the multi-host rig: torchrun per host, srun-like ranks, outcomes judged from outside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import Cluster, Host
from tests.training.conftest import ROOT

MASTER_PORT = 29500  # each host is a fresh namespace: nothing else listens there
BIN = Path(sys.executable).parent  # the venv's console scripts


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user who set no *_IFNAME variable (and no CI rank variables)."""
    drop = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "RANK", "WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "GRAPHSTORE_"))}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def torchrun(cluster: Cluster, host: Host, nnodes: int, master: str, dataset, *args, env=None,
             port: int = MASTER_PORT, agent: tuple[str, ...] = ()) -> Run:
    """``torchrun --nnodes N --nproc-per-node 1 --node-rank I --master-addr M ... -m training.launch DATASET``
    on ``host``, exactly as docs/training.md writes it (torchrun is ``python -m torch.distributed.run``);
    ``agent``: more torchrun options (docs/training.md: ``--rdzv-conf timeout=60``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", "1",
           "--node-rank", str(host.index), "--master-addr", master, "--master-port", str(port), *agent,
           "-m", "training.launch", str(dataset), "--no-progress", *map(str, args)]
    return Run(cluster.popen(host, cmd, env=env or clean_env(), cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True))


def srun_rank(cluster: Cluster, host: Host, rank: int, world: int, master: str, port: int, dataset, *args,
              env=None) -> Run:
    """One rank as SLURM's ``srun`` starts it (SLURM_PROCID/SLURM_NTASKS, MASTER_ADDR/PORT), on ``host``."""
    slurm = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world), "SLURM_LOCALID": "0",
             "MASTER_ADDR": master, "MASTER_PORT": str(port)}
    cmd = [sys.executable, "-m", "training.launch", str(dataset), "--no-progress", *map(str, args)]
    return Run(cluster.popen(host, cmd, env={**clean_env(), **slurm, **(env or {})}, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


def run_cli(cluster: Cluster, host: Host, command: str, *args, env=None) -> Run:
    """``graphstore COMMAND ARGS`` (``command`` "serve") or ``graphstore-train ARGS`` (``command`` "train") on
    ``host``, as a user types them there."""
    exe = ([str(BIN / "graphstore"), command] if command != "train" else [str(BIN / "graphstore-train")])
    return Run(cluster.popen(host, [*exe, *map(str, args)], env=env or clean_env(), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


class Run:
    """A process on a rig host whose stdout/stderr are collected by threads (so a test can wait for a line)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.out, self.err = proc, [], []
        self._threads = [threading.Thread(target=self._read, args=(s, buf), daemon=True)
                         for s, buf in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream, buf: list[str]) -> None:
        for line in stream:
            buf.append(line)

    def wait_for(self, text: str, seconds: float) -> bool:
        """Whether ``text`` appears in stdout within ``seconds`` (False at once if the process ended)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(text in line for line in list(self.out)):
                return True
            if self.proc.poll() is not None:
                return any(text in line for line in list(self.out))
            time.sleep(0.2)
        return False

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)


@dataclass
class Outcome:
    code: int | None  # None: still running at the deadline (then killed)
    seconds: float  # from the start of the wait to its exit
    stdout: str
    stderr: str


def wait_all(runs: list[Run], seconds: float) -> list[Outcome]:
    """Wait for every process up to ``seconds`` from now; those still running then are killed (code None)."""
    start = time.monotonic()
    ended: dict[int, float] = {}
    while len(ended) < len(runs) and time.monotonic() - start < seconds:
        for i, run in enumerate(runs):
            if i not in ended and run.proc.poll() is not None:
                ended[i] = time.monotonic() - start
        time.sleep(0.2)
    out = []
    for i, run in enumerate(runs):
        if i not in ended:
            os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait(timeout=30)
        for t in run._threads:
            t.join(timeout=10)
        out.append(Outcome(run.proc.returncode if i in ended else None, ended.get(i, seconds), run.stdout, run.stderr))
    return out
