"""Availability traces: the file format and its checks, FedScale import, the calibrated synthetic generator,
statistics and the ``trace`` command. Exact online/offline sequences come from tiny hand-written traces;
calibration numbers are the ones stated in traces/README.md."""

from __future__ import annotations

import argparse
import math
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli.trace import add_trace_parser, cmd_trace
from sim.errors import InputError
from sim.plots import plot_online
from sim.safepickle import UnsafePickleError
from sim.traces.fedscale import FedScaleError, import_fedscale, import_fedscale_report
from sim.traces.io import (
    MIN_PARQUET_ROWS,
    PARQUET_ROWS_PER_BYTE,
    SHOWN_CHARS,
    TraceError,
    check_clients,
    load_trace,
    sidecar_path,
    write_trace,
)
from sim.traces.model import Trace
from sim.traces.stats import dominant_period_h, online_counts, online_series, session_stats
from sim.traces.synth import Calibration, expected_online, synthesize

ROOT = Path(__file__).resolve().parent.parent
HEADER = "# dropsim availability trace v1\nclient,start_s,end_s\n"

# client 0: [0, 10) and [20, 30); client 2: [5, 15); client 3: [0, 4) every 10 s;
# client 5: [0, 2) and [8, 10) every 10 s (one session across each wrap); client 7: [0, 6) every 6 s (always)
TINY = HEADER + "0,0,10\n0,20,30\n2,5,15\n3,0,4\n5,0,2\n5,8,10\n7,0,6\n"
TINY_SIDECAR = "client,period_s,compute_ms_per_sample,bandwidth_kbps\n3,10,,\n5,10,25.5,\n7,6,,800\n"


def write(path: Path, text: str, sidecar: str | None = None) -> Path:
    path.write_text(text)
    if sidecar is not None:
        sidecar_path(path).write_text(sidecar)
    return path


@pytest.fixture
def tiny(tmp_path: Path) -> Trace:
    return load_trace(write(tmp_path / "tiny.csv", TINY, TINY_SIDECAR))


# ------------------------------------------------------------------------------------------- online / offline


@pytest.mark.parametrize(
    ("t", "online"),
    [
        (0.0, [0, 3, 5, 7]),  # starts are inclusive
        (1.999, [0, 3, 5, 7]),
        (2.0, [0, 3, 7]),  # ends are exclusive
        (4.0, [0, 7]),
        (5.0, [0, 2, 7]),
        (8.0, [0, 2, 5, 7]),
        (9.999, [0, 2, 5, 7]),
        (10.0, [2, 3, 5, 7]),  # client 0 off; periodic clients 3 and 5 back at local time 0
        (14.0, [2, 7]),
        (15.0, [7]),
        (20.0, [0, 3, 5, 7]),
        (29.5, [0, 5, 7]),
        (30.0, [3, 5, 7]),
        (1e6 + 1, [3, 5, 7]),  # non-repeating clients stay offline after their last interval
    ],
)
def test_online_at_chosen_times(tiny, t, online):
    assert list(tiny.online(t)) == online
    assert int(online_counts(tiny, np.array([t]))[0]) == len(online)


def test_offline_at_non_repeating_client(tiny):
    i = tiny.index_of(0)
    assert tiny.offline_at(i, 0.0) == 10.0
    assert tiny.offline_at(i, 9.5) == 10.0
    assert tiny.offline_at(i, 10.0) == 10.0  # offline already: t itself
    assert tiny.offline_at(i, 25.0) == 30.0
    assert tiny.offline_at(i, 31.0) == 31.0


def test_offline_at_repeating_clients_and_the_wrap(tiny):
    three, five, seven = (tiny.index_of(c) for c in (3, 5, 7))
    assert tiny.offline_at(three, 21.0) == 24.0
    assert tiny.offline_at(three, 25.0) == 25.0
    assert tiny.offline_at(five, 9.0) == 12.0  # [8, 10) runs on into the next period's [0, 2)
    assert tiny.offline_at(five, 28.0) == 32.0
    assert tiny.offline_at(five, 31.0) == 32.0
    assert tiny.offline_at(five, 5.0) == 5.0
    assert math.isinf(tiny.offline_at(seven, 1234.5))  # [0, period): always online


@st.composite
def traces(draw: st.DrawFn, integer: bool = True) -> Trace:
    """Small valid traces with integer times (or integers plus a multiple of 1/8), so that no comparison
    below depends on floating-point rounding."""
    n = draw(st.integers(1, 5))
    ids = sorted(draw(st.sets(st.integers(0, 30), min_size=n, max_size=n)))
    counts, starts, ends, periods = [], [], [], []
    for _ in ids:
        k = draw(st.integers(1, 4))
        gaps = draw(st.lists(st.integers(1, 6), min_size=2 * k, max_size=2 * k))
        edges = np.cumsum(gaps) - gaps[0] + draw(st.integers(0, 3))  # first start may be 0
        if not integer:  # eighths: sums of these stay exact, so period arithmetic has no rounding
            edges = edges + draw(st.sampled_from([0.125, 0.25, 0.375, 0.5]))
        starts += list(edges[0::2].astype(float))
        ends += list(edges[1::2].astype(float))
        counts.append(k)
        repeat = draw(st.sampled_from(["no", "end", "later"]))
        last = float(edges[-1])
        periods.append(np.nan if repeat == "no" else last if repeat == "end" else last + draw(st.integers(1, 4)))
    return Trace(
        clients=np.array(ids, dtype=np.int64),
        offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        starts=np.array(starts),
        ends=np.array(ends),
        periods=np.array(periods),
    )


@settings(max_examples=150, deadline=None)
@given(trace=traces(), t2=st.integers(0, 200))
def test_offline_at_agrees_with_online_mask(trace, t2):
    """Brute force on the half-second grid: offline_at(t) is t exactly when offline, else the first grid time
    at which the client is offline (all boundaries are integers)."""
    t = t2 / 2
    mask = trace.online_mask(t)
    for i in range(trace.size):
        end = trace.offline_at(i, t)
        if not mask[i]:
            assert end == t
            continue
        horizon = t + 2 * 40 + 1  # periods here are <= 40 s
        u = t
        while u < horizon and trace.online_mask(u)[i]:
            u += 0.5
        assert end == (math.inf if u >= horizon else u)


@settings(max_examples=100, deadline=None)
@given(trace=traces(integer=False), times=st.lists(st.integers(0, 1000).map(lambda k: k / 8), min_size=1, max_size=20))
def test_online_counts_agree_with_online_mask(trace, times):
    counts = online_counts(trace, np.array(times))
    assert list(counts) == [int(trace.online_mask(t).sum()) for t in times]


def test_offline_at_and_online_mask_agree_near_a_period_multiple():
    period = 91.58079543013875
    t = 863148.9969290576  # np.mod(t, p) = p - 7e-11, but t - floor(t / p) * p = -1.2e-10
    trace = Trace(
        clients=np.array([0]),
        offsets=np.array([0, 2]),
        starts=np.array([0.0, 50.0]),
        ends=np.array([10.0, period]),
        periods=np.array([period]),
    )
    assert trace.online_mask(t)[0]
    assert trace.offline_at(0, t) > t


# ------------------------------------------------------------------------------------------- format checks


def error(tmp_path: Path, text: str, sidecar: str | None = None) -> TraceError:
    with pytest.raises(TraceError) as info:
        load_trace(write(tmp_path / "t.csv", text, sidecar))
    return info.value


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("", None, "is empty"),
        ("# only a comment\n\n", None, "is empty"),
        ("client,start_s,end_s\n", None, "no intervals"),
        ("client,start,end\n0,0,1\n", 1, "header must be 'client,start_s,end_s'"),
        ("#a\n#b\nclient,start_s\n0,0\n", 3, "header"),
        (HEADER + "0,0,10,5\n", 3, "4 fields; expected 3"),
        (HEADER + "0,0,10\n0,20,30,1\n", 4, "more than 3 fields"),
        (HEADER + "0,0,10\n0,20,30,1,2\n", 4, "5 fields; expected 3"),
        (HEADER + "0,0,10\n0,20\n", 4, "end_s is empty"),
        (HEADER + "0,0,10\n\n0,20,30\n", 4, "blank line"),
        (HEADER + "0,0,10\n0,-20,30\n", 4, "start_s -20 is not a finite time in seconds >= 0"),
        (HEADER + "0,0,10\n0,nan,30\n", 4, "start_s 'nan'"),
        (HEADER + "0,0,10\n0,20,inf\n", 4, "end_s inf is not a finite time"),
        (HEADER + "0,0,10\n0,abc,30\n", 4, "start_s 'abc' is not a number"),
        (HEADER + "0,0,10\n1.5,20,30\n", 4, "client 1.5 is not an integer client id"),
        (HEADER + "0,0,10\n-1,20,30\n", 4, "client -1 is negative"),
        (HEADER + "0,0,10\nx,20,30\n", 4, "client 'x' is not a number"),
        (HEADER + "99999999999999999999,0,1\n", 3, "not an integer client id"),
        (HEADER + "0,0,10\n0,20,20\n", 4, "end_s 20 is not after start_s 20"),
        (HEADER + "0,0,10\n0,30,25\n", 4, "end_s 25 is not after start_s 30"),
        (HEADER + "1,0,10\n0,20,30\n", 4, "client 0 after client 1 (line 3)"),
        (HEADER + "0,20,30\n0,0,10\n", 4, "starts before the previous one [20, 30) on line 3"),
        (HEADER + "0,0,10\n0,5,30\n", 4, "overlaps the previous one [0, 10) on line 3"),
        (HEADER + "0,0,10\n0,10,30\n", 4, "touches the previous one [0, 10) on line 3; write one session"),
        (HEADER + "0,0,10\n1,0,1\n1,0.5,2\n0,40,50\n", 5, "overlaps"),  # the first defect is reported
    ],
)
def test_bad_trace_is_refused_with_its_line(tmp_path, text, line, words):
    err = error(tmp_path, text)
    assert isinstance(err, InputError)
    assert words in str(err)
    assert err.line == line
    assert str(err).startswith(f"{tmp_path / 't.csv'}:{line}: " if line else f"{tmp_path / 't.csv'}: ")


@pytest.mark.parametrize(
    ("sidecar", "line", "words"),
    [
        ("client,period_s\n3,10\n9,10\n", 3, "unknown client 9: it has no interval in t.csv"),
        ("client,period_s\n3,10\n3,20\n", 3, "client 3 appears twice"),
        ("client,period_s,colour\n3,10,red\n", 1, "unknown column 'colour'"),
        ("period_s,client\n10,3\n", 1, "first column must be 'client'"),
        ("client,period_s\n3,0\n", 2, "period_s 0 is not a period in seconds > 0"),
        ("client,period_s\n#3,10\n", 2, "client '#3' is not a number"),
        ("client,bandwidth_kbps\n0,-5\n", 2, "bandwidth_kbps -5 is not kbit/s > 0"),
        ("client,compute_ms_per_sample\n0,fast\n", 2, "compute_ms_per_sample 'fast' is not a number"),
        ("# c\nclient,period_s\n3,10\n0,25\n", 4, "client 0: period_s 25 is shorter than its interval ending at 30"),
    ],
)
def test_bad_sidecar_is_refused_with_its_line(tmp_path, sidecar, line, words):
    err = error(tmp_path, HEADER + "0,0,10\n0,20,30\n3,0,4\n", sidecar)
    assert words in str(err)
    assert err.line == line
    assert str(err).startswith(f"{tmp_path / 't.clients.csv'}:{line}: ")
    if "shorter" in words:
        assert f"({tmp_path / 't.csv'}:4)" in str(err)  # names the interval's line in the main file


def test_comments_blank_lines_at_the_end_and_spaces_are_accepted(tmp_path):
    text = "\n# dropsim availability trace v1\n# made by hand\n\nclient,start_s,end_s\r\n 4 , 1.5 ,2.25\r\n4,3,4\n\n\n"
    trace = load_trace(write(tmp_path / "t.csv", text))
    assert list(trace.clients) == [4]
    assert list(trace.starts) == [1.5, 3.0]
    assert list(trace.ends) == [2.25, 4.0]
    assert np.isnan(trace.periods).all()
    assert trace.compute_ms_per_sample is None and trace.bandwidth_kbps is None


def test_sidecar_columns_are_optional_and_missing_clients_get_nan(tiny):
    assert np.array_equal(tiny.clients, [0, 2, 3, 5, 7])
    assert np.array_equal(tiny.periods, [np.nan, np.nan, 10, 10, 6], equal_nan=True)
    assert tiny.compute_ms_per_sample is not None and tiny.bandwidth_kbps is not None
    assert np.array_equal(tiny.compute_ms_per_sample, [np.nan, np.nan, np.nan, 25.5, np.nan], equal_nan=True)
    assert np.array_equal(tiny.bandwidth_kbps, [np.nan, np.nan, np.nan, np.nan, 800], equal_nan=True)


def test_wrong_kind_of_path_is_refused(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match=r"unknown trace file type '\.txt'"):
        load_trace(write(tmp_path / "t.txt", TINY))
    with pytest.raises(TraceError, match=r"sidecar; load the trace itself \(t\.csv\)"):
        load_trace(write(tmp_path / "t.clients.csv", TINY_SIDECAR))


def test_check_clients_names_the_line_of_the_first_unknown_client(tmp_path):
    path = write(tmp_path / "t.csv", TINY, TINY_SIDECAR)
    trace = load_trace(path)
    check_clients(trace, 8, "scenario.yaml:4")  # ids 0..7: fine
    with pytest.raises(TraceError) as info:
        check_clients(trace, 4, "scenario.yaml:4")
    assert str(info.value).startswith(f"{path}:7: unknown client 5: the population is 4 (scenario.yaml:4)")
    assert info.value.line == 7
    memory = synthesize(3, 0.1, 0)
    with pytest.raises(TraceError, match=r"^synthesize\(clients=3, days=0.1, seed=0\): unknown client 2"):
        check_clients(memory, 2, "population")


# ------------------------------------------------------------------------------------------- writing


def assert_same(a: Trace, b: Trace) -> None:
    assert np.array_equal(a.clients, b.clients)
    assert np.array_equal(a.offsets, b.offsets)
    assert np.array_equal(a.starts, b.starts)
    assert np.array_equal(a.ends, b.ends)
    assert np.array_equal(a.periods, b.periods, equal_nan=True)
    for x, y in ((a.compute_ms_per_sample, b.compute_ms_per_sample), (a.bandwidth_kbps, b.bandwidth_kbps)):
        if x is None or np.isnan(x).all():
            assert y is None or np.isnan(y).all()
        else:
            assert y is not None and np.array_equal(x, y, equal_nan=True)


def test_round_trip_with_sidecar(tiny, tmp_path):
    out = tmp_path / "sub" / "copy.csv"
    assert write_trace(tiny, out, comments=["made in a test"]) == [out, sidecar_path(out)]
    assert out.read_text().startswith(
        "# dropsim availability trace v1\n# made in a test\nclient,start_s,end_s\n0,0,10\n"
    )
    assert sidecar_path(out).read_text().splitlines()[-3:] == ["3,10,,", "5,10,25.5,", "7,6,,800"]
    assert_same(tiny, load_trace(out))
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_sidecar_is_written_only_when_needed_and_a_stale_one_is_removed(tiny, tmp_path):
    out = tmp_path / "t.csv"
    write_trace(tiny, out)
    assert sidecar_path(out).exists()
    plain = synthesize(10, 0.5, 3)
    assert write_trace(plain, out) == [out]
    assert not sidecar_path(out).exists()
    assert_same(plain, load_trace(out))


@settings(max_examples=40, deadline=None)
@given(trace=traces(integer=False), capacity=st.booleans())
def test_round_trip_is_exact(tmp_path_factory, trace, capacity):
    if capacity:
        rng = np.random.default_rng(trace.size)
        values = rng.random(trace.size) * 100
        values[0] = np.nan
        trace = Trace(trace.clients, trace.offsets, trace.starts, trace.ends, trace.periods, values, values / 3)
    out = tmp_path_factory.mktemp("rt") / "t.csv"
    write_trace(trace, out)
    assert_same(trace, load_trace(out))


def test_parquet_without_pyarrow_says_how_to_get_it(tmp_path, tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    with pytest.raises(TraceError, match=r"t\.parquet: reading Parquet needs .*pip install pyarrow"):
        load_trace(tmp_path / "t.parquet")
    with pytest.raises(TraceError, match=r"writing Parquet needs .*pip install pyarrow"):
        write_trace(tiny, tmp_path / "u.parquet")


def test_parquet_round_trip(tmp_path, tiny):
    pytest.importorskip("pyarrow")
    out = tmp_path / "t.parquet"
    assert write_trace(tiny, out) == [out, tmp_path / "t.clients.parquet"]
    assert_same(tiny, load_trace(out))
    frame = pd.DataFrame({"client": [0, 0], "start_s": [0.0, 5.0], "end_s": [10.0, 20.0]})
    frame.to_parquet(tmp_path / "bad.parquet", index=False)
    with pytest.raises(TraceError, match=r"bad\.parquet: row 2: client 0: interval \[5, 20\) overlaps"):
        load_trace(tmp_path / "bad.parquet")


def test_parquet_footer_is_checked_before_any_column_is_read(tmp_path):
    """A run of one value is stored once: 2 million rows of ``0,0,1`` (48 MB as arrays) take some 27 KB of
    Parquet. Refused from the footer, before pandas reads the columns (before the fix they were read, then
    refused as overlapping); so is a column that is not numbers (one long string repeated)."""
    pytest.importorskip("pyarrow")
    n = 2_000_000
    runs = pd.DataFrame({"client": np.zeros(n, np.int64), "start_s": np.zeros(n), "end_s": np.ones(n)})
    runs.to_parquet(tmp_path / "runs.parquet", index=False)
    size = (tmp_path / "runs.parquet").stat().st_size
    assert size * PARQUET_ROWS_PER_BYTE < MIN_PARQUET_ROWS < n
    with pytest.raises(TraceError, match=rf"runs\.parquet: claims {n} rows in {size} bytes; a Parquet trace may"):
        load_trace(tmp_path / "runs.parquet")
    text = pd.DataFrame({"client": ["x" * 100_000] * 3, "start_s": [0.0] * 3, "end_s": [1.0] * 3})
    text.to_parquet(tmp_path / "text.parquet", index=False)
    with pytest.raises(TraceError, match=r"text\.parquet: column client holds (large_)?string; a trace's columns"):
        load_trace(tmp_path / "text.parquet")
    indexed = pd.DataFrame({"client": [3], "start_s": [0.0], "end_s": [1.0]}, index=pd.Index([7], name="row"))
    indexed.to_parquet(tmp_path / "indexed.parquet")  # pandas' own index column is not a trace column
    assert load_trace(tmp_path / "indexed.parquet").clients.tolist() == [3]


def test_text_from_the_file_is_quoted_cut_short(tmp_path):
    """A 100,000-character cell, header or first line is quoted by its first SHOWN_CHARS characters."""
    cases = [
        ("client,start_s,end_s\n" + "1" * 100_000 + "x,0,1\n", ":2: client '" + "1" * SHOWN_CHARS + "'... (100001"),
        ("client,start_s,end_s\n0,a" + "1" * 100_000 + ",1\n", ":2: start_s 'a" + "1" * (SHOWN_CHARS - 1) + "'..."),
        ("client,start_s," + "e" * 100_000 + "\n0,0,1\n", ":1: header 'client,start_s,eeee"),
        ("client,start_s,end_s\n0,0,1," + "9" * 100_000 + "\n", ":2: 4 fields; expected 3"),
    ]
    for text, words in cases:
        path = tmp_path / "long.csv"
        path.write_text(text)
        with pytest.raises(TraceError) as info:
            load_trace(path)
        assert f"{path}{words}" in str(info.value)
        assert len(str(info.value)) < len(str(path)) + 300


# ------------------------------------------------------------------------------------------- FedScale


def pickled(path: Path, obj: object) -> Path:
    path.write_bytes(pickle.dumps(obj, protocol=2))
    return path


BEHAVE = {
    1: {"duration": 100, "active": [0, 30, 50], "inactive": [10, 50, 100], "finish_time": 100, "model": "Pixel"},
    "2": {"duration": 50, "active": [5, 20], "inactive": [5, 40], "finish_time": 60, "model": "x"},  # 1 zero-length
    3: {"duration": 0, "active": [7], "inactive": [7], "finish_time": 60, "model": "y"},  # nothing left
}
CAPACITY = {1: {"computation": 32.5, "communication": 1500.0}, 2: {"computation": 80, "communication": 90}, 9: {}}


def test_fedscale_import_converts_intervals_periods_and_capacity(tmp_path):
    trace, report = import_fedscale_report(
        pickled(tmp_path / "client_behave_trace", BEHAVE), pickled(tmp_path / "client_device_capacity", CAPACITY)
    )
    assert list(trace.clients) == [1, 2]
    assert list(trace.offsets) == [0, 2, 3]
    assert list(trace.starts) == [0, 30, 20]  # [30, 50) and [50, 100) touch: one session
    assert list(trace.ends) == [10, 100, 40]
    assert list(trace.periods) == [100, 60]
    assert trace.compute_ms_per_sample is not None and list(trace.compute_ms_per_sample) == [32.5, 80]
    assert trace.bandwidth_kbps is not None and list(trace.bandwidth_kbps) == [1500, 90]
    assert report.row() == {
        "clients": 3,
        "in trace": 2,
        "intervals": 3,
        "zero-length dropped": 2,
        "touching merged": 1,
        "with capacity": 2,
        "capacity unused": 1,
    }
    # FedScale's rule, active <= t mod finish_time <= inactive, at interior times
    assert list(trace.online(235.0)) == [1]  # 235 mod 100 = 35; 235 mod 60 = 55
    assert list(trace.online(145.0)) == [1, 2]  # 45 and 25
    assert trace.offline_at(0, 95.0) == 110.0  # [30, 100) runs on into the next period's [0, 10)


@pytest.mark.parametrize(
    ("behave", "words"),
    [
        ([1, 2], "holds a list; a FedScale client_behave_trace is a dict"),
        ({"a": {}}, "client key 'a' is not a client id"),
        ({1: {"active": [0], "finish_time": 9}}, "client 1: missing key(s) inactive"),
        ({1: {"active": [0, 5], "inactive": [1], "finish_time": 9}}, "client 1: 2 active times but 1 inactive"),
        ({1: {"active": [5, 0], "inactive": [6, 1], "finish_time": 9}}, "client 1: interval 1 starts at 0, before"),
        ({1: {"active": [0, 2], "inactive": [3, 4], "finish_time": 9}}, "client 1: interval 1 starts at 2, before"),
        ({1: {"active": [0], "inactive": [12], "finish_time": 9}}, "client 1: interval 0 is active 0 .. inactive 12"),
        ({1: {"active": [0], "inactive": ["x"], "finish_time": 9}}, "client 1: inactive[0] is 'x', not a number"),
        ({1: {"active": [0], "inactive": [1], "finish_time": 0}}, "client 1: finish_time 0 must be > 0"),
        ({1: [0, 1]}, "client 1: entry is a list"),
        ({1: {"active": [0], "inactive": [1], "finish_time": 9}, "1": {}}, "client 1 appears twice"),
    ],
)
def test_fedscale_structure_errors_name_the_client(tmp_path, behave, words):
    with pytest.raises(FedScaleError) as info:
        import_fedscale(pickled(tmp_path / "behave", behave))
    assert words in str(info.value)
    assert str(info.value).startswith(str(tmp_path / "behave"))


def test_fedscale_capacity_errors_name_the_client(tmp_path):
    behave = pickled(tmp_path / "behave", BEHAVE)
    with pytest.raises(FedScaleError, match="client 2: computation -1 must be > 0"):
        import_fedscale(behave, pickled(tmp_path / "cap", {2: {"computation": -1, "communication": 5}}))
    with pytest.raises(FedScaleError, match="client 1: entry .* lacks computation and communication"):
        import_fedscale(behave, pickled(tmp_path / "cap", {1: {"computation": 3}}))


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # what a hostile pickle does: call os.system when loaded
        return (os.system, (f"touch {self.marker}",))


def test_fedscale_malicious_pickle_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    path = pickled(tmp_path / "behave", {1: _Exploit(marker)})
    with pytest.raises(UnsafePickleError) as info:
        import_fedscale(path)
    assert info.value.global_name in ("posix.system", "os.system", "nt.system")
    assert not marker.exists()


# ------------------------------------------------------------------------------------------- synthetic


@pytest.fixture(scope="module")
def population() -> Trace:
    return synthesize(20_000, 4, 0)


def test_synthetic_online_fraction_and_period_match_the_stated_calibration(population):
    hourly = online_series(population, 3600.0)
    assert len(hourly) == 96
    assert hourly["fraction"].between(0.13, 0.27).all()
    assert 0.19 <= hourly["fraction"].mean() <= 0.215  # stated: 20.2-20.3% at this size
    assert abs(dominant_period_h(online_series(population, 600.0)) - 24.0) <= 1.0
    expected = expected_online(hourly["time_h"].to_numpy() * 3600)
    assert np.abs(hourly["fraction"].to_numpy() - expected).max() < 0.02
    assert 55 * 60 <= session_stats(population).median_s <= 80 * 60  # stated: 65 min


def test_expected_curve_has_the_reference_shape():
    t = np.arange(0, 96 * 3600, 600.0)
    f = expected_online(t)
    assert f.min() >= 0.15 and f.max() <= 0.25
    days = f.reshape(4, -1)
    peak_hours = days.argmax(axis=1) * 600 / 3600
    assert np.all((peak_hours > 6) & (peak_hours < 8.5))  # peak ~7 h into each day
    assert np.all(np.diff(days.max(axis=1)) < 0)  # daily peaks fall as devices leave
    assert abs(dominant_period_h(pd.DataFrame({"time_h": t / 3600, "fraction": f})) - 24.0) < 0.1


def test_synthetic_trace_is_valid_complete_and_reproducible(population, tmp_path):
    assert population.size == 20_000 and np.array_equal(population.clients, np.arange(20_000))
    assert np.all(np.diff(population.offsets) >= 1)  # every client comes online at least once
    assert population.starts.min() >= 0 and population.ends.max() <= 4 * 86_400
    small = synthesize(300, 2, 7)
    again = synthesize(300, 2, 7)
    assert_same(small, again)
    assert not np.array_equal(synthesize(300, 2, 8).starts[:50], small.starts[:50])
    write_trace(small, tmp_path / "s.csv")  # loading re-checks order and disjointness
    assert_same(small, load_trace(tmp_path / "s.csv"))


def test_synthesize_rejects_bad_arguments():
    with pytest.raises(ValueError, match="clients must be at least 1"):
        synthesize(0, 1, 0)
    with pytest.raises(ValueError, match="days must be a positive number"):
        synthesize(5, 0, 0)
    with pytest.raises(ValueError, match="profile_online"):
        Calibration(profile_online=(0.2,) * 24 + (1.5,))


def test_shipped_sample_is_what_its_command_makes():
    path = ROOT / "traces" / "synthetic_small.csv"
    assert path.stat().st_size < 2_000_000
    assert "dropsim trace synth --clients 5000 --days 4 --seed 1" in path.read_text().splitlines()[1]
    shipped = load_trace(path)
    assert_same(shipped, synthesize(5000, 4, 1))
    assert not sidecar_path(path).exists()


# ------------------------------------------------------------------------------------------- statistics


def test_online_series_and_session_stats_on_the_tiny_trace(tiny):
    series = online_series(tiny, 5.0, end_s=40.0, population=10)
    assert list(series["time_h"] * 3600) == [0, 5, 10, 15, 20, 25, 30, 35]
    assert list(series["online"]) == [4, 3, 4, 1, 4, 2, 3, 1]  # see test_online_at_chosen_times
    assert list(series["fraction"]) == [0.4, 0.3, 0.4, 0.1, 0.4, 0.2, 0.3, 0.1]
    assert len(online_series(tiny, 5.0)) == 6  # default: up to the span (30 s, the last end), excluded
    stats = session_stats(tiny)
    assert (stats.clients, stats.intervals, stats.intervals_per_client) == (5, 7, 1.4)
    assert (stats.median_s, stats.mean_s) == (6.0, 44 / 7)  # lengths 10, 10, 10, 4, 2, 2, 6


def test_dominant_period_of_known_cycles():
    t = np.arange(0, 96, 0.25)
    for period in (12.0, 24.0, 30.0):
        series = pd.DataFrame({"time_h": t, "fraction": np.sin(2 * np.pi * t / period) + 0.002 * t})
        assert abs(dominant_period_h(series) - period) < 0.5


def test_plot_online_writes_png_and_pdf(tiny, tmp_path):
    paths = plot_online(tiny, tmp_path / "fig", step_s=1.0)
    assert [p.name for p in paths] == ["online_clients.png", "online_clients.pdf"]
    assert all(p.stat().st_size > 1000 for p in paths)


# ------------------------------------------------------------------------------------------- command line


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dropsim")
    add_trace_parser(parser.add_subparsers(dest="command", required=True))
    return cmd_trace(parser.parse_args(argv))


def test_cli_synth_then_stats_with_plot(tmp_path, capsys):
    out = tmp_path / "syn.csv"
    assert run(["trace", "synth", "--clients", "200", "--days", "1", "--seed", "4", "--out", str(out)]) == 0
    assert_same(load_trace(out), synthesize(200, 1, 4))
    assert run(["trace", "stats", str(out), "--plot", str(tmp_path / "fig"), "--step-minutes", "30"]) == 0
    printed = capsys.readouterr().out
    assert "session median (min)" in printed and "online min %" in printed
    assert (tmp_path / "fig" / "online_clients.pdf").exists()


def test_cli_import_fedscale(tmp_path, capsys):
    behave = pickled(tmp_path / "client_behave_trace", BEHAVE)
    capacity = pickled(tmp_path / "client_device_capacity", CAPACITY)
    out = tmp_path / "fs.csv"
    assert run(["trace", "import-fedscale", str(behave), "--capacity", str(capacity), "--out", str(out)]) == 0
    assert "touching merged" in capsys.readouterr().out
    assert_same(load_trace(out), import_fedscale(behave, capacity))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["trace", "synth", "--clients", "0", "--days", "1", "--out", "x.csv"], "--clients 0"),
        (["trace", "synth", "--clients", "5", "--days", "-1", "--out", "x.csv"], "--days -1"),
        (["trace", "stats", "nowhere.csv"], "no such trace file"),
        (["trace", "stats", "nowhere.csv", "--step-minutes", "0"], "--step-minutes 0"),
    ],
)
def test_cli_bad_input_raises_input_error(tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=words):
        run(argv)


# ----------------------------------------------------------------------------------------------- select


def test_select_keeps_the_most_available_clients_renumbered(tiny):
    from sim.traces.select import online_seconds, select_clients

    # span 30 s: 0 is online 20 s, 2 10 s, 3 4 s (once: the span holds one pass), 5 4 s, 7 6 s
    assert list(online_seconds(tiny)) == [20.0, 10.0, 4.0, 4.0, 6.0]
    picked = select_clients(tiny, 3)
    assert list(picked.clients) == [0, 1, 2]  # originals 0, 2 and 7, in id order
    assert list(picked.offsets) == [0, 2, 3, 4]
    assert list(picked.starts) == [0.0, 20.0, 5.0, 0.0] and list(picked.ends) == [10.0, 30.0, 15.0, 6.0]
    assert np.isnan(picked.periods[0]) and picked.periods[2] == 6.0
    assert picked.bandwidth_kbps is not None and picked.bandwidth_kbps[2] == 800
    # ties (3 and 5 have 4 s each) go to the lower id; by sessions 0 and 5 have two each
    assert list(select_clients(tiny, 4).starts[4:]) == [0.0]  # original 3's single interval
    assert list(select_clients(tiny, 2, by="sessions").ends) == [10.0, 30.0, 2.0, 10.0]


def test_trace_select_writes_a_trace_that_loads(tmp_path, capsys):
    out = tmp_path / "top.csv"
    assert run(["trace", "select", str(write(tmp_path / "t.csv", TINY)), "--clients", "2", "--out", str(out)]) == 0
    top = load_trace(out)
    assert list(top.clients) == [0, 1] and top.intervals == 3
    assert "the 2 clients of t.csv with the most time online" in out.read_text()
    with pytest.raises(InputError, match="--clients 9: .* has 5 clients"):
        run(["trace", "select", str(tmp_path / "t.csv"), "--clients", "9", "--out", str(out)])


def test_the_shipped_selection_is_what_the_command_makes(tmp_path):
    """traces/available_100.csv is `dropsim trace select traces/synthetic_small.csv --clients 100`."""
    from sim.traces.select import select_clients

    shipped = load_trace(ROOT / "traces" / "available_100.csv")
    made = select_clients(load_trace(ROOT / "traces" / "synthetic_small.csv"), 100)
    for field in ("clients", "offsets", "starts", "ends"):
        assert np.array_equal(getattr(shipped, field), getattr(made, field))
