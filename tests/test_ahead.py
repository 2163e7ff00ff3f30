"""Clients' protocol calls made ahead on threads (``aggregation.threads``, sim.engine.ahead): the same tables,
byte for byte, as every call made in turn, over protocols, dropout stages, silent leavers, a malicious
adversary, XNoise, pipelined rounds, trace replay and a testbed; and the lanes' own rules (order, a lane
closed by a leaver, an error stopping its lane, the round's end)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.dp.noise import usable_cores
from sim.engine import ahead as ahead_module
from sim.engine.ahead import THREAD_NAME, CallsAhead
from sim.engine.virtual_round import Round
from sim.protocol.machine import SERVER, Reaction, RemoteProtocolError, Send, Work
from sim.protocol.wire import Message
from sim.runner import Simulation, run_scenario, scenario_digest
from sim.scenario import ScenarioError, load

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("rounds.csv", "clients.csv", "stages.csv")

BASE = """
name: ahead
seed: 5
rounds: 2
population: 30
sampling: {clients_per_round: 8}
clients:
  compute: {zipf_a: 1.2, slowdown: [1.0, 3.0]}
  bandwidth_mbps: {zipf_a: 1.2, range: [21, 210]}
dropout: {rate: 0.25, stage: before_upload}
data: {dataset: synthetic, samples_per_client: 10, input_shape: [1, 27, 37], classes: 10}
model: {name: linear}
training: {local_epochs: 1, batch_size: 10}
aggregation: {protocol: secagg+, bits: 20}
fidelity: full
"""


def _tables(tmp_path: Path, name: str, overrides: list[str], threads: int) -> dict[str, bytes]:
    (tmp_path / "ahead.yaml").write_text(BASE)
    scenario = load(tmp_path / "ahead.yaml", [*overrides, f"aggregation.threads={threads}"]).base()
    out = tmp_path / f"{name}-{threads}"
    rounds: list[Round] = []
    run_scenario(scenario, out, progress=False, engine=lambda sc: Simulation(sc, observe=rounds.append))
    made_ahead = sum(r.calls.ahead.taken for r in rounds if r.calls.ahead is not None)
    assert (made_ahead > 0) == (threads > 1), made_ahead  # the calls were made ahead (and only then)
    return {table: (out / table).read_bytes() for table in TABLES}


def _same_tables(tmp_path: Path, name: str, overrides: list[str], threads: tuple[int, ...] = (2,)) -> dict[str, bytes]:
    alone = _tables(tmp_path, name, overrides, 1)
    assert alone["clients.csv"].count(b"\n") > 1
    for count in threads:
        assert _tables(tmp_path, name, overrides, count) == alone, (overrides, count)
    return alone


def _trace(tmp_path: Path, overrides: list[str]) -> list[str]:
    """``overrides`` with TRACE made a trace in which client c is online from 0 until 0.02 + 0.002 c seconds:
    clients go offline at every step of the first rounds, some after their part is done."""
    trace = tmp_path / "trace.csv"
    rows = [f"{c},0,{0.02 + 0.002 * c:.6g}" for c in range(30)]
    trace.write_text("\n".join(["# dropsim availability trace v1", "client,start_s,end_s", *rows]) + "\n")
    return [o.replace("TRACE", str(trace)) for o in overrides]


CASES = {
    "secagg+": [],
    "secagg, three threads": ["aggregation.protocol=secagg"],
    "plain": ["aggregation.protocol=plain"],
    "fedavg": ["aggregation.protocol=fedavg"],
    "before share_keys": ["dropout.stage=before_share_keys", "dropout.rate=0.4"],
    "during unmasking": ["dropout.stage=during_unmasking", "dropout.rate=0.3"],
    "after sampling": ["dropout.stage=after_sampling"],
    "silent, timed out": ["dropout.silent=true", "timeouts.masked_input=5", "dropout.rate=0.3"],
    "malicious": ["aggregation.adversary=malicious", "dropout.stage=during_unmasking"],
    "xnoise": [
        "aggregation.protocol=secagg",
        "privacy={strategy: xnoise, epsilon: 6, delta: 0.001, clip: 1.0, tolerance: 0.5}",
    ],
    "pipelined xnoise": [
        "aggregation.protocol=secagg",
        "privacy={strategy: xnoise, epsilon: 6, delta: 0.001, clip: 1.0, tolerance: 0.5}",
        "pipeline={chunks: 3}",
        "dropout.stage=during_unmasking",
    ],
    "pipelined, no dispatch": ["pipeline={chunks: 2, dispatch: false}"],
    "shared cores": ["testbed={cores: 2}"],
    # clients that abort: too few of their holders left to go on (threshold 6 of a key list of 5, say)
    "clients abort": [
        "seed=3347",
        "dropout.stage=before_share_keys",
        "dropout.rate=0.375",
        "rounds=1",
        "sampling.clients_per_round=20",
    ],
    "engine testbed": [
        "costs={profile: flower}",
        "testbed={cores: 2, emulation: engine}",
        "dropout.stage=before_share_keys",
        "dropout.rate=0.3",
    ],
    "engine testbed, model with the upload request": [
        "costs={profile: flower}",
        "testbed={cores: 2, emulation: engine}",
    ],
    "trace replay": ["dropout.rate=0", "trace={file: TRACE}", "rounds=3", "sampling.clients_per_round=20"],
    "pipelined trace replay": [
        "dropout.rate=0",
        "trace={file: TRACE}",
        "rounds=3",
        "sampling.clients_per_round=20",
        "pipeline={chunks: 3}",
    ],
    "trace replay, silent": [
        "dropout.rate=0",
        "trace={file: TRACE}",
        "rounds=3",
        "sampling.clients_per_round=20",
        "dropout.silent=true",
        "timeouts={advertise_keys: 0.05, share_keys: 0.05, masked_input: 0.05, unmasking: 0.05}",
    ],
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_calls_made_ahead_give_the_same_tables(tmp_path: Path, case: str) -> None:
    overrides = _trace(tmp_path, CASES[case])
    alone = _same_tables(tmp_path, case.split(",", maxsplit=1)[0], overrides, (3,) if "three" in case else (2,))
    if "abort" in case:
        assert b"aborted: " in alone["clients.csv"]  # the case does what it says
    if "trace" in case:
        assert b",offline:" in alone["clients.csv"]


@pytest.fixture
def jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call made ahead sleeps 0-3 ms before and after: the threads finish in other orders and later than
    the simulator reaches their calls."""
    made = ahead_module._made

    def late(*args: Any) -> Any:
        time.sleep(random.random() * 0.003)
        outcome = made(*args)
        time.sleep(random.random() * 0.003)
        return outcome

    monkeypatch.setattr(ahead_module, "_made", late)


@pytest.mark.parametrize("case", ["secagg+", "clients abort", "pipelined xnoise", "pipelined trace replay"])
def test_calls_made_late_and_out_of_step_give_the_same_tables(tmp_path: Path, jitter: None, case: str) -> None:
    _same_tables(tmp_path, case, _trace(tmp_path, CASES[case]), (2, 4))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    protocol=st.sampled_from(["secagg", "secagg+"]),
    stage=st.sampled_from(["before_share_keys", "before_upload", "during_unmasking"]),
    rate=st.sampled_from([0.0, 0.125, 0.375]),
    seed=st.integers(0, 2**16),
    silent=st.booleans(),
    chunks=st.sampled_from([None, 2]),
)
def test_calls_made_ahead_give_the_same_tables_whatever_the_dropouts(
    tmp_path_factory: pytest.TempPathFactory,
    protocol: str,
    stage: str,
    rate: float,
    seed: int,
    silent: bool,
    chunks: int | None,
) -> None:
    overrides = [f"aggregation.protocol={protocol}", f"dropout.stage={stage}", f"dropout.rate={rate}", f"seed={seed}"]
    if silent:
        timeouts = "timeouts={advertise_keys: 5, share_keys: 5, masked_input: 5, unmasking: 5}"
        overrides += ["dropout.silent=true", timeouts]
    if chunks is not None:
        overrides.append(f"pipeline={{chunks: {chunks}}}")
    _same_tables(tmp_path_factory.mktemp("ahead"), "h", overrides)


def test_the_calls_are_made_on_threads_and_taken(tmp_path: Path) -> None:
    (tmp_path / "ahead.yaml").write_text(BASE)
    scenario = load(tmp_path / "ahead.yaml", ["aggregation.threads=2", "rounds=1"]).base()
    rounds: list[Round] = []
    simulation = Simulation(scenario, observe=rounds.append)
    names: set[str] = set()
    try:
        record = simulation.step().record
        ahead = rounds[0].calls.ahead
        assert ahead is not None
        # every start and receipt of the round's survivors was made ahead: 8 starts, then 3 receipts each
        # for the 6 that stay (the 2 leavers leave before the masked input, their lanes closed)
        assert record.survivors == 6
        assert ahead.taken == 8 + 6 * 3 + 2 * 1
        names = ahead.thread_names
    finally:
        simulation.close()
    assert names and all(name.startswith(THREAD_NAME) for name in names)


def test_one_thread_makes_no_call_ahead(tmp_path: Path) -> None:
    (tmp_path / "ahead.yaml").write_text(BASE)
    scenario = load(tmp_path / "ahead.yaml", ["rounds=1"]).base()
    rounds: list[Round] = []
    simulation = Simulation(scenario, observe=rounds.append)
    try:
        simulation.step()
    finally:
        simulation.close()
    assert rounds[0].calls.ahead is None
    assert scenario.protocol_threads == 1
    assert "threads" not in scenario.resolved["aggregation"]  # a scenario without the key keeps its digest


def test_timing_fidelity_makes_no_call_ahead(tmp_path: Path) -> None:
    (tmp_path / "ahead.yaml").write_text(BASE)
    scenario = load(tmp_path / "ahead.yaml", ["rounds=1", "fidelity=timing", "aggregation.threads=2"]).base()
    rounds: list[Round] = []
    simulation = Simulation(scenario, observe=rounds.append)
    try:
        simulation.step()
    finally:
        simulation.close()
    assert rounds[0].calls.ahead is None


def test_auto_takes_the_cores_this_run_may_use(tmp_path: Path) -> None:
    (tmp_path / "ahead.yaml").write_text(BASE)
    scenario = load(tmp_path / "ahead.yaml", ["rounds=1", "aggregation.threads=auto"]).base()
    assert scenario.protocol_threads is None and scenario.resolved["aggregation"]["threads"] == "auto"
    rounds: list[Round] = []
    simulation = Simulation(scenario, observe=rounds.append)
    try:
        simulation.step()
        executor = simulation.driver.setup.ahead
        if usable_cores() > 1:
            assert executor is not None and executor._max_workers == usable_cores()
            assert rounds[0].calls.ahead is not None and rounds[0].calls.ahead.taken > 0
        else:
            assert executor is None and rounds[0].calls.ahead is None
    finally:
        simulation.close()


def test_the_thread_count_leaves_the_scenario_digest_alone(tmp_path: Path) -> None:
    (tmp_path / "ahead.yaml").write_text(BASE)
    digests = {
        scenario_digest(load(tmp_path / "ahead.yaml", [f"aggregation.threads={v}"] if v else []).base())
        for v in ("", "1", "2", "auto")
    }
    assert len(digests) == 1  # a run finished on one thread is finished for two
    assert scenario_digest(load(tmp_path / "ahead.yaml", ["aggregation.bits=16"]).base()) not in digests


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "many", "300", "true"])
def test_a_bad_thread_count_is_refused_naming_the_key(tmp_path: Path, value: str) -> None:
    (tmp_path / "ahead.yaml").write_text(BASE)
    with pytest.raises(ScenarioError, match=r"aggregation\.threads"):
        load(tmp_path / "ahead.yaml", [f"aggregation.threads={value}"]).base()


# -- the lanes ------------------------------------------------------------------------------------
class _Note(Message):
    """A message of the lanes' tests: a number."""

    def __init__(self, n: int) -> None:
        self.n = n


class _Machine:
    """A client machine that notes its calls (with the thread they ran on) and replies to each message with
    nothing; a message numbered ``bad`` raises."""

    first_step = "one"
    finished = False

    def __init__(self, bad: int = -1, slow_s: float = 0.0) -> None:
        self.calls: list[tuple[object, str]] = []
        self.bad = bad
        self.slow_s = slow_s

    def start(self, update: Any, weight: float) -> Reaction:
        time.sleep(self.slow_s)
        self.calls.append(("start", threading.current_thread().name))
        return Reaction(work=(Work("x", {}),))

    def receive(self, message: Message) -> Reaction:
        assert isinstance(message, _Note)
        time.sleep(self.slow_s)
        if message.n == self.bad:
            raise RemoteProtocolError(SERVER, "bad message")
        self.calls.append((message.n, threading.current_thread().name))
        return Reaction(sends=(), work=(Work("x", {"n": message.n}),))

    def stage_of(self, message: Message) -> str:
        return "two" if isinstance(message, _Note) and message.n >= 100 else "one"


Leaves = Callable[[int, Any, Message], bool]


@contextmanager
def _lanes(
    leaves: Leaves = lambda c, m, msg: False, frames: dict[int, tuple[Message, bytes]] | None = None
) -> Iterator[CallsAhead]:
    """Calls made ahead on two threads, frames decoded as :class:`_Note`; closed, and the threads ended, after."""
    executor = ThreadPoolExecutor(2, thread_name_prefix=THREAD_NAME)
    calls = CallsAhead(executor, leaves, {} if frames is None else frames, decode=lambda frame: _Note(int(frame)))
    try:
        yield calls
    finally:
        calls.close()
        executor.shutdown()


def test_a_lane_makes_its_calls_in_order_and_gives_them_in_order() -> None:
    machine = _Machine(slow_s=0.01)
    with _lanes() as calls:
        notes = [_Note(i) for i in range(5)]
        calls.sent(7, 0, notes[0], b"0")  # before the start: held until the client starts
        calls.start(7, 0, machine, None, 1.0)  # type: ignore[arg-type]
        for note in notes[1:]:
            calls.sent(7, 0, note, str(note.n).encode())
        start = calls.take_start(7, 0)
        assert start is not None and start.result().work == (Work("x", {}),)
        for note in notes:
            taken = calls.take(7, 0, note)
            assert taken is not None and taken.result().work == (Work("x", {"n": note.n}),)
            assert isinstance(taken.received, _Note) and taken.received.n == note.n
    assert [what for what, _ in machine.calls] == ["start", 0, 1, 2, 3, 4]
    assert all(name.startswith(THREAD_NAME) for _, name in machine.calls)


def test_a_message_taken_out_of_order_is_an_error() -> None:
    with _lanes() as calls:
        first, second = _Note(1), _Note(2)
        calls.start(3, 0, _Machine(), None, 1.0)  # type: ignore[arg-type]
        calls.sent(3, 0, first, b"1")
        calls.sent(3, 0, second, b"2")
        assert calls.take_start(3, 0) is not None
        with pytest.raises(RuntimeError, match="before the _Note sent to it earlier"):
            calls.take(3, 0, second)


def test_a_leaver_closes_its_lane_and_its_later_messages_are_not_made_ahead() -> None:
    machine = _Machine()
    with _lanes(leaves=lambda c, m, msg: m.stage_of(msg) == "two") as calls:
        calls.start(1, 0, machine, None, 1.0)  # type: ignore[arg-type]
        early, leaving, after = _Note(5), _Note(100), _Note(6)
        for note in (early, leaving, after):
            calls.sent(1, 0, note, str(note.n).encode())
        assert calls.take_start(1, 0) is not None
        assert calls.take(1, 0, early) is not None
        assert calls.take(1, 0, leaving) is None  # made in turn, if at all: the client leaves first
        assert calls.take(1, 0, after) is None
    assert [what for what, _ in machine.calls] == ["start", 5]


def test_a_message_not_made_ahead_while_earlier_calls_wait_is_an_error() -> None:
    # the lane closed at its second message (the client leaves there): handling that one before the first,
    # made ahead, would mean handling them in another order than they were sent
    with _lanes(leaves=lambda c, m, msg: m.stage_of(msg) == "two") as calls:
        calls.start(2, 0, _Machine(), None, 1.0)  # type: ignore[arg-type]
        first, leaving = _Note(1), _Note(100)
        calls.sent(2, 0, first, b"1")
        calls.sent(2, 0, leaving, b"100")
        assert calls.take_start(2, 0) is not None
        with pytest.raises(RuntimeError, match="handles a _Note before the _Note sent to it earlier"):
            calls.take(2, 0, leaving)


def test_an_error_is_raised_where_the_call_is_taken_and_stops_its_lane() -> None:
    machine = _Machine(bad=2)
    with _lanes() as calls:
        calls.start(4, 0, machine, None, 1.0)  # type: ignore[arg-type]
        notes = [_Note(i) for i in range(1, 4)]
        for note in notes:
            calls.sent(4, 0, note, str(note.n).encode())
        assert calls.take_start(4, 0) is not None
        assert calls.take(4, 0, notes[0]) is not None
        failed = calls.take(4, 0, notes[1])
        assert failed is not None
        with pytest.raises(RemoteProtocolError, match="bad message"):
            failed.result()
        skipped = calls.take(4, 0, notes[2])
        assert skipped is not None and skipped.skipped
    assert [what for what, _ in machine.calls] == ["start", 1]  # nothing after the error


def test_the_rounds_end_drops_the_calls_not_begun() -> None:
    machines = [_Machine(slow_s=0.05) for _ in range(4)]
    with _lanes() as calls:
        for c, machine in enumerate(machines):
            calls.start(c, 0, machine, None, 1.0)  # type: ignore[arg-type]
            for n in range(5):
                calls.sent(c, 0, _Note(n), str(n).encode())
        calls.close()  # two threads: at most two calls under way, waited for; the rest never begin
        made = sum(len(m.calls) for m in machines)
        assert made <= 4
        time.sleep(0.1)
        assert sum(len(m.calls) for m in machines) == made


def test_replies_are_encoded_and_decoded_ahead_for_the_server() -> None:
    frames: dict[int, tuple[Message, bytes]] = {}

    class Replier(_Machine):
        def receive(self, message: Message) -> Reaction:
            assert isinstance(message, _Note)
            return Reaction(sends=(Send(SERVER, _Encodable(message.n * 10)),))

    with _lanes(frames=frames) as calls:
        calls.start(0, 0, Replier(), None, 1.0)  # type: ignore[arg-type]
        note = _Note(4)
        calls.sent(0, 0, note, b"4")
        assert calls.take_start(0, 0) is not None
        taken = calls.take(0, 0, note)
        assert taken is not None
        (reply,) = taken.result().sends
        assert frames[id(reply.message)] == (reply.message, b"40")
        decoded = calls.for_server_of(reply.message)
        assert isinstance(decoded, _Note) and decoded.n == 40
        assert calls.for_server_of(reply.message) is None  # handed over once


class _Encodable(_Note):
    def encode(self) -> bytes:
        return str(self.n).encode()
