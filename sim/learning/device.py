"""The device that trains a run's model (``training.device``), made deterministic, and how much memory it has.

``auto`` is the first CUDA device when torch sees one, else the CPU; ``cuda`` is the current CUDA device,
``cuda:N`` the N-th. The device changes how fast the simulator runs, never a virtual time: local training
is charged from the cost profile whatever trains it.

Reproducibility: the same seed on the same kind of device (and the same torch and CUDA versions) gives
byte-identical tables. On a CUDA device this needs deterministic kernels, set here before the first one
runs: ``torch.use_deterministic_algorithms(True)`` (which needs ``CUBLAS_WORKSPACE_CONFIG``, set to
``:4096:8`` unless the user set it), ``cudnn.deterministic`` and no ``cudnn.benchmark`` (which would pick
kernels by timing them). TF32 is left at torch's defaults (allowed in cuDNN convolutions, not in matrix
products): deterministic either way. Between the CPU and a GPU the bits differ; the GPU tests
(``pytest -m gpu``) hold the accuracy of a short run on both within 0.02 (docs/performance.md, section 8:
not yet measured on a GPU).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sim.errors import InputError


def cuda_problem(device: str) -> str | None:
    """Why ``device`` (a ``training.device`` value) cannot be used on this machine, or None."""
    if not device.startswith("cuda"):
        return None
    if not torch.cuda.is_available():
        built = torch.version.cuda
        why = "this torch is a CPU-only build" if built is None else f"torch (CUDA {built}) sees no GPU"
        return f"is {device!r}, but {why}; use auto or cpu"
    if ":" in device:
        index = int(device.split(":", 1)[1])
        count = torch.cuda.device_count()
        if index >= count:
            return f"is {device!r}, but this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})"
    return None


def resolve(device: str, where: str = "training.device") -> torch.device:
    """The torch device of a ``training.device`` value; raises :class:`InputError` naming ``where`` if it is
    not there. A CUDA device is made deterministic (module docstring)."""
    problem = cuda_problem(device)
    if problem is not None:
        raise InputError(f"{where} {problem}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    chosen = torch.device(device)
    if chosen.type == "cuda":
        deterministic()
    return chosen


def deterministic() -> None:
    """Deterministic CUDA kernels (module docstring); call before the first CUDA kernel runs."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def free_bytes(device: torch.device) -> int:
    """Memory free for training on ``device``: the GPU's free memory, or the host's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with Path("/proc/meminfo").open(encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def describe(device: torch.device) -> dict[str, object]:
    """What the manifest records of the training device: its kind and name, torch's and CUDA's versions."""
    record: dict[str, object] = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        record["name"] = torch.cuda.get_device_name(device)
        record["deterministic"] = torch.are_deterministic_algorithms_enabled()
        record["tf32_convolutions"] = torch.backends.cudnn.allow_tf32
        record["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return record
