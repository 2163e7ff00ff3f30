"""dropsim: a discrete-event simulator of federated-learning rounds under client dropout.

The import package is ``sim``; the distribution and command are ``dropsim``. Layers, bottom up
(docs/architecture.md): ``sim.crypto`` and ``sim.dp`` (primitives, noise, accounting), ``sim.protocol``
(sans-IO aggregation machines, their wire messages and registry), ``sim.round`` (the round both drivers
play: plans, records, step decisions, stage gates, the privacy ledger), the drivers ``sim.engine``
(SimPy, virtual time) and ``sim.deploy`` (sockets, wall-clock time), ``sim.runner`` (a scenario round by
round through a driver) and the ``sim.cli`` front end. Beside them: ``sim.scenario`` (scenario files),
``sim.clients`` (population, sampling, dropout, availability), ``sim.learning`` (data, models, training),
``sim.costs`` (the cost model; ``sim.profiling`` measures it), ``sim.results`` (tidy tables).
"""

__version__ = "0.1.0"
