"""Flow-level network: transfers share links max-min fairly, in virtual time.

Each transfer is a fluid flow of ``bits`` over a path of links (a client's own link and the server's
link, in the transfer's direction). At every instant the rates are the max-min fair allocation over all
links (progressive filling: the link whose equal share among its unfrozen flows is smallest fixes those
flows at that share, and so on), the idealised behaviour of TCP flows sharing bottlenecks. Whenever a
flow starts, ends or is cancelled, every flow's progress is advanced at its old rate and the rates are
recomputed; a flow completes when its remaining bits reach zero. A lone flow of ``B`` bytes over links of
``c1`` and ``c2`` bit/s therefore takes exactly ``8 B / min(c1, c2)`` seconds.

The recomputation waits for the events already due at the current instant (it is a zero-delay event), so
the many flows of a broadcast, started at one instant, are allocated once; no time passes at the rates in
between. (Flows that processes woken by a completion start at that same instant make a second
allocation.) A flow's completion timer is therefore made after the events made at its start before that
allocation: a timeout made just after a transfer started, due at exactly the transfer's end, comes first.

Links are full-duplex: a node's uplink and downlink are separate :class:`Link` objects. Flows are kept
in start order and ties are broken in that order, so a run is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

_EPS_BITS = 1e-6
"""Remaining bits below which a flow counts as delivered (float round-off of rate * time)."""


class Link:
    """One direction of a network attachment, ``capacity`` bits per second.

    ``shared`` marks a link many flows cross at once (the server's); the others are a client's own. While
    every flow crosses one shared and one own link and no own link carries two flows, the network is a
    set of stars and :class:`Network` allocates it with vector arithmetic."""

    __slots__ = ("_free", "_n_open", "_version", "capacity", "flows", "name", "shared")

    def __init__(self, name: str, capacity_bps: float, shared: bool = False) -> None:
        if not capacity_bps > 0:
            raise ValueError(f"link {name}: capacity must be > 0 bit/s, not {capacity_bps}")
        self.name = name
        self.capacity = float(capacity_bps)
        self.shared = shared
        self.flows: dict[int, Flow] = {}
        self._free = 0.0
        self._n_open = 0
        self._version = 0

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.capacity:g} bit/s{', shared' if self.shared else ''})"


class Flow:
    """A transfer in progress; ``done`` fires (with the flow) when its last bit arrives.

    ``rate`` (bit/s) and ``remaining`` (bits) live in the network's arrays while the flow is active."""

    __slots__ = ("_frozen", "_net", "_rate", "_remaining", "_slot", "bits", "done", "id", "path", "started")

    def __init__(self, fid: int, bits: float, path: Sequence[Link], done: simpy.Event, now: float) -> None:
        self.id = fid
        self.bits = bits
        self.path = tuple(path)
        self.done = done
        self.started = now
        self._frozen = False
        self._net: Network | None = None
        self._slot = -1
        self._rate = 0.0
        self._remaining = bits

    @property
    def rate(self) -> float:
        """Current rate, bit/s (read in a flow's network, it first allocates the instant's changes:
        :meth:`Network.settle`)."""
        if self._net is None:
            return self._rate
        self._net.settle()
        return float(self._net._rate[self._slot])

    @rate.setter
    def rate(self, value: float) -> None:
        if self._net is not None:
            self._net._rate[self._slot] = value
        else:
            self._rate = value

    @property
    def remaining(self) -> float:
        """Bits not yet delivered."""
        return float(self._net._remaining[self._slot]) if self._net is not None else self._remaining


class Network:
    """The set of active flows of one SimPy environment.

    Flow state lives in parallel arrays indexed by slot (remaining bits, rate, size, start order, and for
    the star allocation each flow's own-link capacity and shared link), so advancing the clock, finding the
    next completion and allocating a star are vector operations: an event among 1,000 concurrent transfers
    costs tens of microseconds, not milliseconds of Python loops. Other topologies fall back to
    :func:`allocate_max_min` over the flow objects; both give bit-identical rates on a star.
    """

    _INITIAL_SLOTS = 64

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.flows: dict[int, Flow] = {}
        self._ids = itertools.count()
        self._last = env.now
        self._timer_version = 0
        self._hubs: dict[int, tuple[Link, int]] = {}
        """Shared links that have carried a star flow: id(link) -> (link, hub number)."""
        self._irregular = 0
        """Active flows that are not one own and one shared link, plus own links carrying several flows;
        while non-zero, rates come from :func:`allocate_max_min`."""
        self._slot_flow: list[Flow | None] = []
        self._free_slots: list[int] = []
        self._active = np.zeros(0, dtype=bool)
        self._remaining = np.zeros(0)
        self._rate = np.zeros(0)
        self._bits = np.zeros(0)
        self._fid = np.zeros(0, dtype=np.int64)
        self._own = np.zeros(0)
        """Capacity of the flow's own link, bit/s (star flows)."""
        self._hub = np.zeros(0, dtype=np.int64)
        """Hub number of the flow's shared link, -1 for an irregular flow."""
        self._own_first = np.zeros(0, dtype=bool)
        """Whether the own link comes first in the flow's path (breaks a tie of the progressive filling)."""
        self._pending = False
        """Whether flows started or stopped at this instant since the rates were last allocated."""
        self._grow(self._INITIAL_SLOTS)

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
        self._add(flow)
        self._changed()
        return flow

    def cancel(self, flow: Flow) -> None:
        """Stop a flow (its sender left); its ``done`` event never fires."""
        if flow.id not in self.flows:
            return
        self._advance()
        self._remove(flow)
        self._changed()

    def settle(self) -> None:
        """Allocate the rates now if flows started or stopped at this instant (:meth:`_changed`)."""
        if self._pending:
            self._pending = False
            self._reallocate()

    # -- internals --------------------------------------------------------------------------------
    def _grow(self, size: int) -> None:
        old = self._active.size
        for name in ("_active", "_remaining", "_rate", "_bits", "_fid", "_own", "_hub", "_own_first"):
            array = getattr(self, name)
            wider = np.zeros(size, dtype=array.dtype)
            wider[:old] = array
            setattr(self, name, wider)
        self._slot_flow.extend([None] * (size - old))
        self._free_slots.extend(range(size - 1, old - 1, -1))

    def _add(self, flow: Flow) -> None:
        if not self._free_slots:
            self._grow(2 * self._active.size)
        slot = self._free_slots.pop()
        self._slot_flow[slot] = flow
        self._active[slot] = True
        self._remaining[slot] = flow.bits
        self._rate[slot] = 0.0
        self._bits[slot] = flow.bits
        self._fid[slot] = flow.id
        flow._net, flow._slot = self, slot
        self.flows[flow.id] = flow
        for link in flow.path:
            link.flows[flow.id] = flow
            if not link.shared and len(link.flows) == 2:
                self._irregular += 1
        shared = [link for link in flow.path if link.shared]
        if len(flow.path) == 2 and len(shared) == 1:
            hub = shared[0]
            own = flow.path[1] if flow.path[0] is hub else flow.path[0]
            if id(hub) not in self._hubs:
                self._hubs[id(hub)] = (hub, len(self._hubs))
            self._hub[slot] = self._hubs[id(hub)][1]
            self._own[slot] = own.capacity
            self._own_first[slot] = flow.path[0] is own
        else:
            self._hub[slot] = -1
            self._irregular += 1

    def _remove(self, flow: Flow) -> None:
        slot = flow._slot
        flow._rate, flow._remaining = float(self._rate[slot]), float(self._remaining[slot])
        flow._net, flow._slot = None, -1
        if self._hub[slot] < 0:
            self._irregular -= 1
        self._active[slot] = False
        self._rate[slot] = 0.0
        self._slot_flow[slot] = None
        self._free_slots.append(slot)
        del self.flows[flow.id]
        for link in flow.path:
            if not link.shared and len(link.flows) == 2:
                self._irregular -= 1
            del link.flows[flow.id]

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0 and self.flows:
            self._remaining -= self._rate * dt  # idle slots have rate 0
        self._last = self.env.now

    def _allocate(self) -> None:
        if self._irregular:
            allocate_max_min(self.flows.values())
            return
        for hub, number in self._hubs.values():
            slots = np.flatnonzero(self._active & (self._hub == number))
            if slots.size:
                self._allocate_star(hub, slots)

    def _allocate_star(self, hub: Link, slots: np.ndarray) -> None:
        """Max-min rates of the flows ``slots``, each crossing ``hub`` and an own link of its own.

        Progressive filling on a star, as :func:`allocate_max_min` does it, operation for operation: own
        links in increasing (capacity, start order) freeze their flow at their capacity while that is
        below the hub's current share ``F_k / (n - k)``, ``F_k`` the hub's capacity less the k rates frozen
        so far (subtracted one at a time); then every other flow gets the hub's share. An own link wins
        a tie, except against the hub's first share when the hub entered the filling first.

        The rates depend on the order only through which flows freeze, so the capacities are sorted as
        values; the start order is consulted only where it decides: a tie with the hub's first share, or
        equal capacities on both sides of the last frozen flow (then the flows are sorted in full)."""
        capacity = self._own[slots]
        n = slots.size
        first_share = hub.capacity / n
        lowest = capacity.min()
        if lowest > first_share:  # the hub is every flow's bottleneck (the common case on a busy server)
            self._rate[slots] = first_share
            return
        ordered = np.sort(capacity)
        free = np.subtract.accumulate(np.concatenate(([hub.capacity], ordered)))
        share = free[:n] / np.arange(n, 0, -1)
        own_first = ordered <= share
        if lowest == share[0]:  # the hub's first entry: its order is its first flow's position
            tied = slots[capacity == lowest]
            first = tied[np.argmin(self._fid[tied])]
            own_first[0] = bool(self._fid[first] == self._fid[slots].min() and self._own_first[first])
        stop = n if own_first.all() else int(np.argmin(own_first))
        if stop == n:
            self._rate[slots] = capacity
        elif stop == 0:
            self._rate[slots] = share[0]
        elif ordered[stop] != ordered[stop - 1]:  # the frozen flows are those up to a capacity
            self._rate[slots] = np.where(capacity <= ordered[stop - 1], capacity, share[stop])
        else:  # equal capacities frozen and not: the start order says which
            order = np.lexsort((self._fid[slots], capacity))
            self._rate[slots[order[:stop]]] = ordered[:stop]
            self._rate[slots[order[stop:]]] = share[stop]

    def _changed(self) -> None:
        """Flows started or stopped: the rates and the next completion are allocated by a zero-delay event,
        once for every change made before it runs (:meth:`settle` does it at once). A broadcast starts
        hundreds of flows at one instant, and the rates in between never act: no time passes at them. The
        completion timer already scheduled is stale from now on (its flow may have been cancelled)."""
        self._timer_version += 1  # the next completion changes with the flows
        if not self._pending:
            self._pending = True
            self.env.timeout(0).callbacks.append(lambda _ev: self.settle())

    def _reallocate(self) -> None:
        self._allocate()
        self._timer_version += 1
        if not self.flows:
            return
        wait = float(self._times().min())
        if wait == float("inf"):
            raise RuntimeError("network stalled: every active flow has a zero rate")
        timer = self.env.timeout(max(wait, 0.0))
        version = self._timer_version
        timer.callbacks.append(lambda _ev: self._on_timer(version))

    def _times(self) -> np.ndarray:
        """Seconds until the flow in each slot would finish at its current rate (infinite at rate 0, as in
        a free slot)."""
        out = np.full(self._rate.size, np.inf)
        np.divide(self._remaining, self._rate, out=out, where=self._rate > 0)
        return out

    def _on_timer(self, version: int) -> None:
        if version != self._timer_version:
            return
        self._advance()
        slots = np.flatnonzero(self._active)
        done = slots[self._remaining[slots] <= _EPS_BITS + 1e-12 * self._bits[slots]]
        if not done.size:
            # Round-off left a sliver: finish the closest flow (the earliest started of a tie) now rather
            # than spin on tiny timers.
            times = self._times()[slots]
            closest = slots[times == times.min()]
            done = closest[np.argmin(self._fid[closest])][None]
        finished = [self._slot_flow[s] for s in done[np.argsort(self._fid[done])]]
        for flow in finished:
            assert flow is not None
            self._remaining[flow._slot] = 0.0
            self._remove(flow)
        self._changed()
        for flow in finished:
            assert flow is not None
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
