"""The scenario's frozen types: one dataclass per section, the whole :class:`Scenario`, and the values
its keys allow.

The keys are documented in ``docs/scenarios.md``; :mod:`sim.scenario.parser` checks a document into these
types. Key names here are the user interface: later features add sibling keys but never rename these.
Units: virtual seconds, megabits per second (1 Mbps = 10^6 bit/s), dimensionless factors.

Light on purpose: a module that only needs a config type imports this without the protocol stack.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.dp.strategies import strategy_named
from sim.protocol.params import AggregationParams
from sim.scenario.source import Document

DATASETS = ("digits", "synthetic", "femnist", "cifar10")
LOADER = "loader"
"""``Data.dataset`` of data a plug-in gives (``data.loader``)."""
MODELS = ("cnn", "mlp", "resnet18", "vgg19", "linear")
"""Named models (built by :func:`sim.learning.models.build_model`)."""
SYNTHETIC_SHAPE = (1, 8, 8)
"""Default image shape ``(C, H, W)`` of the ``synthetic`` data set."""
SYNTHETIC_CLASSES = 10
"""Default number of classes of the ``synthetic`` data set."""
FIDELITIES = ("full", "learning", "timing")
"""``full``: real training, encoding, noise and cryptography; ``learning``: the same models, noise and
tables without the cryptography (sized stand-ins; the masks cancel in the sum); ``timing``: sizes only,
nothing trained."""
TRACE_SAMPLING = ("online", "population")


@dataclass(frozen=True)
class ZipfProfile:
    """Compute speeds: the i-th slowest of N devices has latency proportional to ``i^-zipf_a``
    (Dordis section 6.1), min-max scaled into ``[fastest, slowest]``."""

    zipf_a: float
    fastest: float
    """Slow-down factor of the fastest device against the profiled reference device (1.0 = as fast)."""
    slowest: float
    ranks: int | None = None
    """Devices the Zipf rule ranks (None: the whole population); clients share ranks evenly."""


@dataclass(frozen=True)
class BandwidthProfile:
    """Link speeds: the i-th slowest of N links has per-megabit time proportional to ``i^-zipf_a``,
    min-max scaled so that bandwidths span ``[low_mbps, high_mbps]``."""

    zipf_a: float
    low_mbps: float
    high_mbps: float
    ranks: int | None = None
    """Links the Zipf rule ranks (None: the whole population); clients share ranks evenly."""


@dataclass(frozen=True)
class Clients:
    compute: ZipfProfile
    bandwidth: BandwidthProfile


@dataclass(frozen=True)
class Server:
    bandwidth_mbps: float
    """Capacity of the server's link in each direction, shared by concurrent transfers."""
    speed: float
    """Compute speed relative to the profiled reference device (2.0 = twice as fast)."""
    latency_ms: float = 0.0
    """One-way delay of every message between the server and a client, after its last bit is sent
    (propagation and per-message handling), in milliseconds; a round trip costs twice this."""


@dataclass(frozen=True)
class Sampling:
    """Exactly one of ``clients_per_round`` (uniform, without replacement) or ``rate`` (Poisson)."""

    clients_per_round: int | None
    rate: float | None


@dataclass(frozen=True)
class Dropout:
    """Which sampled clients drop, and at which stage of the round.

    ``fixed``: exactly ``round(rate * sampled)`` clients, chosen uniformly (Dordis 6.1).
    ``bernoulli``: each sampled client independently with probability ``rate``.
    ``per_client``: each client of the population has its own probability, ``high`` with probability
    ``high_fraction`` and otherwise uniform in ``low`` (DReS-FL section 6).
    """

    mode: str
    rate: float
    stage: str
    silent: bool
    """A silent dropout is only noticed by the server at the step's timeout (else at once, as a closed
    connection)."""
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The keys only the mode reads, by key (:meth:`sim.scenario.dropout_modes.DropoutMode.read_options`:
    per_client's ``options["high"]``, ``options["high_fraction"]``, ``options["low"]``); a plug-in's ``args``."""
    model: str | None = None
    """A plug-in dropout model (:mod:`sim.plugins`), the name ``mode`` then holds too: an import path
    ``pkg.module:Name`` or an installed ``dropsim.dropout`` entry point's name; built with ``options`` as
    keyword arguments (:func:`sim.scenario.dropout_modes.dropout_mode`)."""


MECHANISMS = ("skellam", "gaussian", "dgaussian")


@dataclass(frozen=True)
class Privacy:
    """Distributed DP (the ``privacy:`` section): what noise, how much, and how it copes with dropout."""

    strategy: str = "none"
    """One of :data:`sim.dp.strategies.STRATEGIES`, or a plug-in's name (an import path or an entry point)."""
    mechanism: str = "skellam"
    epsilon: float = 6.0
    """Budget of the whole training."""
    delta: float = 1e-3
    clip: float = 1.0
    """L2 clip norm of an update (model units)."""
    tolerance: float = 0.5
    """T as a fraction of the sampled clients."""
    guessed_dropout: float = 0.5
    """``con``'s guess x of the dropout rate (only ``con`` uses it)."""
    collusion: int = 0
    """T_C, colluding clients tolerated."""
    headroom: float = 3.0
    """k, standard deviations of an aggregate coordinate that must fit in 2^bits."""

    @property
    def enabled(self) -> bool:
        """Whether the strategy adds noise (a built-in's or a plug-in's: :func:`sim.dp.strategies.strategy_named`)."""
        return strategy_named(self.strategy).enabled


@dataclass(frozen=True)
class TraceReplay:
    """The ``trace:`` section: replay an availability trace (``traces/README.md``)."""

    file: str
    """Trace CSV (or Parquet) file; relative paths are taken from the working directory."""
    offset_hours: float = 0.0
    """Where in the trace virtual time 0 falls."""
    time_scale: float = 1.0
    """Trace seconds per virtual second."""
    until_hours: float | None = None
    """Stop the run once the trace reaches this hour (e.g. 96: replay four days), if before ``rounds``."""
    capacity: bool = False
    """Take clients' compute and bandwidth from the trace's device capacity, where it gives them."""
    sample_from: str = "online"
    """``online``: the server samples among the clients online at the round's start. ``population``: it samples
    from the whole population, as Dordis Figure 1 does, and a sampled client that is offline leaves at once."""


@dataclass(frozen=True)
class Partition:
    kind: str
    """``iid``, ``dirichlet`` (label proportions ~ Dir(alpha) per client) or ``natural`` (by writer)."""
    alpha: float | None = None


@dataclass(frozen=True)
class Data:
    dataset: str
    partition: Partition
    path: str | None
    test_fraction: float
    samples_per_client: int
    writers_per_client: int
    input_shape: tuple[int, int, int] = SYNTHETIC_SHAPE
    """Image shape ``(channels, height, width)`` in pixels of ``synthetic`` data (the other data sets'
    shapes are fixed: :data:`sim.learning.federated.SHAPES`)."""
    classes: int = SYNTHETIC_CLASSES
    """Number of labels of ``synthetic`` data."""
    loader: str | None = None
    """The plug-in that gives the data (:mod:`sim.plugins`; ``dataset`` is then :data:`LOADER`): an import path
    ``pkg.module:function`` or an installed ``dropsim.datasets`` entry point's name, called with ``args``
    (:mod:`sim.learning.plugin_data`)."""
    args: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Keyword arguments of ``loader``."""


@dataclass(frozen=True)
class Model:
    """A named torch model (``name``), a user's own (``factory``: a plug-in), or an abstract model of
    ``params`` parameters for timing studies.

    An abstract model has no weights: its update is a vector of ``params`` float32 values that is never
    computed (``fidelity: timing`` only), and its local training takes, on the profiled reference device,
    ``train_seconds_per_sample`` seconds per sample and epoch (times the client's slow-down factor);
    0 means training is not modelled (it takes no time). A named model's training time comes from the
    cost profile's ``train.<name>.<CxHxW>.<classes>`` operation instead. A factory model's comes from the
    profile's operation for it (``dropsim profile --model``: :func:`sim.learning.models.train_op`) or, when
    ``train_seconds_per_sample`` is given, from that rate.
    """

    name: str | None
    params: int | None = None
    train_seconds_per_sample: float = 0.0
    """Reference-device seconds per training sample per local epoch (abstract or factory model)."""
    factory: str | None = None
    """The plug-in that builds the model (:mod:`sim.plugins`): an import path ``pkg.module:function`` or an
    installed ``dropsim.models`` entry point's name; called with ``args`` (:mod:`sim.learning.plugin_model`)."""
    args: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Keyword arguments of ``factory``."""

    def __post_init__(self) -> None:
        given = [key for key in ("name", "params", "factory") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(
                f"a model has one of name, params or factory (name {self.name!r}, params {self.params!r}, "
                f"factory {self.factory!r})"
            )
        if self.params is not None and self.params < 1:
            raise ValueError(f"model params is {self.params}; a whole number >= 1 is expected")
        if not (math.isfinite(self.train_seconds_per_sample) and self.train_seconds_per_sample >= 0):
            raise ValueError(
                f"model train_seconds_per_sample is {self.train_seconds_per_sample}; a number >= 0 is expected"
            )
        if self.name is not None and self.train_seconds_per_sample:
            raise ValueError("train_seconds_per_sample applies only to an abstract model (params) or a factory")
        if self.args and self.factory is None:
            raise ValueError("model args are the factory's: they need model.factory")


LINK_MODELS = ("shared", "duplex")
MAX_CHUNKS = 64
"""Largest chunk count a scenario may force (Hyades enumerates m in 1..20)."""


@dataclass(frozen=True)
class Pipelining:
    """The ``pipeline:`` section, pipelined aggregation (Dordis section 4): the update cut into ``chunks``
    pieces, each aggregated by its own protocol instance, their stages overlapping on the clients' and
    server's resources."""

    chunks: int | None
    """The chunk count m, or None for ``auto``: the m in 1..``max_chunks`` with the earliest predicted
    completion (Dordis eq. 3 fitted on short simulated runs, Hyades appendix F recurrence)."""
    dispatch: bool = True
    """Whether the server sends each chunk's sum to that chunk's clients, who decode it (Table 1 stages
    4 and 5)."""
    max_chunks: int = 20
    links: str = "shared"
    """``shared``: a client's uploads and dispatches take turns on one link resource (Dordis Table 1's
    comm, the Hyades recurrence); ``duplex``: its uplink and downlink are two resources."""


EMULATIONS = ("process", "kernel", "engine")
"""``testbed.emulation``: ``process`` (sleeps and token buckets inside each party's process, the default),
``kernel`` (cgroup CPU quotas and tc-shaped loopback links: :mod:`sim.testbed`) or ``engine`` (the cost
profile's implementation's own simulation engine, e.g. Flower's on Ray: :mod:`sim.engine.actors`;
simulated only)."""


@dataclass(frozen=True)
class Testbed:
    """The ``testbed:`` section: the server and one process per sampled client on one host of ``cores``
    cores, whose compute they share by processor sharing, one core per thread at most; a client's
    slow-down is a sleep after each computation (:mod:`sim.engine.host`, docs/time-model.md)."""

    cores: int
    """K, the host's cores (each runs one reference-device second of work per virtual second)."""
    cpu_scale: float = 1.0
    """CPU seconds a deployed party's operation takes per second the cost profile gives it: the profile
    times each operation back to back, warm; a party computes one now and then, between messages, beside
    other processes (``dropsim validate`` measures it; docs/deploy.md). It scales every profiled cost,
    not the testbed's own socket costs (``deploy.*``)."""
    emulation: str = "process"
    """How ``dropsim deploy`` emulates the devices and how the simulator models it: ``process`` (each party
    sleeps out its slow-down and shapes its own sockets with token buckets, on the host's shared cores) or
    ``kernel`` (each party in a CPU cgroup of f / s cores and its links shaped by tc in a private network
    namespace: :mod:`sim.testbed`, docs/deploy.md); or ``engine``, which only the simulator models: the
    clients' messages run on the worker pool of the cost profile's own simulation engine
    (:mod:`sim.engine.actors`)."""

    def __post_init__(self) -> None:
        if self.emulation not in EMULATIONS:
            raise ValueError(f"testbed emulation is {self.emulation!r}; one of {', '.join(EMULATIONS)} is expected")
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise ValueError(f"testbed cores is {self.cores!r}; a whole number >= 1 is expected")
        if not (math.isfinite(self.cpu_scale) and self.cpu_scale > 0):
            raise ValueError(f"testbed cpu_scale is {self.cpu_scale!r}; a number > 0 is expected")


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]+)?")
"""The values ``training.device`` takes."""


@dataclass(frozen=True)
class Training:
    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    server_lr: float
    """Step size of the server's FedAvg update (1.0 = plain weighted average of client models)."""
    threads: int
    """Torch CPU threads used for real training (results are reproducible for a fixed value)."""
    workers: int = 1
    """Processes that train a round's clients in parallel (``full`` and ``learning`` fidelity; the same
    results as 1 when clients train one at a time, ``clients_at_once: 1``)."""
    device: str = "auto"
    """Where real training runs: ``auto`` (a GPU when torch sees one), ``cpu``, ``cuda`` or ``cuda:N``
    (:mod:`sim.learning.device`). Wall time only: training is charged from the cost profile."""
    clients_at_once: int | None = None
    """Clients trained together in one vectorised step (:mod:`sim.learning.together`); 1: one at a time,
    None: ``auto`` (chosen per model and device)."""


@dataclass(frozen=True)
class Evaluation:
    every: int
    """Evaluate the global model on the test set every ``every`` rounds (and after the last)."""


@dataclass(frozen=True)
class Scenario:
    """A fully resolved, valid scenario: what one run needs."""

    name: str
    seed: int
    rounds: int
    population: int
    sampling: Sampling
    clients: Clients
    server: Server
    dropout: Dropout
    data: Data
    model: Model
    training: Training
    evaluation: Evaluation
    fidelity: str
    output: str
    timeouts: dict[str, float]
    """Server-side wait limit in virtual seconds per protocol step; a step without one waits for all."""
    cost_profile: str | None
    aggregation: AggregationParams
    resolved: dict[str, Any] = field(compare=False, repr=False)
    """The scenario as a plain mapping with every default filled in (for the manifest)."""
    privacy: Privacy = field(default_factory=Privacy)
    trace: TraceReplay | None = None
    pipeline: Pipelining | None = None
    """Pipelined aggregation, or None (a round ends when the server has the aggregate)."""
    testbed: Testbed | None = None
    """The single-host testbed whose shared cores every party computes on, or None (each party has its
    own processor)."""
    protocol_threads: int | None = 1
    """Threads on which the simulator makes its clients' protocol calls ahead of virtual time (``full``
    fidelity; ``aggregation.threads``), None for the cores the run may use: the same results whatever the
    count (:mod:`sim.engine.ahead`)."""
    swept: dict[str, Any] = field(default_factory=dict)
    """Values of the sweep keys for this run (``{}`` outside a sweep)."""
    run_id: str = ""
    document: Document | None = field(default=None, compare=False, repr=False)
    """The document it was read from (for messages naming where a key was written)."""

    def origin(self, *path: str) -> str:
        """Where key ``path`` was written (file:line, an option), or the file."""
        return self.document.origin(path) if self.document is not None else self.name


EXECUTION_KEYS = (("aggregation", "threads"),)
"""Keys that choose how a run is computed, never what it computes (the same tables whatever their value):
left out of the digest, so that a run finished with one value counts as finished for another."""


def scenario_digest(scenario: Scenario) -> str:
    """SHA-256 of the resolved scenario, less :data:`EXECUTION_KEYS`: a finished run with the same digest need
    not run again."""
    resolved = dict(scenario.resolved)
    for section, key in EXECUTION_KEYS:
        if isinstance(resolved.get(section), dict) and key in resolved[section]:
            resolved[section] = {k: v for k, v in resolved[section].items() if k != key}
    text = json.dumps(resolved, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
