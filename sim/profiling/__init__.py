"""Measuring the cost model's operations on this machine: ``dropsim profile``.

:mod:`sim.profiling.profiler` times this project's own code (:mod:`sim.profiling.micro` for the
secure-aggregation and wire operations, :mod:`sim.profiling.transport` for the deployment's framing,
:mod:`sim.profiling.interference` for the pipeline's interference) and fits the linear models of
:mod:`sim.costs.model`.
"""
