"""Tests for sim.learning.datasets, on tiny files written in the real formats.

The restricted unpickler the CIFAR-10 python batches go through is tested in test_safepickle.py."""

from __future__ import annotations

import functools
import json
import os
import pickle
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_safepickle import _CallOnLoad

from sim.learning.datasets import DataError, Dataset, load_cifar10, load_digits, load_femnist
from sim.safepickle import UnsafePickleError

# ------------------------------------------------------------------------------------------- helpers


def _leaf_user_rows(rng: np.random.Generator, n: int) -> list[list[float]]:
    """``n`` FEMNIST rows of 784 floats in [0, 1], with exact 0.0 and 1.0 at the ends."""
    rows = rng.random((n, 784)).round(4)
    rows[:, 0] = 0.0
    rows[:, -1] = 1.0
    return rows.tolist()


def _write_leaf(file: Path, users: list[str], data: dict[str, tuple[list[list[float]], list[int]]]) -> None:
    """Write one LEAF JSON file holding ``users`` in that order."""
    doc = {
        "users": users,
        "num_samples": [len(data[u][1]) for u in users],
        "user_data": {u: {"x": data[u][0], "y": data[u][1]} for u in users},
    }
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(doc), encoding="utf-8")


@pytest.fixture
def femnist_dir(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A LEAF folder: train/0.json (users ub, ua), train/1.json (users uc, ua), test/t.json (user ua)."""
    rng = np.random.default_rng(0)
    blocks = {
        "0:ub": (_leaf_user_rows(rng, 2), [0, 61]),
        "0:ua": (_leaf_user_rows(rng, 1), [5]),
        "1:uc": (_leaf_user_rows(rng, 3), [10, 11, 12]),
        "1:ua": (_leaf_user_rows(rng, 1), [6]),
        "t:ua": (_leaf_user_rows(rng, 2), [1, 2]),
    }
    root = tmp_path / "femnist"
    # Written in reverse name order to check that files are read sorted by name.
    _write_leaf(root / "train" / "1.json", ["uc", "ua"], {"uc": blocks["1:uc"], "ua": blocks["1:ua"]})
    _write_leaf(root / "train" / "0.json", ["ub", "ua"], {"ub": blocks["0:ub"], "ua": blocks["0:ua"]})
    _write_leaf(root / "test" / "t.json", ["ua"], {"ua": blocks["t:ua"]})
    return root, blocks


def _cifar_batch(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, list[int]]:
    """A random CIFAR-10 batch: uint8 data ``(rows, 3072)`` and labels 0..9."""
    data = rng.integers(0, 256, size=(rows, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, size=rows).tolist()
    return data, labels


_CIFAR_NAMES = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]


def _write_cifar_python(folder: Path, batches: list[tuple[np.ndarray, list[int]]], protocol: int = 2) -> None:
    """Write the six python batches (five train, then test) as pickled dicts with bytes keys."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, (data, labels) in zip(_CIFAR_NAMES, batches, strict=True):
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))


def _write_cifar_binary(folder: Path, batches: list[tuple[np.ndarray, list[int]]]) -> None:
    """Write the six binary batches: records of 1 label byte + 3072 pixel bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, (data, labels) in zip(_CIFAR_NAMES, batches, strict=True):
        records = np.concatenate([np.asarray(labels, dtype=np.uint8)[:, None], data], axis=1)
        (folder / f"{name}.bin").write_bytes(records.tobytes())


def _expected_cifar(batches: list[tuple[np.ndarray, list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """Expected train images ``(N, 3, 32, 32)`` built pixel by pixel from the channel-major rows."""
    data = np.concatenate([d for d, _ in batches[:5]])
    images = np.empty((data.shape[0], 3, 32, 32), dtype=np.float32)
    for c in range(3):
        for r in range(32):
            images[:, c, r, :] = data[:, c * 1024 + r * 32 : c * 1024 + r * 32 + 32]
    return images / np.float32(255), np.concatenate([np.asarray(y, dtype=np.int64) for _, y in batches[:5]])


# ------------------------------------------------------------------------------------------- FEMNIST


def test_femnist_loads_exact_values(femnist_dir: tuple[Path, dict[str, Any]]) -> None:
    root, blocks = femnist_dir
    ds = load_femnist(root)
    order = ["0:ub", "0:ua", "1:uc", "1:ua"]
    rows = [row for key in order for row in blocks[key][0]]
    labels = [y for key in order for y in blocks[key][1]]
    assert ds.name == "femnist"
    assert ds.num_classes == 62
    assert ds.input_shape == (1, 28, 28)
    assert ds.x_train.shape == (7, 1, 28, 28)
    assert ds.x_train.dtype == np.float32
    np.testing.assert_array_equal(ds.x_train.reshape(7, 784), np.asarray(rows, dtype=np.float32))
    assert ds.x_train[0, 0, 3, 5] == np.float32(rows[0][3 * 28 + 5])  # row-major 28x28
    assert ds.y_train.dtype == np.int64
    assert ds.y_train.tolist() == labels
    assert ds.writers is not None
    assert ds.writers.dtype == np.int64
    assert ds.writers.tolist() == [0, 0, 1, 2, 2, 2, 1]  # ub=0, ua=1, uc=2 by first appearance
    np.testing.assert_array_equal(ds.x_test.reshape(2, 784), np.asarray(blocks["t:ua"][0], dtype=np.float32))
    assert ds.y_test.tolist() == [1, 2]


def _edit_leaf(file: Path, edit: Any) -> None:
    """Load a LEAF file, apply ``edit(doc)`` and write it back."""
    doc = json.loads(file.read_text(encoding="utf-8"))
    edit(doc)
    file.write_text(json.dumps(doc), encoding="utf-8")


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (lambda d: d.pop("num_samples"), ["'num_samples'"]),
        (lambda d: d.pop("user_data"), ["'user_data'"]),
        (lambda d: d["user_data"]["ua"]["x"][0].pop(), ["'ua'", "row 0", "784", "783"]),
        (lambda d: d["user_data"]["ub"]["y"].append(3), ["'ub'", "2 rows", "3 labels"]),
        (lambda d: d["num_samples"].__setitem__(0, 5), ["'ub'", "num_samples"]),
        (lambda d: d["user_data"]["ub"]["y"].__setitem__(1, 62), ["'ub'", "62", "0..61"]),
        (lambda d: d["user_data"]["ub"]["y"].__setitem__(1, -1), ["'ub'", "-1"]),
        (lambda d: d["user_data"]["ub"]["x"][1].__setitem__(7, 1.5), ["'ub'", "row 1 pixel 7", "[0, 1]"]),
        (lambda d: d["user_data"].pop("ua"), ["'ua'", "missing from 'user_data'"]),
        (lambda d: d["users"].append("zz"), ["'users'", "'num_samples'"]),
    ],
)
def test_femnist_invalid_file_names_file_and_problem(
    femnist_dir: tuple[Path, dict[str, Any]], edit: Any, fragments: list[str]
) -> None:
    root, _ = femnist_dir
    bad = root / "train" / "0.json"
    _edit_leaf(bad, edit)
    with pytest.raises(DataError) as info:
        load_femnist(root)
    message = str(info.value)
    assert str(bad) in message
    for fragment in fragments:
        assert fragment in message


def test_femnist_bad_json_names_file_and_line(femnist_dir: tuple[Path, dict[str, Any]]) -> None:
    root, _ = femnist_dir
    bad = root / "test" / "t.json"
    bad.write_text('{"users": ["ua"],\n "num_samples": [1,', encoding="utf-8")
    with pytest.raises(DataError, match="invalid JSON at line 2") as info:
        load_femnist(root)
    assert str(bad) in str(info.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"users": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested more deeply than the JSON parser follows"),
        ('{"users": ["ua"], "num_samples": [' + "1" * 5000 + "]}", "an integer of 5000 characters"),
    ],
    ids=["deep", "5000-digits"],
)
def test_femnist_json_the_parser_refuses_is_a_data_error(
    femnist_dir: tuple[Path, dict[str, Any]], text: str, words: str
) -> None:
    """Before the fix, RecursionError and ValueError from ``json`` (tracebacks from ``dropsim run``; the
    command itself is tested in test_fuzz_files.py)."""
    root, _ = femnist_dir
    bad = root / "train" / "0.json"
    bad.write_text(text, encoding="utf-8")
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # lifted: the loader's own bound holds whatever the interpreter's
    try:
        with pytest.raises(DataError) as info:
            load_femnist(root)
    finally:
        sys.set_int_max_str_digits(limit)
    assert str(info.value).startswith(f"{bad}: ")
    assert words in str(info.value)


@pytest.mark.parametrize(
    "pixels",
    [[[0.5]] * 784, [[0.5]] * 783 + [[1.5]], [[0.5]] * 783 + [[0.5, 0.5]], [[[[0.5]]]] * 784],
    ids=["nested", "nested-out-of-range", "ragged", "deeper"],
)
def test_femnist_pixels_that_are_lists_are_refused(femnist_dir: tuple[Path, dict[str, Any]], pixels: Any) -> None:
    """Before the fix, a row of 784 one-element lists was read as if flat, and the others raised ValueError
    from numpy or from unpacking a 3-D index."""
    root, _ = femnist_dir
    bad = root / "train" / "0.json"
    _edit_leaf(bad, lambda d: d["user_data"]["ub"]["x"].__setitem__(1, pixels))
    with pytest.raises(DataError, match="'ub': x rows must hold 784 numbers each") as info:
        load_femnist(root)
    assert str(info.value).startswith(f"{bad}: ")


def test_femnist_messages_show_file_values_cut_short(femnist_dir: tuple[Path, dict[str, Any]]) -> None:
    root, _ = femnist_dir
    bad = root / "train" / "0.json"
    _edit_leaf(bad, lambda d: d["user_data"].__setitem__("u" * 100_000, {}))
    with pytest.raises(DataError, match="is in 'user_data' but not listed in 'users'") as info:
        load_femnist(root)
    assert len(str(info.value)) < len(str(bad)) + 200


@pytest.mark.parametrize("missing", ["train", "test"])
def test_femnist_missing_folder_names_it(femnist_dir: tuple[Path, dict[str, Any]], missing: str) -> None:
    root, _ = femnist_dir
    for file in (root / missing).iterdir():
        file.unlink()
    (root / missing).rmdir()
    with pytest.raises(DataError, match="does not exist") as info:
        load_femnist(root)
    assert str(root / missing) in str(info.value)


def test_femnist_empty_folder_and_missing_root(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    with pytest.raises(DataError, match=r"no \*\.json files") as info:
        load_femnist(tmp_path)
    assert str(tmp_path / "train") in str(info.value)
    with pytest.raises(DataError, match="does not exist"):
        load_femnist(tmp_path / "nowhere")


# ------------------------------------------------------------------------------------------- CIFAR-10


@pytest.mark.parametrize("subfolder", ["", "cifar-10-batches-py"])
def test_cifar_python_batches_pixel_layout_and_labels(tmp_path: Path, subfolder: str) -> None:
    rng = np.random.default_rng(1)
    batches = [_cifar_batch(rng, rows) for rows in (2, 1, 3, 1, 2, 2)]
    # A known pixel: batch 2 (train sample index 2), green channel (c=1), row 4, column 7.
    batches[1][0][0, 1 * 1024 + 4 * 32 + 7] = 200
    _write_cifar_python(tmp_path / subfolder if subfolder else tmp_path, batches)
    ds = load_cifar10(tmp_path)
    assert ds.name == "cifar10"
    assert ds.num_classes == 10
    assert ds.writers is None
    assert ds.input_shape == (3, 32, 32)
    assert ds.x_train.shape == (9, 3, 32, 32)
    assert ds.x_train.dtype == np.float32
    assert ds.x_train[2, 1, 4, 7] == np.float32(200) / np.float32(255)
    expected_x, expected_y = _expected_cifar(batches)
    np.testing.assert_array_equal(ds.x_train, expected_x)
    assert ds.y_train.dtype == np.int64
    np.testing.assert_array_equal(ds.y_train, expected_y)
    assert ds.x_test.shape == (2, 3, 32, 32)
    assert ds.y_test.tolist() == batches[5][1]


@pytest.mark.parametrize("subfolder", ["", "cifar-10-batches-bin"])
def test_cifar_binary_batches(tmp_path: Path, subfolder: str) -> None:
    rng = np.random.default_rng(2)
    batches = [_cifar_batch(rng, rows) for rows in (1, 1, 2, 1, 1, 3)]
    batches[0][0][0, 2 * 1024 + 31 * 32 + 0] = 255  # blue channel, last row, first column
    batches[0][0][0, 0] = 0
    _write_cifar_binary(tmp_path / subfolder if subfolder else tmp_path, batches)
    ds = load_cifar10(tmp_path)
    assert ds.x_train[0, 2, 31, 0] == 1.0
    assert ds.x_train[0, 0, 0, 0] == 0.0
    expected_x, expected_y = _expected_cifar(batches)
    np.testing.assert_array_equal(ds.x_train, expected_x)
    np.testing.assert_array_equal(ds.y_train, expected_y)
    assert ds.y_test.tolist() == batches[5][1]


@settings(max_examples=15, deadline=None)
@given(
    rows=st.lists(st.integers(1, 3), min_size=6, max_size=6),
    seed=st.integers(0, 2**32 - 1),
    protocol=st.integers(0, 4),
)
def test_cifar_python_and_binary_versions_agree(rows: list[int], seed: int, protocol: int) -> None:
    rng = np.random.default_rng(seed)
    batches = [_cifar_batch(rng, n) for n in rows]
    with tempfile.TemporaryDirectory() as py_dir, tempfile.TemporaryDirectory() as bin_dir:
        _write_cifar_python(Path(py_dir), batches, protocol=protocol)
        _write_cifar_binary(Path(bin_dir), batches)
        from_py, from_bin = load_cifar10(py_dir), load_cifar10(bin_dir)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(from_py, field), getattr(from_bin, field))
    assert from_py.x_train.min() >= 0.0
    assert from_py.x_train.max() <= 1.0


def test_cifar_numpy1_style_pickle_loads_without_warnings(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    batches = [_cifar_batch(rng, 1) for _ in range(6)]
    _write_cifar_python(tmp_path, batches)
    for name in _CIFAR_NAMES:  # rewrite as numpy 1.x would have: numpy.core.multiarray._reconstruct
        file = tmp_path / name
        file.write_bytes(file.read_bytes().replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    assert b"numpy.core.multiarray" in (tmp_path / "test_batch").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = load_cifar10(tmp_path)
    np.testing.assert_array_equal(ds.x_test[0].reshape(3072) * np.float32(255), batches[5][0][0])


def _write_tampered_cifar(folder: Path, payload: object, protocol: int = 2) -> Path:
    """Valid batches, except that data_batch_1's b'labels' is ``payload``; return that file."""
    _write_cifar_python(folder, [_cifar_batch(np.random.default_rng(4), 1) for _ in range(6)])
    bad = folder / "data_batch_1"
    batch = {b"data": np.zeros((1, 3072), dtype=np.uint8), b"labels": payload}
    bad.write_bytes(pickle.dumps(batch, protocol=protocol))
    return bad


def test_cifar_malicious_pickle_is_rejected_before_running(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    bad = _write_tampered_cifar(tmp_path / "cifar", _CallOnLoad(os.mkdir, str(marker)))
    with pytest.raises(UnsafePickleError) as info:
        load_cifar10(tmp_path / "cifar")
    assert not marker.exists()
    assert f"{os.mkdir.__module__}.mkdir" in str(info.value)  # "posix.mkdir" on Linux
    assert str(bad) in str(info.value)
    assert info.value.global_name == f"{os.mkdir.__module__}.mkdir"


@pytest.mark.parametrize(("protocol", "global_name"), [(2, "__builtin__.print"), (4, "builtins.print")])
def test_cifar_malicious_print_never_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], protocol: int, global_name: str
) -> None:
    _write_tampered_cifar(tmp_path, _CallOnLoad(print, "PWNED"), protocol=protocol)
    with pytest.raises(UnsafePickleError, match=global_name.replace(".", r"\.")):
        load_cifar10(tmp_path)
    assert "PWNED" not in capsys.readouterr().out


def _rewrite_batch(folder: Path, name: str, batch: object) -> Path:
    """Overwrite one python batch with the pickled ``batch``; return its path."""
    file = folder / name
    file.write_bytes(pickle.dumps(batch, protocol=2))
    return file


@pytest.mark.parametrize(
    ("batch", "fragment"),
    [
        ({b"data": np.zeros((1, 3072), dtype=np.float32), b"labels": [0]}, "uint8"),
        ({b"data": np.zeros((1, 3071), dtype=np.uint8), b"labels": [0]}, "3072"),
        ({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0]}, "2 rows"),
        ({b"data": np.zeros((1, 3072), dtype=np.uint8), b"labels": [10]}, "outside 0..9"),
        ({b"data": np.zeros((1, 3072), dtype=np.uint8)}, "b'labels'"),
        ({b"labels": [1]}, "b'data'"),
        ([1, 2, 3], "dict"),
    ],
)
def test_cifar_invalid_python_batch(tmp_path: Path, batch: object, fragment: str) -> None:
    _write_cifar_python(tmp_path, [_cifar_batch(np.random.default_rng(5), 1) for _ in range(6)])
    bad = _rewrite_batch(tmp_path, "data_batch_4", batch)
    with pytest.raises(DataError, match=fragment) as info:
        load_cifar10(tmp_path)
    assert str(bad) in str(info.value)


def test_cifar_truncated_and_missing_batches(tmp_path: Path) -> None:
    _write_cifar_python(tmp_path, [_cifar_batch(np.random.default_rng(6), 1) for _ in range(6)])
    test_batch = tmp_path / "test_batch"
    test_batch.write_bytes(test_batch.read_bytes()[:100])
    with pytest.raises(DataError, match="not a readable CIFAR-10 python batch") as info:
        load_cifar10(tmp_path)
    assert str(test_batch) in str(info.value)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(DataError, match="data_batch_3"):
        load_cifar10(tmp_path)


def test_cifar_binary_errors(tmp_path: Path) -> None:
    batches = [_cifar_batch(np.random.default_rng(7), 1) for _ in range(6)]
    _write_cifar_binary(tmp_path, batches)
    bad = tmp_path / "data_batch_2.bin"
    bad.write_bytes(bad.read_bytes() + b"\x00")
    with pytest.raises(DataError, match="3073-byte record") as info:
        load_cifar10(tmp_path)
    assert str(bad) in str(info.value)
    bad.write_bytes(bytes([10]) + bytes(3072))
    with pytest.raises(DataError, match="label 10"):
        load_cifar10(tmp_path)
    (tmp_path / "test_batch.bin").unlink()
    with pytest.raises(DataError, match=r"test_batch\.bin"):
        load_cifar10(tmp_path)


def test_cifar_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no CIFAR-10 batches found") as info:
        load_cifar10(tmp_path)
    assert str(tmp_path) in str(info.value)


# ------------------------------------------------------------------------------------------- digits


@functools.cache
def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (pixels 0..16 of shape (1797, 64), labels)."""
    from sklearn.datasets import load_digits as sklearn_load_digits

    bunch = sklearn_load_digits()
    return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target)


def _sorted_rows(table: np.ndarray) -> np.ndarray:
    """Rows of a 2-D table in lexicographic order."""
    return table[np.lexsort(table.T[::-1])]


def test_digits_shapes_values_and_split() -> None:
    ds = load_digits(0.25, np.random.default_rng(0))
    assert isinstance(ds, Dataset)
    assert ds.name == "digits"
    assert ds.num_classes == 10
    assert ds.writers is None
    assert ds.input_shape == (1, 8, 8)
    assert ds.x_test.shape == (round(0.25 * 1797), 1, 8, 8)
    assert ds.x_train.shape == (1797 - round(0.25 * 1797), 1, 8, 8)
    for x in (ds.x_train, ds.x_test):
        assert x.dtype == np.float32
        assert x.min() == 0.0
        assert x.max() == 1.0
        assert set(np.unique(x * 16).tolist()) <= set(range(17))
    assert ds.y_train.dtype == np.int64
    assert set(np.concatenate([ds.y_train, ds.y_test]).tolist()) == set(range(10))


def test_digits_deterministic_per_seed() -> None:
    a = load_digits(0.2, np.random.default_rng(11))
    b = load_digits(0.2, np.random.default_rng(11))
    c = load_digits(0.2, np.random.default_rng(12))
    for field in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.x_test, c.x_test)


@settings(max_examples=20, deadline=None)
@given(fraction=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1))
def test_digits_split_sizes_and_partition(fraction: float, seed: int) -> None:
    ds = load_digits(fraction, np.random.default_rng(seed))
    n_test = min(max(round(fraction * 1797), 1), 1796)
    assert ds.x_test.shape[0] == ds.y_test.shape[0] == n_test
    assert ds.x_train.shape[0] == ds.y_train.shape[0] == 1797 - n_test
    # Train and test together hold every image exactly once: compare sorted (image, label) rows.
    x = np.concatenate([ds.x_train, ds.x_test]).reshape(1797, 64) * 16
    y = np.concatenate([ds.y_train, ds.y_test])
    full_x, full_y = _sklearn_digits()
    assert _sorted_rows(np.column_stack([x, y])).tolist() == _sorted_rows(np.column_stack([full_x, full_y])).tolist()


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan")])
def test_digits_rejects_bad_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits(fraction, np.random.default_rng(0))
