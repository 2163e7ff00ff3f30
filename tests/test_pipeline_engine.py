"""Pipelined rounds in the engine: real chunk instances, identical aggregates, gated resources, aborts."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pipeline_harness import SCENARIO, Capture, scenario

from sim.runner import Simulation, run_scenario
from sim.scenario import ScenarioError, load


def run(tmp_path: Path, name: str, *overrides: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    out = tmp_path / name
    run_scenario(scenario(tmp_path, *overrides), out, progress=False)
    read = lambda t: pd.read_csv(out / f"{t}.csv", keep_default_na=False, na_values=[""])  # noqa: E731
    return read("rounds"), read("stages")


@pytest.mark.parametrize("protocol", ["secagg", "secagg+"])
@pytest.mark.parametrize("stage", ["before_share_keys", "before_upload"])
def test_the_concatenated_aggregate_is_the_unchunked_one(tmp_path: Path, protocol: str, stage: str) -> None:
    base = [f"aggregation.protocol={protocol}", f"dropout.stage={stage}"]
    plain, _ = run(tmp_path, "plain", *base)
    hashes = {}
    for m in (1, 3, 7):
        rounds, stages = run(tmp_path, f"m{m}", *base, f"pipeline={{chunks: {m}}}")
        assert (rounds["outcome"] == "ok").all()
        assert (rounds["chunks"] == m).all()
        assert list(rounds["survivors"]) == list(plain["survivors"])
        hashes[m] = list(rounds["model_sha256"])
        chunk_rows = stages[stages["stage"].str.startswith("chunk.")]
        assert sorted(set(chunk_rows["chunk"].astype(int))) == list(range(m))
        assert set(chunk_rows["pipeline_stage"].astype(int)) == {1, 2, 3, 4, 5}
    assert hashes[1] == hashes[3] == hashes[7] == list(plain["model_sha256"])


def test_a_client_leaving_during_unmasking_has_uploaded_every_chunk(tmp_path: Path) -> None:
    # The first chunk's unmasking request reaches it while later chunks still upload: it answers no
    # unmasking request, and leaves once every masked input is at the server, so it is in every chunk's
    # sum whatever the timing (the socket deployment, timed otherwise, agrees).
    Capture.rounds = []
    Simulation(scenario(tmp_path, "pipeline={chunks: 3}", "dropout.stage=during_unmasking"), Capture.observe).step()
    (rnd,) = Capture.rounds
    assert [len(rnd.results[j].survivors) for j in range(3)] == [8, 8, 8]
    assert rnd.record.survivors == 8 and rnd.record.outcome == "ok"
    leavers = [c for c in rnd.record.clients if c.dropped_stage == "during_unmasking"]
    assert len(leavers) == 2
    for c in leavers:
        assert all(not rnd.chunk_machines[(c.client, j)].finished for j in range(3))  # no unmasking answered
        assert c.left_at >= max(rnd.sent_at[(c.client, j)] for j in range(3))


@pytest.mark.parametrize("testbed", [(), ("testbed.cores=2",)], ids=["per-party", "testbed"])
def test_timing_fidelity_gives_the_same_virtual_times(tmp_path: Path, testbed: tuple[str, ...]) -> None:
    full_rounds, full_stages = run(tmp_path, "full", "pipeline={chunks: 4}", "dropout.stage=during_unmasking", *testbed)
    timing_rounds, timing_stages = run(
        tmp_path, "timing", "pipeline={chunks: 4}", "dropout.stage=during_unmasking", "fidelity=timing", *testbed
    )
    for column in ("t_end", "round_time", "agg_time", "server_bytes_in", "server_bytes_out"):
        assert list(full_rounds[column]) == list(timing_rounds[column])
    assert full_stages[["stage", "t_start", "t_end"]].equals(timing_stages[["stage", "t_start", "t_end"]])


def test_round_columns(tmp_path: Path) -> None:
    rounds, _ = run(tmp_path, "m3", "pipeline={chunks: 3}")
    assert (rounds["agg_time"] + rounds["other_time"] - rounds["round_time"]).abs().max() < 1e-12
    assert (rounds["agg_time"] > 0).all() and (rounds["other_time"] > 0).all()
    for resource in ("client_cpu", "client_link", "server_cpu", "server_link"):
        column = rounds[f"util_{resource}"]
        assert ((column > 0) & (column <= 1)).all(), resource
    # The server's two lanes (aggregation, messaging) overlap: busy is when either works, never > 1.
    xnoise, _ = run(
        tmp_path,
        "xnoise",
        "pipeline={chunks: 4}",
        "fidelity=timing",
        "privacy={strategy: xnoise, epsilon: 6, delta: 0.01, clip: 2.0, tolerance: 0.5}",
    )
    assert ((xnoise["util_server_cpu"] > 0) & (xnoise["util_server_cpu"] <= 1)).all()
    assert (xnoise["server_compute_s"] >= xnoise["util_server_cpu"] * xnoise["round_time"] - 1e-9).all()
    unpiped, _ = run(tmp_path, "none")
    assert (unpiped["chunks"] == 1).all()
    assert (unpiped["agg_time"] + unpiped["other_time"] - unpiped["round_time"]).abs().max() < 1e-12


@pytest.mark.parametrize("strategy", ["orig", "xnoise"])
def test_each_chunk_is_masked_unmasked_and_denoised_on_its_own(tmp_path: Path, strategy: str) -> None:
    Capture.rounds = []
    sc = scenario(
        tmp_path,
        "pipeline={chunks: 3}",
        f"privacy={{strategy: {strategy}, epsilon: 6, delta: 0.01, clip: 2.0, tolerance: 0.5}}",
    )
    Simulation(sc, Capture.observe).step()
    (rnd,) = Capture.rounds
    private = rnd.private
    assert private is not None and len(rnd.results) == 3
    for slot in rnd.slots:
        server = rnd.servers[slot.index]
        view = private.chunk(slot.start, slot.stop)
        expected = np.zeros(slot.length, dtype=np.int64)
        for c in server.aggregate.survivors:
            expected += rnd.encodings[c][slot.start : slot.stop]
            seeds = rnd.chunk_machines[(c, slot.index)].noise_seeds
            for k, seed in enumerate(seeds):
                if private.plan.components[k] and k not in getattr(server, "removed", ()):
                    expected += view.component(seed, k)
        got = np.asarray(rnd.results[slot.index].vector)
        assert np.array_equal(got, private.wrap(expected))
    # Every chunk drew its own noise: no seed is used by two chunks.
    seeds = [s for (c, j), m in rnd.chunk_machines.items() for s in m.noise_seeds]
    assert len(seeds) == len(set(seeds))


def test_resources_run_one_chunk_stage_at_a_time_in_order(tmp_path: Path) -> None:
    Capture.rounds = []
    Simulation(scenario(tmp_path, "pipeline={chunks: 5}", "dropout.rate=0"), Capture.observe).step()
    (rnd,) = Capture.rounds
    gates = [*rnd.cpu_gate.values(), *rnd.link_gate.values(), rnd.server_gate]
    for gate in gates:
        spans = sorted(gate.spans, key=lambda s: s[2])
        assert len(spans) == len(gate.stages) * 5, gate.name
        for (_, _, _, end), (_, _, start, _) in itertools.pairwise(spans):
            assert start >= end, gate.name  # never two at once
        assert [(s, c) for s, c, _, _ in spans] == [(s, c) for s in gate.stages for c in range(5)], gate.name


def test_a_chunk_that_aborts_aborts_the_round(tmp_path: Path) -> None:
    # Half the clients leave before their first upload, with threshold 0.8: chunk 1, whose key exchange
    # starts only after chunk 0's masked inputs, is the first to find too few clients.
    rounds, _ = run(tmp_path, "abort", "pipeline={chunks: 2}", "dropout.rate=0.5", "aggregation.threshold=0.8")
    reason = r"aborted: chunk 1: advertise_keys: 4 of 8 clients answered, threshold 7"
    assert rounds["outcome"].str.fullmatch(reason).all()
    assert (rounds["survivors"] == 0).all()


def test_pipeline_scenario_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"pipeline.chunks.*needs secagg or secagg\+"):
        scenario(tmp_path, "pipeline={chunks: 2}", "aggregation.protocol=plain")
    for bad in ("0", "65", "many", "2.5"):
        with pytest.raises(ScenarioError, match="pipeline.chunks"):
            scenario(tmp_path, f"pipeline={{chunks: {bad}}}")
    with pytest.raises(ScenarioError, match="pipeline.wide"):
        scenario(tmp_path, "pipeline={chunks: 2, wide: 1}")
    assert scenario(tmp_path, "pipeline={}").pipeline.chunks is None  # auto
    assert scenario(tmp_path).pipeline is None


def test_trace_replay_and_silent_dropout_in_pipelined_rounds(tmp_path: Path) -> None:
    # Clients whose session ends mid-round leave every chunk; the rounds still end.
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "trace"
    sc = load(
        root / "scenarios" / "trace_replay.yaml",
        ["rounds=60", "pipeline={chunks: 3}", "trace.until_hours=null"],
        output=str(out),
    ).base()
    run_scenario(sc, out, progress=False)
    rounds = pd.read_csv(out / "rounds.csv")
    clients = pd.read_csv(out / "clients.csv", keep_default_na=False)
    assert len(rounds) == 60 and (rounds["chunks"] == 3).all()
    offline = clients[clients["dropped_stage"].str.startswith("offline:")]
    assert len(offline) > 0
    # Silent dropout: the server learns of it only at chunk 0's deadline, which puts the leavers out of
    # every chunk: one timeout per round, not one per chunk.
    silent = ["pipeline={chunks: 3}", "dropout={rate: 0.25, stage: before_upload, silent: true}"]
    rounds, _ = run(tmp_path, "silent", *silent, "timeouts={masked_input: 5}")
    assert (rounds["outcome"] == "ok").all() and (rounds["survivors"] == 6).all()
    assert ((rounds["round_time"] > 5) & (rounds["round_time"] < 10)).all()


def test_auto_picks_the_planned_chunk_count(tmp_path: Path) -> None:
    from sim.learning.models import model_dimension
    from sim.runner.chunks import plan_chunks

    sc = scenario(tmp_path, "pipeline={chunks: auto, max_chunks: 6}", "fidelity=timing")
    plan = plan_chunks(sc, model_dimension(sc))
    assert set(plan.predicted) == set(range(1, 7))
    assert plan.predicted_best == min(plan.predicted, key=plan.predicted.get)  # type: ignore[arg-type]
    # The choice is the predicted best unless a full-size proxy round at another m was faster.
    assert plan.predicted_best in plan.proxy_seconds
    assert plan.proxy_seconds[plan.chunks] <= plan.proxy_seconds[plan.predicted_best]
    assert {s for s, _, _, _ in plan.observations} == {0, 1, 2, 3, 4}
    rounds, _ = run(tmp_path, "auto", "pipeline={chunks: auto, max_chunks: 6}", "fidelity=timing")
    assert (rounds["chunks"] == plan.chunks).all()


def test_duplex_links_overlap_dispatches_with_uploads(tmp_path: Path) -> None:
    _, shared = run(tmp_path, "shared", "pipeline={chunks: 4}", "dropout.rate=0", "fidelity=timing")
    _, duplex = run(tmp_path, "duplex", "pipeline={chunks: 4, links: duplex}", "dropout.rate=0", "fidelity=timing")
    for stages, up, down in ((shared, "client.link", "client.link"), (duplex, "client.uplink", "client.downlink")):
        one = stages[stages["round"] == 1]
        assert set(one.loc[one["stage"] == "chunk.upload", "resource"]) == {up}
        assert set(one.loc[one["stage"] == "chunk.dispatch", "resource"]) == {down}
    # Shared: a client's first dispatch waits for all its uploads (Hyades eq. 19); duplex: it need not.
    one = duplex[duplex["round"] == 1]
    first_dispatch = one.loc[(one["stage"] == "chunk.dispatch") & (one["chunk"] == 0), "t_start"].iloc[0]
    last_upload = one.loc[one["stage"] == "chunk.upload", "t_end"].max()
    assert first_dispatch < last_upload


def test_profile_pipeline_command(tmp_path: Path, capsys) -> None:
    from sim.cli import main

    path = tmp_path / "pipe.yaml"
    path.write_text(SCENARIO + "fidelity: timing\npipeline: {chunks: auto, max_chunks: 5}\n")
    out = tmp_path / "check.csv"
    assert main(["profile", "--pipeline", str(path), "--check", "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    assert "beta1 (s/value)" in text and "predicted best: chunks" in text and "simulated best: chunks" in text
    table = pd.read_csv(out)
    assert list(table.columns) == ["chunks", "predicted_s", "simulated_agg_s", "simulated_round_s"]
    assert list(table["chunks"]) == [1, 2, 3, 4, 5]
    chosen = int(text.split("chosen: chunks ")[1].split()[0].rstrip(":"))
    simulated = dict(zip(table["chunks"], table["simulated_agg_s"], strict=True))
    assert simulated[chosen] <= 1.1 * min(simulated.values())  # the analytic choice is near the simulated best
    assert main(["profile", "--pipeline", str(path), "--set", "aggregation.protocol=plain"]) == 2


def test_auto_records_its_choice_and_too_many_chunks_are_refused(tmp_path: Path) -> None:
    import json

    from sim.preflight import preflight

    _, _ = run(tmp_path, "auto", "pipeline={chunks: auto, max_chunks: 3}", "fidelity=timing")
    manifest = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert manifest["pipeline"]["chosen_by"] == "auto"
    assert set(manifest["pipeline"]["predicted_s"]) == {"1", "2", "3"}
    sc = scenario(tmp_path, "model={params: 10}", "fidelity=timing", "pipeline={chunks: 12}")
    (problem,) = preflight(sc)
    assert problem.key == "pipeline.chunks" and "more chunks than the update has values (10)" in problem.message


def test_a_later_chunks_first_deadline_counts_from_its_first_answer(tmp_path: Path) -> None:
    # Clients reach chunk j's key advertisement only after chunk j-1's masked input: an advertise_keys
    # timeout that chunk 0 meets but that passes before chunk 3 starts must not cut anyone from chunk 3.
    base = ["pipeline={chunks: 4}", "fidelity=timing", "model={params: 2000000}", "dropout.rate=0", "rounds=1"]
    _, stages = run(tmp_path, "untimed", *base)
    mask = stages[stages["stage"] == "chunk.mask"].set_index("chunk")
    timeout = (mask.loc[1, "t_start"] + mask.loc[3, "t_start"]) / 2
    rounds, _ = run(tmp_path, "timed", *base, f"timeouts={{advertise_keys: {timeout}}}")
    assert (rounds["outcome"] == "ok").all() and (rounds["survivors"] == 8).all()
