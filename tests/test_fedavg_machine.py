"""Tests for the sans-IO FedAvg machines (sim.protocol.fedavg): exact aggregates, legal and illegal input.

The server's aggregate is ``(sum_i w_i * delta_i / sum_i w_i)`` formed in float64 in ascending client order,
then cast to float32; the tests compute it by hand the same way and compare bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sim.protocol.fedavg import ClientUpdate, FedAvgClient, FedAvgServer
from sim.protocol.machine import SERVER, LocalProtocolError, Reaction, RemoteProtocolError, Send, Work
from sim.protocol.messages import ModelDownload
from sim.protocol.wire import Blank, Vector, decode

# ------------------------------------------------------------------------------------------- helpers

ROUND = 3
SAMPLED = (1, 4, 7)
DIM = 4
F32 = np.dtype("<f4")


def _array(vector: Vector) -> np.ndarray:
    assert isinstance(vector, np.ndarray), vector
    return vector


def _expected_mean(updates: dict[int, tuple[float, np.ndarray]], dim: int) -> np.ndarray:
    """The weighted mean by hand: float64 sums in ascending client order, divided, cast to float32."""
    acc = np.zeros(dim, dtype=np.float64)
    total = 0.0
    for client in sorted(updates):
        weight, delta = updates[client]
        acc += weight * delta.astype(np.float64)
        total += weight
    return (acc / total).astype(np.float32)


def _delta(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def _update(client: int, weight: float = 10.0, delta: np.ndarray | None = None, round_: int = ROUND) -> ClientUpdate:
    return ClientUpdate(round_, client, weight, _delta(1.0, 2.0, 3.0, 4.0) if delta is None else delta)


def _snapshot(server: FedAvgServer) -> tuple[object, ...]:
    return (server.step, server.outcome, server.aggregate, server.expected())


# ----------------------------------------------------------------------------------- aggregation


def test_two_clients_weighted_mean_known_answer() -> None:
    server = FedAvgServer(ROUND, SAMPLED, DIM)
    assert server.begin() == Reaction()
    assert server.expected() == frozenset(SAMPLED)
    server.receive(7, _update(7, 30.0, _delta(4.0, 0.0, -8.0, 1.0)))
    server.receive(1, _update(1, 10.0, _delta(0.0, 4.0, 8.0, 1.0)))
    assert server.expected() == frozenset({4})
    server.close_step()
    assert server.step == "done"
    assert server.outcome == "ok"
    assert server.aggregate is not None
    # (10 * (0, 4, 8, 1) + 30 * (4, 0, -8, 1)) / 40 = (120, 40, -160, 40) / 40 = (3, 1, -4, 1)
    assert _array(server.aggregate.vector).dtype == np.float32
    assert _array(server.aggregate.vector).tolist() == [3.0, 1.0, -4.0, 1.0]
    assert server.aggregate.survivors == (1, 7)
    assert server.aggregate.weight == 40.0
    assert server.expected() == frozenset()


@st.composite
def _rounds(draw: st.DrawFn) -> tuple[int, list[int], dict[int, tuple[float, np.ndarray]]]:
    dim = draw(st.integers(0, 20))
    sampled = sorted(draw(st.sets(st.integers(0, 10_000), min_size=1, max_size=10)))
    uploaders = draw(st.lists(st.sampled_from(sampled), min_size=1, unique=True))
    vectors = hnp.arrays(np.float32, dim, elements=st.floats(-1e6, 1e6, width=32))
    weights = st.one_of(st.integers(1, 10_000).map(float), st.floats(1e-3, 1e6))
    updates = {c: (draw(weights), draw(vectors)) for c in uploaders}
    return dim, sampled, updates


@settings(max_examples=150, deadline=None)
@given(round_data=_rounds(), data=st.data())
def test_aggregate_is_exact_weighted_mean_in_any_arrival_order(
    round_data: tuple[int, list[int], dict[int, tuple[float, np.ndarray]]], data: st.DataObject
) -> None:
    dim, sampled, updates = round_data
    arrivals = data.draw(st.permutations(sorted(updates)), label="arrival order")
    results = []
    for sequence in (sorted(arrivals), arrivals, sorted(arrivals, reverse=True)):
        server = FedAvgServer(5, tuple(sampled), dim)
        for client in sequence:
            weight, delta = updates[client]
            reaction = server.receive(client, ClientUpdate(5, client, weight, delta))
            assert reaction == Reaction(work=(Work("fedavg.accumulate", {"elements": dim}),))
        assert server.close_step() == Reaction(work=(Work("fedavg.finalize", {"elements": dim}),))
        assert server.aggregate is not None
        results.append(server.aggregate)
    expected = _expected_mean(updates, dim)
    for aggregate in results:
        assert isinstance(aggregate.vector, np.ndarray)
        assert _array(aggregate.vector).dtype == np.float32
        assert _array(aggregate.vector).tobytes() == expected.tobytes()
        assert aggregate.survivors == tuple(sorted(updates))
        assert aggregate.weight == sum(updates[c][0] for c in sorted(updates))


def test_blank_updates_give_a_blank_aggregate() -> None:
    server = FedAvgServer(ROUND, SAMPLED, 1000)
    server.receive(4, ClientUpdate(ROUND, 4, 5.0, Blank(1000, F32)))
    server.receive(1, ClientUpdate(ROUND, 1, 3.0, Blank(1000, F32)))
    reaction = server.close_step()
    assert reaction.work == (Work("fedavg.finalize", {"elements": 1000}),)
    assert server.aggregate is not None
    assert server.aggregate.vector == Blank(1000, F32)
    assert server.aggregate.survivors == (1, 4)
    assert server.aggregate.weight == 8.0


def test_client_and_server_over_the_wire() -> None:
    """Clients' messages go through encode/decode on the way to the server, as on a real socket."""
    server = FedAvgServer(ROUND, SAMPLED, DIM)
    local = {1: (2.0, _delta(1, 1, 1, 1)), 4: (6.0, _delta(-1, 3, 5, 9)), 7: (8.0, _delta(0.5, 0, 0, 2))}
    work: list[Work] = []
    for client in (7, 1, 4):
        machine = FedAvgClient(ROUND, client)
        reaction = machine.start(local[client][1], local[client][0])
        assert reaction.work == ()
        (send,) = reaction.sends
        assert send.to == SERVER
        assert isinstance(send.message, ClientUpdate)
        work += server.receive(client, decode(send.message.encode())).work
    work += server.close_step().work
    assert work == [Work("fedavg.accumulate", {"elements": DIM})] * 3 + [Work("fedavg.finalize", {"elements": DIM})]
    assert server.aggregate is not None
    assert _array(server.aggregate.vector).tobytes() == _expected_mean(local, DIM).tobytes()
    # by hand: (2*(1,1,1,1) + 6*(-1,3,5,9) + 8*(0.5,0,0,2)) / 16 = (0, 20, 32, 72) / 16
    assert _array(server.aggregate.vector).tolist() == [0.0, 1.25, 2.0, 4.5]


# --------------------------------------------------------------------------------- illegal input

_ILLEGAL = [
    pytest.param(1, _update(1, 99.0, _delta(9, 9, 9, 9)), "sent a second update in one round", id="second-update"),
    pytest.param(2, _update(2), "is not sampled in this round", id="not-sampled"),
    pytest.param(4, _update(4, round_=ROUND - 1), "sent an update for round 2, this is 3", id="wrong-round"),
    pytest.param(4, _update(7), "sent an update claiming to be client 7", id="claims-other-id"),
    pytest.param(4, _update(4, delta=_delta(1, 2, 3)), "sent 3 values, expected 4", id="too-short"),
    pytest.param(4, _update(4, delta=_delta(1, 2, 3, 4, 5)), "sent 5 values, expected 4", id="too-long"),
    pytest.param(4, ClientUpdate(ROUND, 4, 1.0, Blank(5, F32)), "sent 5 values", id="blank-wrong-length"),
    pytest.param(4, _update(4, weight=0.0), "sent weight 0.0", id="zero-weight"),
    pytest.param(4, _update(4, weight=-2.0), "sent weight -2.0", id="negative-weight"),
    pytest.param(4, _update(4, weight=float("nan")), "sent weight nan", id="nan-weight"),
    pytest.param(4, _update(4, weight=float("inf")), "sent weight inf", id="inf-weight"),
    pytest.param(4, ModelDownload(ROUND, _delta(1, 2, 3, 4)), "sent ModelDownload", id="wrong-type"),
]


@pytest.mark.parametrize(("sender", "message", "reason"), _ILLEGAL)
def test_illegal_update_names_the_peer_and_changes_nothing(sender: int, message: object, reason: str) -> None:
    server = FedAvgServer(ROUND, SAMPLED, DIM)
    server.receive(1, _update(1, 10.0, _delta(1, 2, 3, 4)))
    before = _snapshot(server)
    with pytest.raises(RemoteProtocolError) as info:
        server.receive(sender, message)
    assert info.value.peer == sender
    assert reason in info.value.reason
    assert str(info.value).startswith(f"client {sender}: ")
    assert _snapshot(server) == before
    # the machine goes on exactly as a twin that never saw the illegal message
    twin = FedAvgServer(ROUND, SAMPLED, DIM)
    twin.receive(1, _update(1, 10.0, _delta(1, 2, 3, 4)))
    for machine in (server, twin):
        machine.receive(4, _update(4, 30.0, _delta(5, 6, 7, 8)))
        machine.close_step()
    assert server.aggregate is not None
    assert twin.aggregate is not None
    # (10 * (1, 2, 3, 4) + 30 * (5, 6, 7, 8)) / 40 = (160, 200, 240, 280) / 40
    assert _array(server.aggregate.vector).tolist() == _array(twin.aggregate.vector).tolist() == [4.0, 5.0, 6.0, 7.0]
    assert server.aggregate.survivors == twin.aggregate.survivors == (1, 4)
    assert server.aggregate.weight == 40.0


def test_update_after_close_step_is_refused_and_changes_nothing() -> None:
    server = FedAvgServer(ROUND, SAMPLED, DIM)
    server.receive(1, _update(1, 10.0, _delta(1, 2, 3, 4)))
    server.close_step()
    aggregate = server.aggregate
    with pytest.raises(RemoteProtocolError, match=r"^client 4: sent an update after the upload step closed \(done\)$"):
        server.receive(4, _update(4))
    assert server.aggregate is aggregate
    assert (server.step, server.outcome, server.expected()) == ("done", "ok", frozenset())
    assert aggregate is not None
    assert _array(aggregate.vector).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert aggregate.survivors == (1,)


def test_close_step_without_updates_aborts() -> None:
    server = FedAvgServer(ROUND, SAMPLED, DIM)
    assert server.close_step() == Reaction()
    assert server.step == "aborted"
    assert server.outcome.startswith("aborted:")
    assert server.aggregate is None
    assert server.expected() == frozenset()
    with pytest.raises(RemoteProtocolError) as info:
        server.receive(1, _update(1))
    assert info.value.peer == 1
    with pytest.raises(LocalProtocolError, match="aborted"):
        server.close_step()


def test_close_step_twice_is_a_local_error() -> None:
    server = FedAvgServer(ROUND, SAMPLED, DIM)
    server.receive(7, _update(7))
    server.close_step()
    with pytest.raises(LocalProtocolError, match="close_step called in state done"):
        server.close_step()
    assert (server.step, server.outcome) == ("done", "ok")


def test_client_machine_sends_once_and_expects_nothing() -> None:
    client = FedAvgClient(ROUND, 4)
    delta = _delta(1, 2, 3, 4)
    reaction = client.start(delta, 12)
    assert reaction.work == ()
    assert len(reaction.sends) == 1
    send = reaction.sends[0]
    assert isinstance(send, Send)
    assert send.to == SERVER
    message = send.message
    assert isinstance(message, ClientUpdate)
    assert (message.round, message.client, message.weight) == (ROUND, 4, 12.0)
    assert isinstance(message.weight, float)
    assert message.delta is delta
    with pytest.raises(LocalProtocolError, match="start called twice"):
        client.start(delta, 12)
    with pytest.raises(RemoteProtocolError) as info:
        client.receive(ModelDownload(ROUND, delta))
    assert info.value.peer == SERVER
    assert str(info.value).startswith("server: ")
