"""Effects of the kernel testbed that the simulator may miss: microbenchmarks, one effect each.

The calibrated simulator under-estimates the kernel testbed's round times (docs/time-model.md, "The
kernel testbed"). Each section below isolates one effect on the real testbed machinery
(:class:`sim.deploy.kernel.CpuGroups`, :class:`sim.deploy.kernel.LinkShaper`), measures its size, and
says whether and how the simulator models it:

- ``cfs``: a child in a CPU cgroup of quota q cores per period P, idle for a few periods (2 P plus a
  random part of one, so that it starts at a random phase), then busy until its thread has run w CPU
  seconds. Its wall time against the simulator (:class:`sim.engine.host.QuotaScheduler`: q P restored in
  one step at each period boundary, averaged over the phase), the same periodic refill computed apart,
  the simulator's model before 2026-11-28 (a token bucket refilled continuously: w if w <= b / (1 - q),
  else w / q - b / q with b = q P), and the periodic refill with the kernel's per-CPU slack (1 ms) on
  top of the first period's quota.
- ``restart``: a fixed piece of work (a Python integer loop and a fixed-point encoding of 16,384 values, as
  a client's masking does) repeated in a cgroup of q = 1/9 to 1/2 core per 10 ms, and without a quota: the
  CPU seconds each piece took, and how many times the quota throttled it (``cpu.stat``). A piece that a
  spent quota interrupts takes more CPU than one that runs through: its thread comes back to cold caches.
  The simulator charges an operation the same CPU whatever its quota.
- ``threads``: a few SGD steps of a torch Linear model (1e4 to 1e6 parameters) in a cgroup of 0.5 core
  with 1 and 2 intra-op threads: wall, process CPU and throttled time. The simulator charges training
  as one job whatever the threads.
- ``slices``: two threads of one cgroup (q of 1/3 and 1/2 core per 10 ms), the first running a short
  burst and then waking the second, which runs another: both pinned to one CPU, or each to its own (a
  party's event loop handing a frame's work to its compute thread). The simulator's quota is one pool,
  whichever CPU a party's threads run on.
- ``loop``: two processes over TCP on 127.0.0.1 with asyncio streams (as a deployment): ping-pong of 64 B
  to 1 MB frames, and hand-overs of a tiny computation to a thread with ``loop.run_in_executor`` (what
  ``deploy.call`` charges), unconstrained and with both in cgroups of 0.25 core. Wall time per round
  trip / hand-over, CPU of both ends, and the wall not explained by CPU; the kernel profile's
  ``deploy.send`` / ``deploy.receive`` / ``deploy.call`` as the model.
- ``htb``: in a private network namespace, one client shaped by :class:`LinkShaper` at 1 to 210 Mbps;
  1 kB to 1 MB messages over TCP from an idle link, each acknowledged by one byte, against
  bytes * 8 / (rate * PAYLOAD_FRACTION) and against a frame-exact model with htb's one-frame burst.
- ``cores``: N = 1..6 busy processes, each in a cgroup of 0.75 core, on this host's cores (quotas
  oversubscribe them from N = 3): completion times against the simulator's water-filling
  (:class:`QuotaScheduler` with the host's cores) and plain min(q, cores / N) sharing.
- ``gc``: the Python collector in a process that does what a party does (torch imported, numpy arrays of
  1e4 to 1e6 values, many small dicts and bytes like frames): collections per second by generation,
  pause percentiles, total pause as a fraction of wall. The simulator has no collector.

Run as root on a machine with cgroups, ``unshare``, ``ip`` and ``tc`` (sections whose tools are missing
are skipped)::

    python benchmarks/testbed_effects.py --quick                 # every section, about 1 minute
    python benchmarks/testbed_effects.py                         # every section, about 9 minutes
    python benchmarks/testbed_effects.py --sections cfs --csv cfs.csv   # about 6 minutes (capped at 7)

Each section header says how many of the host's cores other processes kept busy meanwhile (and the CSV's
``others_cores``): the sections measure latencies of a few milliseconds, so run them on an otherwise idle
host. The cfs child is pinned to one core.

It prints a table and a verdict per section, and writes one CSV row per measured configuration
(``--csv``, default ``testbed_effects.csv``; units in the column names). Every cgroup
(``dropsim-effects-<pid>-<random>``), namespace and qdisc it makes is removed at the end, on error and on
Ctrl-C; every child process is reaped.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import json
import math
import os
import random
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.deploy import kernel
from sim.testbed import (
    FRAME_BYTES,
    KERNEL_PROFILE,
    MIN_QUOTA_US,
    MSS_BYTES,
    PAYLOAD_FRACTION,
    PERIOD_US,
    cfs_period_us,
    quota_us,
)

HERE = Path(__file__).resolve()
LOCAL_SLACK_S = 0.001
"""Runtime a CPU's run queue keeps when its group goes idle (the kernel's min_cfs_rq_runtime, 1 ms)."""
SECTIONS = ("cfs", "restart", "threads", "slices", "loop", "htb", "cores", "gc")


# -- plumbing ----------------------------------------------------------------------------------------------
class Child:
    """A child process of this script speaking JSON lines over its stdin/stdout; always reaped."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0)
        self.buf = b""

    @classmethod
    def of(cls, kind: str, config: dict[str, Any] | None = None, prefix: Sequence[str] = (), **kw: Any) -> Child:
        """This script run as ``--child kind`` with ``config`` (after ``prefix``, e.g. ``unshare --net --``)."""
        argv = [*prefix, sys.executable, str(HERE), "--child", kind, json.dumps(config or {})]
        return cls(argv, **kw)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, obj: Any) -> None:
        """Write one JSON line to the child."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def recv(self, timeout_s: float) -> Any:
        """The child's next JSON line, waiting at most ``timeout_s`` seconds."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"child {self.pid} said nothing for {timeout_s:.0f} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise RuntimeError(f"child {self.pid} ended (status {self.proc.wait()})")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self, timeout_s: float = 5.0) -> None:
        """Close its stdin and wait for it; kill it if it does not end within ``timeout_s``."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout_s)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


@contextlib.contextmanager
def children() -> Iterator[list[Child]]:
    """A list to put :class:`Child` objects in; all are ended (killed if need be) and reaped on exit."""
    started: list[Child] = []
    failed = False
    try:
        yield started
    except BaseException:
        failed = True
        raise
    finally:
        for child in started:
            if child.proc.poll() is None and not failed:
                with contextlib.suppress(Exception):
                    child.close(timeout_s=5.0)
            if child.proc.poll() is None:
                child.proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(1.0)
            if child.proc.poll() is None:
                child.proc.kill()
            child.proc.wait()
            for pipe in (child.proc.stdin, child.proc.stdout):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()


def say(obj: Any) -> None:
    """A child's reply: one JSON line on stdout."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def listen() -> Any:
    """A child's next command from stdin (None at its end)."""
    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else None


class Groups(kernel.CpuGroups):
    """:class:`CpuGroups` named ``dropsim-effects-<pid>-<random>``, with any quota and period."""

    def __init__(self) -> None:
        super().__init__(name=f"dropsim-effects-{os.getpid()}-{secrets.token_hex(3)}")

    def __enter__(self) -> Groups:
        return self

    def with_child(
        self, kids: list[Child], party: str, kind: str, config: dict[str, Any] | None = None, ready_s: float = 30
    ) -> Child:
        """A child of ``kind`` (reaped with ``kids``) in a new cgroup ``party`` of a whole core, once it is ready."""
        self.add(party, 1.0)
        child = Child.of(kind, config)
        kids.append(child)
        child.recv(ready_s)
        self.attach(party, child.pid)
        return child

    def stat(self, party: str) -> tuple[int, float]:
        """(periods throttled, microseconds throttled) of ``party`` so far."""
        periods, seconds = self.throttling(party)
        return periods, seconds * 1e6


def simulated(quotas: Sequence[float], works: Sequence[float], cores: float, rng: random.Random) -> list[float]:
    """Seconds the simulator's :class:`QuotaScheduler` takes for one job of ``works[i]`` CPU seconds in each
    pool of ``quotas[i]`` cores (the kernel's quota and period: :func:`sim.testbed.quota_us`, each period at a
    random phase, as :class:`sim.engine.host.PartyQuotas` draws them), all started at once on ``cores``."""
    import simpy

    from sim.engine.host import QuotaScheduler

    env = simpy.Environment()
    scheduler = QuotaScheduler(env, cores)
    ends = [math.nan] * len(works)

    def one(i: int) -> Any:
        runtime_us, period_us = quota_us(quotas[i])
        pool = scheduler.pool(runtime_us / 1e6, period_us / 1e6, rng.random() * period_us / 1e6)
        yield from scheduler.run(pool, works[i])
        ends[i] = env.now

    for i in range(len(works)):
        env.process(one(i))
    env.run()
    return ends


def bucket_s(w: float, q: float, b: float) -> float:
    """The simulator's model before 2026-11-28, a token bucket refilled continuously: a lone job of ``w`` CPU
    seconds after long idle at quota ``q`` cores, burst ``b`` s."""
    return w if w <= b / (1 - q) else w / q - b / q


def simulator_s(w: float, q: float, period_s: float, phases: int = 64) -> float:
    """The simulator's own seconds (:class:`sim.engine.host.QuotaScheduler`) for a lone job of ``w`` CPU
    seconds after long idle in a pool of ``q`` cores per period ``period_s``, averaged over ``phases``
    evenly spaced phases of the period."""
    import simpy

    from sim.engine.host import QuotaScheduler

    total = 0.0
    for k in range(phases):
        env = simpy.Environment()
        scheduler = QuotaScheduler(env)
        pool = scheduler.pool(q * period_s, period_s, phase=(k + 0.5) / phases * period_s)
        env.process(scheduler.run(pool, w))
        env.run()
        total += env.now
    return total / phases


def periodic_s(w: float, q: float, period_s: float, extra_s: float = 0.0, phases: int = 400) -> float:
    """Expected seconds for ``w`` CPU seconds when ``q * period_s`` is restored in one step at each period
    boundary (no carry-over) and the job starts at a uniformly random phase after long idle, with
    ``extra_s`` more runtime in its first period (a CPU's leftover slack). Midpoint rule over the phase."""
    quota = q * period_s
    total = 0.0
    for k in range(phases):
        t, left, runtime = 0.0, w, quota + extra_s
        to_boundary = period_s * (1 - (k + 0.5) / phases)
        for _ in range(100_000):
            run = min(left, runtime, to_boundary)
            t += run
            left -= run
            runtime -= run
            to_boundary -= run
            if left <= 1e-12:
                break
            t += to_boundary  # throttled (or the period ends) until the boundary
            runtime, to_boundary = quota, period_s
        total += t
    return total / phases


def host_busy_s() -> float:
    """CPU seconds all of this host's cores have run so far (every state of /proc/stat but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and its reaped children so far."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def busy(cpu_s: float) -> float:
    """Spin until this thread has run ``cpu_s`` CPU seconds; returns the CPU seconds it ran."""
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass
    return time.thread_time() - start


def profile_coef(op: str) -> dict[str, float]:
    """Coefficients (seconds, seconds per byte) of ``op`` in the kernel testbed's cost profile."""
    operations = json.loads(KERNEL_PROFILE.read_text())["operations"]
    return {k: float(v) for k, v in operations.get(op, {}).get("coef", {}).items()}


# -- cfs ---------------------------------------------------------------------------------------------------
def child_cfs(config: dict[str, Any]) -> None:
    """Child: pinned to one core; for each command, sleep ``idle_s``, then burn ``work_s`` CPU seconds."""
    os.sched_setaffinity(0, {config["core"]})
    say({"ready": os.getpid()})
    while (cmd := listen()) is not None:
        time.sleep(cmd["idle_s"])
        t0 = time.perf_counter()
        cpu = busy(cmd["work_s"])
        say({"wall_s": time.perf_counter() - t0, "cpu_s": cpu})


def section_cfs(quick: bool, rng: random.Random) -> pd.DataFrame:
    """Burst wall time (ms) against the bucket and periodic models over quota, period and work."""
    quotas = [0.25, 0.75] if quick else [0.1, 0.25, 0.5, 0.75]
    periods_ms = [10, 100] if quick else [10, 20, 100]
    n_work = 4 if quick else 6
    configs = []
    for q in quotas:
        for p_ms in periods_ms:
            quota = round(q * p_ms * 1000)
            if quota < MIN_QUOTA_US:
                continue
            hi = 8 * quota / 1e6
            for w in np.geomspace(2e-4, hi, n_work):
                configs.append((q, p_ms, float(w)))
    for p_ms in periods_ms:  # control: no quota, the same idle and burst pattern
        for w in (2e-4, 2e-3):
            configs.append((math.inf, p_ms, w))
    reps = {10: 40, 20: 40, 100: 20} if not quick else {10: 6, 100: 4}
    plan = [c for c in configs for _ in range(reps[c[1]])]
    rng.shuffle(plan)
    core = max(os.sched_getaffinity(0))
    samples: dict[tuple[float, int, float], list[tuple[float, float, int, float]]] = collections.defaultdict(list)
    deadline = time.monotonic() + (90 if quick else 420)
    with Groups() as groups, children() as kids:
        child = groups.with_child(kids, "burst", "cfs", {"core": core})
        current = None
        for q, p_ms, w in plan:
            if time.monotonic() > deadline:
                print(f"cfs: time budget spent, {sum(map(len, samples.values()))} of {len(plan)} bursts run")
                break
            if current != (q, p_ms):
                groups.set_quota_us("burst", round(q * p_ms * 1000) if q < math.inf else None, p_ms * 1000)
                current = (q, p_ms)
            period = p_ms / 1e3
            n0, t0 = groups.stat("burst")
            child.send({"idle_s": 2 * period + rng.random() * period, "work_s": w})
            reply = child.recv(30 + 10 * w / q)
            n1, t1 = groups.stat("burst")
            samples[(q, p_ms, w)].append((reply["wall_s"], reply["cpu_s"], n1 - n0, t1 - t0))
    rows = []
    for (q, p_ms, w), got in sorted(samples.items()):
        period = p_ms / 1e3
        wall = np.array([g[0] for g in got])
        b = q * period
        free = q == math.inf  # the control: no quota, every model is w
        sim = w if free else simulator_s(w, q, period)
        rows.append(
            {
                "section": "cfs",
                "q_cores": q,
                "period_ms": p_ms,
                "work_ms": w * 1e3,
                "reps": len(got),
                "measured_ms": wall.mean() * 1e3,
                "measured_sd_ms": wall.std() * 1e3,
                "cpu_ms": np.mean([g[1] for g in got]) * 1e3,
                "simulator_ms": sim * 1e3,
                "measured_p50_ms": np.median(wall) * 1e3,
                "measured_p90_ms": np.percentile(wall, 90) * 1e3,
                "bucket_ms": (w if free else bucket_s(w, q, b)) * 1e3,
                "periodic_ms": (w if free else periodic_s(w, q, period)) * 1e3,
                "periodic_slack_ms": (w if free else periodic_s(w, q, period, LOCAL_SLACK_S)) * 1e3,
                "nr_throttled": np.mean([g[2] for g in got]),
                "throttled_ms": np.mean([g[3] for g in got]) / 1e3,
            }
        )
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["q_cores"] = df["q_cores"].replace(math.inf, math.nan)  # NaN: the no-quota control
    for model in ("simulator", "bucket", "periodic", "periodic_slack"):
        df[f"{model}_diff_ms"] = df["measured_ms"] - df[f"{model}_ms"]
        df[f"{model}_diff_frac"] = df[f"{model}_diff_ms"] / df[f"{model}_ms"]
    errors = df[["bucket_diff_ms", "periodic_diff_ms", "periodic_slack_diff_ms"]].abs()
    df["closest"] = [str(c).removesuffix("_diff_ms") for c in errors.idxmin(axis=1)]
    return df


def verdict_cfs(df: pd.DataFrame) -> str:
    """One paragraph on the cfs table."""
    if df.empty:
        return "cfs: nothing measured."
    control = df[df.q_cores.isna()]
    df = df[df.q_cores.notna()]
    if not control.empty:
        extra = (control.measured_ms - control.work_ms).mean() * 1e3
        intro = f"Without a quota, a burst after the same idle takes {extra:.0f} us more than its CPU time (control). "
    else:
        intro = ""
    mid = df[
        (df["work_ms"] > 0.5 * df["q_cores"] * df["period_ms"]) & (df["work_ms"] < 3 * df["q_cores"] * df["period_ms"])
    ]
    parts = [
        f"Over {len(df)} configurations, measured minus the bucket (the simulator's model before 2026-11-28): "
        f"mean {df.bucket_diff_ms.mean():+.2f} ms "
        f"(median fraction {df.bucket_diff_frac.median():+.1%}, mean {df.bucket_diff_frac.mean():+.1%}); minus the "
        f"periodic refill: mean {df.periodic_diff_ms.mean():+.2f} ms (median fraction "
        f"{df.periodic_diff_frac.median():+.1%}); minus periodic+1 ms slack: "
        f"mean {df.periodic_slack_diff_ms.mean():+.2f} ms "
        f"(median {df.periodic_slack_diff_frac.median():+.1%}).",
        f"Closest model per configuration: {df.closest.value_counts().to_dict()}.",
    ]
    if not mid.empty:
        parts.append(
            f"Where w is 0.5 to 3 periods' quota (the bucket and the periods disagree most), measured minus bucket is "
            f"{mid.bucket_diff_ms.mean():+.2f} ms on average ({mid.bucket_diff_frac.median():+.1%} median), minus "
            f"periodic {mid.periodic_diff_ms.mean():+.2f} ms."
        )
    band = pd.cut(df.work_ms / (df.q_cores * df.period_ms), [0, 0.5, 1, 3, math.inf])
    bands = df.groupby(band, observed=True).agg(
        bucket=("bucket_diff_ms", "mean"),
        periodic=("periodic_diff_ms", "mean"),
        mean_minus_p50=("measured_p50_ms", lambda x: (df.measured_ms[x.index] - x).mean()),
        throttled=("nr_throttled", "mean"),
    )
    parts.append(
        "By w over one period's quota, mean ms measured minus bucket / minus periodic / mean minus median "
        "(the tail) / periods throttled per burst: "
        + "; ".join(
            f"w/qP in {iv}: {r.bucket:+.2f} / {r.periodic:+.2f} / {r.mean_minus_p50:+.2f} / {r.throttled:.2f}"
            for iv, r in bands.iterrows()
        )
        + ". Throttling of bursts under one period's quota (w/qP <= 1) is the kernel's, not either model's."
    )
    by_period = df.groupby("period_ms")["bucket_diff_frac"].median().map(lambda x: f"{x:+.1%}").to_dict()
    parts.append(f"Median bucket error by period (ms): {by_period}.")
    parts.append(
        f"The simulator now refills each period's quota at its boundaries (the periodic model, averaged over the "
        f"phase: measured minus the simulator's own QuotaScheduler is mean {df.simulator_diff_ms.mean():+.2f} ms, "
        f"median fraction {df.simulator_diff_frac.median():+.1%}); the bucket is its model before 2026-11-28. What "
        "is left is the kernel's per-CPU slices and tick, which throttle some bursts under one period's quota."
    )
    return intro + " ".join(parts)


# -- restart ----------------------------------------------------------------------------------------------
def piece(iterations: int, values: np.ndarray) -> None:
    """The restart section's fixed piece of work: ``iterations`` Python integer products, then a fixed-point
    encoding of ``values`` (clip, scale, round, to integers) twice."""
    total = 0
    for i in range(iterations):
        total += i * i
    for _ in range(2):
        np.round(np.clip(values, -1.0, 1.0) * (1 << 19)).astype(np.int64)


def child_restart(config: dict[str, Any]) -> None:
    """Child: for each command, sleep ``idle_s``, then run ``n`` pieces (:func:`piece`) ``gap_s`` apart; the
    CPU seconds of each."""
    values = np.random.default_rng(0).standard_normal(16_384)
    say({"ready": os.getpid()})
    while (cmd := listen()) is not None:
        time.sleep(cmd["idle_s"])
        cpu = []
        for _ in range(cmd["n"]):
            before = time.thread_time()
            piece(cmd["iterations"], values)
            cpu.append(time.thread_time() - before)
            time.sleep(cmd["gap_s"])
        say({"cpu_s": cpu})


def section_restart(quick: bool, rng: random.Random) -> pd.DataFrame:
    """CPU seconds of a fixed piece of work at each quota, against the same piece without one, per throttle."""
    quotas = [1 / 9, 1 / 3, math.inf] if quick else [1 / 9, 1 / 6, 1 / 4, 1 / 3, 1 / 2, math.inf]
    sizes = [60_000] if quick else [15_000, 60_000]  # about 0.8 and 2.8 ms of CPU on this project's machine
    reps = 4 if quick else 10
    plan = [(q, size) for q in quotas for size in sizes for _ in range(reps)]
    rng.shuffle(plan)
    samples: dict[tuple[float, int], list[tuple[list[float], int]]] = collections.defaultdict(list)
    with Groups() as groups, children() as kids:
        child = groups.with_child(kids, "party", "restart", ready_s=60)
        current = None
        for q, size in plan:
            if current != q:
                groups.set_quota_us("party", round(q * PERIOD_US) if q < math.inf else None, PERIOD_US)
                current = q
            n0, _ = groups.stat("party")
            child.send({"idle_s": 0.03 + rng.random() * 0.01, "n": 15, "iterations": size, "gap_s": 0.003})
            reply = child.recv(120)
            n1, _ = groups.stat("party")
            samples[(q, size)].append((reply["cpu_s"], n1 - n0))
    rows = []
    for (q, size), got in sorted(samples.items()):
        cpu = np.array([c for pieces, _ in got for c in pieces])
        rows.append(
            {
                "section": "restart",
                "q_cores": q,
                "iterations": size,
                "pieces": len(cpu),
                "cpu_ms": cpu.mean() * 1e3,
                "cpu_p50_ms": np.median(cpu) * 1e3,
                "throttles_per_piece": sum(n for _, n in got) / len(cpu),
            }
        )
    df = pd.DataFrame(rows)
    free = df[df.q_cores == math.inf].set_index("iterations")["cpu_ms"]
    df["extra_ms"] = df["cpu_ms"] - df["iterations"].map(free)
    df["extra_frac"] = df["extra_ms"] / df["iterations"].map(free)
    throttled = df["throttles_per_piece"] > 0.1
    df["ms_per_throttle"] = np.where(throttled, df["extra_ms"] / df["throttles_per_piece"], np.nan)
    df["q_cores"] = df["q_cores"].replace(math.inf, math.nan)  # NaN: the no-quota control
    return df


def verdict_restart(df: pd.DataFrame) -> str:
    """One paragraph on the restart table."""
    quota = df[df.q_cores.notna()]
    if quota.empty:
        return "restart: nothing measured."
    by_q = quota.groupby("q_cores").agg(frac=("extra_frac", "mean"), per=("ms_per_throttle", "median"))
    each = "; ".join(
        f"q {q:.3f}: {r.frac:+.1%}" + ("" if math.isnan(r.per) else f", {r.per:.3f} ms a throttle")
        for q, r in by_q.iterrows()
    )
    return (
        "A fixed piece of work takes more CPU the more often a spent quota interrupts it (its CPU over the same "
        f"piece without a quota, and per throttle: {each}). The simulator charges each operation its CPU "
        "whatever the quota; a calibration that fits the CPU per operation over all parties charges a party "
        "on a small quota too little."
    )


# -- threads -----------------------------------------------------------------------------------------------
def child_threads(config: dict[str, Any]) -> None:
    """Child: torch with ``threads`` intra-op threads; per command, idle ``idle_s`` then ``steps`` SGD steps
    of a Linear(k, k) (``params`` ~ k*k) on a batch of 64."""
    import torch

    torch.set_num_threads(config["threads"])
    models = {}
    for params in config["params"]:
        k = round(math.sqrt(params))
        model = torch.nn.Linear(k, k)
        models[params] = (model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(64, k), torch.randn(64, k))

    def steps(params: int) -> None:
        model, opt, x, y = models[params]
        for _ in range(config["steps"]):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()

    for params in models:
        steps(params)  # warm-up
    say({"ready": os.getpid()})
    while (cmd := listen()) is not None:
        time.sleep(cmd["idle_s"])
        w0, c0 = time.perf_counter(), time.process_time()
        steps(cmd["params"])
        say({"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0})


def section_threads(quick: bool, rng: random.Random) -> pd.DataFrame:
    """Training wall (ms), process CPU (ms) and throttled time (ms) at 0.5 core with 1 and 2 threads."""
    q = 0.5
    params = [10_000, 100_000, 1_000_000]
    reps, steps = (3, 3) if quick else (12, 5)
    period = cfs_period_us(q) / 1e6
    samples: dict[tuple[int, int], list[tuple[float, float, float]]] = collections.defaultdict(list)
    with Groups() as groups, children() as kids:
        procs = {}
        for threads in (1, 2):
            party = f"t{threads}"
            groups.add(party, q)  # the testbed's own quota and period (sim.testbed.quota_us)
            child = Child.of("threads", {"threads": threads, "params": params, "steps": steps})
            kids.append(child)
            procs[threads] = (party, child)
        for _, child in procs.values():
            child.recv(120)
        for party, child in procs.values():
            groups.attach(party, child.pid)
        plan = [(t, p) for t in (1, 2) for p in params for _ in range(reps)]
        rng.shuffle(plan)
        for threads, p in plan:
            party, child = procs[threads]
            _, t0 = groups.stat(party)
            child.send({"idle_s": 3 * period + rng.random() * period, "params": p})
            reply = child.recv(120)
            _, t1 = groups.stat(party)
            samples[(threads, p)].append((reply["wall_s"], reply["cpu_s"], (t1 - t0) / 1e3))
    rows = []
    quota_period = cfs_period_us(q) / 1e6
    for (threads, p), got in sorted(samples.items()):
        wall, cpu, thr = (float(np.mean([g[i] for g in got])) for i in range(3))
        one_cpu = float(np.mean([g[1] for g in samples[(1, p)]]))
        rows.append(
            {
                "section": "threads",
                "q_cores": q,
                "threads": threads,
                "params": p,
                "steps": steps,
                "reps": len(got),
                "measured_ms": wall * 1e3,
                "cpu_ms": cpu * 1e3,
                "throttled_ms": thr,
                "modelled_ms": simulator_s(one_cpu, q, quota_period) * 1e3,
                "alt_all_threads_cpu_ms": simulator_s(cpu, q, quota_period) * 1e3,
            }
        )
    df = pd.DataFrame(rows)
    df["diff_ms"] = df["measured_ms"] - df["modelled_ms"]
    df["diff_frac"] = df["diff_ms"] / df["modelled_ms"]
    return df


def verdict_threads(df: pd.DataFrame) -> str:
    """One paragraph on the threads table."""
    one, two = df[df.threads == 1].set_index("params"), df[df.threads == 2].set_index("params")
    ratio = (two.measured_ms / one.measured_ms).map(lambda x: f"{x:.2f}").to_dict()
    cpu = (two.cpu_ms / one.cpu_ms).map(lambda x: f"{x:.2f}").to_dict()
    return (
        f"At 0.5 core, 2 threads over 1 thread: wall x{ratio}, process CPU x{cpu} (by parameters). The simulator "
        f"charges the single-thread CPU as one job (modelled_ms, its quota's model): 1 thread measured minus model "
        f"{one.diff_frac.median():+.1%} median, 2 threads {two.diff_frac.median():+.1%}. Charging all threads' CPU "
        f"against the quota (alt_all_threads_cpu_ms) explains 2 threads' wall within "
        f"{((two.measured_ms - two.alt_all_threads_cpu_ms) / two.alt_all_threads_cpu_ms).abs().median():.1%} (median). "
        "Extra threads inside a quota cost wall time to the extent they add CPU (spinning, synchronisation): the "
        "simulator does not model that."
    )


# -- loop --------------------------------------------------------------------------------------------------
QUIT = 0xFFFFFFFF
CPU_QUERY = 0xFFFFFFFE


def child_loop_server(config: dict[str, Any]) -> None:
    """Child: an asyncio echo server of length-prefixed frames on 127.0.0.1; replies to a CPU query with its
    process CPU seconds; ends on QUIT or after ``limit_s``."""

    async def main() -> None:
        done = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    (n,) = struct.unpack("!I", await reader.readexactly(4))
                    if n == QUIT:
                        done.set()
                        break
                    if n == CPU_QUERY:
                        payload = struct.pack("!d", time.process_time())
                        writer.write(struct.pack("!I", len(payload)) + payload)
                    else:
                        payload = await reader.readexactly(n)
                        writer.write(struct.pack("!I", n) + payload)
                    await writer.drain()
            except asyncio.IncompleteReadError:
                done.set()
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        say({"port": server.sockets[0].getsockname()[1], "pid": os.getpid()})
        async with server:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), config["limit_s"])

    asyncio.run(main())


def child_loop_client(config: dict[str, Any]) -> None:
    """Child: after "go", ping-pongs frames of each size with the server, then hands a tiny computation to a
    thread and back; reports wall (s) per round trip / hand-over and CPU (s) of both ends."""
    say({"ready": os.getpid()})
    listen()
    rng = random.Random(config["seed"])

    async def main() -> dict[str, Any]:
        reader, writer = await asyncio.open_connection("127.0.0.1", config["port"])
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        async def server_cpu() -> float:
            writer.write(struct.pack("!I", CPU_QUERY))
            await writer.drain()
            (n,) = struct.unpack("!I", await reader.readexactly(4))
            return float(struct.unpack("!d", await reader.readexactly(n))[0])

        out: dict[str, Any] = {"pingpong": [], "handover": {}}
        for size, count in zip(config["sizes"], config["counts"], strict=True):
            payload = os.urandom(size)
            frame = struct.pack("!I", size) + payload
            walls, client_cpu = [], 0.0
            s0 = await server_cpu()
            deadline = time.monotonic() + config["limit_per_size_s"]
            for _ in range(count):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(rng.random() * config["gap_s"])
                c0, t0 = time.process_time(), time.perf_counter()
                writer.write(frame)
                await writer.drain()
                (n,) = struct.unpack("!I", await reader.readexactly(4))
                await reader.readexactly(n)
                walls.append(time.perf_counter() - t0)
                client_cpu += time.process_time() - c0
            s1 = await server_cpu()
            out["pingpong"].append(
                {"bytes": size, "walls_s": walls, "client_cpu_s": client_cpu, "server_cpu_s": s1 - s0}
            )
        writer.write(struct.pack("!I", QUIT))
        await writer.drain()
        writer.close()

        loop = asyncio.get_running_loop()
        data = np.arange(1000, dtype=np.float64)

        def small() -> float:
            t0 = time.thread_time()
            float(data.sum())
            return time.thread_time() - t0

        with ThreadPoolExecutor(1) as pool:
            await loop.run_in_executor(pool, small)
            walls, inner, cpu = [], 0.0, 0.0
            deadline = time.monotonic() + config["limit_per_size_s"]
            for _ in range(config["handovers"]):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(rng.random() * config["gap_s"])
                c0, t0 = time.process_time(), time.perf_counter()
                inner += await loop.run_in_executor(pool, small)
                walls.append(time.perf_counter() - t0)
                cpu += time.process_time() - c0
            out["handover"] = {"walls_s": walls, "cpu_s": cpu, "inner_cpu_s": inner}
        return out

    say(asyncio.run(main()))


def section_loop(quick: bool, rng: random.Random) -> pd.DataFrame:
    """Round-trip and hand-over wall (us), CPU (us) and unexplained wall (us), free and at 0.25 core."""
    sizes = [64, 4096, 65536, 1 << 20]
    counts = [100, 100, 60, 20] if quick else [400, 400, 200, 60]
    handovers = 200 if quick else 800
    q = 0.25
    send, receive, call = profile_coef("deploy.send"), profile_coef("deploy.receive"), profile_coef("deploy.call")

    def cost(coef: dict[str, float], n: int) -> float:
        return coef.get("const", 0.0) + coef.get("bytes", 0.0) * n

    rows = []
    for mode in ("free", "quota"):
        with Groups() as groups, children() as kids:
            server = Child.of("loop-server", {"limit_s": 300})
            kids.append(server)
            port = server.recv(30)["port"]
            config = {
                "port": port,
                "sizes": sizes,
                "counts": counts,
                "handovers": handovers,
                "gap_s": PERIOD_US / 1e6,
                "limit_per_size_s": 8 if quick else 20,
                "seed": rng.randrange(1 << 30),
            }
            client = Child.of("loop-client", config)
            kids.append(client)
            client.recv(30)
            if mode == "quota":
                for party, child in (("server", server), ("client", client)):
                    groups.add(party, q)
                    groups.attach(party, child.pid)
            stats0 = {p: groups.stat(p) for p in groups.parties}
            client.send("go")
            result = client.recv(300)
            stats1 = {p: groups.stat(p) for p in groups.parties}
            throttled_ms = sum(stats1[p][1] - stats0[p][1] for p in stats0) / 1e3
            for entry in result["pingpong"]:
                n, walls = entry["bytes"], np.array(entry["walls_s"])
                cpu = (entry["client_cpu_s"] + entry["server_cpu_s"]) / len(walls)
                modelled = 2 * (cost(send, n) + cost(receive, n))
                rows.append(loop_row("pingpong", mode, q, n, walls, cpu, modelled, throttled_ms))
            hand = result["handover"]
            walls = np.array(hand["walls_s"])
            rows.append(
                loop_row("handover", mode, q, 0, walls, hand["cpu_s"] / len(walls), cost(call, 0), throttled_ms)
            )
    return pd.DataFrame(rows)


def loop_row(
    what: str, mode: str, q: float, n: int, walls: np.ndarray, cpu: float, modelled: float, throttled_ms: float
) -> dict[str, Any]:
    """One row of the loop table: ``walls`` (seconds each) of ``what`` with ``n`` bytes, against the CPU seconds
    both ends spent per repetition (``cpu``) and the simulator's charge (``modelled``, seconds)."""
    return {
        "section": "loop",
        "what": what,
        "mode": mode,
        "q_cores": q if mode == "quota" else math.nan,
        "bytes": n,
        "count": len(walls),
        "median_us": np.median(walls) * 1e6,
        "mean_us": walls.mean() * 1e6,
        "p90_us": np.percentile(walls, 90) * 1e6,
        "cpu_us": cpu * 1e6,
        "unexplained_us": (walls.mean() - cpu) * 1e6,
        "modelled_us": modelled * 1e6,
        "mean_minus_modelled_us": (walls.mean() - modelled) * 1e6,
        "throttled_ms_all": throttled_ms,
    }


def verdict_loop(df: pd.DataFrame) -> str:
    """One paragraph on the loop table."""
    parts = []
    for mode in ("free", "quota"):
        sub = df[df["mode"] == mode].set_index(["what", "bytes"])
        rt = sub.loc["pingpong"]
        hand = sub.loc["handover"].iloc[0]
        parts.append(
            f"{mode}: a round trip's wall not explained by both ends' CPU is "
            + ", ".join(f"{n} B {r.unexplained_us:.0f} us" for n, r in rt.iterrows())
            + "; measured minus modelled (2 x (deploy.send + deploy.receive)) "
            + ", ".join(f"{r.mean_minus_modelled_us:+.0f} us" for _, r in rt.iterrows())
            + f". A hand-over takes {hand.median_us:.0f} us median, {hand.mean_us:.0f} us mean "
            f"({hand.cpu_us:.0f} us CPU; deploy.call charges {hand.modelled_us:.0f} us)."
        )
    parts.append(
        "The simulator charges the sockets' and hand-overs' CPU (deploy.*) but not the wake-up latency between "
        "processes, nor a wake-up landing in a throttled stretch of a quota (the quota rows' mean over median)."
    )
    return " ".join(parts)


# -- htb ---------------------------------------------------------------------------------------------------
def child_htb(config: dict[str, Any]) -> None:
    """Child, in a private network namespace: one client shaped by :class:`LinkShaper`; sends each message
    size at each rate over TCP from 127.0.1.1 to 127.0.0.1, each acknowledged by one byte; reports the
    seconds to each acknowledgement."""

    def exactly(sock: socket.socket, n: int) -> None:
        while n > 0:
            chunk = sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionError("peer closed")
            n -= len(chunk)

    shaper = kernel.LinkShaper(server_bps=10e9)
    out = []
    try:
        address = shaper.add(0, config["rates_mbps"][0] * 1e6)
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]

            def receive() -> None:
                conn, _ = server.accept()
                with conn:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    while True:
                        head = conn.recv(8, socket.MSG_WAITALL)
                        if len(head) < 8:
                            return
                        (n,) = struct.unpack("!Q", head)
                        exactly(conn, n)
                        conn.sendall(b"k")

            receiver = threading.Thread(target=receive, daemon=True)
            receiver.start()
            with socket.create_connection(("127.0.0.1", port), source_address=(address, 0)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for mbps in config["rates_mbps"]:
                    shaper.retune(0, mbps * 1e6)
                    for size in config["sizes"]:
                        expected = size * 8 / (mbps * 1e6 * PAYLOAD_FRACTION)
                        if expected > config["max_message_s"]:
                            continue
                        reps = max(2, min(config["reps"], int(config["cap_s"] / (expected + config["gap_s"]))))
                        sock.settimeout(10 * expected + 5)
                        payload = os.urandom(size)
                        times = []
                        for _ in range(reps):
                            time.sleep(config["gap_s"])
                            t0 = time.perf_counter()
                            sock.sendall(struct.pack("!Q", size) + payload)
                            if sock.recv(1) != b"k":
                                raise ConnectionError("no acknowledgement")
                            times.append(time.perf_counter() - t0)
                        out.append({"rate_mbps": mbps, "bytes": size, "times_s": times})
            receiver.join(5)
    finally:
        shaper.close()
    say(out)


def section_htb(quick: bool, rng: random.Random) -> pd.DataFrame:
    """Message delivery time (ms) on an htb-shaped idle link against the simulator's bytes*8/(rate*fraction)."""
    del rng
    config = {
        "rates_mbps": [1, 5, 21, 60, 210],
        "sizes": [1_000, 10_000, 100_000, 1_000_000],
        "reps": 4 if quick else 12,
        "cap_s": 3 if quick else 12,
        "gap_s": 0.05,
        "max_message_s": 0.5 if quick else 2.0,
    }
    with children() as kids:
        child = Child.of("htb", config, prefix=["unshare", "--net", "--"], env=kernel.private_network_env())
        kids.append(child)
        result = child.recv(600)
    rows = []
    for entry in result:
        mbps, n, times = entry["rate_mbps"], entry["bytes"], np.array(entry["times_s"])
        bps = mbps * 1e6
        modelled = n * 8 / (bps * PAYLOAD_FRACTION)
        frames = math.ceil(n / MSS_BYTES)
        wire_bits = (n + frames * (FRAME_BYTES - MSS_BYTES)) * 8
        frame_exact = max(0.0, wire_bits - FRAME_BYTES * 8) / bps
        rows.append(
            {
                "section": "htb",
                "rate_mbps": mbps,
                "bytes": n,
                "reps": len(times),
                "measured_ms": times.mean() * 1e3,
                "median_ms": np.median(times) * 1e3,
                "min_ms": times.min() * 1e3,
                "first_ms": times[0] * 1e3,
                "modelled_ms": modelled * 1e3,
                "alt_frames_burst_ms": frame_exact * 1e3,
                "diff_ms": (times.mean() - modelled) * 1e3,
                "diff_frac": (times.mean() - modelled) / modelled,
                "free_bytes_at_rate": (wire_bits / bps - np.median(times)) * bps / 8,
            }
        )
    return pd.DataFrame(rows)


def verdict_htb(df: pd.DataFrame) -> str:
    """One paragraph on the htb table."""
    big = df[df.modelled_ms > 5]
    small = df[df.modelled_ms <= 5]
    smallest = df[df.bytes == df.bytes.min()].median_ms.median()
    by_rate = df.groupby("rate_mbps")["diff_ms"].median().map(lambda x: f"{x:+.2f}").to_dict()
    return (
        f"Measured minus bytes*8/(rate*{PAYLOAD_FRACTION:.3f}): median {df.diff_ms.median():+.2f} ms, "
        f"{df.diff_frac.median():+.1%}; for messages modelled over 5 ms {big.diff_frac.median():+.1%} median "
        f"({big.diff_ms.mean():+.2f} ms mean), under 5 ms {small.diff_ms.median():+.2f} ms median. Median difference "
        f"by rate (ms): {by_rate}. Bytes an idle link passes beyond its rate (free_bytes_at_rate, median over "
        f"messages of at least 10 kB at up to 5 Mbps, where the per-message cost is small against the rate's): "
        f"{df[(df.bytes >= 10_000) & (df.rate_mbps <= 5)].free_bytes_at_rate.median():.0f} (htb's configured "
        f"burst: {FRAME_BYTES}). Smallest messages (1 kB) take {smallest:.2f} ms median whatever the rate: the "
        "fixed cost of a message and its acknowledgement. The simulator models the payload fraction, not the "
        "one-frame burst, the "
        "per-packet and ACK latency nor TCP's window growth on a shaped link; the rows say which matter."
    )


# -- cores -------------------------------------------------------------------------------------------------
def child_busy(config: dict[str, Any]) -> None:
    """Child: wait for a start time (monotonic s), then burn ``work_s`` CPU seconds; report the end time."""
    say({"ready": os.getpid()})
    cmd = listen()
    time.sleep(max(0.0, cmd["t0"] - time.monotonic()))
    busy(config["work_s"])
    say({"end": time.monotonic()})


def section_cores(quick: bool, rng: random.Random) -> pd.DataFrame:
    """Completion times (s) of N busy processes at 0.75 core each on this host's cores vs water-filling."""
    q = 0.75
    cores = len(os.sched_getaffinity(0))
    work = 0.25 if quick else 0.6
    ns = [1, 2, 3, 6] if quick else [1, 2, 3, 4, 5, 6]
    reps = 1 if quick else 2
    rows = []
    for n in ns:
        for rep in range(reps):
            with Groups() as groups, children() as kids:
                for _ in range(n):
                    kids.append(Child.of("busy", {"work_s": work}))
                for i, child in enumerate(kids):
                    child.recv(30)
                    groups.add(f"p{i}", q)
                    groups.attach(f"p{i}", child.pid)
                t0 = time.monotonic() + 0.3
                for child in kids:
                    child.send({"t0": t0})
                ends = np.array([child.recv(60 + 10 * n * work)["end"] - t0 for child in kids])
                throttled = sum(groups.stat(p)[1] for p in groups.parties) / 1e3 / n
            model = simulated([q] * n, [work] * n, cores, rng)
            share = work / min(q, cores / n)
            rows.append(
                {
                    "section": "cores",
                    "n": n,
                    "rep": rep,
                    "q_cores": q,
                    "host_cores": cores,
                    "work_s": work,
                    "mean_s": ends.mean(),
                    "max_s": ends.max(),
                    "modelled_s": float(np.mean(model)),
                    "alt_plain_share_s": share,
                    "extra_s": ends.mean() - float(np.mean(model)),
                    "extra_frac": ends.mean() / float(np.mean(model)) - 1,
                    "throttled_ms_per_process": throttled,
                }
            )
    return pd.DataFrame(rows)


def verdict_cores(df: pd.DataFrame) -> str:
    """One paragraph on the cores table."""
    by_n = df.groupby("n")["extra_frac"].mean().map(lambda x: f"{x:+.1%}").to_dict()
    over = df[df.n * df.q_cores > df.host_cores]
    return (
        f"Mean completion over the simulator's water-filled quotas, by N: {by_n}. Oversubscribed (N q > cores): "
        f"{over.extra_frac.mean():+.1%} mean, the slowest process {((over.max_s / over.modelled_s) - 1).mean():+.1%}. "
        "The simulator models the sharing as a fluid; what is left is the scheduler's slices, throttling of "
        "groups that overran and the other load on this host."
    )


# -- slices ------------------------------------------------------------------------------------------------
def child_slices(config: dict[str, Any]) -> None:
    """Child: two threads. For each command, the main thread sleeps ``idle_s``, runs ``a_s`` CPU seconds on
    CPU ``a``, then wakes the other thread, pinned to CPU ``b``, which runs ``b_s``; reports the wall
    seconds from the first's start to the second's end (a party's event loop handing a frame's work to its
    compute thread)."""
    go, done = threading.Event(), threading.Event()
    plan: dict[str, Any] = {}

    def second() -> None:
        while True:
            go.wait()
            go.clear()
            if plan.get("stop"):
                return
            os.sched_setaffinity(0, {plan["b"]})
            busy(plan["b_s"])
            done.set()

    worker = threading.Thread(target=second, daemon=True)
    worker.start()
    say({"ready": True})
    while (command := listen()) is not None:
        plan.update(command)
        os.sched_setaffinity(0, {command["a"]})
        time.sleep(command["idle_s"])
        start = time.perf_counter()
        busy(command["a_s"])
        go.set()
        done.wait()
        done.clear()
        say({"wall_s": time.perf_counter() - start})
    plan["stop"] = True
    go.set()
    worker.join(1)


def section_slices(quick: bool, rng: random.Random) -> pd.DataFrame:
    """Two threads of one cgroup, one after the other, on one CPU and on two: the wall time (ms) of both
    bursts, against the simulator (the party's quota, whichever CPU its threads run on)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return pd.DataFrame()
    pairs = {"one CPU": (cpus[0], cpus[0]), "two CPUs": (cpus[0], cpus[1])}
    quotas = [1 / 3] if quick else [1 / 3, 0.5]
    bursts = [(3e-4, 1e-3), (1e-3, 2e-3)] if quick else [(3e-4, 1e-3), (5e-4, 2e-3), (1e-3, 2e-3)]
    reps = 15 if quick else 60
    plan = [(q, where, a, b) for q in quotas for where in pairs for a, b in bursts for _ in range(reps)]
    rng.shuffle(plan)
    samples: dict[tuple[float, str, float, float], list[float]] = collections.defaultdict(list)
    with Groups() as groups, children() as kids:
        child = groups.with_child(kids, "party", "slices")
        current = None
        for q, where, a, b in plan:
            if current != q:
                groups.set_quota_us("party", round(q * PERIOD_US), PERIOD_US)
                current = q
            cpu_a, cpu_b = pairs[where]
            idle = 3 * PERIOD_US / 1e6 + rng.random() * PERIOD_US / 1e6
            child.send({"a": cpu_a, "b": cpu_b, "a_s": a, "b_s": b, "idle_s": idle})
            samples[(q, where, a, b)].append(child.recv(30)["wall_s"])
    rows = []
    for (q, where, a, b), walls in sorted(samples.items()):
        wall = np.array(walls)
        rows.append(
            {
                "section": "slices",
                "q_cores": q,
                "cpus": where,
                "a_ms": a * 1e3,
                "b_ms": b * 1e3,
                "reps": len(wall),
                "measured_ms": wall.mean() * 1e3,
                "measured_p50_ms": np.median(wall) * 1e3,
                "measured_p90_ms": np.percentile(wall, 90) * 1e3,
                "simulator_ms": simulator_s(a + b, q, PERIOD_US / 1e6) * 1e3,
            }
        )
    df = pd.DataFrame(rows)
    df["diff_ms"] = df["measured_ms"] - df["simulator_ms"]
    return df


def verdict_slices(df: pd.DataFrame) -> str:
    """One paragraph on the slices table."""
    if df.empty:
        return "slices: needs two CPUs."
    keys = ["q_cores", "a_ms", "b_ms"]
    one = df[df.cpus == "one CPU"].set_index(keys)
    two = df[df.cpus == "two CPUs"].set_index(keys)
    extra = (two.measured_ms - one.measured_ms).mean()
    return (
        f"Two threads of one party, one after the other: on two CPUs they take {extra:+.2f} ms more on average "
        f"than on one (mean over {len(two)} configurations; tails: p90 {two.measured_p90_ms.mean():.2f} against "
        f"{one.measured_p90_ms.mean():.2f} ms). Measured minus the simulator: {one.diff_ms.mean():+.2f} ms on one "
        f"CPU, {two.diff_ms.mean():+.2f} ms on two. CFS hands a cgroup's runtime to each CPU in slices, so a "
        "thread that wakes on another CPU may find the party's quota held by the first CPU and wait for the next "
        "period; the simulator's quota is one pool, whichever CPU its threads run on."
    )


# -- gc ----------------------------------------------------------------------------------------------------
def child_gc(config: dict[str, Any]) -> None:
    """Child: a party-like allocation loop (torch imported) for ``duration_s``; every collection's pause."""
    import torch  # noqa: F401  (a party's heap holds torch's objects, which full collections traverse)

    import sim.deploy  # noqa: F401

    pauses: list[tuple[int, float]] = []
    started: dict[str, float] = {}

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            pauses.append((info["generation"], time.perf_counter() - started.pop("t")))

    rng = np.random.default_rng(config["seed"])
    arrays: collections.deque[np.ndarray] = collections.deque(maxlen=8)
    frames: collections.deque[list[dict[str, Any]]] = collections.deque(maxlen=100)
    tracked = len(gc.get_objects())
    gc.callbacks.append(callback)
    t0 = time.perf_counter()
    i = 0
    try:
        while i < config["max_iter"] and time.perf_counter() - t0 < config["duration_s"]:
            arrays.append(rng.standard_normal(int(10 ** rng.uniform(4, 6)), dtype=np.float32))
            frames.append([{"round": i, "client": j, "kind": "share", "payload": os.urandom(64)} for j in range(200)])
            i += 1
    finally:
        wall = time.perf_counter() - t0
        gc.callbacks.remove(callback)
    forced = []
    for _ in range(3):  # a full collection of this heap, forced: what one costs when it comes
        f0 = time.perf_counter()
        gc.collect()
        forced.append(time.perf_counter() - f0)
    say({"wall_s": wall, "iterations": i, "pauses": pauses, "tracked": tracked, "forced_full_s": forced})


def section_gc(quick: bool, rng: random.Random) -> pd.DataFrame:
    """Collections per second and pause percentiles (ms) by generation in a party-like process."""
    config = {"duration_s": 3 if quick else 10, "max_iter": 10**6, "seed": rng.randrange(1 << 30)}
    with children() as kids:
        child = Child.of("gc", config)
        kids.append(child)
        result = child.recv(120)
    wall = result["wall_s"]
    rows = []
    pauses = result["pauses"]
    for gen in (0, 1, 2, "all"):
        got = np.array([p for g, p in pauses if gen in ("all", g)])
        rows.append(
            {
                "section": "gc",
                "generation": gen,
                "wall_s": wall,
                "iterations": result["iterations"],
                "tracked_objects": result["tracked"],
                "count": len(got),
                "per_s": len(got) / wall,
                "p50_ms": np.percentile(got, 50) * 1e3 if len(got) else math.nan,
                "p99_ms": np.percentile(got, 99) * 1e3 if len(got) else math.nan,
                "max_ms": got.max() * 1e3 if len(got) else math.nan,
                "total_ms": got.sum() * 1e3,
                "fraction_of_wall": got.sum() / wall,
                "forced_full_ms": float(np.median(result["forced_full_s"])) * 1e3,
                "modelled_ms": 0.0,
            }
        )
    return pd.DataFrame(rows)


def verdict_gc(df: pd.DataFrame) -> str:
    """One paragraph on the gc table."""
    every = df[df.generation == "all"].iloc[0]
    full = df[df.generation == 2].iloc[0]
    return (
        f"{every['count']} collections in {every.wall_s:.1f} s ({every.per_s:.1f}/s), {every.fraction_of_wall:.2%} of "
        f"wall in pauses; full (gen 2) collections {full.per_s:.2f}/s, {full.p50_ms:.1f} ms median, "
        f"{full.max_ms:.1f} ms max with {int(every.tracked_objects)} objects tracked (a forced full collection of "
        f"this heap: {every.forced_full_ms:.1f} ms). The simulator has no collector; "
        "the profile's means carry the young collections, a full one lands on whatever operation runs then (at "
        "q cores it costs pause / q of wall once the quota is spent)."
    )


# -- main --------------------------------------------------------------------------------------------------
CHILDREN: dict[str, Callable[[dict[str, Any]], None]] = {
    "cfs": child_cfs,
    "restart": child_restart,
    "threads": child_threads,
    "slices": child_slices,
    "loop-server": child_loop_server,
    "loop-client": child_loop_client,
    "htb": child_htb,
    "busy": child_busy,
    "gc": child_gc,
}

RUNNERS: dict[str, tuple[Callable[[bool, random.Random], pd.DataFrame], Callable[[pd.DataFrame], str]]] = {
    "cfs": (section_cfs, verdict_cfs),
    "restart": (section_restart, verdict_restart),
    "threads": (section_threads, verdict_threads),
    "slices": (section_slices, verdict_slices),
    "loop": (section_loop, verdict_loop),
    "htb": (section_htb, verdict_htb),
    "cores": (section_cores, verdict_cores),
    "gc": (section_gc, verdict_gc),
}

NEEDS_ROOT = {"cfs", "restart", "threads", "slices", "loop", "htb", "cores"}


def _terminate(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {','.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="fewer configurations and repetitions (~2 min)")
    parser.add_argument("--csv", type=Path, default=Path("testbed_effects.csv"), help="one row per configuration")
    parser.add_argument("--seed", type=int, default=None, help="random seed of the plans (default: fresh)")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
            CHILDREN[args.child[0]](json.loads(args.child[1]))
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}")
    problems = kernel.missing()
    rng = random.Random(args.seed)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    tables = []
    status = 0
    for section in sections:
        if section in NEEDS_ROOT and problems:
            print(f"== {section}: skipped, this machine lacks: {'; '.join(problems)}")
            continue
        run, verdict = RUNNERS[section]
        start, host0, own0 = time.monotonic(), host_busy_s(), own_cpu_s()
        try:
            df = run(args.quick, rng)
        except KeyboardInterrupt:
            print(f"== {section}: interrupted")
            status = 130
            break
        except Exception as exc:  # a section's failure must not lose the others' results
            print(f"== {section}: FAILED: {type(exc).__name__}: {exc}")
            status = 1
            continue
        wall = time.monotonic() - start
        others = max(0.0, (host_busy_s() - host0 - (own_cpu_s() - own0)) / wall)
        print(f"== {section} ({wall:.0f} s; other processes kept {others:.2f} of the host's cores busy meanwhile)")
        print(df.drop(columns="section").to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        print(f"-- verdict ({section}): {verdict(df)}\n", flush=True)
        df["others_cores"] = others
        tables.append(df)
        pd.concat(tables, ignore_index=True).to_csv(args.csv, index=False)
    if tables:
        print(f"wrote {args.csv}")
    return status


if __name__ == "__main__":
    sys.exit(main())
