"""The kernel testbed's emulation, measured on this machine: a party's CPU rate is its cgroup quota, a
client's throughput is its shaped bandwidth both ways, and everything created is removed after success,
an error and Ctrl-C. The host's own loopback is never shaped.

Tolerances: a quota's rate within 8% (CFS accounts in ticks of the period; the machine's other load
competes for the second core), a shaped link's goodput within 3% of its rate times the payload fraction of
a 1514-byte frame (sim.testbed.PAYLOAD_FRACTION: the namespace's loopback has an Ethernet MTU without
segmentation offload, so htb shapes frames; its burst lets one frame through at once).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from sim.deploy import kernel
from sim.deploy.kernel import CpuGroups, KernelTestbedError, LinkShaper
from sim.testbed import PAYLOAD_FRACTION

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


@needs_kernel
def test_a_small_quota_runs_on_a_longer_period_the_kernel_accepts() -> None:
    with CpuGroups() as groups:
        groups.add("slow", 0.05)  # 0.5 ms a 10 ms period would be under the kernel's least quota
        assert groups.quota("slow") == pytest.approx(0.05)
        group = groups.parties["slow"]
        period = (
            (group / "cpu.max").read_text().split()[1]
            if groups.version == 2
            else (group / "cpu.cfs_period_us").read_text()
        )
        assert int(period) == 20_000
        rate = _rate_in(groups, "slow", work_s=0.1, op_s=0.005)
        assert abs(rate - 0.05) <= 0.08 * 0.05, f"quota 0.05 ran at {rate:.4f} cores"


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
                child.wait()
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
    goodput = 20e6 * PAYLOAD_FRACTION  # 1448 bytes of payload in every 1514-byte frame shaped
    for direction in ("up_bps", "down_bps"):
        assert abs(result[direction] - goodput) <= 0.03 * goodput, f"{direction}: {result[direction] / 1e6:.2f} Mbps"
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


def test_a_command_interrupted_by_ctrl_c_is_reaped() -> None:
    # subprocess.run kills its child on Ctrl-C without waiting for it: a zombie that outlives the command
    # where init does not reap orphans. The kernel testbed's commands (tc, ip) are reaped.
    before = set(_children(os.getpid()))

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            kernel._run(["sleep", "30"], "sleep")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert _described(set(_children(os.getpid())) - before) == []


def test_a_commands_failure_names_what_failed() -> None:
    with pytest.raises(KernelTestbedError, match=r"read it back: sh -c .*: no such thing"):
        kernel._run(["sh", "-c", "cat >&2; exit 3"], "read it back", stdin="no such thing\n")
    assert kernel._run(["sh", "-c", "cat"], "echo", stdin="a\nb\n") == "a\nb\n"
    with pytest.raises(KernelTestbedError, match="no-such-program"):
        kernel._run(["no-such-program-here"], "run no-such-program")


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


# ------------------------------------------------------------------------------ dropsim deploy --testbed kernel
DEPLOY = """
name: kdep
seed: 3
rounds: 2
population: 8
sampling: {clients_per_round: 3}
clients:
  compute: {zipf_a: 1.2, slowdown: [1.0, 3.0]}
  bandwidth_mbps: {zipf_a: 1.2, range: [21, 210]}
dropout: {rate: 0.0, stage: before_upload}
data: {dataset: synthetic, samples_per_client: 10, input_shape: [1, 27, 37], classes: 10}
model: {name: linear}
training: {local_epochs: 1, batch_size: 10, clients_at_once: 1}  # as deployed clients train
aggregation: {protocol: secagg, bits: 20}
fidelity: full
"""


def _ours(pid: int) -> set[str]:
    """The cgroups process ``pid`` made (``dropsim-<pid>-*``; none may be left behind). Other runs of
    dropsim on the machine have their own."""
    found: set[str] = set()
    for hierarchy in (kernel.CGROUP_ROOT, kernel.CGROUP_ROOT / "cpu"):
        if hierarchy.is_dir():
            found |= {p.name for p in hierarchy.iterdir() if p.name.startswith(f"dropsim-{pid}-")}
    return found


def _deploy(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    (tmp_path / "kdep.yaml").write_text(DEPLOY)
    command = [sys.executable, "-m", "sim", "deploy", str(tmp_path / "kdep.yaml"), "--testbed", "kernel"]
    command += ["--output", str(tmp_path / "out"), "--quiet", *extra]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@needs_kernel
def test_deploy_on_the_kernel_testbed_writes_its_tables_and_leaves_nothing(tmp_path: Path) -> None:
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    process = _deploy(tmp_path)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    run = tmp_path / "out"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    entry = manifest["testbed"]
    assert entry["emulation"] == "kernel" and 0 < entry["time_dilation"] <= 1
    assert entry["cgroup"] in ("v1", "v2")
    for table in ("rounds", "clients", "stages", "operations", "throttles"):
        assert (run / f"{table}.csv").is_file()
    operations = (run / "operations.csv").read_text().splitlines()
    assert operations[0] == "round,party,thread,call,cpu_s,work,requested_s,acquired_s,began_s,returned_s,resumed_s"
    for r in ("1", "2"):  # the server and the round's 3 clients, every round
        parties = {line.split(",")[1] for line in operations[1:] if line.split(",")[0] == r}
        assert "server" in parties and len(parties) == 4, (r, parties)
    # how often each party's quota held it back, per round: the server and the round's 3 clients
    throttles = list(csv.DictReader((run / "throttles.csv").open()))
    for r in ("1", "2"):
        rows = [row for row in throttles if row["round"] == r]
        parties = {line.split(",")[1] for line in operations[1:] if line.split(",")[0] == r}
        assert {row["party"] for row in rows} == parties and len(rows) == 4, rows  # the same names as there
        assert all(int(row["throttled_periods"]) >= 0 and float(row["throttled_s"]) >= 0 for row in rows)
    # each computation's instants, on the run's clock, lie in its round (a worker's placed by its clock's offset)
    rounds = {row["round"]: row for row in csv.DictReader((run / "rounds.csv").open())}
    for row in csv.DictReader((run / "operations.csv").open()):
        if row["thread"] == "compute":
            start, end = float(rounds[row["round"]]["t_start"]), float(rounds[row["round"]]["t_end"])
            assert start - 0.005 <= float(row["requested_s"]) <= float(row["resumed_s"]) <= end + 1.0, row
    assert not _ours(process.pid)  # its cgroups are gone
    after = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    assert after == qdiscs  # the host's qdiscs were never touched


@pytest.mark.slow
@needs_kernel
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ctrl_c_during_a_kernel_deployment_removes_its_cgroups_and_workers(tmp_path: Path, sig: int) -> None:
    process = _deploy(tmp_path, "--set", "rounds=50")
    rounds = tmp_path / "out" / "rounds.csv"
    for _ in range(600):  # bounded: until its first round is written, at most 60 s
        if rounds.is_file() and len(rounds.read_text().splitlines()) > 1:
            break
        time.sleep(0.1)
    assert _ours(process.pid), "the deployment made no cgroup"
    workers = _children(process.pid)
    assert workers
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + sig, err  # 130 for Ctrl-C, 143 for a kill, as run and sweep
    assert "finished rounds are kept" in err
    assert not _ours(process.pid)
    assert _described(workers) == []  # every process it started is gone, none left a zombie


@pytest.mark.slow
@needs_kernel
def test_an_error_in_a_kernel_deployment_removes_its_cgroups(tmp_path: Path) -> None:
    process = _deploy(tmp_path, "--connect-timeout", "0.001")  # no worker announces itself that soon
    _, err = process.communicate(timeout=300)
    assert process.returncode == 2, err
    assert "announced no key" in err
    assert not _ours(process.pid)


def _described(pids: Iterable[int]) -> list[str]:
    """Those of ``pids`` still in the process table (a zombie included), each as "pid (name) state"."""
    found = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            found.append(" ".join(Path(f"/proc/{pid}/stat").read_text().split()[:3]))
    return found


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    out = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(status.parent.name))
    return out


def test_a_machine_without_the_kernel_testbed_exits_2_naming_what_it_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.cli.main import main as dropsim

    monkeypatch.setattr(kernel, "missing", lambda: ["root: the kernel testbed creates cgroups", "the tc command"])
    monkeypatch.delenv(kernel.HOST_NETNS_ENV, raising=False)
    monkeypatch.setattr(kernel, "in_private_network", lambda: False)
    (tmp_path / "kdep.yaml").write_text(DEPLOY)
    code = dropsim(["deploy", str(tmp_path / "kdep.yaml"), "--testbed", "kernel", "--output", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot run the kernel testbed" in err and "the tc command" in err and "root" in err
    assert not (tmp_path / "o").exists()  # nothing started


SHARED = """
import json, socket, threading, time
from sim.deploy.kernel import LinkShaper, SERVER_ADDRESS

SERVER, CLIENT, SIZE = 30e6, 20e6, 1_500_000  # two 20 Mbps clients under a 30 Mbps server
shaper = LinkShaper(server_bps=SERVER)
addresses = [shaper.add(i, CLIENT) for i in range(2)]
listener = socket.create_server((SERVER_ADDRESS, 0))
port = listener.getsockname()[1]
result = {}

def serve():
    conns = [listener.accept()[0] for _ in addresses]
    for conn in conns:
        conn.recv(1)
    threads = [threading.Thread(target=conn.sendall, args=(b"x" * SIZE,)) for conn in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

def fetch(i, address):
    client = socket.create_connection((SERVER_ADDRESS, port), source_address=(address, 0))
    client.sendall(b"g")
    got, start = 0, None
    while got < SIZE:
        data = client.recv(1 << 16)
        start = start or time.perf_counter()
        got += len(data)
    result[i] = SIZE * 8 / (time.perf_counter() - start)

server = threading.Thread(target=serve)
server.start()
clients = [threading.Thread(target=fetch, args=(i, a)) for i, a in enumerate(addresses)]
for t in clients:
    t.start()
for t in clients:
    t.join(60)
server.join(60)
print(json.dumps(result))
"""


@needs_kernel
def test_the_servers_link_bounds_its_clients_sum() -> None:
    """Two clients of 20 Mbps downloading at once from a server of 30 Mbps get 15 Mbps each (of frames;
    times the payload fraction of goodput), as the simulator's max-min fair links give them."""
    env = {**kernel.private_network_env(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", SHARED], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    rates = json.loads(done.stdout)
    for rate in rates.values():
        assert abs(rate - 15e6 * PAYLOAD_FRACTION) <= 0.10 * 15e6, f"{rate / 1e6:.2f} Mbps"
