"""The round layer: what a federated round is, written once for every driver (docs/architecture.md).

Nothing here imports simpy, asyncio or torch, nor reads a clock: the SimPy engine (:mod:`sim.engine`) and
the socket deployment (:mod:`sim.deploy`) both play a :class:`~sim.round.plan.RoundPlan` and return a
:class:`~sim.round.records.RoundRecord`, through the interface in :mod:`sim.round.driver`.
"""
