"""dropsim: a discrete-event simulator of federated-learning rounds under client dropout.

The import package is ``sim``; the distribution and command are ``dropsim``. Layers, bottom up:
``sim.protocol`` (sans-IO aggregation machines and their wire messages), ``sim.learning`` (data, models,
local training), ``sim.costs`` (virtual-time cost model; ``sim.profiling`` measures it), ``sim.engine``
(the SimPy world that drives the machines in virtual time), ``sim.scenario`` (scenario files),
``sim.results`` (tidy tables), and the ``sim.cli`` front end.
"""

__version__ = "0.1.0"
