"""``dropsim calibrate`` and what it reads: operations.csv from deployed parties (sim.deploy.operations,
sim.profiling.calibrate)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from sim import testbed
from sim.cli.main import main as dropsim
from sim.costs.model import DEFAULT_PROFILE, CostModel
from sim.deploy.compute import NO_TIMES, Call
from sim.deploy.control import Operations, decode_from_worker
from sim.deploy.operations import (
    BASE_COLUMNS,
    COLUMNS,
    Entry,
    OperationsLog,
    ThrottleLog,
    entries,
    from_message,
    to_message,
    work_json,
)
from sim.profiling.calibrate import (
    RESTART_UNIT_S,
    CalibrationError,
    calibrate,
    feature_class,
    fit_scales,
    kind,
    predicted,
    restart_shares,
    role_kind,
)
from sim.protocol.machine import Work

BASE = CostModel.load()

CALLS = [
    (
        Work("x25519.agree", {"count": 4.0}),
        Work("prg.expand", {"elements": 1e5}),
        Work("vector.add", {"elements": 1e5}),
    ),
    (Work("encode.fixed_point", {"elements": 1e5}), Work("x25519.keygen", {"count": 2.0})),
    (Work("train.linear.1x8x8.10", {"samples": 20.0, "batches": 2.0}),),
    (Work("aead.seal", {"count": 4.0, "bytes": 400.0}), Work("shamir.share", {"count": 2.0, "n": 5.0})),
    (Work("wire.decode", {"bytes": 4e5, "packed": 1e5}),),
]
"""Computations of a client, as a deployment logs them."""

TRUE = {"crypto": 1.5, "encoding": 0.8, "training": 2.0, "framing": 3.0, "handover": 1.0}


def _truth(work: tuple[Work, ...], factor: float = 1.0) -> float:
    """CPU seconds of ``work`` on a made-up host whose every kind costs TRUE times the profile."""
    return factor * sum(TRUE[kind(w.op)] * BASE.seconds(w.op, w.size) for w in work)


FRAMING = {"deploy.send": {"const": 10.0, "bytes": 1.0}, "deploy.receive": {"bytes": 5.0}}
"""A made-up host's framing: each feature of each frame's cost its own multiple of the profile's."""


def _framing_truth(op: str, size: float) -> float:
    return sum(FRAMING[op][k] * v for k, v in BASE.cost(op).terms({"bytes": size}).items())


RESTART = 3e-4
"""A made-up host's CPU per throttled period (seconds)."""


def _run(folder: Path, rounds: int = 6, noise: float = 0.0, framing: bool = False, throttled: bool = False) -> Path:
    """A deployment folder with a manifest and an operations.csv of made-up, consistent parties (whose
    frames cost :data:`FRAMING` with ``framing``, else the framing kind's scale in TRUE; with ``throttled``,
    a kernel testbed's: each party-round throttled some periods, which cost its computations :data:`RESTART`
    each, in proportion to their stalls, kept in throttles.csv)."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"scenario": {"costs": {"profile": None}}, "status": "complete"}))
    log = OperationsLog(folder)
    throttles = ThrottleLog(folder) if throttled else None
    for r in range(1, rounds + 1):
        parties = {}
        periods = {str(c): (r * c) % 5 for c in range(4)}
        for c in range(4):
            calls = [
                Call(_truth((*w, Work("deploy.call", {}))) * (1 + noise * ((r + c + i) % 3 - 1)), w)
                for i, w in enumerate(CALLS)
            ]
            if throttled:  # stalls of 0, 1, 2, 3 and 4 ms in turn, starting somewhere by round and client
                stalls = [((r + c + i) % 5) * 1e-3 for i in range(len(CALLS))]
                calls, t = [], 10.0 * r
                for i, w in enumerate(CALLS):
                    share = periods[str(c)] * stalls[i] / sum(stalls)
                    cpu = _truth((*w, Work("deploy.call", {}))) + RESTART * share
                    calls.append(Call(cpu, w, (t, t, t, t + cpu + stalls[i], t + cpu + stalls[i])))
                    t += cpu + stalls[i] + 1e-3
            # frames in counts and sizes that vary, so that each framing feature's scale can be told apart
            sent, received = [1000 * (c + 1)] * (1 + c % 2) + [200_000 * r], [400_000 * (1 + r % 2), 300]
            if framing:
                loop = sum(_framing_truth("deploy.send", n) for n in sent)
                loop += sum(_framing_truth("deploy.receive", n) for n in received)
            else:
                loop = _truth(tuple(Work("deploy.send", {"bytes": float(n)}) for n in sent))
                loop += _truth(tuple(Work("deploy.receive", {"bytes": float(n)}) for n in received))
            parties[str(c)] = entries(calls, sum(call.cpu_s for call in calls) + loop, sent, received)
        log.append(r, parties)
        if throttles is not None:
            throttles.append(r, {party: (k, k * 0.005) for party, k in periods.items()})
    return folder


def test_operations_go_to_the_server_and_back_as_they_were() -> None:
    calls = [Call(0.25, CALLS[0], (10.0, 10.5, 10.75, 11.0, 11.25)), Call(0.5, ())]
    party = entries(calls, 1.0, [100, 2000], [300])
    assert [e.thread for e in party] == ["compute", "compute", "loop"]
    assert party[0].work[-1] == Work("deploy.call", {})  # the hand-over the simulator adds to each charge
    assert party[2].cpu_s == 0.25  # the process's CPU less its compute thread's
    assert [w.op for w in party[2].work] == ["deploy.send", "deploy.send", "deploy.receive"]
    message = decode_from_worker(to_message(7, party).encode())
    assert isinstance(message, Operations) and message.round == 7
    assert from_message(message) == party
    # on the server, the worker's instants move to the run's clock; those not kept stay unknown
    moved = from_message(message, shift=-10.0, bounds=(0.0, 2.0))
    assert moved[0].times == (0.0, 0.5, 0.75, 1.0, 1.25)
    assert moved[1].times is NO_TIMES and moved[2].times is NO_TIMES
    # a worker's clock that puts them before the run or after now (or nowhere) is refused
    for shift in (-10.5, -8.5, -math.inf, 1e300):
        with pytest.raises(ValueError, match="on the run's clock"):
            from_message(message, shift=shift, bounds=(0.0, 2.0))


def test_a_deployment_keeps_each_computations_instants_in_its_operations_table(tmp_path: Path) -> None:
    log = OperationsLog(tmp_path)
    log.append(1, {"3": entries([Call(0.125, (), (1.0, 1.5, 1.75, 2.0, 2.5))], 0.25, [], [])})
    rows = list(csv.DictReader(io.StringIO((tmp_path / "operations.csv").read_text())))
    assert [(r["thread"], r["requested_s"], r["began_s"], r["resumed_s"]) for r in rows] == [
        ("compute", "1.0", "1.75", "2.5"),
        ("loop", "", "", ""),
    ]


@pytest.mark.parametrize(
    ("calls", "says"),
    [
        (((b"gpu", 0.1, NO_TIMES, ()),), "thread 'gpu'"),
        (((b"compute", -1.0, NO_TIMES, ()),), "CPU seconds"),
        (((b"compute", math.nan, NO_TIMES, ()),), "CPU seconds"),
        (((b"compute", 0.1, NO_TIMES, ((b"x25519 agree", ()),)),), "operation"),
        (((b"compute", 0.1, NO_TIMES, ((b"wire.decode", ((b"bytes", math.inf),)),)),), "feature value"),
        (((b"compute", 0.1, NO_TIMES, ((b"wire.decode", ((b"b" * 65, 1.0),)),)),), "feature"),
        (((b"compute", 0.1, (1.0, 2.0), ()),), "2 instants: 5 expected"),
        (((b"compute", 0.1, (1.0, 2.0, 1.5, 3.0, 4.0), ()),), "non-decreasing"),
        (((b"compute", 0.1, (1.0, 2.0, math.inf, 3.0, 4.0), ()),), "finite"),
        (((b"loop", 0.1, (1.0, 2.0, 3.0, 3.0, 4.0), ()),), "a loop's entry has no instants"),
    ],
)
def test_a_workers_operations_are_checked_as_hostile_input(calls: tuple, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        from_message(Operations(1, calls))


def test_each_operation_has_a_class_and_a_kind() -> None:
    assert feature_class("train.cnn.1x8x8.10", "samples") == "train.cnn.1x8x8.10"  # each model's own
    assert kind("train.cnn.1x8x8.10@client") == "training" and kind("x25519.agree@server") == "crypto"
    assert feature_class("x25519.agree", "count") == "x25519.agree" and kind("x25519.agree") == "crypto"
    assert kind("deploy.call") == "handover" and kind("deploy.send") == "framing"
    assert (
        feature_class("deploy.send", "bytes") == "deploy.send:bytes" and kind("deploy.send:bytes@server") == "framing"
    )
    for op in BASE.operations:
        kind(op)  # every operation of the shipped profile is of a kind
    with pytest.raises(CalibrationError, match="of no kind"):
        kind("gpu.matmul")


def test_calibration_recovers_the_scales_of_consistent_runs(tmp_path: Path) -> None:
    doc = calibrate([_run(tmp_path / "a"), _run(tmp_path / "b", rounds=3)])
    cal = doc["calibration"]
    assert all(name.endswith("@client") for name in cal["kind_scales"])  # the made-up runs have no server
    for name, scale in cal["kind_scales"].items():
        assert scale == pytest.approx(TRUE[kind(name)], rel=1e-6), name
    for cls, scale in cal["scales"].items():
        assert scale == pytest.approx(TRUE[kind(cls)], rel=1e-6), cls
    fit = cal["fit"]
    assert fit["median_abs_relative_error_calibrated"] == pytest.approx(0, abs=1e-9)
    assert fit["calibrated_s"] == pytest.approx(fit["measured_s"])
    assert cal["base_profile"] == str(DEFAULT_PROFILE)
    assert [r["folder"] for r in cal["runs"]] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert {"hostname", "cpus"} <= set(cal["host"]) and cal["date"]
    # the profile it writes charges every operation its class's scale
    model = CostModel.from_dict(doc, "calibrated")
    size = {"elements": 1e5, "count": 3.0, "bytes": 1e4, "samples": 20.0, "batches": 2.0, "n": 5.0}
    for op, cost in BASE.operations.items():
        # a client's every operation at its kind's scale (classes it never ran too); the server's as is
        expected = TRUE[kind(op)]
        assert model.seconds(op, size, "client") == pytest.approx(expected * cost.seconds(size), rel=1e-9), op
        assert model.seconds(op, size, "server") == pytest.approx(cost.seconds(size), rel=1e-9), op
        assert model.seconds(op, size) == cost.seconds(size)  # no role: the profile's own


def test_a_partys_throttles_in_a_round_are_shared_by_its_computations_as_their_stalls() -> None:
    rows = [
        ("1", "3", 0.002),
        ("1", "3", None),  # its loop: no share
        ("1", "3", 0.006),
        ("1", "server", 0.0),  # no stall at all: shared evenly
        ("1", "server", 0.0),
        ("2", "3", 0.004),  # a round without a count: none
    ]
    counts = {("1", "3"): 4.0, ("1", "server"): 1.0}
    assert restart_shares(rows, counts) == {0: 1.0, 2: 3.0, 3: 0.5, 4: 0.5}


def test_calibration_fits_a_throttles_cpu_where_the_runs_counted_them(tmp_path: Path) -> None:
    doc = calibrate([_run(tmp_path / "a", throttled=True)])
    ops = doc["operations"]
    assert ops["deploy.restart"]["coef"] == {"count": RESTART_UNIT_S}  # the base has none: a unit, scaled
    assert ops["deploy.restart@client"]["coef"]["count"] == pytest.approx(RESTART, rel=1e-6)
    # these runs have no server: its restarts take the clients' scale
    assert ops["deploy.restart@server"]["coef"]["count"] == pytest.approx(RESTART, rel=1e-6)
    assert doc["calibration"]["scales"]["x25519.agree@client"] == pytest.approx(TRUE["crypto"], rel=1e-6)
    # runs without throttles.csv fit none, and the profile charges none, even when its base had some
    assert "deploy.restart" not in calibrate([_run(tmp_path / "b")])["operations"]
    base = tmp_path / "fitted.json"
    base.write_text(json.dumps(doc))
    again = calibrate([_run(tmp_path / "c")], base=base)["operations"]
    assert not any(op.startswith("deploy.restart") for op in again)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("round,party,periods\n", "columns"),
        ("round,party,throttled_periods,throttled_s\n1,3,2,0.01\n1,3,1,0.01\n", "listed twice"),
        ("round,party,throttled_periods,throttled_s\n1,3,-1,0.0\n", "a count >= 0"),
        ("round,party,throttled_periods,throttled_s\n1,3,1.5,0.0\n", "line 2"),
    ],
)
def test_a_throttles_table_is_checked_as_anyones_file(tmp_path: Path, text: str, says: str) -> None:
    run = _run(tmp_path / "a")
    (run / "throttles.csv").write_text(text)
    with pytest.raises(CalibrationError, match=f"throttles.csv.*{says}"):
        calibrate([run])


def test_a_table_written_before_the_instants_were_kept_calibrates_the_same(tmp_path: Path) -> None:
    run = _run(tmp_path / "new")
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_bytes((run / "manifest.json").read_bytes())
    rows = list(csv.DictReader(io.StringIO((run / "operations.csv").read_text())))
    with (old / "operations.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, BASE_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    assert calibrate([old])["calibration"]["scales"] == calibrate([run])["calibration"]["scales"]


def test_the_ridge_keeps_inseparable_operations_near_their_kinds_scale(tmp_path: Path) -> None:
    """x25519.agree, prg.expand and vector.add come together in one call here: the entries alone cannot
    tell their scales apart, and no scale goes to 0 or far from its kind's."""
    doc = calibrate([_run(tmp_path / "a", noise=0.05)])
    scales, kinds = doc["calibration"]["scales"], doc["calibration"]["kind_scales"]
    for cls in ("x25519.agree@client", "prg.expand@client", "vector.add@client"):
        assert 0.5 * kinds[role_kind(cls)] < scales[cls] < 2 * kinds[role_kind(cls)], cls


def test_each_feature_of_a_frames_cost_is_fitted_on_its_own(tmp_path: Path) -> None:
    """A frame's fixed cost and its cost per byte differ on a deployed party from the profile's by
    different factors (fitted on the kernel grid: a client's send about 11 times the profile's fixed cost
    and 1.2 times its cost per byte); the calibration finds each, without a pull towards the kind's scale."""
    doc = calibrate([_run(tmp_path / "a", framing=True)])
    scales = doc["calibration"]["scales"]
    for op, by_feature in FRAMING.items():
        for feature, truth in by_feature.items():
            assert scales[f"{op}:{feature}@client"] == pytest.approx(truth, rel=1e-6), (op, feature)
    model = CostModel.from_dict(doc, "calibrated")
    assert model.seconds("deploy.send", {"bytes": 5e4}, "client") == pytest.approx(_framing_truth("deploy.send", 5e4))
    assert doc["operations"]["deploy.send@client"]["calibration_scales"] == pytest.approx({"const": 10.0, "bytes": 1.0})


def test_the_cli_writes_a_profile_scenarios_can_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "run")
    out = tmp_path / "profiles" / "kernel.json"
    assert dropsim(["calibrate", str(run), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "by kind: crypto@client x1.5" in text and str(out) in text
    assert CostModel.load(out).seconds("train.linear.1x8x8.10", {"samples": 20, "batches": 2}) > 0
    assert json.loads(out.read_text())["calibration"]["scales"]["train.linear.1x8x8.10@client"] == pytest.approx(2.0)


def test_calibration_refuses_what_it_cannot_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert dropsim(["calibrate", str(empty), "--out", str(tmp_path / "p.json")]) == 2
    assert "no operations.csv" in capsys.readouterr().err
    bad = _run(tmp_path / "bad", rounds=1)
    with (bad / "operations.csv").open("a") as f:
        f.write('2,0,compute,0,0.1,"[[""gpu.matmul"",{}]]"\n')
    with pytest.raises(CalibrationError, match=r"operations.csv, line \d+: .*gpu.matmul"):
        calibrate([bad])
    worse = _run(tmp_path / "worse", rounds=1)
    with (worse / "operations.csv").open("a") as f:
        f.write("2,0,compute,0,-3,[]\n")
    with pytest.raises(CalibrationError, match="cpu_s '-3'"):
        calibrate([worse])
    wrong = _run(tmp_path / "wrong", rounds=1)
    (wrong / "operations.csv").write_text("a,b\n")
    with pytest.raises(CalibrationError, match="columns"):
        calibrate([wrong])
    assert not (tmp_path / "p.json").exists()


def test_fit_scales_needs_some_predicted_cost() -> None:
    with pytest.raises(CalibrationError, match="nothing to calibrate"):
        fit_scales([])


def test_predicted_groups_by_class() -> None:
    work = CALLS[0]
    by = predicted(BASE, work)
    assert set(by) == {"x25519.agree@client", "prg.expand@client", "vector.add@client"}
    framing = predicted(BASE, (Work("deploy.send", {"bytes": 100.0}), Work("deploy.receive", {"bytes": 50.0})))
    assert set(framing) == {"deploy.send:const@client", "deploy.send:bytes@client", "deploy.receive:bytes@client"}
    assert sum(by.values()) == pytest.approx(BASE.work_seconds(work))
    assert work_json(work).startswith('[["x25519.agree",{"count":4.0}]')
    assert COLUMNS == (
        "round", "party", "thread", "call", "cpu_s", "work",
        "requested_s", "acquired_s", "began_s", "returned_s", "resumed_s",
    )  # fmt: skip
    assert Entry("loop", 0.0, ()).work == ()


def test_calibration_refuses_an_operations_table_changed_since_its_run_completed(tmp_path: Path) -> None:
    from sim.results.integrity import ChangedTableError
    from sim.results.writer import DIGESTS, table_digests

    run = _run(tmp_path / "run", rounds=2)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest[DIGESTS] = table_digests(run)
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert calibrate([run])  # as its run wrote it
    with (run / "operations.csv").open("a") as f:
        f.write("3,0,compute,0,9.5,[]\n")
    with pytest.raises(ChangedTableError, match=r"operations\.csv: changed since its run completed"):
        calibrate([run])


def test_calibrate_takes_either_runs_or_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    neither = ["calibrate", "--out", str(tmp_path / "p.json")]
    for argv in (neither, ["calibrate", str(tmp_path), "--host", "--out", "p"]):
        assert dropsim(argv) == 2
        assert "give either folders of deployed runs, or --host" in capsys.readouterr().err
    assert dropsim(["calibrate", "--host", "--rounds", "0", "--out", str(tmp_path / "p.json")]) == 2
    assert "--rounds is 0" in capsys.readouterr().err


def test_validate_names_the_host_calibration_when_the_round_is_far_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    import sim.preflight as preflight
    from sim.cli.deploy import calibration_advice
    from sim.deploy.validate import Validation
    from sim.scenario import load

    root = Path(__file__).resolve().parent.parent
    kernel = load(root / "scenarios" / "deploy.yaml", ["testbed.emulation=kernel"]).base()
    process = load(root / "scenarios" / "deploy.yaml").base()

    def advice(error: float, scenario: object) -> str:
        summary = pd.DataFrame([{"stage": "download", "error": 0.5}, {"stage": "round", "error": error}])
        return calibration_advice(Validation(pd.DataFrame(), summary, True, 3, math.nan), scenario)  # type: ignore[arg-type]

    monkeypatch.setattr(preflight, "host", lambda: {"processor": "Another CPU", "cpus": 16})
    assert advice(-0.10, kernel) == advice(math.nan, kernel) == advice(-0.5, process) == ""
    far = advice(-0.28, kernel)
    assert far.startswith("the simulated round time is -28% off the measured one, with a profile measured on another")
    assert "dropsim calibrate --host --out host.json" in far and "--set costs.profile=host.json" in far
    machine = json.loads(testbed.KERNEL_PROFILE.read_text())["calibration"]["host"]
    monkeypatch.setattr(preflight, "host", lambda: {"processor": machine["processor"], "cpus": machine["cpus"]})
    assert "with a profile of this machine: what is left is the model's" in advice(0.2, kernel)
