"""The scenario: frozen, validated parts, and the parser from a scenario document.

Key names here are the user interface (see ``docs/scenarios.md``): later features add sibling keys but
never rename these. Every value is checked where it is read; all problems are reported together.
Units: virtual seconds, megabits per second (1 Mbps = 10^6 bit/s), dimensionless factors.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.dp.strategies import REMOVING, STRATEGIES, allowed
from sim.protocol.collusion import (
    largest_safe_collusion,
    smallest_safe_fraction,
    smallest_safe_threshold,
    split_view_possible,
)
from sim.protocol.graph import auto_degree
from sim.protocol.registry import (
    NOISE_REMOVAL_STAGES,
    PIPELINED,
    PROTOCOLS,
    AggregationParams,
    reconstruction_threshold,
    secret_holders,
)
from sim.scenario.errors import ScenarioError
from sim.scenario.reader import Reader
from sim.scenario.source import Document

DATASETS = ("digits", "synthetic", "femnist", "cifar10")
MODELS = ("cnn", "mlp", "resnet18", "vgg19", "linear")
"""Named models (built by :func:`sim.learning.models.build_model`)."""
SYNTHETIC_SHAPE = (1, 8, 8)
"""Default image shape ``(C, H, W)`` of the ``synthetic`` data set."""
SYNTHETIC_CLASSES = 10
"""Default number of classes of the ``synthetic`` data set."""
FIDELITIES = ("full", "timing")
DROPOUT_MODES = ("fixed", "bernoulli", "per_client")
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
    high: float
    high_fraction: float
    low: tuple[float, float]


MECHANISMS = ("skellam", "gaussian", "dgaussian")


@dataclass(frozen=True)
class Privacy:
    """Distributed DP (the ``privacy:`` section): what noise, how much, and how it copes with dropout."""

    strategy: str = "none"
    """One of :data:`sim.dp.strategies.STRATEGIES`."""
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
        return self.strategy != "none"


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


@dataclass(frozen=True)
class Model:
    """A named torch model (``name``), or an abstract model of ``params`` parameters for timing studies.

    An abstract model has no weights: its update is a vector of ``params`` float32 values that is never
    computed (``fidelity: timing`` only), and its local training takes, on the profiled reference device,
    ``train_seconds_per_sample`` seconds per sample and epoch (times the client's slow-down factor);
    0 means training is not modelled (it takes no time). A named model's training time comes from the
    cost profile's ``train.<name>.<CxHxW>.<classes>`` operation instead.
    """

    name: str | None
    params: int | None = None
    train_seconds_per_sample: float = 0.0
    """Reference-device seconds per training sample per local epoch (abstract model only)."""

    def __post_init__(self) -> None:
        if (self.name is None) == (self.params is None):
            raise ValueError(
                f"a model has a name or params, not both or neither (name {self.name!r}, params {self.params!r})"
            )
        if self.params is not None and self.params < 1:
            raise ValueError(f"model params is {self.params}; a whole number >= 1 is expected")
        if not (math.isfinite(self.train_seconds_per_sample) and self.train_seconds_per_sample >= 0):
            raise ValueError(
                f"model train_seconds_per_sample is {self.train_seconds_per_sample}; a number >= 0 is expected"
            )
        if self.name is not None and self.train_seconds_per_sample:
            raise ValueError("train_seconds_per_sample applies only to an abstract model (params)")


LINK_MODELS = ("shared", "duplex")
MAX_CHUNKS = 64
"""Largest chunk count a scenario may force (Hyades enumerates m in 1..20)."""


@dataclass(frozen=True)
class Pipeline:
    """Pipelined aggregation (Dordis section 4): the update cut into ``chunks`` pieces, each aggregated by
    its own protocol instance, their stages overlapping on the clients' and server's resources."""

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

    def __post_init__(self) -> None:
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise ValueError(f"testbed cores is {self.cores!r}; a whole number >= 1 is expected")
        if not (math.isfinite(self.cpu_scale) and self.cpu_scale > 0):
            raise ValueError(f"testbed cpu_scale is {self.cpu_scale!r}; a number > 0 is expected")


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
    """Processes that train a round's clients in parallel (``full`` fidelity; the same results as 1)."""


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
    pipeline: Pipeline | None = None
    """Pipelined aggregation, or None (a round ends when the server has the aggregate)."""
    testbed: Testbed | None = None
    """The single-host testbed whose shared cores every party computes on, or None (each party has its
    own processor)."""
    swept: dict[str, Any] = field(default_factory=dict)
    """Values of the sweep keys for this run (``{}`` outside a sweep)."""
    run_id: str = ""
    document: Document | None = field(default=None, compare=False, repr=False)
    """The document it was read from (for messages naming where a key was written)."""

    def origin(self, *path: str) -> str:
        """Where key ``path`` was written (file:line, an option), or the file."""
        return self.document.origin(path) if self.document is not None else self.name


def parse(doc: Document, default_name: str | None = None) -> Scenario:
    """Check and resolve a scenario document (without a ``sweep`` key: see :mod:`sim.scenario.grid`)."""
    r = Reader(doc, doc.data)
    name = r.string("name", default_name or Path(doc.name).stem)
    seed = r.integer("seed", 0, lo=0, hi=2**63 - 1)
    rounds = r.integer("rounds", lo=1)
    population = r.integer("population", lo=1)

    sampling = _sampling(r.section("sampling"), population)
    clients = _clients(r.section("clients"))
    s = r.section("server")
    server = Server(
        bandwidth_mbps=s.number("bandwidth_mbps", 1000.0, lo=0, lo_open=True),
        speed=s.number("speed", 1.0, lo=0, lo_open=True),
        latency_ms=s.number("latency_ms", 0.0, lo=0),
    )
    s.finish()
    aggregation = _aggregation(r.section("aggregation"), sampling)
    privacy = _privacy(r.section("privacy"), aggregation, sampling, population)
    aggregation = dataclasses.replace(aggregation, strategy=privacy.strategy, collusion=privacy.collusion)
    steps = aggregation.steps()
    dropout = _dropout(r.section("dropout"), aggregation)
    data = _data(r.section("data"), population)
    model = _model(r.section("model"))
    training = _training(r.section("training"))
    e = r.section("evaluation")
    evaluation = Evaluation(every=e.integer("every", 1, lo=1))
    e.finish()
    fidelity = r.choice("fidelity", FIDELITIES, "full")
    if model.params is not None and fidelity != "timing":
        r.fail(
            ("model", "params"),
            f"is {model.params}: an abstract model has no weights, so there is nothing to train under fidelity "
            f"{fidelity!r}; set fidelity: timing, or name a real model (model.name: {', '.join(MODELS)})",
        )
    output = r.string("output", f"results/{name}")
    timeouts = _timeouts(r.section("timeouts"), aggregation)
    trace = _trace(r.section("trace"))
    pipeline = None
    if r.has("pipeline"):
        pipeline = _pipeline(r.section("pipeline"), aggregation)
    elif "pipeline" in r.data:
        r.raw("pipeline")  # pipeline: null, as absent
    testbed = None
    if r.has("testbed"):  # resolved only when given: a scenario without it keeps its digest
        testbed = _testbed(r.section("testbed"))
    elif "testbed" in r.data:
        r.raw("testbed")  # testbed: null, as absent
    c = r.section("costs")
    cost_profile = c.string("profile", None)
    c.finish()
    can_drop = dropout.mode == "per_client" or (dropout.rate or 0) > 0
    if dropout.silent and trace is not None:
        # A client whose session ends leaves silently at whatever step the round is in.
        untimed = [step for step in steps if step not in timeouts]
        if untimed:
            r.fail(
                ("dropout", "silent"),
                "is true with a trace: clients going offline leave silently at any step, whose server would wait "
                f"for them for ever; set {', '.join(f'timeouts.{step}' for step in untimed)}",
            )
    elif dropout.silent and can_drop and dropout.stage is not None:
        # A client leaving silently before step X is missed only in X: that step needs a deadline.
        # (Pipelined, the first chunk's deadline there puts the leaver out of every chunk's instance.)
        waits_in = aggregation.dropout_stages()[dropout.stage] or steps[0]
        if waits_in not in timeouts:
            r.fail(
                ("dropout", "silent"),
                f"is true: clients leaving silently at {dropout.stage} are missed in step {waits_in}, whose "
                f"server would wait for them for ever; set timeouts.{waits_in}",
            )
    r.finish(extra_allowed=("sweep", "pipeline", "testbed"))
    if r.problems:
        raise ScenarioError(r.problems)
    return Scenario(
        name=name,
        seed=seed,
        rounds=rounds,
        population=population,
        sampling=sampling,
        clients=clients,
        server=server,
        dropout=dropout,
        data=data,
        model=model,
        training=training,
        evaluation=evaluation,
        fidelity=fidelity,
        output=output,
        timeouts=timeouts,
        cost_profile=cost_profile,
        aggregation=aggregation,
        resolved=r.resolved,
        privacy=privacy,
        trace=trace,
        pipeline=pipeline,
        testbed=testbed,
        document=doc,
    )


def _sampling(r: Reader, population: int) -> Sampling:
    if r.has("clients_per_round") and r.has("rate"):
        r.fail(
            "rate",
            "cannot be given with clients_per_round; give one: clients_per_round (a fixed "
            "number each round) or rate (Poisson sampling)",
        )
    if r.has("rate"):
        sampling = Sampling(None, r.number("rate", lo=0, hi=1, lo_open=True))
    else:
        k = r.integer("clients_per_round", min(10, population or 10), lo=1)
        if population is not None and k is not None and k > population:
            r.fail("clients_per_round", f"is {k}, more than the population ({population})")
        sampling = Sampling(k, None)
    r.finish(extra_allowed=("clients_per_round", "rate"))
    return sampling


def _clients(r: Reader) -> Clients:
    c = r.section("compute")
    compute_a = c.number("zipf_a", 1.2, lo=0)
    fastest, slowest = c.interval("slowdown", (1.0, 3.0), lo=0, lo_open=True)
    compute = ZipfProfile(compute_a, fastest, slowest, c.integer("ranks", None, lo=1))
    c.finish()
    b = r.section("bandwidth_mbps")
    a = b.number("zipf_a", 1.2, lo=0)
    lo_mbps, hi_mbps = b.interval("range", (21.0, 210.0), lo=0, lo_open=True)
    bandwidth = BandwidthProfile(a, lo_mbps, hi_mbps, b.integer("ranks", None, lo=1))
    b.finish()
    r.finish()
    return Clients(compute=compute, bandwidth=bandwidth)


def _aggregation(r: Reader, sampling: Sampling) -> AggregationParams:
    protocol = r.choice("protocol", tuple(PROTOCOLS), "fedavg")
    bits = r.integer("bits", 20, lo=2, hi=32)
    clip = r.number("clip", 1.0, lo=0, lo_open=True)
    threshold = r.number("threshold", 0.5, lo=0, hi=1, hi_open=True)
    neighbours = r.custom("neighbours", None, _neighbours)
    if "neighbours" not in r.resolved:
        r.resolved["neighbours"] = "auto"
    adversary = r.choice("adversary", ("semi-honest", "malicious"), "semi-honest")
    if neighbours is not None and protocol != "secagg+":
        r.fail("neighbours", f"only applies to protocol secagg+, not {protocol!r}")
    if adversary == "malicious" and protocol not in ("secagg", "secagg+"):
        r.fail("adversary", f"malicious needs protocol secagg or secagg+ (signatures), not {protocol!r}")
    if adversary == "malicious" and threshold is not None and threshold < 0.5:
        r.fail(
            "threshold",
            f"is {threshold}; the malicious variant needs threshold >= 0.5 so that more than half "
            "the clients must take part (Dordis footnote 3)",
        )
    k = sampling.clients_per_round
    if protocol != "fedavg" and bits is not None and k is not None and 2 ** (bits - 1) - 1 - k <= 0:
        r.fail("bits", f"is {bits}: too few to sum {k} clients' updates; need 2^(bits-1) > {k + 1}")
    if protocol in ("secagg", "secagg+") and threshold is not None and k is not None and k > 1:
        # Each secret is shared among the client and its neighbours; a threshold of 1 hands it out whole.
        degree = k - 1 if protocol == "secagg" or (neighbours is None and auto_degree(k) >= k - 1) else None
        holders = 1 + (degree if degree is not None else min(k - 1, neighbours or auto_degree(k)))
        if math.floor(threshold * holders) + 1 < 2:
            r.fail(
                "threshold",
                f"is {threshold}: with {holders} holders per secret the reconstruction threshold would be 1, "
                f"so every share would be the secret itself; use at least {1 / holders:.3g}",
            )
    r.finish()
    return AggregationParams(protocol, bits, clip, threshold, neighbours, adversary == "malicious")


def _privacy(r: Reader, aggregation: AggregationParams, sampling: Sampling, population: int | None) -> Privacy:
    d = Privacy()
    strategy = r.choice("strategy", STRATEGIES, d.strategy)
    p = Privacy(
        strategy=_or(strategy, d.strategy),
        mechanism=_or(r.choice("mechanism", MECHANISMS, d.mechanism), d.mechanism),
        epsilon=_or(r.number("epsilon", d.epsilon, lo=0, lo_open=True), d.epsilon),
        delta=_or(r.number("delta", d.delta, lo=0, hi=1, lo_open=True, hi_open=True), d.delta),
        clip=_or(r.number("clip", d.clip, lo=0, lo_open=True), d.clip),
        tolerance=_or(r.number("tolerance", d.tolerance, lo=0, hi=1, hi_open=True), d.tolerance),
        guessed_dropout=_or(
            r.number("guessed_dropout", d.guessed_dropout, lo=0, hi=1, hi_open=True), d.guessed_dropout
        ),
        collusion=_or(r.integer("collusion", d.collusion, lo=0), d.collusion),
        headroom=_or(r.number("headroom", d.headroom, lo=0, lo_open=True), d.headroom),
    )
    protocol = aggregation.protocol
    if p.enabled and strategy not in allowed(protocol):  # say why, in the user's terms
        if protocol == "fedavg":
            r.fail(
                "strategy",
                f"is {strategy!r}, which needs an encoded protocol: set aggregation.protocol to plain, secagg or "
                "secagg+ (fedavg sends float updates)",
            )
        if strategy in (*REMOVING, "rebasing"):
            r.fail(
                "strategy",
                f"is {strategy!r}, which removes noise with seeds shared under secure aggregation: set "
                f"aggregation.protocol to secagg or secagg+, not {protocol!r}",
            )
        elif protocol == "plain":
            r.fail(
                "strategy",
                f"is {strategy!r}, whose clients share the noise: under plain the server sees every noisy update "
                "alone, so only central or local DP hold; use secagg or secagg+ (or strategy central or local)",
            )
    if p.collusion and protocol not in ("secagg", "secagg+"):
        r.fail(
            "collusion",
            f"is {p.collusion}: collusion tolerance scales noise by SecAgg's t / (t - T_C); "
            f"it needs protocol secagg or secagg+, not {protocol!r}",
        )
    if not r.has("strategy") and any(r.has(key) for key in ("epsilon", "delta", "mechanism", "tolerance")):
        r.fail(
            "strategy",
            "is missing: a privacy section without a strategy adds no noise (strategy none); name one, e.g. "
            "xnoise, or none to run without DP",
        )
    k = sampling.clients_per_round
    if aggregation.malicious and p.collusion and protocol in ("secagg", "secagg+"):
        _consistency_check(r, aggregation, p.collusion, sampling, population)
    if p.enabled and k is not None and p.collusion and protocol in ("secagg", "secagg+"):
        t = reconstruction_threshold(aggregation, k)
        if p.collusion >= t:
            r.fail(
                "collusion",
                f"is {p.collusion}, not below the reconstruction threshold t = {t} of {k} sampled clients "
                f"({protocol}); lower it or raise aggregation.threshold",
            )
    r.finish()
    return p


def _consistency_check(
    r: Reader, aggregation: AggregationParams, colluders: int, sampling: Sampling, population: int | None
) -> None:
    """The malicious variant's consistency check must withstand ``colluders`` signing two survivor sets:
    t > (holders + colluding holders) / 2 per secret (:mod:`sim.protocol.collusion`). Under Poisson sampling
    this checks the nominal round of round(rate population) clients; each round is checked again as its
    machines are built, and one whose size makes it unsafe aborts."""
    k = sampling.clients_per_round
    sampled = f"{k} sampled clients"
    if k is None:
        if sampling.rate is None or population is None:
            return
        k = max(1, round(sampling.rate * population))
        sampled = f"a nominal {k} sampled clients at Poisson rate {sampling.rate}"
    n = secret_holders(aggregation, k)
    t = reconstruction_threshold(aggregation, k)
    if not split_view_possible(t, n, colluders):
        return
    where = sampled if n == k else f"{n} per neighbourhood of {sampled}"
    fix = f"raise aggregation.threshold to at least {smallest_safe_fraction(n, colluders)} (t = "
    fix += f"{smallest_safe_threshold(n, colluders)})"
    most = largest_safe_collusion(t, n)
    if most is not None and most >= 0:
        fix += f", or lower privacy.collusion to at most {most}"
    r.fail(
        "collusion",
        f"is {colluders} with aggregation.adversary: malicious and aggregation.threshold: {aggregation.threshold}, "
        f"whose t = {t} of the {n} holders of each secret ({aggregation.protocol}, {where}) is too low: a server "
        f"with {colluders} colluding client{'s' if colluders != 1 else ''} could show two camps of honest holders "
        "different survivor sets, each confirmed by t holders, and recover a client's input from one camp's shares "
        "of its seed and the other's of its key (the consistency check needs 2t > holders + colluding holders, "
        "docs/protocols.md); " + fix,
    )


def _trace(r: Reader) -> TraceReplay | None:
    if not r.data:
        r.finish()
        return None
    if not r.has("file"):
        r.fail("file", "is required in a trace section: the availability trace to replay (see traces/README.md)")
    file = r.string("file", "")
    offset = r.number("offset_hours", 0.0, lo=0)
    scale = r.number("time_scale", 1.0, lo=0, lo_open=True)
    until = r.number("until_hours", None, lo=0, lo_open=True)
    capacity = r.boolean("capacity", False)
    sample_from = r.choice("sample_from", TRACE_SAMPLING, "online")
    if until is not None and offset is not None and until <= offset:
        r.fail("until_hours", f"is {until}: it must come after offset_hours ({offset})")
    r.finish()
    return TraceReplay(file or "", _or(offset, 0.0), _or(scale, 1.0), until, bool(capacity), sample_from or "online")


def _chunks(value: Any) -> tuple[int | None, Any]:
    if value == "auto":
        return None, "auto"
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CHUNKS:
        return value, value
    raise ValueError(f"allowed: auto, or a whole number of chunks from 1 to {MAX_CHUNKS}")


def _pipeline(r: Reader, aggregation: AggregationParams) -> Pipeline:
    chunks = r.custom("chunks", None, _chunks)
    if "chunks" not in r.resolved:
        r.resolved["chunks"] = "auto"
    dispatch = r.boolean("dispatch", True)
    max_chunks = r.integer("max_chunks", 20, lo=1, hi=MAX_CHUNKS)
    links = r.choice("links", LINK_MODELS, "shared")
    if chunks is not None and r.has("max_chunks"):
        r.fail("max_chunks", f"bounds the choice of chunks: auto, but chunks is {chunks}: drop max_chunks or set auto")
    if aggregation.protocol not in PIPELINED:
        r.fail(
            "chunks",
            f"pipelines the protocol, but aggregation.protocol is {aggregation.protocol!r}: pipelining runs one "
            f"secure-aggregation instance per chunk, so it needs {' or '.join(PIPELINED)}",
        )
    r.finish()
    return Pipeline(chunks, bool(_or(dispatch, True)), int(_or(max_chunks, 20)), str(_or(links, "shared")))


def _testbed(r: Reader) -> Testbed:
    if not r.has("cores"):
        r.fail("cores", "is required in a testbed section: the host's CPU cores, a whole number >= 1")
    cores = r.integer("cores", 1, lo=1)
    cpu_scale = r.number("cpu_scale", 1.0, lo=0, lo_open=True)
    r.finish()
    return Testbed(int(_or(cores, 1)), float(_or(cpu_scale, 1.0)))


def _or(value: Any, default: Any) -> Any:
    """A reader's value, or the default where the reader failed (returned None)."""
    return default if value is None else value


def _neighbours(value: Any) -> tuple[int | None, Any]:
    if value == "auto":
        return None, "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 2:
        return value, value
    raise ValueError("allowed: auto, or a whole number >= 2 (the SecAgg+ degree, rounded up to even)")


def _dropout(r: Reader, aggregation: AggregationParams) -> Dropout:
    mode = r.choice("mode", DROPOUT_MODES, "fixed")
    rate = r.number("rate", 0.0, lo=0, hi=1)
    if r.has("stage") and r.raw("stage") in NOISE_REMOVAL_STAGES and r.raw("stage") not in aggregation.dropout_stages():
        r.fail("stage", f"is {r.raw('stage')!r}: noise is removed only with privacy.strategy xnoise or xnoise-appr")
        stage = "before_upload"
    else:
        stage = r.choice("stage", tuple(aggregation.dropout_stages()), "before_upload")
    silent = r.boolean("silent", False)
    if mode == "per_client":
        high = r.number("high", 0.99, lo=0, hi=1)
        high_fraction = r.number("high_fraction", 0.5, lo=0, hi=1)
        low = r.interval("low", (0.0, 0.1), lo=0, hi=1)
        if r.has("rate"):
            r.fail(
                "rate",
                "is not used with mode per_client (each client's probability comes from high, "
                "high_fraction and low); remove it",
            )
    else:
        high, high_fraction, low = 0.99, 0.5, (0.0, 0.1)
        for key in ("high", "high_fraction", "low"):
            if r.has(key):
                r.raw(key)
                r.fail(key, f"only applies to mode per_client, not {mode!r}")
    r.finish(extra_allowed=("high", "high_fraction", "low"))
    return Dropout(mode, rate, stage, silent, high, high_fraction, low)


def _partition(value: Any) -> tuple[Partition, Any]:
    allowed = "allowed: iid, natural, or {dirichlet: ALPHA} with ALPHA > 0"
    if value in ("iid", "natural"):
        return Partition(value), value
    if isinstance(value, dict) and list(value) == ["dirichlet"]:
        alpha = value["dirichlet"]
        if isinstance(alpha, int | float) and not isinstance(alpha, bool) and alpha > 0 and math.isfinite(alpha):
            return Partition("dirichlet", float(alpha)), {"dirichlet": float(alpha)}
    raise ValueError(allowed)


def _data(r: Reader, population: int | None) -> Data:
    dataset = r.choice("dataset", DATASETS, "digits")
    partition = r.custom("partition", Partition("iid"), _partition)
    if "partition" not in r.resolved:
        r.resolved["partition"] = "iid"
    path: str | None = None
    test_fraction, samples_per_client, writers_per_client = 0.2, 50, 1
    input_shape, classes = SYNTHETIC_SHAPE, SYNTHETIC_CLASSES
    # Each data set reads only its own keys: another's is an error naming who uses it.
    own = {
        "path": ("femnist", "cifar10"),
        "test_fraction": ("digits",),
        "samples_per_client": ("synthetic",),
        "input_shape": ("synthetic",),
        "classes": ("synthetic",),
        "writers_per_client": ("femnist",),
    }
    for key, users in own.items():
        if dataset in users:
            continue
        if r.has(key):
            r.raw(key)
            r.fail(key, f"is not used by dataset {dataset!r} (only by {' and '.join(users)})")
    if dataset in own["path"]:
        if not r.has("path"):
            r.fail(
                "path", f"is required for dataset {dataset}: the folder holding its files (no data set is downloaded)"
            )
        path = r.string("path", None)
    if dataset == "digits":
        test_fraction = r.number("test_fraction", 0.2, lo=0, hi=1, lo_open=True, hi_open=True)
    if dataset == "synthetic":
        samples_per_client = r.integer("samples_per_client", 50, lo=1)
        input_shape = r.custom("input_shape", SYNTHETIC_SHAPE, _image_shape)
        if "input_shape" not in r.resolved:
            r.resolved["input_shape"] = list(SYNTHETIC_SHAPE)
        classes = _or(r.integer("classes", SYNTHETIC_CLASSES, lo=2, hi=1000), SYNTHETIC_CLASSES)
    if dataset == "femnist":
        writers_per_client = r.integer("writers_per_client", 1, lo=1)
    if partition.kind == "natural" and dataset != "femnist":
        r.fail("partition", f"is 'natural', which needs writer ids: only femnist has them, not {dataset}")
    r.finish(extra_allowed=tuple(own))
    return Data(dataset, partition, path, test_fraction, samples_per_client, writers_per_client, input_shape, classes)


def _model(r: Reader) -> Model:
    if not r.has("params"):
        name = r.choice("name", MODELS, "cnn")
        if r.has("train_seconds_per_sample"):
            r.raw("train_seconds_per_sample")
            r.fail(
                "train_seconds_per_sample",
                f"applies only to an abstract model (model.params); model {name!r}'s training time comes from "
                f"the cost profile's train.{name}.* operation",
            )
        r.finish(extra_allowed=("params", "train_seconds_per_sample"))
        return Model(name)
    if r.has("name"):
        r.fail(
            "name",
            f"is {r.raw('name')!r}, given with params; give one: name (a real model) or params (an abstract "
            "model of that many parameters, for fidelity timing)",
        )
    params = r.integer("params", lo=1)
    rate = r.number("train_seconds_per_sample", 0.0, lo=0)
    r.finish()
    return Model(None, _or(params, 1), _or(rate, 0.0))


def _image_shape(value: Any) -> tuple[tuple[int, int, int], Any]:
    allowed = "allowed: [C, H, W], whole numbers with 1 <= C <= 4 channels and 6 <= H, W <= 256 pixels"
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise ValueError(allowed)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(allowed)
    c, h, w = value
    if not (1 <= c <= 4 and 6 <= h <= 256 and 6 <= w <= 256):
        raise ValueError(allowed)
    return (c, h, w), [c, h, w]


def _training(r: Reader) -> Training:
    t = Training(
        local_epochs=r.integer("local_epochs", 1, lo=1),
        batch_size=r.integer("batch_size", 20, lo=1),
        lr=r.number("lr", 0.05, lo=0, lo_open=True),
        momentum=r.number("momentum", 0.9, lo=0, hi=1, hi_open=True),
        weight_decay=r.number("weight_decay", 0.0, lo=0),
        server_lr=r.number("server_lr", 1.0, lo=0, lo_open=True),
        threads=r.integer("threads", 1, lo=1, hi=256),
        workers=r.integer("workers", 1, lo=1, hi=256),
    )
    r.finish()
    return t


def _timeouts(r: Reader, aggregation: AggregationParams) -> dict[str, float]:
    timeouts = {}
    steps = aggregation.steps()
    for step in steps:
        if r.has(step):
            timeouts[step] = r.number(step, lo=0, lo_open=True)
    for step in aggregation.spec.steps:
        if step not in steps and r.has(step):
            r.raw(step)
            needs = (
                "privacy.strategy xnoise or xnoise-appr"
                if step == "noise_removal"
                else "aggregation.adversary: malicious"
            )
            r.fail(step, f"is a step of {aggregation.protocol} only with {needs}")
    r.finish(extra_allowed=steps)
    return timeouts
