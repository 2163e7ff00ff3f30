"""Tests for sim.engine.network: flow-level max-min fair sharing of links, in virtual time.

Each story starts SimPy processes that send over a :class:`Network` and append ``(name, env.now)`` to a
log when their transfer ends; the tests assert the whole log, computed by hand. Capacities and sizes are
chosen so that every intermediate value is exact in binary floating point, so the times are asserted
with ``==``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Generator, Sequence
from typing import Any

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.network import Flow, Link, Network, allocate_max_min

Log = list[tuple[str, float]]

# ------------------------------------------------------------------------------------------- helpers


def _send(
    env: simpy.Environment,
    net: Network,
    log: Log,
    name: str,
    nbytes: int,
    path: Sequence[Link],
    start: float = 0.0,
    flows: dict[str, Flow] | None = None,
) -> simpy.Process:
    """A process that starts sending at ``start`` and logs ``(name, time)`` when the last bit arrives."""

    def proc() -> Generator[simpy.Event, Any, None]:
        if start > 0:
            yield env.timeout(start)
        flow = net.transfer(nbytes, path)
        if flows is not None:
            flows[name] = flow
        done = yield flow.done
        assert done is flow
        log.append((name, env.now))

    return env.process(proc())


def _world() -> tuple[simpy.Environment, Network, Log]:
    env = simpy.Environment()
    return env, Network(env), []


# ---------------------------------------------------------------------------------------- a lone flow


def test_lone_flow_ends_at_size_over_bottleneck_exactly() -> None:
    env, net, log = _world()
    client = Link("client", 4000.0)
    server = Link("server", 16000.0)
    _send(env, net, log, "upload", 1000, [client, server])
    env.run()
    # 8 * 1000 bytes / min(4000, 16000) bit/s = 8000 / 4000 = 2 s
    assert log == [("upload", 2.0)]


def test_lone_flow_bottleneck_can_be_the_second_link() -> None:
    env, net, log = _world()
    _send(env, net, log, "download", 250_000, [Link("server", 8e6), Link("client", 1e6)], start=3.0)
    env.run()
    # starts at 3 s; 8 * 250000 bytes / min(8e6, 1e6) bit/s = 2e6 / 1e6 = 2 s -> 5 s
    assert log == [("download", 5.0)]


def test_lone_flow_inexact_numbers() -> None:
    env, net, log = _world()
    _send(env, net, log, "upload", 1000, [Link("client", 1e6), Link("server", 1e7)])
    env.run()
    # 8 * 1000 bytes / 1e6 bit/s = 0.008 s (not exact in binary)
    assert [name for name, _ in log] == ["upload"]
    assert log[0][1] == pytest.approx(0.008, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    nbytes=st.integers(1, 10**9),
    c1=st.floats(1e3, 1e10),
    c2=st.floats(1e3, 1e10),
    start=st.floats(0.0, 1e4),
)
def test_lone_flow_time_property(nbytes: int, c1: float, c2: float, start: float) -> None:
    env, net, log = _world()
    _send(env, net, log, "f", nbytes, [Link("a", c1), Link("b", c2)], start=start)
    env.run()
    assert len(log) == 1
    # the duration is a difference of absolute clock values: allow a few ulps of the clock
    end = log[0][1]
    assert end - start == pytest.approx(8 * nbytes / min(c1, c2), rel=1e-9, abs=4 * math.ulp(end))


# --------------------------------------------------------------------------------- sharing a link


@pytest.mark.parametrize(
    ("b_client_bps", "b_end"),
    [
        # B alone after 2 s: min(4e6, 2e6) = 2e6 bit/s; 6e6 bits left / 2e6 = 3 s -> ends at 5 s
        (4e6, 5.0),
        # B alone after 2 s: min(1.5e6, 2e6) = 1.5e6 bit/s; 6e6 / 1.5e6 = 4 s -> ends at 6 s
        (1.5e6, 6.0),
    ],
)
def test_two_flows_share_server_link_then_survivor_speeds_up(b_client_bps: float, b_end: float) -> None:
    env, net, log = _world()
    server = Link("server", 2e6)
    flows: dict[str, Flow] = {}
    # both client links exceed C/2 = 1e6, so the server link is the bottleneck: 1e6 bit/s each
    _send(env, net, log, "A", 250_000, [Link("a", 1.5e6), server], flows=flows)
    _send(env, net, log, "B", 1_000_000, [Link("b", b_client_bps), server], flows=flows)
    env.run(until=1.0)
    assert (flows["A"].rate, flows["B"].rate) == (1e6, 1e6)
    env.run()
    # A: 8 * 250000 = 2e6 bits / 1e6 bit/s = 2 s.  B: 8e6 bits, 2e6 of them delivered by t = 2 s.
    assert log == [("A", 2.0), ("B", b_end)]
    assert flows["B"].remaining == 0.0
    assert net.flows == {}


def test_water_filling_client_capped_flow_leaves_remainder_to_others() -> None:
    env, net, log = _world()
    server = Link("server", 10e6)
    flows: dict[str, Flow] = {}
    # A is capped at 2e6 by its own link (below the fair share 10e6 / 3); B and C split the rest: 4e6 each.
    _send(env, net, log, "A", 250_000, [Link("a", 2e6), server], flows=flows)
    _send(env, net, log, "B", 1_125_000, [Link("b", 100e6), server], flows=flows)
    _send(env, net, log, "C", 1_750_000, [Link("c", 100e6), server], flows=flows)
    env.run(until=0.5)
    assert [flows[n].rate for n in "ABC"] == [2e6, 4e6, 4e6]
    env.run()
    # A: 8 * 250000 = 2e6 bits / 2e6 bit/s = 1 s.
    # B: 9e6 bits; 4e6 by t = 1, then 5e6 bit/s (10e6 / 2): 5e6 / 5e6 = 1 s -> 2 s.
    # C: 14e6 bits; 4e6 + 5e6 = 9e6 by t = 2, then alone at min(100e6, 10e6): 5e6 / 10e6 = 0.5 s -> 2.5 s.
    assert log == [("A", 1.0), ("B", 2.0), ("C", 2.5)]


def test_flow_joining_later_takes_its_share() -> None:
    env, net, log = _world()
    server = Link("server", 4e6)
    _send(env, net, log, "early", 1_000_000, [Link("e", 100e6), server])
    _send(env, net, log, "late", 250_000, [Link("l", 100e6), server], start=1.0)
    env.run()
    # early: 8e6 bits; alone at 4e6 for 1 s (4e6 bits), then 2e6 bit/s each.
    # late: 2e6 bits / 2e6 = 1 s -> ends at 2 s; early then has 4e6 - 2e6 = 2e6 bits left at 4e6 -> 2.5 s.
    assert log == [("late", 2.0), ("early", 2.5)]


def test_simultaneous_ends_are_logged_in_start_order() -> None:
    env, net, log = _world()
    server = Link("server", 2e6)
    _send(env, net, log, "first", 125_000, [Link("x", 8e6), server])
    _send(env, net, log, "second", 125_000, [Link("y", 8e6), server])
    env.run()
    # 1e6 bits each at 1e6 bit/s -> both at 1 s
    assert log == [("first", 1.0), ("second", 1.0)]


# ---------------------------------------------------------------------------- zero bytes, cancel


def test_zero_byte_transfer_completes_at_once_without_disturbing_others() -> None:
    env, net, log = _world()
    server = Link("server", 1e6)
    flows: dict[str, Flow] = {}
    _send(env, net, log, "big", 250_000, [Link("a", 8e6), server], flows=flows)
    _send(env, net, log, "empty", 0, [Link("b", 8e6), server], start=0.5, flows=flows)
    env.run()
    # empty: done at its start, 0.5 s; big: 2e6 bits at 1e6 bit/s throughout -> 2 s
    assert log == [("empty", 0.5), ("big", 2.0)]
    assert flows["empty"].id not in net.flows


def test_cancel_stops_flow_and_others_speed_up() -> None:
    env, net, log = _world()
    server = Link("server", 2e6)
    flows: dict[str, Flow] = {}
    _send(env, net, log, "A", 1_000_000, [Link("a", 4e6), server], flows=flows)
    _send(env, net, log, "B", 1_000_000, [Link("b", 4e6), server], flows=flows)

    def leaver() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(1.0)
        net.cancel(flows["A"])
        log.append(("cancel A", env.now))
        net.cancel(flows["A"])  # a second cancel is harmless

    env.process(leaver())
    env.run()
    # B: 8e6 bits; 1e6 bit/s for 1 s, then alone at min(4e6, 2e6) = 2e6: 7e6 / 2e6 = 3.5 s -> 4.5 s
    assert log == [("cancel A", 1.0), ("B", 4.5)]
    assert not flows["A"].done.triggered
    assert net.flows == {}


def test_flows_that_start_at_one_instant_are_allocated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broadcast: 50 flows start at t = 0 and share the server's 8 Mbit/s. The rates are allocated once,
    after the last of them (reading a rate earlier settles the instant at once, with the flows so far), and
    once more when the flows end together."""
    env, net, _ = _world()
    allocations = []
    allocate = Network._allocate
    monkeypatch.setattr(Network, "_allocate", lambda self: (allocations.append(env.now), allocate(self))[1])
    server = Link("server", 8e6, shared=True)
    first = net.transfer(1_000, [server, Link("c0", 1e9)])
    assert first.rate == 8e6 and allocations == [0.0]  # read at once: the one flow so far, allocated now
    flows = [first] + [net.transfer(1_000, [server, Link(f"c{i}", 1e9)]) for i in range(1, 50)]
    assert allocations == [0.0]  # the other 49 wait for the instant's end
    env.run()
    # After the 50th; then when all 50 end: 8,000 bits each at 8e6 / 50 bit/s, 0.05 s (the first flow ran
    # alone for no time at all)
    assert allocations == [0.0, 0.0, 8_000 / (8e6 / 50)]
    assert all(f.done.triggered for f in flows) and env.now == 8_000 / (8e6 / 50)
    assert net.flows == {}


def test_a_flow_cancelled_at_the_instant_it_would_end_leaves_the_other_on_time() -> None:
    """B would end at 1 s; at exactly 1 s, before its completion is handled, its sender leaves. The
    completion timer due then is stale: it must not end A, which runs on alone to its own end."""
    env, net, log = _world()
    server = Link("server", 2e6, shared=True)
    flows: dict[str, Flow] = {}

    def leaver() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(1.0)  # made before the transfers start: due before their completion at 1 s
        net.cancel(flows["B"])
        log.append(("cancel B", env.now))

    env.process(leaver())
    _send(env, net, log, "A", 1_000_000, [Link("a", 4e6), server], flows=flows)
    _send(env, net, log, "B", 125_000, [Link("b", 4e6), server], flows=flows)
    env.run()
    # A and B at 1e6 bit/s each; B's 1e6 bits would end at 1 s. A: 7e6 bits left at 1 s, alone at 2e6 bit/s
    assert log == [("cancel B", 1.0), ("A", 4.5)]
    assert not flows["B"].done.triggered


def test_invalid_inputs_are_rejected() -> None:
    _, net, _ = _world()
    with pytest.raises(ValueError, match="capacity"):
        Link("bad", 0.0)
    with pytest.raises(ValueError, match="-1 bytes"):
        net.transfer(-1, [Link("l", 1.0)])
    with pytest.raises(ValueError, match="at least one link"):
        net.transfer(10, [])


# --------------------------------------------------------------------------- max-min property


def _check_max_min(flows: Sequence[Flow]) -> None:
    """Capacities hold and every flow has a bottleneck: a saturated link where its rate is the largest."""
    links = {id(link): link for f in flows for link in f.path}
    for link in links.values():
        assert sum(f.rate for f in link.flows.values()) <= link.capacity * (1 + 1e-9), link
    for f in flows:
        assert f.rate > 0
        bottlenecks = [
            link
            for link in f.path
            if sum(g.rate for g in link.flows.values()) >= link.capacity * (1 - 1e-9)
            and f.rate >= max(g.rate for g in link.flows.values()) * (1 - 1e-9)
        ]
        assert bottlenecks, f"flow {f.id} at {f.rate} bit/s has no bottleneck on {f.path}"


@st.composite
def _topologies(draw: st.DrawFn) -> tuple[float, list[tuple[float, int, float]]]:
    server = draw(st.floats(1e3, 1e9))
    n = draw(st.integers(1, 12))
    flows = [
        (
            draw(st.floats(1e3, 1e9)),  # client link, bit/s
            draw(st.integers(0, 10**6)),  # bytes
            draw(st.one_of(st.just(0.0), st.floats(0.0, 10.0))),  # start time
        )
        for _ in range(n)
    ]
    return server, flows


@settings(max_examples=150, deadline=None)
@given(_topologies())
def test_random_topology_allocation_is_max_min_fair_and_everything_arrives(
    topology: tuple[float, list[tuple[float, int, float]]],
) -> None:
    server_bps, specs = topology
    env, net, log = _world()
    server = Link("server", server_bps)
    snapshots: list[tuple[float, dict[int, float]]] = []
    started: dict[str, Flow] = {}

    def snapshot() -> None:
        active = list(net.flows.values())
        _check_max_min(active)
        snapshots.append((env.now, {f.id: f.rate for f in active}))

    def sender(i: int, client_bps: float, nbytes: int, start: float) -> Generator[simpy.Event, Any, None]:
        yield env.timeout(start)
        flow = net.transfer(nbytes, [Link(f"client{i}", client_bps), server])
        started[str(i)] = flow
        snapshot()
        yield flow.done
        log.append((str(i), env.now))
        snapshot()

    for i, (client_bps, nbytes, start) in enumerate(specs):
        env.process(sender(i, client_bps, nbytes, start))
    env.run()

    assert sorted(name for name, _ in log) == sorted(str(i) for i in range(len(specs)))
    assert net.flows == {}
    # every flow takes at least as long as it would alone
    for name, end in log:
        client_bps, nbytes, start = specs[int(name)]
        # (less a few ulps of the clock: a duration is a difference of two absolute times)
        assert end - start >= 8 * nbytes / min(client_bps, server_bps) * (1 - 1e-9) - 4 * math.ulp(end)
    # integrate the piecewise-constant rates between snapshots: every bit arrives, no more
    # (each interval's length is a difference of clock values, good to a few ulps of the clock)
    delivered = {f.id: 0.0 for f in started.values()}
    slack = {f.id: 1e-6 for f in started.values()}
    for (t0, rates), (t1, _) in itertools.pairwise(snapshots):
        for fid, rate in rates.items():
            delivered[fid] += rate * (t1 - t0)
            slack[fid] += rate * 4 * math.ulp(t1)
    for name, flow in started.items():
        assert delivered[flow.id] == pytest.approx(8 * specs[int(name)][1], rel=1e-9, abs=slack[flow.id])
    total = 8 * sum(nbytes for _, nbytes, _ in specs)
    assert sum(delivered.values()) == pytest.approx(total, rel=1e-9, abs=sum(slack.values()))


@settings(max_examples=100, deadline=None)
@given(
    capacities=st.lists(st.floats(1e3, 1e9), min_size=2, max_size=6),
    paths=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), min_size=1, max_size=12),
)
def test_allocate_max_min_on_arbitrary_paths(capacities: list[float], paths: list[list[int]]) -> None:
    """Progressive filling directly, on flows crossing any set of distinct links (not only client+server)."""
    env = simpy.Environment()
    links = [Link(f"l{i}", c) for i, c in enumerate(capacities)]
    flows = []
    for fid, path in enumerate(paths):
        distinct = dict.fromkeys(i % len(links) for i in path)
        flow = Flow(fid, 8.0, [links[j] for j in distinct], env.event(), 0.0)
        for link in flow.path:
            link.flows[fid] = flow
        flows.append(flow)
    allocate_max_min(flows)
    _check_max_min(flows)


# ------------------------------------------------------------------------- the star's vector allocation


@st.composite
def _stars(draw: st.DrawFn) -> tuple[list[float], list[float], list[tuple[int, int, bool, int, float]]]:
    """Two hubs, a few own links and flows over one own link and one hub, in either order. Own capacities
    are often exactly a hub's fair share C / k, where the progressive filling's tie-breaking decides the
    last bit of the rates; own links are sometimes reused, which crowds them (the general allocation takes
    over while they are)."""
    hubs = [draw(st.floats(1e6, 1e8)), draw(st.floats(1e6, 1e8))]
    shares = [h / k for h in hubs for k in range(1, 6)]
    owns = draw(st.lists(st.one_of(st.sampled_from(shares), st.floats(1e5, 1e8)), min_size=1, max_size=8))
    flows = draw(
        st.lists(
            st.tuples(
                st.integers(0, len(owns) - 1),  # own link
                st.integers(0, 1),  # hub
                st.booleans(),  # own link first in the path
                st.integers(1, 10**6),  # bytes
                st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.7]),  # start, s (ties at 0)
            ),
            min_size=1,
            max_size=10,
        )
    )
    return hubs, owns, flows


def _run_star(
    hubs: list[float], owns: list[float], specs: list[tuple[int, int, bool, int, float]], shared: bool
) -> tuple[Log, list[dict[int, float]]]:
    env, net, log = _world()
    hub_links = [Link(f"hub{i}", c, shared=shared) for i, c in enumerate(hubs)]
    own_links = [Link(f"own{i}", c) for i, c in enumerate(owns)]
    rates: list[dict[int, float]] = []

    def sender(i: int, own: int, hub: int, own_first: bool, nbytes: int, start: float) -> Any:
        yield env.timeout(start)
        path = [own_links[own], hub_links[hub]]
        flow = net.transfer(nbytes, path if own_first else path[::-1])
        rates.append({f.id: f.rate for f in net.flows.values()})
        yield flow.done
        log.append((str(i), env.now))

    for i, spec in enumerate(specs):
        env.process(sender(i, *spec))
    env.run()
    return log, rates


@settings(max_examples=200, deadline=None)
@given(_stars())
def test_star_allocation_is_bit_identical_to_progressive_filling(
    star: tuple[list[float], list[float], list[tuple[int, int, bool, int, float]]],
) -> None:
    """Shared hubs take the vector path, unshared ones the general algorithm: every rate and every
    completion time agree to the last bit."""
    fast = _run_star(*star, shared=True)
    general = _run_star(*star, shared=False)
    assert fast == general


def _star_rates(hub_bps: float, owns: list[float], own_first: bool, shared: bool) -> list[float]:
    _, net, _ = _world()
    hub = Link("hub", hub_bps, shared=shared)
    flows = []
    for i, c in enumerate(owns):
        own = Link(f"own{i}", c)
        flows.append(net.transfer(10**6, [own, hub] if own_first else [hub, own]))
    return [f.rate for f in flows]


def test_star_ties_decide_the_last_bit_as_progressive_filling_does() -> None:
    """Ties between an own link's capacity and the hub's share, where the order of the filling changes the
    last bit of the other flows' rates. (Numbers found by search: C / 7 frozen first leaves
    (C - C/7) / 6, one ulp above C / 7.)"""
    c = 33085476.680183955
    owns = [c / 7] + [1e9] * 6
    # The hub's first share ties the first flow's own link: the own link wins if it was listed first.
    own_wins = _star_rates(c, owns, own_first=True, shared=True)
    hub_wins = _star_rates(c, owns, own_first=False, shared=True)
    assert own_wins == [c / 7] + [(c - c / 7) / 6] * 6 and own_wins[1] != c / 7
    assert hub_wins == [c / 7] * 7
    assert own_wins == _star_rates(c, owns, own_first=True, shared=False)
    assert hub_wins == _star_rates(c, owns, own_first=False, shared=False)
    # A later share of the hub (after one flow froze) ties an own link: the own link wins, whatever the order.
    c, c1 = 76948605.28564824, 2197456.492757353
    c2 = (c - c1) / 7
    owns = [1e9, c2, c1, 1e9, 1e9, 1e9, 1e9, 1e9]
    for own_first in (True, False):
        rates = _star_rates(c, owns, own_first, shared=True)
        assert rates == _star_rates(c, owns, own_first, shared=False)
        assert rates[1:3] == [c2, c1] and rates[0] == (c - c1 - c2) / 6 != c2
    # Equal own links on both sides of the last frozen flow: C / 7 frozen first leaves (C - C/7) / 6, one
    # ulp below C / 7, so only the first started of seven equal own links freezes (the start order decides).
    c = 10292099.090649255
    assert (c - c / 7) / 6 < c / 7
    rates = _star_rates(c, [c / 7] * 7, own_first=True, shared=True)
    assert rates == [c / 7] + [(c - c / 7) / 6] * 6
    assert rates == _star_rates(c, [c / 7] * 7, own_first=True, shared=False)
    # The same where the flows' slots are not in their start order: the first started still freezes.
    rates = _rates_in_reused_slots(c, [c / 7] * 7, shared=True)
    assert rates == [c / 7] + [(c - c / 7) / 6] * 6
    assert rates == _rates_in_reused_slots(c, [c / 7] * 7, shared=False)
    # Own links below, at and above the level where the filling stops, in reused slots
    owns = [c / 9, c / 7, 2 * c / 7, c / 7, c / 9, c / 7, c / 7, 1e9]
    assert _rates_in_reused_slots(c, owns, shared=True) == _rates_in_reused_slots(c, owns, shared=False)


def _rates_in_reused_slots(hub_bps: float, owns: list[float], shared: bool) -> list[float]:
    """Rates of flows over ``owns`` and one hub, in start order, started once three earlier flows have
    ended: they take the freed slots last freed first, so their slots are not in their start order."""
    env, net, _ = _world()
    hub = Link("hub", hub_bps, shared=shared)
    early = [net.transfer(1, [Link(f"early{i}", 1e9), hub]) for i in range(3)]
    env.run()
    assert all(f.done.triggered for f in early) and not net.flows
    flows = [net.transfer(10**6, [Link(f"own{i}", c), hub]) for i, c in enumerate(owns)]
    assert [f._slot for f in flows[:3]] == [2, 1, 0] or not shared
    return [f.rate for f in flows]
