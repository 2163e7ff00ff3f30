"""Kernel emulation of a testbed's devices: CPU quotas in cgroups, links shaped by ``tc`` on loopback.

The ``process`` emulation (:mod:`sim.deploy.compute`, :mod:`sim.deploy.shaping`) slows a device down
inside its own process: sleeps after each computation, token buckets around each socket. The ``kernel``
emulation leaves that to the kernel, as real FL testbeds do (Dordis shaped its clients' links with
wondershaper):

- **CPU** (:class:`CpuGroups`): each party's processes run in a CPU cgroup of their own whose CFS quota is
  the party's share of a core (``cores`` = quota / period), under the cgroup v2 ``cpu`` controller
  (``cpu.max``) or the v1 ``cpu`` hierarchy (``cpu.cfs_quota_us``, ``cpu.cfs_period_us``), whichever the
  machine has. A party that computes runs at that rate and no faster; with all quotas summing to at most
  the machine's cores, no party waits for another's core.
- **Network** (:class:`LinkShaper`): every party talks over the loopback interface of a private network
  namespace (never the host's), the server on 127.0.0.1 and client ``i`` on an address of its own. An htb
  qdisc on that ``lo`` gives each client two classes, its uplink (packets from its address) and its
  downlink (packets to it), each at the client's rate, under two parent classes at the server's rate (all
  uplinks share the server's downlink, all downlinks its uplink), as the simulator's star network.

Everything is created under names of this process's own (``dropsim-<pid>-<random>``) and removed by
:meth:`CpuGroups.close` and the namespace's end; nothing outside them is touched. :func:`missing` says
what a machine lacks for all this.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import numpy as np

from sim.errors import InputError
from sim.testbed import FRAME_BYTES, MTU_BYTES, PERIOD_US, client_cores, quota_us, server_cores

__all__ = [
    "PERIOD_US",
    "CpuGroups",
    "KernelEmulation",
    "KernelTestbedError",
    "LinkShaper",
    "missing",
    "reexec_in_private_network",
    "require",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the cgroup file systems are mounted (v2 unified here, or v1 hierarchies below it)."""


class KernelTestbedError(InputError):
    """The machine cannot run the kernel emulation, or a step of it failed; the message says what."""


def _completed(command: list[str], stdin: str | None = None, timeout_s: float = 30.0) -> tuple[int, str, str]:
    """Run ``command`` (feeding it ``stdin``, if any) to its end: its exit status, output and error output.

    The child is reaped whatever happens. :func:`subprocess.run` kills a child on Ctrl-C (or the kill this
    command turns into Ctrl-C) but does not wait for it; once we exit, the orphan is the init process's to
    reap, and an init that does not reap orphans (a container's or a micro-VM's) keeps it as a zombie
    forever. Raises :class:`OSError` (no such program) or :class:`subprocess.TimeoutExpired`."""
    with subprocess.Popen(
        command, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    ) as process:  # fmt: skip
        try:
            out, err = process.communicate(stdin, timeout=timeout_s)
        except BaseException:
            process.kill()
            process.wait()
            raise
    return process.returncode, out, err


def _run(command: list[str], what: str, stdin: str | None = None) -> str:
    """Run ``command``; its standard output, or :class:`KernelTestbedError` naming ``what`` failed."""
    try:
        code, out, err = _completed(command, stdin)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelTestbedError(f"{what}: {' '.join(command)}: {exc}") from None
    if code != 0:
        raise KernelTestbedError(f"{what}: {' '.join(command)}: {(err or out).strip()}")
    return out


# -- what the machine has ---------------------------------------------------------------------------------
def cgroup_version(root: Path | None = None) -> int | None:
    """2 if the unified hierarchy offers the ``cpu`` controller, 1 if a v1 ``cpu`` hierarchy with CFS quotas
    is mounted, else None (under ``root``, default :data:`CGROUP_ROOT`)."""
    root = root or CGROUP_ROOT
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and "cpu" in controllers.read_text().split():
        return 2
    if (root / "cpu" / "cpu.cfs_quota_us").is_file():
        return 1
    return None


def missing() -> list[str]:
    """What this machine lacks for the kernel emulation (empty: nothing), each saying how to get it."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root: the kernel testbed creates cgroups, a network namespace and tc qdiscs (run as root)")
    for tool, package in (("unshare", "util-linux"), ("ip", "iproute2"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            problems.append(f"the {tool} command ({package})")
    if cgroup_version() is None:
        problems.append(
            f"a cgroup cpu controller (v2 'cpu' in {CGROUP_ROOT}/cgroup.controllers, or v1 {CGROUP_ROOT}/cpu)"
        )
    if not problems:
        try:
            _run(["unshare", "--net", "true"], "a private network namespace")
        except KernelTestbedError as exc:
            problems.append(f"network namespaces ({exc})")
    return problems


def require() -> None:
    """Raise :class:`KernelTestbedError` listing what the machine lacks, if anything."""
    problems = missing()
    if problems:
        raise KernelTestbedError("this machine cannot run the kernel testbed; it lacks: " + "; ".join(problems))


HOST_NETNS_ENV = "DROPSIM_HOST_NETNS"
"""Environment variable by which a launcher tells the processes it starts under ``unshare --net`` which
network namespace it left (its inode: :func:`network_namespace`)."""


def network_namespace() -> int:
    """The inode of this process's network namespace."""
    return Path("/proc/self/ns/net").stat().st_ino


def in_private_network() -> bool:
    """Whether this process is in a network namespace other than the host's: the one its launcher left
    (:data:`HOST_NETNS_ENV`), else the first process's when that can be read. When neither is known, no."""
    try:
        here = network_namespace()
        host = os.environ.get(HOST_NETNS_ENV)
        if host is not None:
            return host.isdigit() and here != int(host)
        return here != Path("/proc/1/ns/net").stat().st_ino
    except OSError:
        return False


def private_network_env() -> dict[str, str]:
    """The environment for a command started under ``unshare --net`` from here (it may shape its loopback)."""
    return {**os.environ, HOST_NETNS_ENV: str(network_namespace())}


# -- CPU --------------------------------------------------------------------------------------------------
@dataclass
class CpuGroups:
    """A CPU cgroup per party under a parent of this object's own; :meth:`close` removes them all."""

    version: int | None = None
    """2 or 1 (default: what the machine has)."""
    root: Path = field(default_factory=lambda: CGROUP_ROOT)
    name: str = field(default_factory=lambda: f"dropsim-{os.getpid()}-{secrets.token_hex(3)}")
    parties: dict[str, Path] = field(default_factory=dict)
    origins: dict[int, Path] = field(default_factory=dict)
    """The cgroup each attached process came from."""

    def __post_init__(self) -> None:
        self.version = self.version or cgroup_version(self.root)
        if self.version is None:
            raise KernelTestbedError(f"no cgroup cpu controller under {self.root}")
        hierarchy = self.root if self.version == 2 else self.root / "cpu"
        self.hierarchy = hierarchy
        self.parent = hierarchy / self.name
        try:
            self.parent.mkdir()
            if self.version == 2:
                (self.parent / "cgroup.subtree_control").write_text("+cpu")
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.parent.rmdir()
            raise KernelTestbedError(f"cannot create the cgroup {self.parent}: {exc}") from None

    def add(self, party: str, cores: float) -> Path:
        """A cgroup for ``party`` whose processes may use ``cores`` of a core (a fraction, or more than 1)."""
        if not party.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"party name {party!r}: letters, digits, '-' and '_' only")
        if not cores > 0:
            raise ValueError(f"{party}: a CPU quota must be > 0 cores, not {cores!r}")
        group = self.parent / party
        try:
            group.mkdir()
        except OSError as exc:
            raise KernelTestbedError(f"cannot create {party}'s cgroup {group}: {exc}") from None
        self.parties[party] = group
        self.set(party, cores)
        return group

    def set(self, party: str, cores: float) -> None:
        """Let ``party``'s processes use ``cores`` of a core from now on (a worker playing another client)."""
        if not cores > 0:
            raise ValueError(f"{party}: a CPU quota must be > 0 cores, not {cores!r}")
        self.set_quota_us(party, *quota_us(cores))  # sim.testbed: the simulator models the same periods

    def set_quota_us(self, party: str, quota: int | None, period: int) -> None:
        """Let ``party``'s processes run ``quota`` microseconds of CPU every ``period`` microseconds (None: no
        quota), as the kernel takes them."""
        group = self.parties[party]
        try:
            if self.version == 2:
                (group / "cpu.max").write_text(f"{'max' if quota is None else quota} {period}")
            else:
                # the quota first where it shrinks (the kernel refuses a quota/period above the parent's)
                (group / "cpu.cfs_quota_us").write_text("-1")
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(-1 if quota is None else quota))
        except OSError as exc:
            raise KernelTestbedError(f"cannot set {party}'s CPU quota in {group}: {exc}") from None

    def quota(self, party: str) -> float:
        """The cores ``party`` may use, as the kernel holds them."""
        group = self.parties[party]
        if self.version == 2:
            quota, period = (group / "cpu.max").read_text().split()
            return int(quota) / int(period)
        return int((group / "cpu.cfs_quota_us").read_text()) / int((group / "cpu.cfs_period_us").read_text())

    def attach(self, party: str, pid: int) -> None:
        """Move process ``pid`` (with its threads) into ``party``'s cgroup (:meth:`close` moves it back to
        the cgroup it came from)."""
        self.origins.setdefault(pid, self._cgroup_of(pid))
        try:
            (self.parties[party] / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            raise KernelTestbedError(f"cannot move process {pid} into {party}'s cgroup: {exc}") from None

    def throttled_s(self, party: str) -> float:
        """Seconds ``party``'s processes were held back by their quota so far."""
        return self.throttling(party)[1]

    def throttling(self, party: str) -> tuple[int, float]:
        """(periods in which ``party``'s processes were held back by their quota, seconds held back) so far."""
        lines = (self.parties[party] / "cpu.stat").read_text().splitlines()
        stat = dict(line.split()[:2] for line in lines if line.strip())
        if self.version == 2:
            return int(stat.get("nr_throttled", 0)), int(stat.get("throttled_usec", 0)) / 1e6
        return int(stat.get("nr_throttled", 0)), int(stat.get("throttled_time", 0)) / 1e9

    def _pids(self, group: Path) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in (group / "cgroup.procs").read_text().split()]
        return []

    def _cgroup_of(self, pid: int) -> Path:
        """The cgroup of this hierarchy that process ``pid`` is in now (the hierarchy's root if unknown)."""
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                mine = (self.version == 2 and controllers == "") or (
                    self.version == 1 and "cpu" in controllers.split(",")
                )
                if mine:
                    group = self.hierarchy / path.lstrip("/")
                    if group.is_dir() and self.parent not in group.parents and group != self.parent:
                        return group
        return self.hierarchy

    def close(self) -> None:
        """Move any process still in a party's cgroup back to the cgroup it came from (the root for one
        not attached here), then remove every cgroup made here. Safe to call twice."""
        for group in [*self.parties.values(), self.parent]:
            for pid in self._pids(group):
                home = self.origins.get(pid, self.hierarchy)
                with contextlib.suppress(OSError):  # it (or its first home) may be gone meanwhile
                    try:
                        (home / "cgroup.procs").write_text(str(pid))
                    except OSError:
                        (self.hierarchy / "cgroup.procs").write_text(str(pid))
        for group in [*self.parties.values(), self.parent]:
            for _ in range(100):  # a process just moved out may take a moment to leave the count
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
        self.parties.clear()

    def __enter__(self) -> CpuGroups:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


# -- network ----------------------------------------------------------------------------------------------
SERVER_ADDRESS = "127.0.0.1"


def client_address(index: int) -> str:
    """Loopback address of the ``index``-th client (0-based): 127.0.1.1, 127.0.1.2, ... then 127.0.2.x."""
    if not 0 <= index < 254 * 254:
        raise ValueError(f"client index {index} out of range")
    return f"127.0.{1 + index // 254}.{1 + index % 254}"


CLIENT_FLOOR_BPS = 8_000.0
"""The rate an htb class of a client is guaranteed; it borrows the rest of its own from the server's."""


def _rate(bps: float) -> str:
    return f"{max(1, round(bps))}bit"


@dataclass
class LinkShaper:
    """Shapes the loopback of this process's private network namespace: each client's uplink and downlink
    at its rate, under the server's link (htb)."""

    server_bps: float
    latency_s: float = 0.0
    """One-way delay of every client message, each way (netem under each client class; 0: none)."""
    device: str = "lo"
    clients: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Client index -> (address, rate in bits per second)."""

    def __post_init__(self) -> None:
        if not in_private_network():
            raise KernelTestbedError(
                "the link shaper only shapes the loopback of a network namespace of its own, never the host's "
                "(run it under unshare --net)"
            )
        _run(["ip", "link", "set", self.device, "up"], "bring the loopback up")
        # Ethernet's MTU and no segmentation offload: htb shapes frames, and a link's burst is one of them
        _run(
            ["ip", "link", "set", "dev", self.device, "mtu", str(MTU_BYTES), "gso_max_size", str(MTU_BYTES),
             "gso_max_segs", "1"],
            "give the loopback an Ethernet MTU without segmentation offload",
        )  # fmt: skip
        self._tc("qdisc", "add", "dev", self.device, "root", "handle", "1:", "htb", "default", "3")
        # 1:1 the server's downlink (what clients upload), 1:2 its uplink (what they download), 1:3 the rest
        for classid in ("1:1", "1:2"):
            self._class("1:", classid, self.server_bps)
        self._class("1:", "1:3", 10e9)

    def _tc(self, *args: str) -> None:
        _run(["tc", *args], "tc")

    def _class(self, parent: str, classid: str, bps: float, verb: str = "add") -> None:
        self._tc(*self._class_args(parent, classid, bps, verb))

    def _class_args(self, parent: str, classid: str, bps: float, verb: str) -> list[str]:
        """htb class arguments. burst and cburst of one frame: an idle link passes one packet at once, then
        keeps its rate. A client's class (under the server's) is guaranteed only :data:`CLIENT_FLOOR_BPS`
        and borrows up to its rate (``ceil``) from the server's class, so that the server's link limits
        the clients' sum, shared among them in equal quanta (max-min fair, as the simulator's links): a
        class at its guaranteed rate would send without asking its parent."""
        burst = str(FRAME_BYTES)
        rate = min(bps, CLIENT_FLOOR_BPS) if parent in ("1:1", "1:2") else bps
        return [
            "class", verb, "dev", self.device, "parent", parent, "classid", classid, "htb",
            "rate", _rate(rate), "ceil", _rate(bps), "burst", burst, "cburst", burst, "quantum", burst,
        ]  # fmt: skip

    def add(self, index: int, bps: float) -> str:
        """Shape client ``index`` at ``bps`` bits per second both ways; returns the address it must use."""
        if index in self.clients:
            raise ValueError(f"client {index} is shaped already")
        address = client_address(index)
        _run(["ip", "addr", "add", f"{address}/32", "dev", self.device], f"give client {index} its address")
        up, down = self._classes(index)
        self._class("1:1", up, bps)
        self._class("1:2", down, bps)
        if self.latency_s > 0:  # netem in place of each class's default leaf queue
            for classid in (up, down):
                minor = int(classid.split(":")[1], 16)
                self._tc(
                    "qdisc", "add", "dev", self.device, "parent", classid, "handle", f"{minor:x}:",
                    "netem", "delay", f"{self.latency_s * 1e6:.0f}us", "limit", "100000",
                )  # fmt: skip
        for direction, classid in (("src", up), ("dst", down)):
            self._tc(
                "filter", "add", "dev", self.device, "parent", "1:", "protocol", "ip", "prio", "1",
                "u32", "match", "ip", direction, f"{address}/32", "flowid", classid,
            )  # fmt: skip
        self.clients[index] = (address, bps)
        return address

    @staticmethod
    def _classes(index: int) -> tuple[str, str]:
        """htb class ids of client ``index``'s uplink and downlink (minor ids are 16 bits)."""
        if not 0 <= index <= (0xFFFF - 0x101) // 2:
            raise ValueError(f"client index {index}: htb class ids hold {(0xFFFF - 0x101) // 2 + 1} clients")
        return f"1:{0x100 + 2 * index:x}", f"1:{0x101 + 2 * index:x}"

    def close(self) -> None:
        """Remove the qdisc, its classes and filters, and the clients' addresses (the namespace may host
        another deployment). Safe to call twice."""
        with contextlib.suppress(KernelTestbedError):
            _run(["tc", "qdisc", "del", "dev", self.device, "root"], "remove the qdisc")
        for address, _ in self.clients.values():
            with contextlib.suppress(KernelTestbedError):
                _run(["ip", "addr", "del", f"{address}/32", "dev", self.device], "remove a client's address")
        self.clients.clear()

    def retune_all(self, rates: dict[int, float]) -> None:
        """:meth:`retune` every client of ``rates`` (index -> bits per second) with one ``tc`` process."""
        lines = []
        for index, bps in sorted(rates.items()):
            up, down = self._classes(index)
            for parent, classid in (("1:1", up), ("1:2", down)):
                lines.append(" ".join(self._class_args(parent, classid, bps, "change")))
            self.clients[index] = (self.clients[index][0], bps)
        if lines:
            _run(["tc", "-batch", "-"], "retune the clients' links", stdin="\n".join(lines) + "\n")

    def retune(self, index: int, bps: float) -> None:
        """Shape client ``index`` (an address a worker keeps) at ``bps`` from now on: the client it plays this
        round."""
        address, _ = self.clients[index]
        up, down = self._classes(index)
        self._class("1:1", up, bps, "change")
        self._class("1:2", down, bps, "change")
        self.clients[index] = (address, bps)


# -- a deployment's testbed -------------------------------------------------------------------------------
def reexec_in_private_network(argv: Sequence[str]) -> NoReturn:
    """Run ``argv`` in place of this process in a network namespace of its own (``unshare --net``), told
    which namespace it left (:data:`HOST_NETNS_ENV`). The process keeps its id, so Ctrl-C and its exit
    status are the command's; the namespace, with its addresses and qdiscs, ends with its last process.
    Raises :class:`KernelTestbedError` naming what this machine lacks, if anything."""
    require()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe("unshare", ["unshare", "--net", "--", *argv], private_network_env())


SETUP_CORES = float(os.cpu_count() or 1)
"""A party's quota outside rounds (starting, configuring, between rounds): the whole host, so that loading
torch and the data is not slowed down; rounds run at the emulated quotas."""


@dataclass
class KernelEmulation:
    """A deployment's kernel testbed: the server's and every worker's CPU cgroup, every worker's address and
    shaped links. Each round, :meth:`assign` gives each worker the quota and the link rate of the client it
    plays (f / s cores; its bandwidth both ways) and the server its own (f times its speed); :meth:`release`
    lifts the quotas until the next round. :meth:`close` removes the cgroups (the namespace's addresses and
    qdiscs end with it)."""

    f: float
    server_speed: float
    server_bps: float
    workers: int
    slowdown: np.ndarray
    """Every client's slow-down, by client id."""
    bandwidth_bps: np.ndarray
    """Every client's link rate in bits per second, by client id."""
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        require()
        if not in_private_network():
            raise KernelTestbedError(
                "a kernel testbed runs in a network namespace of its own: dropsim deploy --testbed kernel "
                "starts itself again under unshare --net (it was not, here)"
            )
        self.groups = CpuGroups()
        self._playing: dict[str, str] = {}
        """cgroup -> the party it holds this round (``server``, or a client's number)."""
        self._before: dict[str, tuple[int, float]] = {}
        """cgroup -> its throttling (:meth:`CpuGroups.throttling`) when the round's quotas were set."""
        try:
            self.groups.add("server", SETUP_CORES)
            for j in range(self.workers):
                self.groups.add(f"worker-{j}", SETUP_CORES)
            self.groups.attach("server", os.getpid())
            self.shaper = LinkShaper(self.server_bps, self.latency_s)
        except BaseException:
            self.groups.close()
            raise
        try:
            for j in range(self.workers):
                self.shaper.add(j, self.server_bps)
        except BaseException:
            self.close()
            raise

    def address(self, worker: int) -> str:
        """The loopback address worker ``worker`` connects from (whose traffic the shaper shapes)."""
        return self.shaper.clients[worker][0]

    def attach(self, worker: int, pid: int) -> None:
        self.groups.attach(f"worker-{worker}", pid)

    def assign(self, playing: dict[int, int]) -> None:
        """Worker -> client of the round about to start: each worker's quota and links become its client's."""
        self.groups.set("server", server_cores(self.f, self.server_speed))
        for worker, client in playing.items():
            self.groups.set(f"worker-{worker}", client_cores(self.f, float(self.slowdown[client])))
        parties = {"server": "server", **{f"worker-{w}": str(c) for w, c in playing.items()}}
        before = {group: self.groups.throttling(group) for group in parties}
        self._playing, self._before = parties, before
        self.shaper.retune_all({worker: float(self.bandwidth_bps[client]) for worker, client in playing.items()})

    def throttles(self) -> dict[str, tuple[int, float]]:
        """Per party of the round assigned last (``server``, and each client by its number): the CFS periods in
        which its quota held it back since :meth:`assign`, and the seconds it was held back."""
        out = {}
        for group, party in self._playing.items():
            periods, seconds = self.groups.throttling(group)
            before_periods, before_seconds = self._before[group]
            out[party] = (max(0, periods - before_periods), max(0.0, seconds - before_seconds))
        return out

    def release(self) -> None:
        """Every party's quota back to the whole host (the round is over)."""
        self._playing, self._before = {}, {}  # a round refused before its quotas were set has no throttles
        for party in self.groups.parties:
            self.groups.set(party, SETUP_CORES)

    def close(self) -> None:
        """Remove the cgroups, the qdisc and the addresses made here."""
        try:
            self.shaper.close()
        finally:
            self.groups.close()
