"""``dropsim profile``: fit the cost model from micro-benchmarks of this project's own code.

Each operation is timed (median of ``repeats`` wall-clock measurements with ``time.perf_counter``) at a
grid of sizes and fitted by least squares to ``seconds = coef . features`` with non-negative
coefficients (a feature whose coefficient comes out negative is dropped and the fit redone):

- ``train.<model>.<CxHxW>.<classes>``: real local training (:class:`~sim.learning.trainer.Learner`) on
  random data of that shape; features ``const``, ``samples`` (sample passes = samples x epochs) and
  ``batches`` (optimizer steps); every model of :data:`~sim.learning.models.MODELS` at every data set's
  shape (:data:`~sim.learning.federated.SHAPES`). The large models (``resnet18``, ``vgg19``: some 5 to
  50 ms per sample on one core) are timed on fewer, smaller points (:func:`training_grid`), which keeps
  the full profile within a few minutes. Other shapes (of ``synthetic`` data) are timed when asked
  (``run_profile(shapes=...)``).
- ``fedavg.accumulate`` and ``fedavg.finalize``: the FedAvg server machine's ``close_step`` over n
  updates of d values, fitted as ``a + b n d + c d``; ``accumulate`` (charged per arriving update) gets
  ``b`` per element, ``finalize`` gets ``a`` and ``c``.
- the secure-aggregation and wire operations of :mod:`sim.profiling.micro`;
- the profile's ``pipeline`` entry: the interference of pipelined chunk tasks on a client's compute
  (Dordis eq. 3's beta_2), measured by :mod:`sim.profiling.interference`.

Torch runs with one thread, and numpy's BLAS too (threadpoolctl), so the reference device is one core
of the profiling machine; a client's slow-down factor and the server's speed scale from there.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from sim.costs.model import FORMAT, CostModel, CostModelError, read_profile, resolve_profile
from sim.learning.federated import SHAPES, FederatedData, data_shape
from sim.learning.models import MODELS, model_name, train_op, update_dimension
from sim.learning.trainer import Learner, local_batches
from sim.profiling.fit import fit_nonnegative
from sim.profiling.interference import measure_pipeline
from sim.profiling.micro import BENCHMARKS
from sim.profiling.transport import TRANSPORT
from sim.protocol.fedavg import ClientUpdate, FedAvgServer
from sim.results.manifest import host, versions
from sim.results.writer import write_json
from sim.scenario.types import Model, Scenario, Training
from sim.testbed import cost_profile


class _RandomData(FederatedData):
    """Random images of a given shape, as many as asked, for timing training."""

    def __init__(self, shape: tuple[int, ...], classes: int, samples: int) -> None:
        self.input_shape, self.num_classes, self.samples = shape, classes, samples
        rng = np.random.default_rng(0)
        self.x = rng.random((samples, *shape), dtype=np.float32)
        self.y = rng.integers(0, classes, size=samples).astype(np.int64)

    def num_samples(self, client: int) -> int:
        return self.samples

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x, self.y

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x, self.y


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocator, lazy initialisation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


LARGE_MODELS = ("resnet18", "vgg19")
"""Models timed on the smaller grid of :func:`training_grid`."""


def training_grid(model: str, quick: bool) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """``(sample counts, batch sizes, repeats)`` at which ``model``'s local training is timed."""
    if model in LARGE_MODELS:
        return ((2, 4), (1, 2), 1) if quick else ((10, 20, 40), (5, 10, 20), 3)
    return ((8, 32), (4, 8), 1) if quick else ((20, 60, 120, 240), (10, 20, 50), 5)


def profile_training(
    model: str | Model,
    shape: tuple[int, ...],
    classes: int,
    sizes: Sequence[int],
    batch_sizes: Sequence[int],
    repeats: int,
) -> dict[str, Any]:
    rows, seconds = [], []
    for samples in sizes:
        data = _RandomData(shape, classes, samples)
        for batch_size in batch_sizes:
            training = Training(1, batch_size, 0.01, 0.9, 0.0, 1.0, 1, device="cpu", clients_at_once=1)  # one core
            learner = Learner(model, data, training, seed=0)
            seconds.append(_median_seconds(partial(learner.local_update, 0, 1), repeats))
            rows.append({"samples": float(samples), "batches": float(local_batches(samples, batch_size, 1))})
    return fit_nonnegative(("const", "samples", "batches"), rows, seconds)


def profile_fedavg(clients: Sequence[int], dims: Sequence[int], repeats: int) -> dict[str, dict[str, Any]]:
    rows: list[dict[str, float]] = []
    seconds: list[float] = []
    rng = np.random.default_rng(0)
    for d in dims:
        delta = rng.standard_normal(d).astype(np.float32)
        for n in clients:
            updates = [ClientUpdate(1, c, 10.0, delta) for c in range(n)]

            def close(updates: list[ClientUpdate] = updates, n: int = n, d: int = d) -> None:
                server = FedAvgServer(1, tuple(range(n)), d)
                for u in updates:
                    server.receive(u.client, u)
                server.close_step()

            seconds.append(_median_seconds(close, repeats))
            rows.append({"client_elements": float(n * d), "elements": float(d)})
    fit = fit_nonnegative(("const", "client_elements", "elements"), rows, seconds)
    coef = fit["coef"]
    return {
        "fedavg.accumulate": {
            "coef": {"elements": coef.get("client_elements", 0.0)},
            "r2": fit["r2"],
            "points": fit["points"],
            "fitted_with": "fedavg.finalize",
        },
        "fedavg.finalize": {
            "coef": {"const": coef.get("const", 0.0), "elements": coef.get("elements", 0.0)},
            "r2": fit["r2"],
            "points": fit["points"],
        },
    }


VALIDATION_SHAPES: tuple[tuple[tuple[int, int, int], int], ...] = (
    ((1, 27, 37), 10),
    ((1, 99, 101), 10),
    ((1, 99, 101), 100),
)
"""``(input shape, classes)`` of the ``linear`` models of ``scenarios/deploy.yaml`` and
``benchmarks/validate.py`` (exactly 10^4, 10^5 and 10^6 parameters): profiled too, so that the
deployment's validation runs on the default profile."""


def training_plan(
    shapes: Sequence[tuple[tuple[int, int, int], int]] = (),
) -> list[tuple[str, str, tuple[int, int, int], int, str]]:
    """``(op, model, input shape, classes, for what)`` of each training operation a profile times: every
    model at every data set's shape, then at the extra ``(input shape, classes)`` of ``shapes``."""
    extra = {f"synthetic {'x'.join(map(str, s))}, {k} classes": (s, k) for s, k in shapes}
    plan: dict[str, tuple[str, str, tuple[int, int, int], int, str]] = {}
    for source, (shape, classes) in {**SHAPES, **extra}.items():
        for model in MODELS:
            op = train_op(model, shape, classes)
            plan.setdefault(op, (op, model, shape, classes, source))
    for shape, classes in VALIDATION_SHAPES:
        op = train_op("linear", shape, classes)
        plan.setdefault(op, (op, "linear", shape, classes, "the deployment's validation grid"))
    return list(plan.values())


def run_profile(
    out: Path,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
    shapes: Sequence[tuple[tuple[int, int, int], int]] = (),
) -> dict[str, Any]:
    """Measure every operation and write the profile to ``out``; returns the profile. Training is timed
    at every data set's shape and at the extra ``(input shape, classes)`` of ``shapes`` (e.g. a synthetic
    data shape)."""
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):  # any BLAS or OpenMP pool on one core too, as a deployed party's
        return _run_profile(out, quick, progress, shapes)


def training_op(scenario: Scenario) -> str:
    """The training operation of ``scenario``'s model (:func:`sim.learning.models.train_op`) on its data's input
    shape and classes, whether or not it trains at a given rate. An abstract model (``model.params``) has none."""
    if scenario.model.params is not None:
        raise CostModelError(
            f"{scenario.origin('model', 'params')}: model.params is an abstract model: it trains at "
            "model.train_seconds_per_sample, there is nothing to time"
        )
    shape, classes = data_shape(scenario.data, scenario.population, scenario.seed)
    return train_op(model_name(scenario.model), shape, classes)


def profile_model(
    scenario: Scenario, out: Path, quick: bool = False, progress: Callable[[str], None] | None = None
) -> tuple[str, dict[str, Any]]:
    """Time local training of ``scenario``'s model (a factory plug-in's, or a built-in's) on its data's input
    shape and classes, and add the operation (:func:`sim.learning.models.train_op`) to the profile at ``out``:
    the existing file, else a copy of the scenario's cost profile (the shipped default where that file does not
    exist yet, as when the scenario names ``out`` itself). Returns the operation and the profile.

    The model is timed as ``dropsim profile`` times the built-in ones (random inputs of the data's shape, one
    thread), on the larger grid when it has more than 5 million parameters."""
    sc = scenario
    op = training_op(sc)
    shape, classes = data_shape(sc.data, sc.population, sc.seed)
    base = out if out.is_file() else resolve_profile(cost_profile(sc))
    if not base.is_file():  # the scenario names the profile this makes (costs.profile: out): start from the default
        base = resolve_profile(None)
    doc = read_profile(base)
    CostModel.from_dict(doc, str(base))  # a dropsim profile, or a clear error
    large = update_dimension(sc.model, shape, classes) > 5_000_000
    say = progress or (lambda _msg: None)
    say(f"{op} (from {base})")
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        entry = profile_training(sc.model, shape, classes, *training_grid("vgg19" if large else "cnn", quick))
    entry["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    entry["quick"] = quick
    entry["host"] = host()
    entry["model"] = {"factory": sc.model.factory, "name": sc.model.name, "args": dict(sc.model.args)}
    doc["operations"][op] = entry
    write_json(out, doc)
    return op, dict(doc)


def _measure(bench: Any, quick: bool, repeats: int) -> dict[str, Any]:
    """Time ``bench`` at its sizes and fit its linear cost."""
    rows, seconds = [], []
    for point in bench.points(quick):
        rows.append(point.features)
        seconds.append(_median_seconds(point.run, repeats))
    return fit_nonnegative(bench.features, rows, seconds)


def update_profile(
    path: Path, ops: Sequence[str], quick: bool = False, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Measure again only the operations ``ops`` (of :data:`~sim.profiling.micro.BENCHMARKS` and the transport
    operations) and replace their entries in the profile at ``path``, each stamped with its own
    ``measured_at`` and ``host``; the rest of the profile is kept. Refuses a profile measured on another
    kind of machine (another processor or core count: its other fits would describe a different one).
    Returns the updated profile.

    For when one primitive changed (a faster sampler, say): the other fits stay as measured."""
    if not path.is_file():
        raise CostModelError(f"cost profile {path}: is not a file; write a whole profile first (dropsim profile)")
    doc = read_profile(path)
    CostModel.from_dict(doc, str(path))  # a dropsim profile, or a clear error
    benches = {bench.op: bench for bench in (*BENCHMARKS, *TRANSPORT)}
    unknown = [op for op in ops if op not in benches]
    if unknown:
        raise CostModelError(
            f"cannot re-measure {', '.join(unknown)}: not a measured operation ({', '.join(sorted(benches))})"
        )
    here = host()
    there = doc.get("machine", {})
    differs = [key for key in ("processor", "cpus") if key in there and there[key] != here.get(key)]
    if differs:
        raise CostModelError(
            f"cost profile {path}: was measured on another machine ({', '.join(f'{k} {there[k]!r}' for k in differs)}, "
            f"here {', '.join(repr(here.get(k)) for k in differs)}); measure a whole profile here instead"
        )
    repeats = 1 if quick else 5
    say = progress or (lambda _msg: None)
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        for op in ops:
            say(op)
            entry = _measure(benches[op], quick, repeats)
            entry["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            entry["quick"] = quick
            entry["host"] = here
            doc["operations"][op] = entry
    write_json(path, doc)
    return dict(doc)


def _run_profile(
    out: Path,
    quick: bool,
    progress: Callable[[str], None] | None,
    shapes: Sequence[tuple[tuple[int, int, int], int]],
) -> dict[str, Any]:
    say = progress or (lambda _msg: None)
    repeats = 1 if quick else 5
    operations: dict[str, Any] = {}
    for op, model, shape, classes, source in training_plan(shapes):
        say(f"{op} (for {source})")
        operations[op] = profile_training(model, shape, classes, *training_grid(model, quick))
    say("fedavg.accumulate, fedavg.finalize")
    operations.update(
        profile_fedavg(
            (2, 8) if quick else (2, 5, 10, 20), (1_000, 10_000) if quick else (10_000, 100_000, 1_000_000), repeats
        )
    )
    for bench in (*BENCHMARKS, *TRANSPORT):
        say(bench.op)
        operations[bench.op] = _measure(bench, quick, repeats)
    doc = {
        "format": FORMAT,
        "machine": {
            **host(),
            "torch_threads": 1,
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "quick": quick,
            "versions": versions(),
            "python": platform.python_version(),
        },
        "operations": operations,
    }
    say("pipeline interference (Dordis eq. 3)")

    doc["pipeline"] = measure_pipeline(quick=quick)
    write_json(out, doc)
    return doc
