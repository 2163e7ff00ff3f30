"""A run's memory: estimated from the scenario before anything is built (sim.footprint), refused up front when
it cannot fit, and independent of the population's size (a billion clients, bounded by an rlimit)."""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import footprint
from sim.cli.main import main
from sim.scenario import load

ROOT = Path(__file__).resolve().parents[1]
SCALE = ROOT / "scenarios" / "scale.yaml"

TRACED = """
name: traced
seed: 5
rounds: 2
population: 100
sampling: {clients_per_round: 10}
data: {dataset: synthetic, samples_per_client: 5}
model: {name: mlp}
aggregation: {protocol: secagg, bits: 20}
fidelity: timing
trace: {file: TRACE}
"""


def _scale(*sets: str):
    return load(SCALE, list(sets)).base()


# ------------------------------------------------------------------------------------------- estimates


def test_the_sampled_clients_are_charged_by_protocol_and_fidelity() -> None:
    # SecAgg+ at 1000 sampled: 2 ceil(log2 1000) = 20 neighbours, so 21 holders and 20 peers
    (need,) = footprint.needs(_scale("sampling.clients_per_round=1000"))
    assert need.bytes == 1000 * (footprint.CLIENT_BYTES + 20 * footprint.PAIR_BYTES)
    assert need.what == "1,000 sampled clients a round at about 119.1 KB each"
    # SecAgg: every other client is a peer; full fidelity adds the update's values
    (need,) = footprint.needs(_scale("sampling.clients_per_round=300", "aggregation.protocol=secagg"), dim=1000)
    assert need.bytes == 300 * (footprint.CLIENT_BYTES + 299 * footprint.PAIR_BYTES)  # timing: dim unused
    sc = _scale("sampling.clients_per_round=300", "aggregation.protocol=secagg", "fidelity=full")
    (need,) = footprint.needs(sc, dim=1000)
    assert need.bytes == 300 * (footprint.CLIENT_BYTES + 299 * footprint.PAIR_BYTES + 1000 * 16)
    # calls made ahead on threads hold each reply's decoded copy for the server too
    (ahead,) = footprint.needs(dataclasses.replace(sc, protocol_threads=2), dim=1000)
    assert ahead.bytes == need.bytes + 300 * 1000 * 4
    # plain federated averaging exchanges no keys
    (need,) = footprint.needs(_scale("sampling.clients_per_round=50", "aggregation={protocol: fedavg}"))
    assert need.bytes == 50 * footprint.CLIENT_BYTES


def test_a_poisson_sample_is_charged_at_its_mean_plus_six_deviations() -> None:
    sc = _scale("population=1000000000", "sampling={rate: 0.01}")
    k = footprint.most_sampled(sc)
    assert k == 10**7 + 1 + int(6 * (0.01 * 0.99 * 10**9) ** 0.5) + 1
    whats = [n.what for n in footprint.needs(sc)]
    assert whats[0].startswith(f"{k:,} sampled clients") and len(whats) == 1  # 1% < 1/50: no index of everyone
    big = footprint.needs(_scale("population=1000000", "sampling={rate: 0.5}"))
    assert big[1].bytes == 8.0 * 10**6 and big[1].what == "an index of all 1,000,000 clients to draw 503,001 of them"


def test_a_trace_is_charged_by_its_rows_before_it_is_read(tmp_path: Path) -> None:
    trace = tmp_path / "avail.csv"
    trace.write_text("client,start_s,end_s\n" + "".join(f"{c},0.0,10.0\n" for c in range(100)))
    file = tmp_path / "traced.yaml"
    file.write_text(TRACED.replace("TRACE", str(trace)))
    sc = load(file).base()
    need = footprint.needs(sc)[0]
    assert need.bytes == 101 * footprint.TRACE_ROW_BYTES and need.what == "the trace's 101 rows"
    assert need.where == f"{file}:11"
    assert len(footprint.needs(sc, trace=False)) == 1  # the sampled clients only


def test_the_room_is_the_least_of_what_bounds_it() -> None:
    bound = footprint.room()
    assert bound is not None  # Linux: MemAvailable at least
    size, what = bound
    available = next(
        int(x.split()[1]) * 1024 for x in Path("/proc/meminfo").read_text().splitlines() if "MemAvail" in x
    )
    assert 0 <= size <= available * 1.05 and what


# ------------------------------------------------------------------------------------------- refusals


def test_a_run_that_cannot_fit_is_refused_before_the_trace_is_read(tmp_path: Path, monkeypatch, capsys) -> None:
    trace = tmp_path / "avail.csv"
    trace.write_text("client,start_s,end_s\n" + "".join(f"{c},0.0,10.0\n" for c in range(10_000)))
    file = tmp_path / "traced.yaml"
    file.write_text(TRACED.replace("TRACE", str(trace)))
    monkeypatch.setattr(footprint, "room", lambda: (4096, "left under this process's RLIMIT_AS"))

    def unread(*args: object) -> None:
        raise AssertionError("the trace was read")

    monkeypatch.setattr("sim.traces.io.load_trace", unread)
    out = tmp_path / "out"
    for command in (["check", str(file)], ["run", str(file), "--output", str(out)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"{file}:6: sampling.clients_per_round: this run would need about " in err
        assert "more than the 4.0 KB left under this process's RLIMIT_AS" in err
        assert f"the trace's 10,001 rows: 625.1 KB ({file}:11)" in err
        assert "10 sampled clients a round at about 105.2 KB each" in err
    assert not out.exists()


def test_the_python_api_refuses_it_too(monkeypatch) -> None:
    from sim.runner import Simulation

    monkeypatch.setattr(footprint, "room", lambda: (10**6, "available on this machine"))
    with pytest.raises(footprint.FootprintError, match=r"scale: this run would need about 116\.3 MB of memory"):
        Simulation(_scale())


# ----------------------------------------------------------------------------------- a billion clients


def _limited(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


CHILD = """
import json, sys
from pathlib import Path
from sim.cli.main import main
rc = main(sys.argv[1:])
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
print(json.dumps({"rc": rc, "peak": int(status["VmHWM"].split()[0]) * 1024}))
"""


def _run_limited(tmp_path: Path, population: int, scenario: Path = SCALE, *sets: str) -> tuple[int, pd.DataFrame]:
    out = tmp_path / f"{scenario.stem}-{population}"
    argv = ["run", str(scenario), "--set", f"population={population}", "--set", "sampling.clients_per_round=200"]
    argv += ["--set", "rounds=5", "--output", str(out), "--quiet"]
    for item in sets:
        argv += ["--set", item]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: _limited(2 * 2**30),
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, done.stderr[-3000:]
    return result["peak"], pd.read_csv(out / "rounds.csv")


@pytest.mark.slow
def test_a_billion_clients_run_in_under_2_gb(tmp_path: Path) -> None:
    """10^9 clients, 200 sampled, 5 timing-fidelity rounds, under a 2 GiB address-space limit (so the
    resident peak is below it too); their peak is within 64 MB of a population of 1,000's: under 0.07 bytes
    per idle client."""
    peak, rounds = _run_limited(tmp_path, 10**9)
    small, _ = _run_limited(tmp_path, 1000)
    assert len(rounds) == 5 and (rounds["sampled"] == 200).all() and (rounds["online"] == 10**9).all()
    assert peak < 2 * 2**30
    assert peak - small < 64 * 2**20


@pytest.mark.slow
@pytest.mark.parametrize("sample_from", ["online", "population"])
def test_a_trace_replayed_over_a_billion_clients_keeps_only_the_traces(tmp_path: Path, sample_from: str) -> None:
    """scenarios/trace_replay.yaml's trace of 5,000 clients (with their device capacity) in a population of
    10^9, under the same 2 GiB limit."""
    replay = ROOT / "scenarios" / "trace_replay.yaml"
    peak, rounds = _run_limited(tmp_path, 10**9, replay, "trace.capacity=true", f"trace.sample_from={sample_from}")
    assert len(rounds) == 5 and peak < 2 * 2**30
    assert (rounds["online"] <= 5000).all()  # the trace's clients online at each round's start
    if sample_from == "population":  # 200 of the 10^9, whoever is online
        assert (rounds["sampled"] == 200).all()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.dictionaries(
        st.sampled_from(["/proc/meminfo", "/proc/self/cgroup", "/proc/self/status", "limit", "usage", "stat"]),
        st.one_of(
            st.text(max_size=60),
            st.sampled_from(["MemAvailable: 1000 kB\n", "MemAvailable:\n", "0::/x\n", "4:memory:/x\n", "max", "-1"]),
            st.integers(-(2**62), 2**62).map(str),
        ),
    )
)
def test_the_room_is_read_from_whatever_the_kernel_files_hold(texts: dict[str, str], monkeypatch) -> None:
    """Odd, empty or malformed /proc and cgroup files never stop a run: what cannot be read is left out."""

    def read(path: object) -> str:
        name = str(path)
        for key in ("limit", "usage", "stat"):
            if name.endswith(("memory.max", "memory.limit_in_bytes")) and key == "limit":
                return texts.get("limit", "")
            if name.endswith(("memory.current", "memory.usage_in_bytes")) and key == "usage":
                return texts.get("usage", "")
            if name.endswith("memory.stat") and key == "stat":
                return texts.get("stat", "")
        return texts.get(name, "")

    monkeypatch.setattr(footprint, "_read", read)  # the same replacement for every example
    bound = footprint.room()
    assert bound is None or (bound[0] >= 0 and bound[1])


def test_a_cgroup_limit_counts_its_droppable_page_cache_as_room(monkeypatch) -> None:
    files = {
        "/proc/self/cgroup": "0::/jobs/run\n",
        "/sys/fs/cgroup/jobs/run/memory.max": "1000000\n",
        "/sys/fs/cgroup/jobs/run/memory.current": "900000\n",
        "/sys/fs/cgroup/jobs/run/memory.stat": "anon 500000\ninactive_file 300000\n",
    }
    monkeypatch.setattr(footprint, "_read", lambda path: files.get(str(path), ""))
    assert footprint.room() == (400_000, "left in this process's memory cgroup")
