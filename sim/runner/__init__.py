"""Running scenarios: plan each round, have a driver play it, write the tables (docs/architecture.md).

:class:`~sim.runner.experiment.Experiment` runs one scenario round by round through any driver
(:class:`Simulation`: the simulator); :func:`~sim.runner.run.run_scenario` writes its tables as rounds
finish; :mod:`sim.runner.chunks` chooses ``pipeline.chunks: auto``; :mod:`sim.runner.workers` runs a sweep's points
in worker processes, and :mod:`sim.runner.interrupts` turns SIGINT and SIGTERM into one way of stopping.
"""

from sim.runner.experiment import Deployed, Experiment, Simulation
from sim.runner.run import RunSummary, prepare_output, run_scenario, summarize
from sim.scenario.types import scenario_digest

__all__ = [
    "Deployed",
    "Experiment",
    "RunSummary",
    "Simulation",
    "prepare_output",
    "run_scenario",
    "scenario_digest",
    "summarize",
]
