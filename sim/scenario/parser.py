"""The scenario parser: checks a scenario document into the frozen types of :mod:`sim.scenario.types`.

Every value is checked where it is read; all problems are reported together (one :class:`ScenarioError`).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from sim.dp.strategies import STRATEGIES, plugin_strategy, strategy_named
from sim.plugins import GROUPS, PluginError, is_import_path, is_installed, resolve
from sim.protocol.params import AggregationParams
from sim.protocol.registry import PROTOCOLS, optional_stages, spec_of
from sim.protocol.spec import ProtocolSpec, either
from sim.scenario.dropout_modes import DEFAULT_MODE, MODES, dropout_mode, may_drop
from sim.scenario.errors import ScenarioError
from sim.scenario.reader import MAX_INTEGER, Reader, as_number, shown
from sim.scenario.source import Document
from sim.scenario.types import (
    DATASETS,
    DEVICE_PATTERN,
    EMULATIONS,
    FIDELITIES,
    LINK_MODELS,
    LOADER,
    MAX_CHUNKS,
    MECHANISMS,
    MODELS,
    SYNTHETIC_CLASSES,
    SYNTHETIC_SHAPE,
    TRACE_SAMPLING,
    BandwidthProfile,
    Clients,
    Data,
    Dropout,
    Evaluation,
    Model,
    Partition,
    Pipelining,
    Privacy,
    Sampling,
    Scenario,
    Server,
    Testbed,
    TraceReplay,
    Training,
    ZipfProfile,
)


def parse(doc: Document, default_name: str | None = None) -> Scenario:
    """Check and resolve a scenario document (without a ``sweep`` key: see :mod:`sim.scenario.grid`)."""
    r = Reader(doc, doc.data)
    name = r.string("name", default_name or Path(doc.name).stem)
    seed = r.integer("seed", 0, lo=0, hi=2**63 - 1)
    rounds = r.integer("rounds", lo=1)
    population = r.integer("population", lo=1, hi=2**62)  # client ids and their permutation are 64-bit

    sampling = _sampling(r.section("sampling"), population)
    clients = _clients(r.section("clients"))
    s = r.section("server")
    server = Server(
        bandwidth_mbps=s.number("bandwidth_mbps", 1000.0, lo=0, lo_open=True),
        speed=s.number("speed", 1.0, lo=0, lo_open=True),
        latency_ms=s.number("latency_ms", 0.0, lo=0),
    )
    s.finish()
    aggregation, protocol_threads = _aggregation(r.section("aggregation"), sampling)
    spec = spec_of(aggregation)
    privacy = _privacy(r.section("privacy"), spec, aggregation, sampling, population)
    aggregation = dataclasses.replace(aggregation, strategy=privacy.strategy, collusion=privacy.collusion)
    steps = spec.steps_for(aggregation)
    dropout = _dropout(r.section("dropout"), spec, aggregation)
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
    timeouts = _timeouts(r.section("timeouts"), spec, aggregation)
    trace = _trace(r.section("trace"))
    pipeline = None
    if r.has("pipeline"):
        pipeline = _pipeline(r.section("pipeline"), spec, aggregation)
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
    if testbed is not None and testbed.emulation == "engine" and pipeline is not None:
        r.fail(
            ("testbed", "emulation"),
            "is engine: a simulation engine's workers run one client message at a time, whole, so a round on it "
            "is not pipelined; drop the pipeline section or choose another emulation",
        )
    try:
        can_drop = may_drop(dropout_mode(dropout), dropout)
    except PluginError:  # a plug-in that failed to build: reported above
        can_drop = False
    except Exception as exc:  # a plug-in's can_drop that fails
        r.fail(("dropout", "model"), f"{dropout.model}.can_drop raised {type(exc).__name__}: {exc}")
        can_drop = False
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
        waits_in = spec.dropout_stages_for(aggregation)[dropout.stage] or steps[0]
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
        protocol_threads=protocol_threads,
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


def _aggregation(r: Reader, sampling: Sampling) -> tuple[AggregationParams, int | None]:
    """The protocol's parameters, and the threads its clients' calls are made on (``threads``: resolved only
    when given, so that a scenario without it keeps its digest)."""
    protocol = r.choice("protocol", tuple(PROTOCOLS), AggregationParams.protocol)
    bits = r.integer("bits", 20, lo=2, hi=32)
    clip = r.number("clip", 1.0, lo=0, lo_open=True)
    threshold = r.number("threshold", 0.5, lo=0, hi=1, hi_open=True)
    neighbours = r.custom("neighbours", None, _neighbours)
    if "neighbours" not in r.resolved:
        r.resolved["neighbours"] = "auto"
    adversary = r.choice("adversary", ("semi-honest", "malicious"), "semi-honest")
    params = AggregationParams(protocol, bits, clip, threshold, neighbours, adversary == "malicious")
    spec_of(params).check_aggregation(params, sampling.clients_per_round, PROTOCOLS, r.fail)
    threads: int | None = 1
    if r.has("threads"):
        threads = r.custom("threads", threads, _threads)
    r.finish()
    return params, threads


def _privacy(
    r: Reader, spec: ProtocolSpec, aggregation: AggregationParams, sampling: Sampling, population: int | None
) -> Privacy:
    d = Privacy()
    raw = r.raw("strategy")
    if isinstance(raw, str) and raw not in STRATEGIES and (is_import_path(raw) or is_installed("strategy", raw)):
        strategy = r.string("strategy")
        try:
            plugin_strategy(strategy, r.where("strategy"))  # imported and checked against the interface now
        except PluginError as exc:
            r.failed("strategy", exc)
            strategy = d.strategy
    else:
        strategy = _built_in(r, "strategy", tuple(STRATEGIES), d.strategy, "strategy")
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
    spec.check_privacy(aggregation, strategy_named(p.strategy), p.collusion, PROTOCOLS, r.fail)
    if not r.has("strategy") and any(r.has(key) for key in ("epsilon", "delta", "mechanism", "tolerance")):
        r.fail(
            "strategy",
            "is missing: a privacy section without a strategy adds no noise (strategy none); name one, e.g. "
            "xnoise, or none to run without DP",
        )
    spec.check_collusion(
        aggregation, p.collusion, p.enabled, sampling.clients_per_round, sampling.rate, population, r.fail
    )
    r.finish()
    return p


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


def _pipeline(r: Reader, spec: ProtocolSpec, aggregation: AggregationParams) -> Pipelining:
    chunks = r.custom("chunks", None, _chunks)
    if "chunks" not in r.resolved:
        r.resolved["chunks"] = "auto"
    dispatch = r.boolean("dispatch", True)
    max_chunks = r.integer("max_chunks", 20, lo=1, hi=MAX_CHUNKS)
    links = r.choice("links", LINK_MODELS, "shared")
    if chunks is not None and r.has("max_chunks"):
        r.fail("max_chunks", f"bounds the choice of chunks: auto, but chunks is {chunks}: drop max_chunks or set auto")
    spec.check_pipeline(aggregation, PROTOCOLS, r.fail)
    r.finish()
    return Pipelining(chunks, bool(_or(dispatch, True)), int(_or(max_chunks, 20)), str(_or(links, "shared")))


def _testbed(r: Reader) -> Testbed:
    if not r.has("cores"):
        r.fail("cores", "is required in a testbed section: the host's CPU cores, a whole number >= 1")
    cores = r.integer("cores", 1, lo=1)
    cpu_scale = r.number("cpu_scale", 1.0, lo=0, lo_open=True)
    emulation = "process"
    if r.has("emulation"):  # resolved only when given: a testbed without it keeps its digest
        emulation = r.choice("emulation", EMULATIONS, "process")
    r.finish()
    return Testbed(int(_or(cores, 1)), float(_or(cpu_scale, 1.0)), str(_or(emulation, "process")))


def _built_in(r: Reader, key: str, names: tuple[str, ...], default: str, kind: str) -> str:
    """``r.choice`` of a key that also takes a plug-in's name: its problem says so."""
    before = len(r.problems)
    value = r.choice(key, names, default)
    if len(r.problems) > before:
        last = r.problems[-1]
        path = "an import path module:Name or " if kind == "strategy" else ""
        hint = f"; or a plug-in: {path}an installed {GROUPS[kind]} entry point's name (docs/plugins.md)"
        head, mean, rest = last.message.partition("; did you mean")
        r.problems[-1] = dataclasses.replace(last, message=head + hint + mean + rest)
    return value


def _or(value: Any, default: Any) -> Any:
    """A reader's value, or the default where the reader failed (returned None)."""
    return default if value is None else value


def _threads(value: Any) -> tuple[int | None, Any]:
    """``aggregation.threads``: a count, or ``auto`` (None: the cores the run may use, found when it starts)."""
    if value == "auto":
        return None, "auto"
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 256:
        return value, value
    raise ValueError("allowed: auto (the cores this run may use), or a whole number of threads from 1 to 256")


def _neighbours(value: Any) -> tuple[int | None, Any]:
    if value == "auto":
        return None, "auto"
    if isinstance(value, int) and not isinstance(value, bool) and 2 <= value <= MAX_INTEGER:
        return value, value
    raise ValueError("allowed: auto, or a whole number >= 2 (the SecAgg+ degree, rounded up to even), at most 2^63 - 1")


def _dropout(r: Reader, spec: ProtocolSpec, aggregation: AggregationParams) -> Dropout:
    raw = r.raw("mode")
    if r.has("model") or (isinstance(raw, str) and raw not in MODES and is_installed("dropout", raw)):
        return _dropout_plugin(r, spec, aggregation)
    mode = _built_in(r, "mode", tuple(MODES), DEFAULT_MODE, "dropout")
    rate = r.number("rate", 0.0, lo=0, hi=1)
    stage = _dropout_stage(r, spec, aggregation)
    silent = r.boolean("silent", False)
    # Keys only some modes read: the mode declares and reads its own (per_client's high, high_fraction, low).
    own = MODES[mode].keys
    options = MODES[mode].read_options(r)
    if not MODES[mode].uses_rate and r.has("rate"):
        r.fail(
            "rate",
            f"is not used with mode {mode} (each client's probability comes from {either(own, 'and')}); remove it",
        )
    keys = tuple(dict.fromkeys(key for m in MODES.values() for key in m.keys))
    for key in keys:
        if key not in own and r.has(key):
            r.raw(key)
            users = [name for name, m in MODES.items() if key in m.keys]
            r.fail(key, f"only applies to mode {either(users)}, not {mode!r}")
    if r.has("args"):
        r.raw("args")
        r.fail("args", "are a plug-in dropout model's arguments: they need dropout.model")
    r.finish(extra_allowed=(*keys, "model"))
    return Dropout(mode, rate, stage, silent, options)


def _dropout_stage(r: Reader, spec: ProtocolSpec, aggregation: AggregationParams) -> str:
    conditional = optional_stages()
    stages = spec.dropout_stages_for(aggregation)
    if r.has("stage") and r.raw("stage") in tuple(conditional) and r.raw("stage") not in stages:
        condition = conditional[r.raw("stage")]
        r.fail("stage", f"is {r.raw('stage')!r}: {condition.purpose} only with {condition.needs()}")
        return "before_upload"
    return r.choice("stage", tuple(stages), "before_upload")


def _plugin_key(r: Reader, own: str, built_in: str, names: tuple[str, ...]) -> str:
    """The key a plug-in is named under: its own (``own``, e.g. ``loader``) if given, else ``built_in`` (e.g.
    ``dataset``) holding an installed plug-in's name; both given is a problem."""
    if not r.has(own):
        return built_in
    if r.has(built_in):
        r.fail(
            built_in,
            f"is {shown(r.raw(built_in))}, given with {own}; give one: {built_in} (a built-in: {', '.join(names)}) "
            f"or {own} (a plug-in)",
        )
    return own


def _dropout_plugin(r: Reader, spec: ProtocolSpec, aggregation: AggregationParams) -> Dropout:
    """A plug-in dropout model: ``model`` (or ``mode``, an installed entry point's name) and its ``args``."""
    key = _plugin_key(r, "model", "mode", tuple(MODES))
    name = r.string(key)
    args = r.mapping("args")
    stage = _dropout_stage(r, spec, aggregation)
    silent = r.boolean("silent", False)
    mode = None
    if name:
        try:
            mode = dropout_mode(Dropout(name, 0.0, stage, bool(silent), args, model=name), r.where(key))
        except PluginError as exc:
            r.failed(key, exc)
    rate = 0.0
    if mode is not None and mode.uses_rate:
        rate = r.number("rate", 0.0, lo=0, hi=1)
    elif r.has("rate"):
        r.raw("rate")
        if mode is not None:  # else the model's problem is reported
            r.fail("rate", f"is not used by dropout model {name} (its uses_rate is False); remove it")
    r.finish()
    return Dropout(name or "", _or(rate, 0.0), stage, bool(silent), args, model=name or "")


def _partition(value: Any) -> tuple[Partition, Any]:
    allowed = "allowed: iid, natural, or {dirichlet: ALPHA} with ALPHA > 0"
    if value in ("iid", "natural"):
        return Partition(value), value
    if isinstance(value, dict) and list(value) == ["dirichlet"]:
        alpha = value["dirichlet"]
        number = as_number(alpha) if isinstance(alpha, int | float) else None  # (an int beyond floats: inf)
        if number is not None and number > 0 and math.isfinite(number):
            return Partition("dirichlet", number), {"dirichlet": number}
    raise ValueError(allowed)


def _data(r: Reader, population: int | None) -> Data:
    raw = r.raw("dataset")
    if r.has("loader") or (isinstance(raw, str) and raw not in DATASETS and is_installed("dataset", raw)):
        return _data_plugin(r)
    if r.has("args"):
        r.raw("args")
        r.fail("args", "are a data loader's arguments: they need data.loader")
    dataset = _built_in(r, "dataset", DATASETS, "digits", "dataset")
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
    r.finish(extra_allowed=(*own, "loader"))
    return Data(dataset, partition, path, test_fraction, samples_per_client, writers_per_client, input_shape, classes)


_BUILT_IN_DATA_KEYS = ("path", "test_fraction", "samples_per_client", "input_shape", "classes", "writers_per_client")


def _data_plugin(r: Reader) -> Data:
    """A user's data: ``loader`` (or ``dataset``, an installed entry point's name) and its ``args``; ``partition``
    cuts a loader's ``train`` set among the clients (a loader's ``clients`` are taken as given)."""
    key = _plugin_key(r, "loader", "dataset", DATASETS)
    loader = r.string(key) or ""
    args = r.mapping("args")
    partition = Partition("iid")
    if r.has("partition"):  # resolved only when given: a loader's clients need none
        partition = r.custom("partition", Partition("iid"), _partition)
    for other in _BUILT_IN_DATA_KEYS:
        if r.has(other):
            r.raw(other)
            r.fail(other, f"is a built-in data set's key, not used with a {key} plug-in (its args are)")
    if loader:  # else its problem is reported
        try:
            resolve("dataset", loader, r.where(key))
        except PluginError as exc:
            r.failed(key, exc)
    r.finish(extra_allowed=_BUILT_IN_DATA_KEYS)
    return Data(LOADER, partition, None, 0.2, 50, 1, loader=loader, args=args)


def _model(r: Reader) -> Model:
    raw = r.raw("name")
    if r.has("factory") or (isinstance(raw, str) and raw not in MODELS and is_installed("model", raw)):
        return _model_plugin(r)
    if r.has("args"):
        r.raw("args")
        r.fail("args", "are a model factory's arguments: they need model.factory")
    if not r.has("params"):
        name = _built_in(r, "name", MODELS, "cnn", "model")
        if r.has("train_seconds_per_sample"):
            r.raw("train_seconds_per_sample")
            r.fail(
                "train_seconds_per_sample",
                f"applies only to an abstract model (model.params) or a factory; model {name!r}'s training time "
                f"comes from the cost profile's train.{name}.* operation",
            )
        r.finish(extra_allowed=("params", "train_seconds_per_sample", "factory"))
        return Model(name)
    if r.has("name"):
        r.fail(
            "name",
            f"is {shown(r.raw('name'))}, given with params; give one: name (a real model) or params (an abstract "
            "model of that many parameters, for fidelity timing)",
        )
    params = r.integer("params", lo=1)
    rate = r.number("train_seconds_per_sample", 0.0, lo=0)
    r.finish(extra_allowed=("factory",))
    return Model(None, _or(params, 1), _or(rate, 0.0))


def _model_plugin(r: Reader) -> Model:
    """A user's model: ``factory`` (or ``name``, an installed entry point's name) and its ``args``; its training
    time from the cost profile or ``train_seconds_per_sample``."""
    key = "factory" if r.has("factory") else "name"
    for other in ("name", "params"):
        if other != key and r.has(other):
            r.fail(
                other,
                f"is {shown(r.raw(other))}, given with {key}; give one: name (a built-in model), params (an "
                "abstract model) or factory (a plug-in)",
            )
    factory = r.string(key) or ""
    args = r.mapping("args")
    rate = 0.0
    if r.has("train_seconds_per_sample"):
        rate = _or(r.number("train_seconds_per_sample", 0.0, lo=0), 0.0)
    if factory:  # else its problem is reported
        try:
            resolve("model", factory, r.where(key))
        except PluginError as exc:
            r.failed(key, exc)
    r.finish()
    return Model(None, None, rate, factory=factory, args=args)


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
        device=_device(r),
        clients_at_once=_clients_at_once(r),
    )
    r.finish()
    return t


def _device(r: Reader) -> str:
    """``training.device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether this machine has it is
    ``dropsim check``'s and the run's to say: a scenario file is read on other machines too)."""
    value = r.raw("device")
    if value is None:
        r.resolved["device"] = "auto"
        return "auto"
    if not isinstance(value, str) or not DEVICE_PATTERN.fullmatch(value):
        r.fail("device", f"is {shown(value)}; allowed: auto, cpu, cuda or cuda:N (N a GPU's index)")
        return "auto"
    r.resolved["device"] = value
    return value


def _clients_at_once(r: Reader) -> int | None:
    """``training.clients_at_once``: ``auto`` (None) or a whole number >= 1."""
    value = r.raw("clients_at_once")
    if value is None or value == "auto":
        r.resolved["clients_at_once"] = "auto"
        return None
    if isinstance(value, str):
        r.fail("clients_at_once", f"is {shown(value)}; allowed: auto or a whole number >= 1")
        return None
    return r.integer("clients_at_once", lo=1)


def _timeouts(r: Reader, spec: ProtocolSpec, aggregation: AggregationParams) -> dict[str, float]:
    timeouts = {}
    steps = spec.steps_for(aggregation)
    for step in steps:
        if r.has(step):
            timeouts[step] = r.number(step, lo=0, lo_open=True)
    for step in spec.steps:
        if step not in steps and r.has(step):
            r.raw(step)
            r.fail(step, f"is a step of {aggregation.protocol} only with {spec.step_needs(step)}")
    r.finish(extra_allowed=steps)
    return timeouts
