"""Plug-ins named by import path or by entry point (sim.plugins): what they resolve to, where they came from,
and the errors that name the path and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.plugins import PluginError, PluginRef, is_import_path, resolve

MODULE = """
def build(width=4):
    return ("built", width)


class Holder:
    factory = staticmethod(build)
"""


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module ``plugmod`` on sys.path, installed as distribution ``myplug`` 1.2 with an entry point
    ``my-model`` in ``dropsim.models``; and a module that fails on import."""
    (tmp_path / "plugmod.py").write_text(MODULE)
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('no GPU here')\n")
    (tmp_path / "typo_plugin.py").write_text("import sim.nothing_here\n")
    info = tmp_path / "myplug-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text("[dropsim.models]\nmy-model = plugmod:build\n")
    (info / "top_level.txt").write_text("plugmod\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_import_path_resolves_to_its_object_and_its_distribution(plugin_dir):
    build, ref = resolve("model", "plugmod:build", "s.yaml:3: model.factory")
    assert build(2) == ("built", 2)
    assert ref == PluginRef("model", "plugmod:build", "plugmod:build", "myplug", "1.2")
    assert ref.record()["version"] == "1.2"
    factory, _ = resolve("model", "plugmod:Holder.factory", "here")
    assert factory() == ("built", 4)
    assert is_import_path("a.b:c") and not is_import_path("my-model")


def test_an_installed_entry_point_is_a_name_a_scenario_can_use(plugin_dir):
    build, ref = resolve("model", "my-model", "s.yaml:3: model.name")
    assert build() == ("built", 4)
    assert (ref.name, ref.path, ref.distribution, ref.version) == ("my-model", "plugmod:build", "myplug", "1.2")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nosuchpkg.models:build", r"cannot import 'nosuchpkg.models:build': no module named 'nosuchpkg'"),
        (
            "broken_plugin:build",
            r"importing broken_plugin raised RuntimeError: no GPU here \(at .*broken_plugin.py:1\)",
        ),
        ("typo_plugin:build", r"importing typo_plugin raised ModuleNotFoundError: No module named 'sim.nothing_here'"),
        ("plugmod:biuld", r"plugmod has no attribute 'biuld'; did you mean 'build'\?"),
        ("plugmod:nothing", r"plugmod has no attribute 'nothing'"),
        ("plugmod:Holder.missing", r"plugmod.Holder has no attribute 'missing'"),
        ("plugmod:", r"is not an import path"),
        ("plug mod:build", r"is not an import path"),
        ("other-model", r"'other-model' is neither an import path .* dropsim.models \(installed: my-model\)"),
    ],
)
def test_a_plugin_that_cannot_be_imported_says_which_and_why(plugin_dir, name, message):
    with pytest.raises(PluginError, match=r"^s\.yaml:7: model\.factory: .*" + message):
        resolve("model", name, "s.yaml:7: model.factory")


def test_a_module_outside_any_distribution_has_no_version(tmp_path, monkeypatch):
    (tmp_path / "loose_plugin.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _, ref = resolve("dataset", "loose_plugin:f", "here")
    assert (ref.distribution, ref.version) == (None, None)
    with pytest.raises(ValueError, match="unknown kind"):
        resolve("widget", "loose_plugin:f", "here")


def test_call_passes_args_and_only_the_offered_values_a_plugin_names():
    from sim.plugins import call

    def loader(population, samples=3):
        return (population, samples)

    def greedy(**kwargs):
        return kwargs

    assert call(loader, {"samples": 5}, {"population": 7, "seed": 1}, "m:loader", "here") == (7, 5)
    assert call(loader, {"population": 2}, {"population": 7}, "m:loader", "here") == (2, 3)  # args win
    assert call(greedy, {"a": 1}, {"seed": 1}, "m:greedy", "here") == {"a": 1}  # **kwargs is not asked for seed
    with pytest.raises(PluginError, match=r"^here: m:loader\(population, samples=3\) cannot take args \{'size': 1\}"):
        call(loader, {"size": 1}, {"population": 7}, "m:loader", "here")
    with pytest.raises(PluginError, match=r"^here: m:boom raised ZeroDivisionError: division by zero"):
        call(lambda: 1 / 0, {}, {}, "m:boom", "here")
    with pytest.raises(PluginError, match="is a int, not a function or class to call"):
        call(3, {}, {}, "m:three", "here")


def test_a_module_in_the_working_directory_is_found_after_everything_installed(tmp_path, monkeypatch):
    import sys

    (tmp_path / "cwd_only_plugin.py").write_text("def f():\n    return 'here'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    from sim.plugins import _RESOLVED

    try:
        f, ref = resolve("model", "cwd_only_plugin:f", "here")
        assert f() == "here" and ref.path == "cwd_only_plugin:f"
        assert sys.path[-1] == str(tmp_path)  # appended: installed modules of the same name win
    finally:
        _RESOLVED.pop(("model", "cwd_only_plugin:f"), None)
        sys.modules.pop("cwd_only_plugin", None)
