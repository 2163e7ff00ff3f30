"""The kernel testbed's grid of scenarios: what ``benchmarks/validate.py --testbed kernel`` validates the
simulator on, and what ``dropsim calibrate --host`` deploys to calibrate a host (docs/deploy.md, "How far
the simulator is from the kernel testbed").

Every point is ``scenarios/deploy.yaml`` (SecAgg, Zipf slow-downs 1-3 and 21-210 Mbps links, a server at
1 Gbps, a ``linear`` model on synthetic data) with the clients, the model's size, the protocol, XNoise,
the dropout stage and the chunks of the point (:class:`KernelPoint`), each deployment kept in a folder of
its own (:func:`deployments`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.results.read import read_manifest

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "deploy.yaml"
"""The grid's base scenario, in the clone dropsim runs from."""

SHAPES = {10_000: ([1, 27, 37], 10), 100_000: ([1, 99, 101], 10), 1_000_000: ([1, 99, 101], 100)}
"""Parameters -> (input shape, classes) of a ``linear`` model with exactly that many parameters."""


@dataclass(frozen=True)
class KernelPoint:
    """One point of the kernel testbed's grid."""

    clients: int
    params: int
    protocol: str
    xnoise: bool
    stage: str
    chunks: int
    slowdown: tuple[float, float] | None = None
    """The clients' slow-down range (``clients.compute.slowdown``), if not the scenario's."""

    @property
    def name(self) -> str:
        noise = "xnoise" if self.xnoise else "plain"
        name = f"n{self.clients}_d{self.params:g}_{self.protocol}_{noise}_{self.stage}_m{self.chunks}"
        return name if self.slowdown is None else f"{name}_s{self.slowdown[0]:g}-{self.slowdown[1]:g}"

    @property
    def levels(self) -> tuple[int, int, int, int]:
        """Each two-level factor's level (0: the first)."""
        return (
            int(self.protocol == "secagg+"),
            int(self.xnoise),
            int(self.stage == "during_unmasking"),
            int(self.chunks > 1),
        )

    def overrides(self, rounds: int) -> list[str]:
        """The scenario's keys at this point, with ``rounds`` times its :data:`ROUNDS_FACTOR` rounds."""
        shape, classes = SHAPES[self.params]
        point = [
            f"rounds={rounds * ROUNDS_FACTOR[self.params]}",
            f"population={2 * self.clients}",
            f"sampling.clients_per_round={self.clients}",
            f"data.input_shape={shape}",
            f"data.classes={classes}",
            f"aggregation.protocol={self.protocol}",
            "dropout.rate=0.2",
            f"dropout.stage={self.stage}",
        ]
        if self.xnoise:
            point.append("privacy={strategy: xnoise, epsilon: 6, delta: 0.01, clip: 3.0, tolerance: 0.5}")
        if self.chunks > 1:
            point.append(f"pipeline={{chunks: {self.chunks}, links: shared}}")
        if self.slowdown is not None:
            point.append(f"clients.compute.slowdown=[{self.slowdown[0]}, {self.slowdown[1]}]")
        return point


ROUNDS_FACTOR = {10_000: 4, 100_000: 2, 1_000_000: 1}
"""The kernel grid's rounds per point, in multiples of ``--rounds``, by model size. A small model's round
is a few CPU periods of its parties, so it varies more with their phase: measured on the grid, two points
of 5 clients that do the same work (``repeatability`` in benchmarks/validate.py) differed by a median of
24% at 10^4 parameters with 4 rounds and 13% with 16, and by 5% and 1% in two grids at 10^6 with 4."""


def kernel_grid(clients: Sequence[int] = (5, 10, 20), slowdown: tuple[float, float] | None = None) -> list[KernelPoint]:
    """48 points: for each of 5, 10 and 20 clients, every combination of the four two-level factors
    (protocol, XNoise, dropout stage, chunks; combination ``c`` has protocol ``c & 1``, XNoise ``c & 2``,
    ...), the model size rotating over 10^4, 10^5 and 10^6 parameters with ``(c >> 1) + i`` (i: the client
    count's index), so that each half of :func:`calibration_half` holds every client count with every size,
    2 or 3 times. ``clients`` and ``slowdown`` give other client counts (16 points each) and slow-downs."""
    sizes = sorted(SHAPES)
    points = []
    for i, n in enumerate(clients):
        for combo in range(16):
            points.append(
                KernelPoint(
                    n,
                    sizes[((combo >> 1) + i) % 3],
                    "secagg+" if combo & 1 else "secagg",
                    bool(combo & 2),
                    "during_unmasking" if combo & 4 else "before_upload",
                    3 if combo & 8 else 1,
                    slowdown,
                )
            )
    return points


F1_CLIENTS = 3
"""Clients per round of ``--regime f1``: with the server's core and :data:`F1_SLOWDOWN`, every party's quota
fits in 2 cores at f = 1 (1 + 3 / 3 = 2), so no party ever waits for another's core."""

F1_SLOWDOWN = (3.0, 9.0)
"""The clients' slow-down range of ``--regime f1``: a client's quota is 1/3 to 1/9 of a core."""

BIAS_COMBOS = (0, 1, 2, 3, 6, 7, 8, 9)
"""The grid's combinations that ``--repeats`` deploys by default: SecAgg and SecAgg+ (a pair of the same
work, one in each half) of plain and XNoise rounds dropping before upload, XNoise dropping during
unmasking, and plain with 3 chunks; 10^4 and 10^5 parameters (a 10^6 round is long, and quiet)."""


def grid_for(regime: str) -> list[KernelPoint]:
    """The kernel grid of ``regime``: ``usual`` (:func:`kernel_grid`: this host's usual time dilation f),
    or ``f1`` (:data:`F1_CLIENTS` clients of :data:`F1_SLOWDOWN`, f = 1 on 2 cores)."""
    if regime == "f1":
        return kernel_grid((F1_CLIENTS,), F1_SLOWDOWN)
    return kernel_grid()


def repeated_points(grid: list[KernelPoint]) -> list[KernelPoint]:
    """The points ``--repeats`` deploys when no ``--points`` are given: :data:`BIAS_COMBOS` at the grid's
    smallest client count."""
    fewest = min(p.clients for p in grid)
    first = [p for p in grid if p.clients == fewest]
    return [first[c] for c in BIAS_COMBOS]


def deployments(root: Path, point: KernelPoint, repeats: int) -> list[Path]:
    """The folders of ``point``'s ``repeats`` deployments under ``root`` (the first is ``deployed``, as a
    grid without repeats keeps it)."""
    return [root / point.name / ("deployed" if r == 0 else f"deployed-{r + 1}") for r in range(repeats)]


def calibration_half(point: KernelPoint) -> bool:
    """The points calibrated on: those with an even number of factors at their second level (a 2^(4-1)
    half-fraction, so both halves hold every level of every factor, and every pair of levels, equally
    often, at every client count)."""
    return sum(point.levels) % 2 == 0


def complete(run: Path) -> bool:
    """Whether ``run`` holds a finished run (its manifest says so)."""
    try:
        return read_manifest(run).get("status") == "complete"
    except Exception:
        return False
