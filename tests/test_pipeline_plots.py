"""Pipeline figures from result tables: Dordis Figure 6 (a round's Gantt chart) and Figure 10 (round time
split into aggregation and the rest, plain against pipelined).

The run folders are synthetic, written as ``sim.results.writer`` writes them, with the pipeline columns of
the engine's table spec: ``stages.csv`` ``chunk, pipeline_stage``; ``rounds.csv`` ``chunks, agg_time,
other_time, util_*``. Times are multiples of 1/4, so every difference below is exact in binary.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from sim.cli import main
from sim.plots import (
    gantt_spans,
    load_rounds,
    plot_gantt,
    plot_round_time_breakdown,
    round_time_breakdown,
    with_scenario_keys,
)
from sim.results.read import read_run_table
from sim.results.tables import CLIENT_COLUMNS, ROUND_COLUMNS, STAGE_COLUMNS
from sim.results.writer import MANIFEST, ResultsError, csv_bytes, write_atomic, write_json

PIPELINE_STAGE_COLUMNS = STAGE_COLUMNS  # with chunk and pipeline_stage
PIPELINE_ROUND_COLUMNS = ROUND_COLUMNS  # with chunks, agg_time, other_time and util_*
CHUNK_STAGES = (
    ("chunk.mask", "client.cpu"),
    ("chunk.upload", "client.link"),
    ("chunk.aggregate", "server.cpu"),
    ("chunk.dispatch", "client.link"),
    ("chunk.decode", "client.cpu"),
)


def stage_rows(run_id: str, round: int, t0: float, chunks: int) -> list[dict[str, Any]]:
    """One round's stages: download 1 s, train 2 s, encode 1/2 s, then ``chunks`` chunks whose stage s
    (1..5) runs over [s/2 + c/4, s/2 + c/4 + 3/4) after the encoding (neighbours overlap, as with slow
    clients), then update 1/4 s; plus the protocol's step and aggregate rows, which the Gantt leaves out.
    ``chunks == 0``: a round with no pipeline rows (chunk and pipeline_stage empty)."""
    rows: list[dict[str, Any]] = []

    def add(stage: str, resource: str, start: float, end: float, chunk: int | None = None, s: int | None = None):
        rows.append(
            {
                "run_id": run_id,
                "round": round,
                "stage": stage,
                "resource": resource,
                "t_start": t0 + start,
                "t_end": t0 + end,
                "clients": 4,
                "chunk": chunk,
                "pipeline_stage": s,
            }
        )

    add("download", "network", 0.0, 1.0)
    add("train", "client", 1.0, 3.0)
    add("upload", "network", 3.0, 5.0)
    add("step.masked_input", "server", 3.5, 5.0)
    add("encode", "client.cpu", 3.0, 3.5)
    last = 3.5
    for c in range(chunks):
        for s, (stage, resource) in enumerate(CHUNK_STAGES, start=1):
            start = 3.5 + s / 2 + c / 4
            add(stage, resource, start, start + 0.75, c, s)
            last = max(last, start + 0.75)
    add("update", "server.cpu", last, last + 0.25)
    add("aggregate", "server", 3.5, last + 0.25)
    return rows


def round_row(
    run_id: str, round: int, t0: float, agg: float, other: float, chunks: int, outcome: str = "ok"
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "round": round,
        "t_start": t0,
        "t_end": t0 + agg + other,
        "round_time": agg + other,
        "outcome": outcome,
        "sampled": 4,
        "survivors": 4,
        "dropped": 0,
        "accuracy": 0.5 + round / 100,
        "epsilon": math.inf,
        "chunks": chunks,
        "agg_time": agg,
        "other_time": other,
        "util_client_cpu": 0.5,
        "util_client_link": 0.25,
        "util_server_cpu": 0.125,
        "util_server_link": 0.25,
    }


def scenario(protocol: str, strategy: str, dropout: float, chunks: int) -> dict[str, Any]:
    """The part of a resolved scenario the breakdown reads (a real manifest holds every key)."""
    return {
        "name": "pipe",
        "aggregation": {"protocol": protocol, "bits": 20},
        "privacy": {"strategy": strategy, "epsilon": 6.0},
        "dropout": {"mode": "fixed", "rate": dropout},
        "pipeline": {"chunks": chunks},
    }


def write_run(
    directory: Path,
    run_id: str,
    doc: dict[str, Any],
    rounds: list[dict[str, Any]],
    stages: list[dict[str, Any]],
    swept: dict[str, Any] | None = None,
) -> Path:
    """A finished run folder as ``RunWriter`` leaves it: the tables with their headers, then the manifest."""
    swept = swept or {}
    directory.mkdir(parents=True, exist_ok=True)
    extra = tuple(swept)
    rows = {
        "rounds": ([{**r, **swept} for r in rounds], (*PIPELINE_ROUND_COLUMNS, *extra)),
        "clients": ([], (*CLIENT_COLUMNS, *extra)),
        "stages": ([{**r, **swept} for r in stages], (*PIPELINE_STAGE_COLUMNS, *extra)),
    }
    for name, (table, columns) in rows.items():
        write_atomic(directory / f"{name}.csv", csv_bytes(table, columns, header=True))
    manifest = {
        "run_id": run_id,
        "scenario_name": "pipe",
        "seed": 1,
        "swept": swept,
        "scenario": doc,
        "status": "complete",
        "rounds_completed": len(rounds),
    }
    write_json(directory / MANIFEST, manifest)
    return directory


def pipelined_run(directory: Path, run_id: str = "r1", chunks: tuple[int, ...] = (2, 3, 0)) -> Path:
    """Three rounds of 10 s; round k has ``chunks[k-1]`` chunks (0: no pipeline rows)."""
    stages = [row for k, m in enumerate(chunks) for row in stage_rows(run_id, k + 1, 10.0 * k, m)]
    rounds = [round_row(run_id, k + 1, 10.0 * k, 6.0, 4.0, max(m, 1)) for k, m in enumerate(chunks)]
    return write_run(directory, run_id, scenario("secagg", "xnoise", 0.1, max(chunks)), rounds, stages)


def test_the_gantt_bars_span_what_the_stages_table_says(tmp_path):
    stages = read_run_table(pipelined_run(tmp_path / "r1"), "stages")
    spans = gantt_spans(stages)  # default: the first run, its round with the most chunks (round 2, m = 3)
    assert set(spans["run_id"]) == {"r1"} and set(spans["round"]) == {2}
    table = stages[stages["round"] == 2]
    drawn = table[table["chunk"].notna() | table["stage"].isin(["download", "train", "encode", "update"])]
    assert len(spans) == len(drawn) == 15 + 4  # 3 chunks x 5 stages, 4 context stages; not step.*/aggregate
    assert list(spans["t_start"]) == list(drawn["t_start"]) and list(spans["t_end"]) == list(drawn["t_end"])
    # since the round's start: round 2 starts at 10 s (its download)
    assert list(spans["start"]) == [t - 10.0 for t in drawn["t_start"]]
    assert list(spans["end"]) == [t - 10.0 for t in drawn["t_end"]]
    upload_1 = spans[(spans["stage"] == "chunk.upload") & (spans["chunk"] == 1)].iloc[0]
    assert (upload_1["resource"], upload_1["pipeline_stage"], upload_1["start"], upload_1["end"]) == (
        "client.link",
        2,
        4.75,  # 3.5 + 2/2 + 1/4
        5.5,
    )
    context = spans[spans["chunk"] == -1].set_index("stage")
    assert list(context.index) == ["download", "train", "encode", "update"]
    assert (context.loc["update", "start"], context.loc["update", "end"]) == (7.25, 7.5)  # after decode of chunk 2
    assert (context["pipeline_stage"] == 0).all()
    assert set(gantt_spans(stages, "r1", 1)["chunk"]) == {-1, 0, 1}


def test_the_gantt_chart_is_written_for_several_chunks_and_for_one(tmp_path):
    stages = read_run_table(pipelined_run(tmp_path / "r1", chunks=(1, 3, 0)), "stages")
    out = tmp_path / "figs"
    paths = plot_gantt(stages, out)
    assert [p.name for p in paths] == ["gantt_r1_round2.png", "gantt_r1_round2.pdf"]
    assert paths[0].read_bytes().startswith(b"\x89PNG") and paths[1].read_bytes().startswith(b"%PDF")
    paths = plot_gantt(stages, out, run_id="r1", round=1)  # m = 1: one lane, one chunk row
    assert [p.name for p in paths] == ["gantt_r1_round1.png", "gantt_r1_round1.pdf"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_a_round_without_pipeline_rows_is_refused_by_name(tmp_path):
    stages = read_run_table(pipelined_run(tmp_path / "r1"), "stages")
    with pytest.raises(
        ResultsError,
        match=r"run 'r1', round 3: the stages table has no pipeline rows .*; rounds that have them: 1, 2$",
    ):
        plot_gantt(stages, tmp_path / "figs", round=3)
    old = stages.drop(columns=["chunk", "pipeline_stage"])  # a table from before pipelining
    with pytest.raises(
        ResultsError, match=r"run 'r1', round 1: the stages table has no pipeline rows .*pipeline\.chunks"
    ):
        plot_gantt(old, tmp_path / "figs")
    with pytest.raises(ResultsError, match=r"run 'r1' has no round 9 in its stages table; its rounds: 1 to 3"):
        gantt_spans(stages, round=9)
    with pytest.raises(ResultsError, match=r"run 'r9': not in the stages table; its runs: r1"):
        gantt_spans(stages, run_id="r9")
    assert not (tmp_path / "figs").exists()


def rounds_frame(rows: list[tuple[str, str, float, int, str, str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        rows, columns=["protocol", "strategy", "dropout", "chunks", "line", "outcome", "agg_time", "other_time"]
    ).assign(round_time=lambda f: f["agg_time"] + f["other_time"])


def test_the_breakdown_averages_finished_rounds_per_run_then_over_runs():
    rounds = rounds_frame(
        [
            # xnoise, d = 10%: only a pipelined bar, so no speedup
            ("secagg", "xnoise", 0.1, 4, "x4", "ok", 4.0, 1.0),
            # orig, d = 10%: two plain runs (seeds), pipelined with m = 4 and m = 8
            ("secagg", "orig", 0.1, 1, "plain-s1", "ok", 3.0, 1.0),
            ("secagg", "orig", 0.1, 1, "plain-s1", "ok", 5.0, 1.0),
            ("secagg", "orig", 0.1, 1, "plain-s1", "aborted: too few survivors", 99.0, 1.0),
            ("secagg", "orig", 0.1, 1, "plain-s2", "ok", 6.0, 1.0),
            ("secagg", "orig", 0.1, 4, "m4", "ok", 1.5, 1.0),
            ("secagg", "orig", 0.1, 4, "m4", "ok", 2.5, 1.0),
            ("secagg", "orig", 0.1, 8, "m8", "ok", 3.0, 1.0),
            # xnoise, no dropout: only a plain bar
            ("secagg", "xnoise", 0.0, 1, "x1", "ok", 6.0, 2.0),
        ]
    )
    table = round_time_breakdown(rounds)
    # By hand: plain-s1 means 4 + 1 (the aborted round left out), plain-s2 6 + 1; their mean 5 + 1 = 6 s.
    # m = 4: 2 + 1 = 3 s, speedup 6 / 3 = 2; m = 8: 3 + 1 = 4 s, speedup 6 / 4 = 1.5.
    expected = pd.DataFrame(
        {
            "protocol": ["secagg"] * 5,
            "strategy": ["orig", "orig", "orig", "xnoise", "xnoise"],
            "dropout": [0.1, 0.1, 0.1, 0.0, 0.1],
            "chunks": [1, 4, 8, 1, 4],
            "runs": [2, 1, 1, 1, 1],
            "rounds": [3, 2, 1, 1, 1],
            "agg_time": [5.0, 2.0, 3.0, 6.0, 4.0],
            "other_time": [1.0, 1.0, 1.0, 2.0, 1.0],
            "round_time": [6.0, 3.0, 4.0, 8.0, 5.0],
            "speedup": [1.0, 2.0, 1.5, 1.0, math.nan],
        }
    )
    pd.testing.assert_frame_equal(table, expected, check_dtype=False)


def test_the_breakdown_reads_its_groups_from_the_manifests_and_the_swept_columns(tmp_path):
    a = write_run(tmp_path / "a", "a", scenario("secagg+", "orig", 0.2, 1), [round_row("a", 1, 0.0, 3.0, 1.0, 1)], [])
    b = write_run(
        tmp_path / "b",
        "b",
        scenario("secagg", "xnoise", 0.2, 4),
        [round_row("b", 1, 0.0, 1.0, 1.0, 4)],
        [],
        swept={"dropout.rate": 0.3},  # a swept column holds the run's value (here it disagrees, to tell)
    )
    keyed = with_scenario_keys(load_rounds([a, b]))
    assert list(keyed["protocol"]) == ["secagg+", "secagg"]
    assert list(keyed["strategy"]) == ["orig", "xnoise"]
    assert list(keyed["dropout"]) == [0.2, 0.3]
    out = tmp_path / "figs"
    paths = plot_round_time_breakdown(load_rounds([a]), out, name="only_plain")
    paths += plot_round_time_breakdown(load_rounds([b]), out, name="only_pipelined")
    assert [p.name for p in paths] == [
        "only_plain.png",
        "only_plain.pdf",
        "only_pipelined.png",
        "only_pipelined.pdf",
    ]
    assert paths[1].read_bytes().startswith(b"%PDF") and paths[2].read_bytes().startswith(b"\x89PNG")


def pipeline_sweep(folder: Path) -> Path:
    """A sweep over privacy.strategy and pipeline.chunks: plain rounds of 8 s (orig) and 10 s (xnoise), 2 s
    of which other; pipelined (m = 3) rounds with the aggregation halved."""
    run_ids = []
    for strategy, agg in (("orig", 6.0), ("xnoise", 8.0)):
        for chunks in (1, 3):
            run_id = f"privacy.strategy={strategy}_pipeline.chunks={chunks}"
            run_ids.append(run_id)
            a = agg if chunks == 1 else agg / 2
            rounds = [round_row(run_id, k + 1, (a + 2.0) * k, a, 2.0, chunks) for k in range(2)]
            stages = [
                row for k in range(2) for row in stage_rows(run_id, k + 1, (a + 2.0) * k, chunks if k == 0 else 0)
            ]
            swept = {"privacy.strategy": strategy, "pipeline.chunks": chunks}
            write_run(
                folder / "runs" / run_id, run_id, scenario("secagg", strategy, 0.1, chunks), rounds, stages, swept
            )
    write_json(
        folder / "sweep.json",
        {"scenario_file": "pipe.yaml", "sweep": {"privacy.strategy": ["orig", "xnoise"]}, "run_ids": run_ids},
    )
    return folder


def test_plot_draws_the_breakdown_and_the_gantt_of_each_run(tmp_path, capsys):
    sweep = pipeline_sweep(tmp_path / "sw")
    figs = tmp_path / "figs"
    assert main(["plot", str(sweep), "--out", str(figs), "--gantt", "1"]) == 0
    names = {p.name for p in figs.iterdir()}
    assert {"round_time_breakdown.png", "round_time_breakdown.pdf"} <= names
    gantts = sorted(n for n in names if n.startswith("gantt_"))
    assert gantts == sorted(
        f"gantt_privacy.strategy={s}_pipeline.chunks={m}_round1.{e}"
        for s in ("orig", "xnoise")
        for m in (1, 3)
        for e in ("png", "pdf")
    )
    assert str(figs / "round_time_breakdown.pdf") in capsys.readouterr().out
    table = round_time_breakdown(with_scenario_keys(load_rounds([sweep])))
    assert list(table["speedup"]) == [1.0, 8.0 / 5.0, 1.0, 10.0 / 6.0]  # by hand: (a + 2) / (a / 2 + 2)

    assert main(["plot", str(sweep), "--out", str(figs), "--gantt", "2"]) == 2
    err = capsys.readouterr().err
    run = sweep / "runs" / "privacy.strategy=orig_pipeline.chunks=1"
    assert (
        f"dropsim: {run}: run 'privacy.strategy=orig_pipeline.chunks=1', round 2: the stages table has no pipeline rows"
        in err
    )


def test_the_breakdown_keeps_other_swept_keys_apart():
    # Two links models swept beside the chunk count: four bars, not two averaged ones.
    rows = []
    for links, agg in (("shared", 4.0), ("duplex", 2.0)):
        for chunks in (1, 4):
            a = 8.0 if chunks == 1 else agg
            rows.append(
                {
                    "protocol": "secagg",
                    "strategy": "none",
                    "dropout": 0.0,
                    "pipeline.links": links,
                    "pipeline.chunks": chunks,
                    "chunks": chunks,
                    "line": f"{links}-{chunks}",
                    "outcome": "ok",
                    "agg_time": a,
                    "other_time": 2.0,
                    "round_time": a + 2.0,
                }
            )
    table = round_time_breakdown(pd.DataFrame(rows))
    assert list(table["pipeline.links"]) == ["duplex", "duplex", "shared", "shared"]
    assert list(table["speedup"]) == [1.0, 10.0 / 4.0, 1.0, 10.0 / 6.0]
