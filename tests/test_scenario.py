"""Scenario files: every wrong key, value and type is reported with file:line, key path, value and what
is allowed; overrides and sweeps expand as documented; defaults are resolved."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.scenario import ScenarioError, load
from sim.scenario.grid import parse_override, run_label
from sim.scenario.reader import as_number, shown
from sim.scenario.source import MAX_NUMBER_CHARS, load_yaml

ROOT = Path(__file__).resolve().parent.parent

BASE = """\
name: t
seed: 3
rounds: 2
population: 20
sampling: {clients_per_round: 5}
dropout: {rate: 0.2, stage: before_upload}
data: {dataset: digits, partition: iid}
fidelity: timing
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load(write(tmp_path, text), overrides).points()
    return [str(p) for p in info.value.problems]


def test_valid_file_resolves_every_default(tmp_path):
    scenario = load(write(tmp_path, BASE)).base()
    assert scenario.name == "t" and scenario.seed == 3 and scenario.rounds == 2
    assert scenario.sampling.clients_per_round == 5 and scenario.sampling.rate is None
    assert scenario.clients.compute.zipf_a == 1.2
    assert (scenario.clients.compute.fastest, scenario.clients.compute.slowest) == (1.0, 3.0)
    assert (scenario.clients.bandwidth.low_mbps, scenario.clients.bandwidth.high_mbps) == (21, 210)
    assert scenario.training.local_epochs == 1 and scenario.training.threads == 1
    assert scenario.output == "results/t"
    resolved = scenario.resolved
    assert resolved["server"] == {"bandwidth_mbps": 1000.0, "speed": 1.0, "latency_ms": 0.0}
    assert resolved["clients"]["bandwidth_mbps"] == {"zipf_a": 1.2, "range": [21.0, 210.0], "ranks": None}
    assert resolved["dropout"]["mode"] == "fixed"
    assert resolved["data"]["partition"] == "iid"


def test_misspelt_key_names_line_path_and_closest_key(tmp_path):
    text = BASE.replace("dropout: {rate: 0.2, stage: before_upload}", "dropout:\n  rat: 0.2")
    (message,) = problems(tmp_path, text)
    assert message.startswith(f"{tmp_path / 's.yaml'}:7: dropout.rat: is not a known key")
    assert "did you mean 'dropout.rate'?" in message
    assert "allowed keys here: high, high_fraction, low, mode, model, rate, silent, stage" in message


def test_misspelt_top_level_key(tmp_path):
    (message,) = problems(tmp_path, BASE + "rounds_: 3\n")
    assert ":9: rounds_: is not a known key; did you mean 'rounds'?" in message


def test_value_out_of_range_says_what_is_allowed(tmp_path):
    (message,) = problems(tmp_path, BASE.replace("rate: 0.2", "rate: 1.5"))
    assert message.endswith(":6: dropout.rate: is 1.5, out of range; allowed: a number in [0, 1]")


def test_wrong_types(tmp_path):
    found = problems(
        tmp_path,
        BASE.replace("rounds: 2", "rounds: two").replace("seed: 3", "seed: 1.5") + "server: {speed: true}\n",
    )
    assert any("rounds: is 'two'; a whole number >= 1 is expected" in m for m in found)
    assert any("seed: is 1.5; a whole number in [0, 9223372036854775807] is expected" in m for m in found)
    assert any("server.speed: is True; a number > 0 is expected" in m for m in found)
    assert len(found) == 3


def test_choice_suggests_closest_value(tmp_path):
    (message,) = problems(tmp_path, BASE.replace("stage: before_upload", "stage: before_uplod"))
    assert "dropout.stage: is 'before_uplod'; allowed: after_sampling | before_upload; did you mean" in message


def test_missing_required_keys(tmp_path):
    found = problems(tmp_path, "name: x\n")
    assert any(m.endswith("rounds: is required") for m in found)
    assert any(m.endswith("population: is required") for m in found)


def test_sampling_needs_exactly_one_form(tmp_path):
    (message,) = problems(tmp_path, BASE.replace("{clients_per_round: 5}", "{clients_per_round: 5, rate: 0.1}"))
    assert "sampling.rate: cannot be given with clients_per_round" in message
    (message,) = problems(tmp_path, BASE.replace("{clients_per_round: 5}", "{clients_per_round: 50}"))
    assert "sampling.clients_per_round: is 50, more than the population (20)" in message


def test_interval_must_be_ordered_pair(tmp_path):
    text = BASE + "clients:\n  compute: {slowdown: [3, 1]}\n"
    (message,) = problems(tmp_path, text)
    assert "clients.compute.slowdown: is [3, 1]; a pair [low, high] of numbers > 0 with low <= high" in message


def test_partition_forms(tmp_path):
    ok = load(write(tmp_path, BASE.replace("partition: iid", "partition: {dirichlet: 0.5}"))).base()
    assert ok.data.partition.kind == "dirichlet" and ok.data.partition.alpha == 0.5
    assert ok.resolved["data"]["partition"] == {"dirichlet": 0.5}
    (message,) = problems(tmp_path, BASE.replace("partition: iid", "partition: {dirichlet: -1}"))
    assert "data.partition: is {'dirichlet': -1}; allowed: iid, natural, or {dirichlet: ALPHA}" in message
    (message,) = problems(tmp_path, BASE.replace("partition: iid", "partition: natural"))
    assert "natural', which needs writer ids: only femnist has them" in message


def test_file_datasets_need_a_path(tmp_path):
    (message,) = problems(tmp_path, BASE.replace("dataset: digits", "dataset: femnist"))
    assert "data.path: is required for dataset femnist" in message
    (message,) = problems(tmp_path, BASE.replace("dataset: digits", "dataset: digits, path: /x"))
    assert "data.path: is not used by dataset 'digits'" in message


def test_per_client_keys_only_with_per_client_mode(tmp_path):
    (message,) = problems(tmp_path, BASE.replace("rate: 0.2,", "rate: 0.2, high: 0.9,"))
    assert "dropout.high: only applies to mode per_client, not 'fixed'" in message
    ok = load(write(tmp_path, BASE.replace("rate: 0.2,", "mode: per_client, low: [0, 0.2],"))).base()
    assert ok.dropout.mode == "per_client"
    assert ok.dropout.options == {"high": 0.99, "high_fraction": 0.5, "low": (0.0, 0.2)}
    assert not hasattr(ok.dropout, "high")  # a mode's keys are read from options, by key


def test_timeouts_are_keyed_by_protocol_step(tmp_path):
    ok = load(write(tmp_path, BASE + "timeouts: {upload: 30}\n")).base()
    assert ok.timeouts == {"upload": 30.0}
    (message,) = problems(tmp_path, BASE + "timeouts: {uplaod: 30}\n")
    assert "timeouts.uplaod: is not a known key; did you mean 'timeouts.upload'?" in message


def test_silent_dropout_needs_a_timeout(tmp_path):
    (message,) = problems(tmp_path, BASE.replace("rate: 0.2,", "rate: 0.2, silent: true,"))
    assert "dropout.silent: is true: clients leaving silently at before_upload are missed in step upload" in message
    assert message.endswith("set timeouts.upload")


def test_yaml_errors_and_duplicates_name_the_line(tmp_path):
    (message,) = problems(tmp_path, BASE + "model: {name: cnn\n")
    assert "s.yaml:" in message and "is not valid YAML" in message
    (message,) = problems(tmp_path, BASE + "seed: 4\n")
    assert message.endswith(":9: seed: is given twice (first on line 2); keep one")


def test_top_level_must_be_a_mapping(tmp_path):
    (message,) = problems(tmp_path, "- 1\n- 2\n")
    assert "must be a mapping of keys to values, not a list" in message


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="cannot be read"):
        load(tmp_path / "nope.yaml")


def test_overrides_and_output(tmp_path):
    path = write(tmp_path, BASE)
    scenario = load(path, ["dropout.rate=0.4", "training.lr=0.5", "sampling={rate: 0.25}"], output="o").base()
    assert scenario.dropout.rate == 0.4 and scenario.training.lr == 0.5
    assert scenario.sampling.rate == 0.25 and scenario.sampling.clients_per_round is None
    assert scenario.output == "o"
    with pytest.raises(ScenarioError) as info:
        load(path, ["dropout.rate=2"]).base()
    assert str(info.value) == "--set dropout.rate=2: dropout.rate: is 2, out of range; allowed: a number in [0, 1]"
    with pytest.raises(ScenarioError, match="must be written KEY.PATH=VALUE"):
        load(path, ["dropout.rate"])
    with pytest.raises(ScenarioError, match="is 0.2, not a mapping"):
        load(path, ["dropout.rate.x=1"])


def test_overrides_of_new_keys_name_the_option(tmp_path):
    path = write(tmp_path, BASE)
    for override, key in [("dropout.foo.bar=1", "dropout.foo"), ("foo.bar=1", "foo"), ("timeouts.upload.x=1", "")]:
        with pytest.raises(ScenarioError) as info:
            load(path, [override]).base()
        text = str(info.value)
        assert f"--set {override}" in text, text
        if key:
            assert f": {key}: is not a known key" in text
    with pytest.raises(ScenarioError, match="has no value; write KEY.PATH=VALUE"):
        load(path, ["dropout.rate="])


def test_parse_override_keeps_sweep_keys_whole():
    assert parse_override("sweep.dropout.rate=[0, 0.5]") == (("sweep", "dropout.rate"), [0, 0.5])
    assert parse_override("a.b=null") == (("a", "b"), None)


def test_sweep_is_the_product_in_written_order(tmp_path):
    grid = load(write(tmp_path, BASE + "sweep: {dropout.rate: [0, 0.5], seed: [1, 2, 3]}\n"))
    points = grid.points()
    assert grid.size == 6
    assert [(p.dropout.rate, p.seed) for p in points] == [(0, 1), (0, 2), (0, 3), (0.5, 1), (0.5, 2), (0.5, 3)]
    assert [p.run_id for p in points][:2] == ["dropout.rate=0_seed=1", "dropout.rate=0_seed=2"]
    assert points[3].swept == {"dropout.rate": 0.5, "seed": 1}
    assert grid.base().run_id == "t" and grid.base().swept == {}


def test_sweep_of_mappings_gets_safe_names(tmp_path):
    grid = load(write(tmp_path, BASE + "sweep: {sampling: [{rate: 0.1}, {clients_per_round: 4}]}\n"))
    assert [p.run_id for p in grid.points()] == ["sampling=-rate-0.1-", "sampling=-clients_per_round-4-"]
    assert run_label({"a": "x y/z"}) == "a=x-y-z"


def test_sweep_errors_name_the_point(tmp_path):
    found = problems(tmp_path, BASE + "sweep: {dropout.rate: [0.1, 3], training.lrr: [1]}\n")
    assert any("(sweep dropout.rate=3_training.lrr=1): dropout.rate: is 3, out of range" in m for m in found)
    assert any("training.lrr: is not a known key; did you mean 'training.lr'?" in m for m in found)
    found = problems(tmp_path, BASE + "sweep: {output: [a, b]}\n")
    assert any("sweep.output: cannot be swept" in m for m in found)
    found = problems(tmp_path, BASE + "sweep: {seed: 3}\n")
    assert any("sweep.seed: is 3; a non-empty list of values is expected" in m for m in found)


def test_a_sweep_of_aliased_lists_is_refused_by_its_size_before_any_point_is_made(tmp_path):
    """Eight aliases of one list of 20 values ask for 20^8 = 2.56e10 points from a few lines: refused by the
    product of the lists' lengths, before any point is built (the bound: :data:`sim.scenario.grid.MAX_POINTS`)."""
    from sim.scenario.grid import MAX_POINTS

    values = "&v [" + ", ".join(str(i) for i in range(20)) + "]"
    keys = ["seed", "rounds", "population", "dropout.rate", "training.lr", "training.batch_size", "a.b", "c.d"]
    sweep = "sweep:\n" + "\n".join(f"  {k}: {values if i == 0 else '*v'}" for i, k in enumerate(keys))
    found = problems(tmp_path, BASE + sweep + "\n")
    line = BASE.count("\n") + 1
    assert found == [
        f"{tmp_path / 's.yaml'}:{line}: sweep: has more than {MAX_POINTS} points; split it into several files"
    ]


def test_overrides_are_read_by_the_bounded_yaml_loader():
    assert parse_override("name=1:30") == (("name",), "1:30")  # base-60 is text, as in a file
    with pytest.raises(ScenarioError, match=r"^--set rounds=9{70}\.\.\.: rounds: value '9{76}\.\.\. holds an integer"):
        parse_override("rounds=" + "9" * 5000)
    with pytest.raises(ScenarioError, match=r"dropout\.rate: value '\[0\.1' is not valid YAML"):
        parse_override("dropout.rate=[0.1")


def test_a_sweep_key_or_value_too_long_to_show_is_shown_cut_short(tmp_path):
    found = problems(tmp_path, BASE + f"sweep: {{seed: {'7' * 1000}}}\n")
    assert any("sweep.seed: is 7777" in m and "...; a non-empty list of values is expected" in m for m in found)


def test_shipped_quickstart_is_valid():
    scenario = load(Path(__file__).parent.parent / "scenarios" / "quickstart.yaml").base()
    assert scenario.name == "quickstart" and scenario.fidelity == "full"


def test_data_keys_belong_to_their_data_set(tmp_path):
    (message,) = problems(tmp_path, BASE.replace("dataset: digits,", "dataset: digits, samples_per_client: 5,"))
    assert "data.samples_per_client: is not used by dataset 'digits' (only by synthetic)" in message
    ok = load(write(tmp_path, BASE.replace("dataset: digits,", "dataset: synthetic, samples_per_client: 5,"))).base()
    assert ok.data.samples_per_client == 5 and "test_fraction" not in ok.resolved["data"]


def test_numbers_are_bounded_before_they_are_converted(tmp_path: Path) -> None:
    """A 5000-digit seed, and the 200,000 hexadecimal digits of ``rounds: 0x...``, are refused by the loader
    before conversion, naming file and line, whatever the interpreter's digit limit (lifted here). Before the
    fix the first was Python's own ValueError without a line (and with the limit lifted, a quadratic
    conversion); the second was read, and ``dropsim check`` printed the rounds: a traceback."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        for text, line, characters in (
            ("seed: " + "9" * 5000 + "\nrounds: 1\npopulation: 10\n", 1, 5000),
            ("name: x\nrounds: 0x" + "f" * 200_000 + "\npopulation: 10\n", 2, 200_002),
            ("a: !!float " + "1" * 2000 + ".5\n", 1, 2002),
        ):
            with pytest.raises(ScenarioError) as info:
                load(write(tmp_path, text))
            assert str(info.value) == (
                f"{tmp_path / 's.yaml'}:{line}: (file): holds {'a float' if 'float' in text else 'an integer'} of "
                f"{characters} characters; a number may have at most {MAX_NUMBER_CHARS}"
            )
    finally:
        sys.set_int_max_str_digits(limit)


def test_whole_numbers_are_64_bit_and_huge_ones_are_named_not_raised(tmp_path: Path) -> None:
    """A key without a bound of its own takes at most 2^63 - 1; a number beyond any float, or a list holding
    one beyond ``repr``, is shown in its message, not raised."""
    text = f"rounds: 0x{'f' * 900}\npopulation: {2**63}\nclients: {{compute: {{zipf_a: 0x{'f' * 998}}}}}\n"
    text += "data: {dataset: digits, partition: {dirichlet: 0x" + "f" * 998 + "}}\n"
    found = problems(tmp_path, text)
    assert any(f":1: rounds: is {str(16**900 - 1)[:60]}" in m for m in found)
    assert any(m.endswith("out of range; allowed: a whole number >= 1, at most 2^63 - 1 (64 bits)") for m in found)
    assert any(f"population: is {2**63}, out of range; allowed: a whole number in [1, {2**62}]" in m for m in found)
    assert any(":3: clients.compute.zipf_a: is 5149234739" in m and "a number >= 0 is expected" in m for m in found)
    assert any(":4: data.partition: is {'dirichlet': 5149234739" in m and "allowed: iid, natural" in m for m in found)
    assert shown(1 << 20_000) == "an integer of 6021 digits"
    assert shown({"a": [1 << 20_000]}) == "{'a': [an integer of 6021 digits]}"


def test_base_60_numbers_are_text(tmp_path: Path) -> None:
    """YAML 1.1's ``1:30`` (90) is read as the text it looks like; a tag asking for it as a number is refused.
    Before, 160,000 groups of ``:1`` took seconds to convert (quadratic: each group multiplies the value)."""
    (message,) = problems(tmp_path, BASE.replace("rounds: 2", "rounds: 1:30"))
    assert message.endswith(":3: rounds: is '1:30'; a whole number >= 1 is expected")
    for tag in ("!!int", "!!float"):
        with pytest.raises(ScenarioError) as info:
            load(write(tmp_path, f"name: x\nrounds: {tag} 1:30\n"))
        assert str(info.value).endswith(
            ":2: (file): holds the base-60 number '1:30', which is not read; write it in base 10"
        )
    assert load_yaml("a: 1:30\nb: 1:30.5\nc: 0x1F\nd: 010\ne: 1_000\nf: 0b11\ng: yes\n", "t") == {
        "a": "1:30",
        "b": "1:30.5",
        "c": 31,
        "d": 8,
        "e": 1000,
        "f": 3,
        "g": True,
    }


def test_numbers_written_as_text_are_read_in_linear_time(tmp_path: Path) -> None:
    """``rounds: '111...1x'``: the former pattern tried every split of the digits between two of its runs, so a
    failed match was quadratic (50,000 digits: most of a minute; tests/test_fuzz_files.py counts CPU time). Text
    is now matched only up to MAX_NUMBER_CHARS characters, by a pattern with one way to match."""
    (message,) = problems(tmp_path, BASE.replace("rounds: 2", f"rounds: '{'1' * 50_000}x'"))
    assert message.endswith("rounds: is '" + "1" * 76 + "...; a whole number >= 1 is expected")
    assert as_number("1" * 900 + ".5e3") == float("1" * 900 + ".5e3")
    assert as_number("1" * (MAX_NUMBER_CHARS + 1)) is None
    assert [as_number(t) for t in ("1.", ".5", "-2e3", "+1.5E-2", "1e", ".", "1.2.3")] == [
        1.0,
        0.5,
        -2000.0,
        0.015,
        None,
        None,
        None,
    ]


def _shipped_yaml() -> list[tuple[str, str]]:
    """Every YAML text the project ships: scenarios/**, and the yaml blocks of README.md, docs/ and traces/."""
    texts = [
        (str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in sorted(ROOT.glob("scenarios/**/*.y*ml"))
    ]
    for page in [ROOT / "README.md", *sorted(ROOT.glob("docs/**/*.md")), *sorted(ROOT.glob("traces/**/*.md"))]:
        blocks = re.findall(r"^```ya?ml\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        texts += [(f"{page.relative_to(ROOT)} block {i}", block) for i, block in enumerate(blocks)]
    return texts


def _typed(value: Any) -> Any:
    """``value`` with every scalar paired with its type: ``1 == 1.0 == True``, but the loaders must agree."""
    if isinstance(value, dict):
        return {_typed(k): _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def test_every_shipped_yaml_reads_as_the_safe_loader_reads_it() -> None:
    """The bounded loader drops only base-60 numbers and numbers over MAX_NUMBER_CHARS: every scenario and
    YAML example the project ships is the same data, type for type, through both."""
    texts = _shipped_yaml()
    assert len(texts) > 25
    for name, text in texts:
        assert _typed(load_yaml(text, name)) == _typed(yaml.safe_load(text)), name


def test_whole_numbers_beyond_2_53_are_read_exactly(tmp_path: Path) -> None:
    """Integers as written are compared and kept exactly (not through a float, which rounds past 2^53)."""
    path = tmp_path / "big.yaml"
    path.write_text(f"rounds: 1\npopulation: {2**62}\nseed: {2**63 - 1}\n")
    scenario = load(path).base()
    assert (scenario.population, scenario.seed) == (2**62, 2**63 - 1)
    path.write_text(f"rounds: 1\npopulation: {2**62 + 1}\n")
    with pytest.raises(ScenarioError, match=rf"big.yaml:2: population: is {2**62 + 1}, out of range"):
        load(path).base()
