"""dropsim: a discrete-event simulator of federated-learning rounds under client dropout.

The import package is ``sim``; the distribution and command are ``dropsim``. Every child of ``sim`` is in a
layer of ``.importlinter`` (docs/architecture.md, "Layers"), bottom up among others: ``sim.crypto`` and
``sim.dp`` (primitives, noise, accounting), ``sim.protocol`` (sans-IO aggregation machines, their wire
messages and registry), ``sim.scenario`` (scenario files), ``sim.round`` (the round every driver plays:
plans, records, step decisions, stage gates, pipelining's rules, the privacy ledger) beside
``sim.clients``, ``sim.learning`` and ``sim.costs``, the drivers ``sim.engine`` (SimPy, virtual time),
``sim.deploy`` (sockets, wall-clock time) and ``sim.loopback`` (in memory, no clock), ``sim.runner`` (a
scenario round by round through a driver), the API and the ``sim.cli`` front end.

The Python API (:mod:`sim.api`, docs/api.md) is re-exported here: ``sim.load_scenario``, ``sim.run``,
``sim.sweep``, ``sim.privacy_table``, ``sim.RunResult``, ``sim.SweepResult`` (imported on first use, so
that ``import sim`` stays light).
"""

import importlib
from typing import Any

__version__ = "0.1.0"

_API = ("load_scenario", "run", "sweep", "privacy_table", "RunResult", "SweepResult")
__all__ = ["RunResult", "SweepResult", "__version__", "load_scenario", "privacy_table", "run", "sweep"]


def __getattr__(name: str) -> Any:
    """The API's names, from :mod:`sim.api` on first use."""
    if name in _API:
        # imported by name, on use: ``import sim`` (which every module's ``sim.__version__`` does) must not
        # load the API, which sits above the runner
        return getattr(importlib.import_module("sim.api"), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
