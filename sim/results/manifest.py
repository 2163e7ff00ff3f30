"""What a run's manifest records besides the scenario: package versions and the host."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import sim

PACKAGES = ("numpy", "pandas", "simpy", "torch", "scikit-learn", "pyyaml", "matplotlib")


def versions() -> dict[str, str]:
    """Versions of dropsim, Python and the packages that shape results."""
    found = {"dropsim": sim.__version__, "python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def host() -> dict[str, Any]:
    """The machine the run was made on."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or _cpu_model(),
        "cpus": os.cpu_count(),
    }


def _cpu_model() -> str:
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
