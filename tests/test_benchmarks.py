"""The benchmark scripts run and measure what they say (no timing assertions: times are not tested)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import overhead  # noqa: E402
import scale  # noqa: E402
import skellam  # noqa: E402

from sim.crypto import agreement  # noqa: E402


@pytest.mark.slow
def test_overhead_replays_every_primitive_of_a_private_secagg_round() -> None:
    original = agreement.generate
    row = overhead.measure(
        ROOT / "scenarios" / "privacy.yaml",
        ["population=12", "sampling.clients_per_round=4", "dropout.rate=0.25"],
        rounds=1,
        label="tiny",
        repeats=1,
    )
    assert agreement.generate is original  # the recording is taken off again
    assert (row["protocol"], row["privacy"], row["clients"], row["rounds"]) == ("secagg", "xnoise", 4, 1)
    # the round's work, as recorded: key agreement, masks, Shamir, noise, encoding, frames and training
    for name in (
        "x25519.keygen",
        "x25519.agree",
        "aead.seal",
        "shamir.share",
        "prg.expand",
        "noise",
        "encode.dskellam",
        "decode.dskellam",
        "vector.add",
        "wire.encode",
        "wire.decode",
        "training",
    ):
        assert float(row[f"{name}_s"]) > 0, name
    names = {name for _, _, name in overhead.PRIMITIVES}
    assert float(row["primitives_s"]) == pytest.approx(sum(float(row[f"{n}_s"]) for n in names if f"{n}_s" in row))
    assert int(row["calls"]) > 0


@pytest.mark.slow
def test_scale_counts_events_and_memory_in_a_fresh_process() -> None:
    result = scale.measure(population=5_000, sampled=20, rounds=1)
    assert (result["population"], result["sampled"], result["rounds"]) == (5_000, 20, 1)
    assert result["events_per_round"] > 20  # every client's messages are events
    assert result["virtual_s_per_round"] > 0
    assert result["peak_rss_mb"] > 0


def test_skellam_benchmark_times_ours_and_both_references() -> None:
    table = skellam.run([3.0, 1e6], [1_000], repeats=1)
    assert table[["variance", "values"]].values.tolist() == [[3.0, 1_000], [1e6, 1_000]]
    for column in ("ours_ns_per_value", "ours_ns_per_draw", "numpy_ns_per_draw", "torch_ns_per_draw"):
        assert (table[column] > 0).all(), column


def test_the_doc_blocks_are_rewritten_in_place(tmp_path: Path) -> None:
    import pandas as pd
    import performance

    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- performance:scale:begin -->\nold\n<!-- performance:scale:end -->\nafter\n")
    table = performance.markdown(pd.DataFrame({"sampled": [100], "rounds_per_s": [6.7278]}))
    assert table == "| sampled | rounds_per_s |\n| --- | --- |\n| 100 | 6.728 |"
    performance.rewrite_doc(doc, {"scale": table})
    block = f"<!-- performance:scale:begin -->\n{table}\n<!-- performance:scale:end -->"
    assert doc.read_text() == f"intro\n{block}\nafter\n"
    with pytest.raises(SystemExit, match="peer"):
        performance.rewrite_doc(doc, {"peer": table})
