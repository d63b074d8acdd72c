"""Who this process is in the job: rank, world size, local rank, rendezvous and device (a value object)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphstore.errors import InvalidInputError

if TYPE_CHECKING:  # the launcher reads a world without torch
    import torch


TIMEOUT_ENV = "GRAPHSTORE_TIMEOUT"  # set by graphstore-run --timeout: a training.Session's default timeout
DEVICE_ENV = "GRAPHSTORE_DEVICE"  # set by graphstore-run --device: a training.Session's default device
SERVERS_ENV = "GRAPHSTORE_SERVERS"  # set by graphstore-run --servers: a training.Session's default servers
LOADER_WORKERS_ENV = "GRAPHSTORE_LOADER_WORKERS"  # set by graphstore-run --loader-workers: its default workers
FEATURE_CACHE_ENV = "GRAPHSTORE_FEATURE_CACHE"  # set by graphstore-run --feature-cache: its default feature_cache


@dataclass(frozen=True)
class World:
    """Rank facts, from torchrun's or SLURM's environment, the local launcher, or explicit arguments.

    ``init_method`` is a ``file://`` or ``tcp://`` rendezvous for ``torch.distributed``.

    Examples
    --------
    >>> World(rank=0, world_size=1, local_rank=0, init_method="file:///tmp/rdzv").backend
    'gloo'
    """

    rank: int
    world_size: int
    local_rank: int
    init_method: str
    master_addr: str = "127.0.0.1"
    use_cuda: bool = False
    local_world_size: int = 1  # ranks of this job on this host (they share its cores)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise InvalidInputError(f"rank {self.rank} is outside world size {self.world_size}")

    @property
    def backend(self) -> str:
        """gloo on CPU; with CUDA, nccl for GPU tensors and gloo for the CPU bookkeeping tensors."""
        return "cpu:gloo,cuda:nccl" if self.use_cuda else "gloo"

    @property
    def device(self) -> torch.device:
        """``cuda:<local_rank>`` with CUDA (one GPU per local rank), else the CPU."""
        import torch

        return torch.device(f"cuda:{self.local_rank}") if self.use_cuda else torch.device("cpu")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, use_cuda: bool | None = None) -> World | None:
        """The world described by torchrun (``RANK``...), SLURM (``SLURM_PROCID``...) or our launcher;
        ``None`` when the environment describes no job (then launch locally)."""
        env = dict(os.environ if env is None else env)
        if use_cuda is None:
            import torch

            use_cuda = torch.cuda.is_available()
        cuda = use_cuda
        if "GRAPHSTORE_INIT_METHOD" in env:  # our local launcher
            missing = [k for k in ("GRAPHSTORE_RANK", "GRAPHSTORE_WORLD_SIZE") if k not in env]
            if missing:
                raise InvalidInputError(f"GRAPHSTORE_INIT_METHOD is set but {' and '.join(missing)} "
                                        f"{'is' if len(missing) == 1 else 'are'} not; graphstore-train sets these "
                                        "for the ranks it starts: unset GRAPHSTORE_INIT_METHOD")
            size = _env_int(env, "GRAPHSTORE_WORLD_SIZE", 1)
            rank = _env_int(env, "GRAPHSTORE_RANK", 0)
            return cls(rank, size, rank, env["GRAPHSTORE_INIT_METHOD"], use_cuda=cuda, local_world_size=size)
        if "RANK" in env and "WORLD_SIZE" in env:  # torchrun / torch.distributed.launch
            addr, port = env.get("MASTER_ADDR", "127.0.0.1"), env.get("MASTER_PORT")
            if port is None:
                raise InvalidInputError("RANK/WORLD_SIZE are set but MASTER_PORT is not; launch with torchrun")
            _env_int(env, "MASTER_PORT", 1, 65535)
            # env:// lets torchrun's agent keep hosting the store on MASTER_PORT (tcp:// would start a second one)
            return cls(_env_int(env, "RANK", 0), _env_int(env, "WORLD_SIZE", 1),
                       _env_int(env, "LOCAL_RANK", 0, default=0), "env://", addr, use_cuda=cuda,
                       local_world_size=_env_int(env, "LOCAL_WORLD_SIZE", 1, default=1))
        if "SLURM_PROCID" in env and _env_int(env, "SLURM_NTASKS", 1, default=1) > 1:
            return cls._from_slurm(env, cuda)
        return None

    @classmethod
    def _from_slurm(cls, env: dict[str, str], cuda: bool) -> World:
        addr = env.get("MASTER_ADDR") or _first_slurm_host(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", ""))
        port = (_env_int(env, "MASTER_PORT", 1, 65535) if env.get("MASTER_PORT")
                else 20000 + _env_int(env, "SLURM_JOB_ID", 0, default=0) % 20000)
        return cls(_env_int(env, "SLURM_PROCID", 0), _env_int(env, "SLURM_NTASKS", 1),
                   _env_int(env, "SLURM_LOCALID", 0, default=0), f"tcp://{addr}:{port}", addr, use_cuda=cuda,
                   local_world_size=_slurm_tasks_here(env))


def _env_int(env: dict[str, str], name: str, low: int, high: int | None = None, default: int | None = None) -> int:
    """The integer environment variable ``name`` (``default`` when unset), refused in one line when it is
    not an integer in ``[low, high]``."""
    raw = env.get(name)
    if raw is None and default is not None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidInputError(f"environment variable {name}={raw!r} is not an integer {bound}; fix or unset it "
                                "(the launcher, torchrun or SLURM sets it for each rank)")
    return value


def _slurm_tasks_here(env: dict[str, str]) -> int:
    """Tasks of the job on this node: ``SLURM_NTASKS_PER_NODE``, else the first count of
    ``SLURM_TASKS_PER_NODE`` (``2(x4),1`` → 2), else 1."""
    for key in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        match = re.match(r"(\d+)", env.get(key, ""))
        if match and int(match.group(1)) > 0:
            return int(match.group(1))
    return 1


def _first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``node[01-04],gpu7`` → ``node01``)."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    match = re.match(r"([^\[,]+)(?:\[(\d+)[^\]]*\])?", nodelist)
    if not match:
        raise InvalidInputError(f"cannot tell the first host of SLURM node list {nodelist!r}; set MASTER_ADDR")
    return match.group(1) + (match.group(2) or "")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it: no guessed ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
