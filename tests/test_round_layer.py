"""The sans-IO round layer on its own: the step collector's decisions and labels, record closing, Dordis
Table 1's stages and a stage gate on a plain clock. Both drivers rely on exactly these rules."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from sim.protocol.machine import Aggregate, RoundAbortedError
from sim.round.closing import close_record, expose, revealed, step_spans
from sim.round.collector import ACCEPT, CLOSE, DISCARD, GONE, MESSAGE, OUT, SKIP, UNASKED, Roster, StepCollector
from sim.round.gates import StageGate
from sim.round.records import ClientRecord, RoundRecord
from sim.round.stages import TABLE_1, gated, resources, used


@dataclass
class FakeServer:
    """A server machine reduced to what a collector reads."""

    awaited: set[int]
    step: str = "masked_input"
    outcome: str = ""
    aggregate: Aggregate | None = None
    exposed: int | None = None

    def expected(self) -> frozenset[int]:
        return frozenset(self.awaited)

    def awaits(self, client: int) -> bool:
        return client in self.awaited


def roster(*clients: int) -> Roster:
    return Roster({c: ClientRecord(client=c, slowdown=1.0, bandwidth_mbps=10.0, samples=1) for c in clients})


def test_an_answer_that_arrived_by_the_deadline_counts_even_if_read_later() -> None:
    r = roster(1, 2)
    c = StepCollector(FakeServer({1, 2}), r, timeout=1.0, now=10.0)  # type: ignore[arg-type]
    assert c.deadline == 11.0 and c.waiting() and c.awaited() == [1, 2]
    assert c.arrival(MESSAGE, 1, 11.0) is ACCEPT  # exactly at the deadline: in time
    c.took(1)
    assert r.answered == {(0, "masked_input"): {1}}
    assert c.arrival(MESSAGE, 2, 11.5) is CLOSE  # after it: the step closes, the awaited are late
    assert c.missed == [1, 2]  # the fake machine still expects 1 (it never removes anyone)
    assert r.records[2].dropped_stage == "timeout:masked_input"
    assert r.late == {1, 2} and r.excluded(2)


def test_a_departure_takes_a_client_out_and_is_labelled_only_with_a_reason() -> None:
    r = roster(1, 2, 3)
    c = StepCollector(FakeServer({1, 2, 3}), r, timeout=None, now=0.0)  # type: ignore[arg-type]
    assert c.deadline is None
    assert c.arrival(GONE, 1, 0.5) is SKIP
    assert c.arrival(GONE, 2, 0.6, reason="bad frame") is SKIP
    assert c.waiting() and c.awaited() == [3]
    assert r.departed == {1: ("masked_input", 0.5), 2: ("masked_input", 0.6)}
    assert r.records[1].dropped_stage == "" and r.records[2].dropped_stage == "rejected: bad frame"
    assert c.arrival(OUT, 3, 0.7) is SKIP and 3 not in r.departed  # news from another instance only wakes


def test_late_refused_and_unasked_messages() -> None:
    r = roster(1, 2, 3)
    r.miss(1, "share_keys")
    r.reject(2, "a replayed message")
    c = StepCollector(FakeServer({1, 2}), r, timeout=None, now=0.0)  # type: ignore[arg-type]
    assert c.arrival(MESSAGE, 1, 0.1) is DISCARD
    assert c.arrival(MESSAGE, 2, 0.1) is DISCARD
    assert c.arrival(MESSAGE, 3, 0.1) is UNASKED
    r.depart(3, "masked_input", 0.15)  # it left: what was on its way is only late news
    assert c.arrival(MESSAGE, 3, 0.2) is DISCARD
    assert c.unasked("MaskedInput") == "a message it was not asked for in step masked_input (MaskedInput)"
    assert r.records[1].dropped_stage == "timeout:share_keys"
    assert r.records[2].dropped_stage == "rejected: a replayed message"


def test_a_lazy_deadline_counts_from_the_first_message() -> None:
    r = roster(1, 2)
    c = StepCollector(FakeServer({1, 2}), r, timeout=2.0, now=0.0, lazy=True)  # type: ignore[arg-type]
    assert c.deadline is None
    assert c.arrival(GONE, 9, 5.0) is SKIP and c.deadline is None  # a departure does not start it
    assert c.arrival(MESSAGE, 1, 5.0) is ACCEPT and c.deadline == 7.0
    assert c.arrival(MESSAGE, 2, 7.5) is CLOSE and r.late == {1, 2}


def test_expire_uses_who_was_awaited_when_the_driver_last_asked() -> None:
    # a driver asks waiting(), then waits; clients leaving meanwhile are still those the deadline finds late
    r = roster(1, 2)
    c = StepCollector(FakeServer({1, 2}), r, timeout=1.0, now=0.0)  # type: ignore[arg-type]
    assert c.waiting() and c.awaited() == [1, 2]
    r.depart(2, "masked_input", 0.5)
    assert c.expire() == [1, 2]


def test_liars_found_when_a_step_cannot_close_are_refused_once() -> None:
    r = roster(1, 2, 3)
    r.reject(3, "earlier")
    blamed = r.blame(RoundAbortedError("shares contradict", suspects=(1, 3, 7)))
    assert blamed == [1]
    assert r.records[1].dropped_stage == "rejected: shares contradict"
    assert r.records[3].dropped_stage == "rejected: earlier"


def test_closing_counts_and_labels() -> None:
    r = roster(1, 2, 3, 4)
    r.miss(2, "unmasking")
    r.records[3].dropped_stage = "before_upload"
    rec = RoundRecord(round=1, t_start=0.0, t_end=2.0)
    close_record(rec, r, [4, 3, 2, 1], {1}, planned_drops=1)
    assert [c.client for c in rec.clients] == [4, 3, 2, 1]
    assert [c.dropped_stage for c in rec.clients] == ["not aggregated", "before_upload", "timeout:unmasking", ""]
    assert (rec.survivors, rec.dropped_planned, rec.timed_out) == (1, 1, 1)


def test_what_the_server_revealed() -> None:
    done = FakeServer(set(), aggregate=Aggregate([0.0], (1, 2, 3), 3.0))
    unmasked = FakeServer(set(), exposed=5)
    nothing = FakeServer(set())
    assert [revealed(s) for s in (done, unmasked, nothing)] == [3, 5, None]  # type: ignore[arg-type]
    rec = RoundRecord(round=1, t_start=0.0)
    expose(rec, [done, unmasked, nothing], pipelined=True)  # type: ignore[list-item]
    assert rec.exposures == [3, 5] and rec.exposed == 3
    expose(rec, [unmasked], pipelined=False)  # type: ignore[list-item]
    assert rec.exposures == [] and rec.exposed == 5


def test_step_spans_cover_every_chunk() -> None:
    chunks = [("a", 0.0, 1.0), ("a", 0.5, 1.5), ("b", 1.0, 2.0), ("b", 1.5, 3.0)]
    assert step_spans(chunks) == [("a", 0.0, 1.5), ("b", 1.0, 3.0)]


def test_table_1_is_one_definition() -> None:
    assert [s.name for s in TABLE_1] == [
        "chunk.mask",
        "chunk.upload",
        "chunk.aggregate",
        "chunk.dispatch",
        "chunk.decode",
    ]
    assert resources("shared") == ("client.cpu", "client.link", "server.cpu", "client.link", "client.cpu")
    assert resources("duplex")[1::2] == ("client.uplink", "client.downlink")
    assert gated("client.cpu", "shared", True) == (1, 5) and gated("client.cpu", "shared", False) == (1,)
    assert gated("client.link", "shared", True) == (2, 4) and gated("client.link", "shared", False) == (2,)
    assert gated("client.uplink", "duplex", True) == (2,) and gated("client.downlink", "duplex", True) == (4,)
    assert [s.number for s in used(False)] == [1, 2, 3]


@dataclass
class Clock:
    """A clock a test moves by hand; its events record that they fired."""

    now: float = 0.0
    fired: list[Event] = field(default_factory=list)

    def event(self) -> Event:
        return Event(self)


@dataclass
class Event:
    clock: Clock
    done: bool = False

    def succeed(self, value: object = None) -> object:
        self.done = True
        self.clock.fired.append(self)
        return self


@given(st.integers(1, 4), st.lists(st.floats(0.1, 5.0), min_size=2, max_size=2))
def test_a_gate_runs_stages_in_the_hyades_order(chunks: int, lengths: list[float]) -> None:
    """Stage 2 of chunk c waits for chunk c-1 and for every chunk's stage 1 (Hyades appendix F, eq. 19),
    driven by hand: each admitted task runs its length, then is released."""
    clock = Clock()
    gate = StageGate(clock, "link", (1, 2), chunks)
    pending = {(s, c): gate.admit(s, c) for s in (1, 2) for c in range(chunks)}
    order: list[tuple[int, int]] = []
    while pending:
        ready = [key for key, event in pending.items() if event.done]
        assert len(ready) == 1, ready  # one task at a time
        stage, chunk = ready[0]
        del pending[ready[0]]
        order.append((stage, chunk))
        clock.now += lengths[stage - 1]
        gate.release(stage, chunk)
    assert order == [(1, c) for c in range(chunks)] + [(2, c) for c in range(chunks)]
    assert math.isclose(clock.now, chunks * sum(lengths))
    assert [s[:2] for s in gate.spans] == order


def test_where_a_planned_dropout_leaves() -> None:
    from sim.protocol.params import AggregationParams
    from sim.protocol.secagg.spec import SECAGG
    from sim.round.departure import STAYS, Departure

    secagg = AggregationParams("secagg")
    assert Departure.plan(SECAGG, secagg, "") == STAYS and not STAYS.before("upload") and not STAYS.before_download
    assert Departure.plan(SECAGG, secagg, "after_sampling").before_download
    before = Departure.plan(SECAGG, secagg, "before_upload")
    assert before.before("masked_input") and not before.before("share_keys") and not before.waits_for_uploads
    assert Departure.plan(SECAGG, secagg, "during_unmasking").waits_for_uploads  # after the uploads: they go first
    try:
        Departure.plan(SECAGG, secagg, "during_noise_removal")  # only where noise is removed
    except ValueError as exc:
        assert "is not one of secagg's" in str(exc)
    else:
        raise AssertionError("an unknown stage was accepted")
