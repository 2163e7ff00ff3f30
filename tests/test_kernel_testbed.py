"""The kernel testbed's emulation, measured on this machine: a party's CPU rate is its cgroup quota, a
client's throughput is its shaped bandwidth both ways, and everything created is removed after success,
an error and Ctrl-C. The host's own loopback is never shaped.

Tolerances: a quota's rate within 8% (CFS accounts in ticks of the period; the machine's other load
competes for the second core), a shaped link's goodput within 10% of its rate (TCP/IP headers take about
3% of a loopback packet at the 64 KiB MTU; htb's burst lets the first packets through at once).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sim.deploy import kernel
from sim.deploy.kernel import CpuGroups, KernelTestbedError, LinkShaper

ROOT = Path(__file__).resolve().parent.parent

needs_kernel = pytest.mark.skipif(bool(kernel.missing()), reason=f"no kernel testbed here: {kernel.missing()}")

BUSY = """
import sys, time
sys.stdin.readline()  # wait until moved into the cgroup
wall, cpu, work = time.perf_counter(), time.process_time(), float(sys.argv[1])
ops = 0
while time.process_time() - cpu < work:
    end = time.process_time() + float(sys.argv[2])  # one operation of this many CPU seconds
    while time.process_time() < end:
        pass
    ops += 1
print((time.process_time() - cpu) / (time.perf_counter() - wall), ops)
"""


def _rate_in(groups: CpuGroups, party: str, work_s: float, op_s: float) -> float:
    """CPU seconds per wall second of a busy process in ``party``'s cgroup, doing ``work_s`` CPU seconds in
    operations of ``op_s`` each."""
    child = subprocess.Popen(
        [sys.executable, "-c", BUSY, str(work_s), str(op_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        groups.attach(party, child.pid)
        out, _ = child.communicate("go\n", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return float(out.split()[0])


@needs_kernel
@pytest.mark.parametrize("cores", [0.25, 0.5])
def test_a_quota_gives_its_cpu_rate(cores: float) -> None:
    with CpuGroups() as groups:
        groups.add("client0", cores)
        assert groups.quota("client0") == pytest.approx(cores)
        rate = _rate_in(groups, "client0", work_s=0.6, op_s=0.01)
        assert abs(rate - cores) <= 0.08 * cores, f"quota {cores} ran at {rate:.3f} cores"
        assert groups.throttled_s("client0") > 0
    assert not groups.parent.exists()


@needs_kernel
def test_a_quota_changed_between_rounds_gives_its_new_rate() -> None:
    with CpuGroups() as groups:
        groups.add("worker0", 0.5)
        groups.set("worker0", 0.25)  # the worker plays a slower client this round
        assert groups.quota("worker0") == pytest.approx(0.25)
        rate = _rate_in(groups, "worker0", work_s=0.4, op_s=0.01)
        assert abs(rate - 0.25) <= 0.08 * 0.25, f"quota 0.25 ran at {rate:.3f} cores"
        with pytest.raises(ValueError, match="> 0 cores"):
            groups.add("worker1", 0.0)
        assert "worker1" not in groups.parties


def test_the_dilation_fits_every_quota_in_the_cores() -> None:
    assert kernel.dilation(2, 1.0, [1.0, 2.0]) == pytest.approx(2 / 2.5)  # server 1 + clients 1 + 1/2
    assert kernel.dilation(64, 1.0, [1.0, 2.0]) == 1.0  # room enough: nobody is slowed beyond its device
    slowdowns = [1.0 + k / 3 for k in range(20)]
    f = kernel.dilation(2, 4.0, slowdowns)
    assert f * 4.0 + sum(f / s for s in slowdowns) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        kernel.dilation(2, 1.0, [0.5])


@needs_kernel
def test_sub_millisecond_operations_keep_the_quota_rate() -> None:
    """Operations of 0.2 ms CPU under a half-core quota take, on average, twice their CPU time: the 10 ms
    period throttles them in short stretches, not in 50 ms bursts that would stall some of them."""
    with CpuGroups() as groups:
        groups.add("server", 0.5)
        rate = _rate_in(groups, "server", work_s=0.4, op_s=0.0002)
        assert abs(rate - 0.5) <= 0.08 * 0.5, f"0.2 ms operations at a 0.5 quota ran at {rate:.3f} cores"


@needs_kernel
def test_cgroups_are_removed_after_an_error() -> None:
    with pytest.raises(RuntimeError, match="boom"), CpuGroups() as groups:
        groups.add("client0", 0.5)
        parent = groups.parent
        raise RuntimeError("boom")
    assert not parent.exists()


@needs_kernel
def test_cgroups_are_removed_after_ctrl_c(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        from sim.deploy.kernel import CpuGroups
        with CpuGroups() as groups:
            groups.add("client0", 0.5)
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            groups.attach("client0", child.pid)
            print(groups.parent, child.pid, flush=True)
            try:
                time.sleep(60)
            finally:
                child.kill()
        """
    )
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    parent, _ = process.stdout.readline().split()
    assert Path(parent).is_dir()
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)
    assert not Path(parent).exists()


@needs_kernel
def test_the_link_shaper_refuses_the_hosts_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KernelTestbedError, match="never the host's"):
        LinkShaper(1e9)
    monkeypatch.setenv(kernel.HOST_NETNS_ENV, str(kernel.network_namespace()))  # told it is where it started
    with pytest.raises(KernelTestbedError, match="never the host's"):
        LinkShaper(1e9)


SHAPED = """
import json, socket, threading, time
from sim.deploy.kernel import LinkShaper, SERVER_ADDRESS

RATE, SIZE = 20e6, 2_500_000  # 20 Mbps; 2.5 MB take one second
shaper = LinkShaper(server_bps=1e9)
address = shaper.add(0, 5e6)
shaper.retune(0, RATE)  # a worker's link set to the client it plays
listener = socket.create_server((SERVER_ADDRESS, 0))
port = listener.getsockname()[1]
result = {}

def serve():
    conn, peer = listener.accept()
    result["peer"] = peer[0]
    got, start = 0, None
    while got < SIZE:  # the client's upload
        data = conn.recv(1 << 16)
        start = start or time.perf_counter()
        got += len(data)
    result["up_s"] = time.perf_counter() - start
    conn.sendall(b"x" * SIZE)  # its download
    conn.close()

thread = threading.Thread(target=serve)
thread.start()
client = socket.create_connection((SERVER_ADDRESS, port), source_address=(address, 0))
client.sendall(b"x" * SIZE)
got, start = 0, None
while got < SIZE:
    data = client.recv(1 << 16)
    start = start or time.perf_counter()
    got += len(data)
result["down_s"] = time.perf_counter() - start
thread.join(30)
result["up_bps"] = SIZE * 8 / result["up_s"]
result["down_bps"] = SIZE * 8 / result["down_s"]
print(json.dumps(result))
"""


@needs_kernel
def test_a_clients_throughput_is_its_shaped_bandwidth_both_ways() -> None:
    before = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
    env = {**kernel.private_network_env(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", SHAPED], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["peer"] == kernel.client_address(0)  # the client spoke from its own address
    for direction in ("up_bps", "down_bps"):
        assert abs(result[direction] - 20e6) <= 0.10 * 20e6, f"{direction}: {result[direction] / 1e6:.2f} Mbps"
    after = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
    assert after == before  # the host's loopback was never touched; the namespace's went with it


def test_missing_says_what_a_machine_lacks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(kernel.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(kernel.shutil, "which", lambda tool: None if tool == "tc" else "/usr/bin/" + tool)
    monkeypatch.setattr(kernel, "CGROUP_ROOT", tmp_path)  # no controllers mounted there
    problems = kernel.missing()
    assert any(p.startswith("root") for p in problems)
    assert "the tc command (iproute2)" in problems
    assert any("cgroup cpu controller" in p for p in problems)
    with pytest.raises(KernelTestbedError, match="lacks: root"):
        kernel.require()


def test_client_addresses_are_loopback_and_distinct() -> None:
    addresses = [kernel.client_address(i) for i in range(600)]
    assert len(set(addresses)) == 600 and all(a.startswith("127.0.") for a in addresses)
    assert kernel.SERVER_ADDRESS not in addresses
    assert kernel.client_address(0) == "127.0.1.1" and kernel.client_address(254) == "127.0.2.1"
    classes = [c for i in range(600) for c in LinkShaper._classes(i)]
    assert len(set(classes)) == 1200 and "1:1" not in classes and "1:2" not in classes and "1:3" not in classes
    with pytest.raises(ValueError, match="htb class ids"):
        LinkShaper._classes(40_000)


def test_a_worker_connects_from_its_bound_address() -> None:
    """``dropsim worker --bind``: the worker's connection comes from the address it is given (a kernel
    testbed shapes each worker's traffic by it)."""
    import asyncio

    from sim.deploy.identity import new_identity
    from sim.deploy.worker import Worker

    async def connect() -> str:
        peers: list[str] = []

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peers.append(writer.get_extra_info("peername")[0])
            writer.close()

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        worker = Worker("127.0.0.1", port, 0, new_identity(), b"", 1 << 20, bind="127.0.0.7")
        _, writer = await worker._connect()
        for _ in range(100):  # bounded: the accept callback runs on the next loop turns
            if peers:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()
        return peers[0]

    assert asyncio.run(connect()) == "127.0.0.7"


def test_the_worker_command_refuses_a_bind_that_is_no_address(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    assert main(["worker", "--connect", "127.0.0.1:9", "--index", "0", "--bind", "lo0"]) == 2
    assert "--bind 'lo0': expected an IP address" in capsys.readouterr().err
