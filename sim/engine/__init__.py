"""The simulator: the driver that plays round plans in virtual time (:class:`~sim.engine.simulator.Simulator`),
with a flow-level network, processors and the testbed's shared cores, driving the sans-IO protocol machines
through the round layer (:mod:`sim.round`)."""
