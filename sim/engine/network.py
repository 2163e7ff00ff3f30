"""Flow-level network: transfers share links max-min fairly, in virtual time.

Each transfer is a fluid flow of ``bits`` over a path of links (a client's own link and the server's
link, in the transfer's direction). At every instant the rates are the max-min fair allocation over all
links (progressive filling: the link whose equal share among its unfrozen flows is smallest fixes those
flows at that share, and so on), the idealised behaviour of TCP flows sharing bottlenecks. Whenever a
flow starts, ends or is cancelled, every flow's progress is advanced at its old rate and the rates are
recomputed; a flow completes when its remaining bits reach zero. A lone flow of ``B`` bytes over links of
``c1`` and ``c2`` bit/s therefore takes exactly ``8 B / min(c1, c2)`` seconds.

Links are full-duplex: a node's uplink and downlink are separate :class:`Link` objects. Flows are kept
in start order and ties are broken in that order, so a run is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import simpy

_EPS_BITS = 1e-6
"""Remaining bits below which a flow counts as delivered (float round-off of rate * time)."""


class Link:
    """One direction of a network attachment, ``capacity`` bits per second."""

    __slots__ = ("_free", "_n_open", "_version", "capacity", "flows", "name")

    def __init__(self, name: str, capacity_bps: float) -> None:
        if not capacity_bps > 0:
            raise ValueError(f"link {name}: capacity must be > 0 bit/s, not {capacity_bps}")
        self.name = name
        self.capacity = float(capacity_bps)
        self.flows: dict[int, Flow] = {}
        self._free = 0.0
        self._n_open = 0
        self._version = 0

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.capacity:g} bit/s)"


class Flow:
    """A transfer in progress; ``done`` fires (with the flow) when its last bit arrives."""

    __slots__ = ("_frozen", "bits", "done", "id", "path", "rate", "remaining", "started")

    def __init__(self, fid: int, bits: float, path: Sequence[Link], done: simpy.Event, now: float) -> None:
        self.id = fid
        self.bits = bits
        self.remaining = bits
        self.path = tuple(path)
        self.rate = 0.0
        self.done = done
        self.started = now
        self._frozen = False


class Network:
    """The set of active flows of one SimPy environment."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.flows: dict[int, Flow] = {}
        self._ids = itertools.count()
        self._last = env.now
        self._timer_version = 0

    def transfer(self, nbytes: int, path: Sequence[Link]) -> Flow:
        """Start sending ``nbytes`` over ``path``; wait on the returned flow's ``done`` event."""
        if nbytes < 0:
            raise ValueError(f"cannot transfer {nbytes} bytes")
        if not path:
            raise ValueError("a transfer needs at least one link")
        self._advance()
        flow = Flow(next(self._ids), 8.0 * nbytes, path, self.env.event(), self.env.now)
        if flow.bits <= _EPS_BITS:
            flow.done.succeed(flow)
            return flow
        self.flows[flow.id] = flow
        for link in flow.path:
            link.flows[flow.id] = flow
        self._reallocate()
        return flow

    def cancel(self, flow: Flow) -> None:
        """Stop a flow (its sender left); its ``done`` event never fires."""
        if flow.id not in self.flows:
            return
        self._advance()
        self._remove(flow)
        self._reallocate()

    # -- internals --------------------------------------------------------------------------------
    def _remove(self, flow: Flow) -> None:
        del self.flows[flow.id]
        for link in flow.path:
            del link.flows[flow.id]

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            for flow in self.flows.values():
                flow.remaining -= flow.rate * dt
        self._last = self.env.now

    def _reallocate(self) -> None:
        allocate_max_min(self.flows.values())
        self._timer_version += 1
        if not self.flows:
            return
        wait = min(f.remaining / f.rate if f.rate > 0 else float("inf") for f in self.flows.values())
        if wait == float("inf"):
            raise RuntimeError("network stalled: every active flow has a zero rate")
        timer = self.env.timeout(max(wait, 0.0))
        version = self._timer_version
        timer.callbacks.append(lambda _ev: self._on_timer(version))

    def _on_timer(self, version: int) -> None:
        if version != self._timer_version:
            return
        self._advance()
        finished = [f for f in self.flows.values() if f.remaining <= _EPS_BITS + 1e-12 * f.bits]
        if not finished:
            # Round-off left a sliver: finish the closest flow now rather than spin on tiny timers.
            finished = [min(self.flows.values(), key=lambda f: f.remaining / f.rate if f.rate > 0 else float("inf"))]
        for flow in finished:
            flow.remaining = 0.0
            self._remove(flow)
        self._reallocate()
        for flow in finished:
            flow.done.succeed(flow)


def allocate_max_min(flows: Any) -> None:
    """Set ``rate`` of every flow to its max-min fair share (progressive filling over links)."""
    flow_list = list(flows)
    links: dict[int, Link] = {}
    for flow in flow_list:
        flow._frozen = False
        flow.rate = 0.0
        for link in flow.path:
            if id(link) not in links:
                links[id(link)] = link
                link._free = link.capacity
                link._n_open = 0
                link._version = 0
            link._n_open += 1
    heap: list[tuple[float, int, int, Link]] = []
    order = itertools.count()
    for link in links.values():
        heapq.heappush(heap, (link._free / link._n_open, next(order), link._version, link))
    while heap:
        share, _, version, link = heapq.heappop(heap)
        if version != link._version or link._n_open == 0:
            continue
        for flow in link.flows.values():
            if flow._frozen:
                continue
            flow._frozen = True
            flow.rate = share
            for other in flow.path:
                other._free = max(other._free - share, 0.0)
                other._n_open -= 1
                other._version += 1
                if other is not link and other._n_open > 0:
                    heapq.heappush(heap, (other._free / other._n_open, next(order), other._version, other))
        link._n_open = 0
