"""sim.protocol and sim.crypto are pure: no simpy, asyncio, socket or torch, and no clock."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PURE = ("protocol", "crypto")
ROOT = Path(__file__).resolve().parent.parent / "sim"


def test_pure_packages_import_no_io_libraries():
    code = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        import sim.protocol, sim.crypto
        for package in (sim.protocol, sim.crypto):
            for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
                importlib.import_module(info.name)
        print(",".join(m for m in ("simpy", "asyncio", "socket", "torch") if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "", f"the pure packages imported {result.stdout.strip()}"


def test_pure_packages_read_no_clock():
    clocks = {"time", "datetime", "simpy", "asyncio", "socket", "torch"}
    for package in PURE:
        for path in (ROOT / package).glob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module.split(".")[0]]
                assert not clocks & set(names), f"{path.name} imports {clocks & set(names)}"
