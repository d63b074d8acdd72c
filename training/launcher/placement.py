"""Where ranks run: ``--device auto|cpu|cuda`` against the host's GPUs, and how many local ranks to start."""

from __future__ import annotations

import glob
import os

from graphstore.errors import InvalidInputError

DEVICES = ("auto", "cpu", "cuda")


_GPU_DRIVER_FILES = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")  # NVIDIA's driver, ROCm's


def gpu_count() -> int:
    """CUDA devices this process can use (0 without CUDA). On a host without a GPU driver that is 0 without
    importing torch, which the launcher would otherwise load (seconds) only to ask."""
    if not any(os.path.exists(p) for p in _GPU_DRIVER_FILES) and not glob.glob("/dev/nvidia[0-9]*"):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def use_cuda(device: str, gpus: int) -> bool:
    """Whether ranks train on CUDA: ``auto`` when the host has a GPU; ``cuda`` refused without one."""
    if device not in DEVICES:
        raise InvalidInputError(f"--device {device!r} is not one of {DEVICES}")
    if device == "cuda" and gpus == 0:
        raise InvalidInputError("--device cuda: this host has no CUDA device (torch.cuda.is_available() is "
                                "False, or a CPU build of torch); use --device cpu, or auto to take a GPU when "
                                "there is one")
    return device == "cuda" or (device == "auto" and gpus > 0)


def local_ranks(nproc: int | None, num_parts: int, cuda: bool, gpus: int) -> int:
    """The ranks to start on this host: ``--nproc``, else one per GPU on CUDA, else one per partition.

    Any rank count trains over any partition count (ranks own several partitions or share one), but
    nccl needs a GPU of its own per rank: more ranks than GPUs is refused, naming what to change.
    """
    if nproc is None:
        return max(1, gpus) if cuda else num_parts
    if cuda and nproc > gpus:
        raise InvalidInputError(f"--nproc {nproc}: this host has {gpus} GPU(s) and each rank needs one of its own "
                                f"(nccl); give --nproc {gpus} or fewer (a rank then owns several of the dataset's "
                                f"{num_parts} partitions), or --device cpu")
    return nproc


def check_local_rank(local_rank: int, cuda: bool, gpus: int) -> None:
    """Under torchrun/srun: a rank whose local rank has no GPU of its own stops at once, saying why."""
    if cuda and local_rank >= gpus:
        raise InvalidInputError(f"local rank {local_rank} has no GPU: this host has {gpus} (cuda:0..{gpus - 1}); "
                                f"start at most {gpus} rank(s) per host (torchrun --nproc-per-node {gpus}, srun "
                                "--ntasks-per-node), or pass --device cpu")
