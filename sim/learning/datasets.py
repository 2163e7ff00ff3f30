"""In-memory labelled image data sets: sklearn digits, LEAF FEMNIST and CIFAR-10.

Theory of operation
-------------------
Each loader reads a whole data set into memory once and returns a frozen :class:`Dataset` holding four numpy
arrays: images as ``float32`` of shape ``(N, C, H, W)`` scaled to ``[0, 1]``, and labels as ``int64`` in
``[0, num_classes)``. Nothing is downloaded: the caller points the loader at files already on disk (digits
ships inside scikit-learn). Partitioning the training set among simulated clients is not done here; FEMNIST
only records which writer produced each training image (``Dataset.writers``) so that a partitioner can give
each client one writer's data, as LEAF does.

Every input is validated as it is read; a malformed file raises :class:`DataError` (a ``ValueError``) whose
message names the file -- and the user, key, row or byte offset where it helps -- and what was expected.
Values from a file are shown in messages cut short (:func:`sim.safepickle.short_repr`), whatever their size.

File formats
------------
digits
    ``sklearn.datasets.load_digits()``: 1797 images of 8x8 pixels with integer values 0..16, 10 classes.
    Scaled by 1/16 to ``(N, 1, 8, 8)``; split at random into train and test by :func:`load_digits`.

FEMNIST (LEAF)
    A folder with ``train/`` and ``test/`` subfolders, each holding one or more ``*.json`` files (read in
    sorted file-name order) of the form::

        {"users": ["f0000_14", ...],            # user (writer) ids, in order
         "num_samples": [12, ...],              # samples per user, same order
         "hierarchies": [...],                  # optional, ignored
         "user_data": {"f0000_14": {"x": [[784 floats in 0..1], ...],   # 28x28 row-major
                                    "y": [label, ...]}, ...}}           # ints in 0..61

    Images become ``(N, 1, 28, 28)``; 62 classes (10 digits, 26 upper-case, 26 lower-case letters).
    ``writers[i]`` is the index of training sample ``i``'s user, counted in order of first appearance across
    the train files.

    Each file is at most :data:`MAX_LEAF_FILE_BYTES` (checked before it is read) and parsed by Python's
    ``json`` (C, linear in the file). Nesting deeper than that parser follows (the interpreter's recursion
    limit) and an integer of more than :data:`MAX_LEAF_INT_DIGITS` digits (refused before it is converted,
    whatever limit the interpreter sets) are a DataError naming the file.

CIFAR-10
    "Python version": ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` in ``path`` or in
    ``path/cifar-10-batches-py``. Each is a Python 2 pickle of a dict with ``b"data"`` (``uint8`` ndarray
    ``(rows, 3072)``: the 1024 red values of a 32x32 image in row-major order, then 1024 green, then 1024
    blue) and ``b"labels"`` (list of ints 0..9). Loaded only through :func:`sim.safepickle.restricted_load`,
    so a tampered batch raises :class:`sim.safepickle.UnsafePickleError` instead of running code.
    "Binary version" (used when no python batch is present): ``data_batch_1.bin`` .. ``data_batch_5.bin``
    and ``test_batch.bin`` in ``path`` or ``path/cifar-10-batches-bin``; each a sequence of 3073-byte records
    of 1 label byte followed by the same 3072 pixel bytes. Batches may hold any number of rows.
    Images become ``(N, 3, 32, 32)`` with values ``byte / 255``; 10 classes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import InputError
from sim.safepickle import PickleFormatError, restricted_load, short_repr

__all__ = ["DataError", "Dataset", "load_cifar10", "load_digits", "load_femnist"]


class DataError(InputError):
    """A data file or folder that cannot be read.

    The message names the file (and line/key where it helps) and what was expected.
    """


@dataclass(frozen=True, eq=False)
class Dataset:
    """Images as float32 arrays of shape (N, C, H, W) with values in [0, 1]; labels int64 in [0, num_classes).

    ``writers`` is ``None`` or an int64 array of shape ``(N_train,)`` giving the writer index 0..W-1 of each
    training sample (FEMNIST). Equality is identity (``eq=False``): comparing arrays field-wise is ambiguous.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    writers: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one input: ``(C, H, W)`` of an image (a loader's train set may hold other inputs)."""
        return tuple(int(s) for s in self.x_train.shape[1:])


# --------------------------------------------------------------------------------------------- helpers


def _require_dir(folder: Path, what: str) -> None:
    """Raise :class:`DataError` unless ``folder`` is an existing directory."""
    if not folder.is_dir():
        state = "is not a folder" if folder.exists() else "does not exist"
        raise DataError(f"{folder}: {state}; expected {what}")


def _require_nonempty(name: str, where: Path, split: str, n: int) -> None:
    """Raise :class:`DataError` if a split of a data set holds no samples."""
    if n == 0:
        raise DataError(f"{where}: the {name} {split} set holds no samples")


def _check_labels(labels: np.ndarray, num_classes: int, where: str) -> np.ndarray:
    """Return ``labels`` as int64 after checking it is a 1-D integer array with values in [0, num_classes)."""
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise DataError(
            f"{where}: labels must be a flat list of integers, got dtype {labels.dtype} and shape {labels.shape}"
        )
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        raise DataError(f"{where}: label {labels[bad[0]]} at index {bad[0]} is outside 0..{num_classes - 1}")
    return labels.astype(np.int64, copy=False)


# --------------------------------------------------------------------------------------------- digits

_DIGITS_LEVELS = 16.0  # sklearn digits pixels are integers 0..16
DIGITS_SAMPLES = 1797
"""Images in scikit-learn's digits."""


def digits_train_size(test_fraction: float) -> int:
    """Training samples of :func:`load_digits` for ``test_fraction`` (without loading it)."""
    return DIGITS_SAMPLES - _test_size(test_fraction, DIGITS_SAMPLES)


def _test_size(test_fraction: float, n: int) -> int:
    """Number of test samples: ``round(test_fraction * n)``, clamped so both splits hold at least one."""
    if not 0.0 <= test_fraction <= 1.0:  # also rejects NaN
        raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
    return min(max(round(test_fraction * n), 1), n - 1)


def load_digits(test_fraction: float, rng: np.random.Generator) -> Dataset:
    """Load scikit-learn's bundled 8x8 digits, split at random into train and test.

    ``test_fraction`` in [0, 1] sets the test size to ``round(test_fraction * 1797)``, clamped to leave at
    least one sample in each split. The split is one ``rng.permutation`` (plain, not stratified): the first
    ``n_test`` permuted indices form the test set, the rest the training set, both in permuted order. Images
    are ``(N, 1, 8, 8)`` float32 in [0, 1] (pixel / 16); 10 classes.
    """
    # deferred: scikit-learn is heavy and only the digits data set needs it
    from sklearn.datasets import load_digits as sklearn_load_digits

    bunch = sklearn_load_digits()
    images = np.asarray(bunch.images, dtype=np.float64)
    n = images.shape[0]
    x = (images / _DIGITS_LEVELS).astype(np.float32).reshape(n, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    n_test = _test_size(test_fraction, n)
    order = rng.permutation(n)
    test_idx, train_idx = order[:n_test], order[n_test:]
    return Dataset(
        name="digits",
        x_train=x[train_idx],
        y_train=y[train_idx],
        x_test=x[test_idx],
        y_test=y[test_idx],
        num_classes=10,
    )


# --------------------------------------------------------------------------------------------- FEMNIST

FEMNIST_SIDE = 28
FEMNIST_PIXELS = FEMNIST_SIDE * FEMNIST_SIDE
FEMNIST_CLASSES = 62
MAX_LEAF_FILE_BYTES = 1 << 30
"""Largest LEAF JSON file read (1 GiB; LEAF writes FEMNIST in files of a few tens of MB)."""
MAX_LEAF_INT_DIGITS = 100
"""Most characters of an integer in a LEAF file (labels and sample counts take a few)."""


class _LongIntegerError(Exception):
    """An integer of more than MAX_LEAF_INT_DIGITS characters, met by the JSON parser."""


def _leaf_int(text: str) -> int:
    """``json``'s conversion of an integer, refusing one too long before converting it."""
    if len(text) > MAX_LEAF_INT_DIGITS:
        raise _LongIntegerError(len(text))
    return int(text)


@dataclass
class _Split:
    """Accumulates one split (train or test) of a LEAF data set, user by user."""

    xs: list[np.ndarray]
    ys: list[np.ndarray]
    writer_of_sample: list[np.ndarray]
    writer_index: dict[str, int]


def _json_files(folder: Path) -> list[Path]:
    """The ``*.json`` files in ``folder``, sorted by name; DataError if the folder or files are missing."""
    _require_dir(folder, "a folder of LEAF *.json files")
    files = sorted(p for p in folder.glob("*.json") if p.is_file())
    if not files:
        raise DataError(f"{folder}: no *.json files; expected one or more LEAF data files")
    return files


def _read_json(file: Path) -> Any:
    """Parse one JSON file; DataError (with line and column for syntax errors) if it cannot be read."""
    try:
        size = file.stat().st_size
    except OSError as exc:
        raise DataError(f"{file}: cannot read: {exc}") from exc
    if size > MAX_LEAF_FILE_BYTES:
        raise DataError(
            f"{file}: {size} bytes is larger than the {MAX_LEAF_FILE_BYTES} bytes a LEAF JSON file may have"
        )
    try:
        with file.open(encoding="utf-8") as stream:
            return json.load(stream, parse_int=_leaf_int)
    except json.JSONDecodeError as exc:
        raise DataError(f"{file}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{file}: cannot read as UTF-8 JSON: {exc}") from exc
    except RecursionError:  # json's parser recurses per level, up to the interpreter's limit
        raise DataError(
            f"{file}: arrays and objects nested more deeply than the JSON parser follows (about "
            f"{sys.getrecursionlimit()} levels); a LEAF file nests 5"
        ) from None
    except _LongIntegerError as exc:
        raise DataError(
            f"{file}: an integer of {exc.args[0]} characters, more than the {MAX_LEAF_INT_DIGITS} read; a LEAF file "
            "holds labels and sample counts (small whole numbers) and pixels in [0, 1]"
        ) from None


def _require_key(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """Return ``doc[key]``, raising DataError if it is missing or not of type ``kind``."""
    if key not in doc:
        raise DataError(
            f"{where}: missing key {key!r}; expected a LEAF file with 'users', 'num_samples' and 'user_data'"
        )
    value = doc[key]
    if not isinstance(value, kind):
        raise DataError(f"{where}: {key!r} must be a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def _leaf_rows(rows: Any, where: str) -> np.ndarray:
    """Parse a user's ``x`` (list of 784-float rows in [0, 1]) into float32 ``(n, 784)``."""
    if not isinstance(rows, list):
        raise DataError(f"{where}: 'x' must be a list of rows, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != FEMNIST_PIXELS:
            got = f"length {len(row)}" if isinstance(row, list) else type(row).__name__
            raise DataError(f"{where}: x row {i} must be a list of {FEMNIST_PIXELS} numbers, got {got}")
    if not rows:
        return np.zeros((0, FEMNIST_PIXELS), dtype=np.float32)
    try:
        values = np.array(rows)
    except ValueError:  # pixels that are lists of different lengths, or nested past numpy's 32 dimensions
        values = np.zeros(0, dtype=object)
    if values.dtype.kind not in "iuf" or values.ndim != 2:
        raise DataError(f"{where}: x rows must hold {FEMNIST_PIXELS} numbers each, got values of dtype {values.dtype}")
    outside = np.argwhere(~((values >= 0.0) & (values <= 1.0)))  # NaN counts as outside
    if outside.size:
        i, j = outside[0]
        raise DataError(f"{where}: x row {i} pixel {j} is {values[i, j]}; expected a value in [0, 1]")
    return values.astype(np.float32)


def _leaf_labels(labels: Any, where: str) -> np.ndarray:
    """Parse a user's ``y`` (list of ints in 0..61) into int64 ``(n,)``."""
    if not isinstance(labels, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in labels):
        raise DataError(f"{where}: 'y' must be a list of integers")
    try:
        values = np.array(labels, dtype=np.int64)
    except OverflowError as exc:
        raise DataError(f"{where}: 'y' holds an integer outside 0..{FEMNIST_CLASSES - 1}") from exc
    return _check_labels(values, FEMNIST_CLASSES, where)


def _read_leaf_user(file: Path, user: str, count: Any, user_data: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Validate and parse one user's block; return ``(x (n, 784) float32, y (n,) int64)``."""
    where = f"{file}: user {short_repr(user)}"
    if user not in user_data:
        raise DataError(f"{where}: listed in 'users' but missing from 'user_data'")
    entry = user_data[user]
    if not isinstance(entry, dict) or "x" not in entry or "y" not in entry:
        raise DataError(f"{where}: user_data entry must be an object with keys 'x' and 'y'")
    x = _leaf_rows(entry["x"], where)
    y = _leaf_labels(entry["y"], where)
    if x.shape[0] != y.shape[0]:
        raise DataError(f"{where}: 'x' has {x.shape[0]} rows but 'y' has {y.shape[0]} labels")
    if isinstance(count, bool) or not isinstance(count, int) or count != y.shape[0]:
        raise DataError(f"{where}: num_samples says {short_repr(count)} but the user has {y.shape[0]} samples")
    return x, y


def _read_leaf_file(file: Path, split: _Split) -> None:
    """Append every user of one LEAF JSON file to ``split``, in the order of the file's ``users`` list."""
    doc = _read_json(file)
    if not isinstance(doc, dict):
        raise DataError(f"{file}: top level must be a JSON object, got {type(doc).__name__}")
    users = _require_key(doc, "users", list, str(file))
    counts = _require_key(doc, "num_samples", list, str(file))
    user_data = _require_key(doc, "user_data", dict, str(file))
    if len(users) != len(counts):
        raise DataError(f"{file}: 'users' has {len(users)} entries but 'num_samples' has {len(counts)}")
    if any(not isinstance(user, str) for user in users):
        raise DataError(f"{file}: 'users' must be a list of strings")
    if len(set(users)) != len(users):
        raise DataError(f"{file}: 'users' lists a user more than once")
    unlisted = sorted(set(user_data) - set(users))
    if unlisted:
        raise DataError(f"{file}: user {short_repr(unlisted[0])} is in 'user_data' but not listed in 'users'")
    for user, count in zip(users, counts, strict=True):
        x, y = _read_leaf_user(file, user, count, user_data)
        writer = split.writer_index.setdefault(user, len(split.writer_index))
        split.xs.append(x)
        split.ys.append(y)
        split.writer_of_sample.append(np.full(y.shape[0], writer, dtype=np.int64))


def _read_leaf_split(folder: Path) -> _Split:
    """Read all ``*.json`` files of one LEAF split folder, one file at a time."""
    split = _Split(xs=[], ys=[], writer_of_sample=[], writer_index={})
    for file in _json_files(folder):
        _read_leaf_file(file, split)
    _require_nonempty("FEMNIST", folder, folder.name, sum(y.shape[0] for y in split.ys))
    return split


def _leaf_images(xs: list[np.ndarray]) -> np.ndarray:
    """Stack per-user ``(n, 784)`` rows into ``(N, 1, 28, 28)`` float32."""
    return np.concatenate(xs).reshape(-1, 1, FEMNIST_SIDE, FEMNIST_SIDE)


def load_femnist(path: str | Path) -> Dataset:
    """Load LEAF FEMNIST from ``path/train/*.json`` and ``path/test/*.json`` (format in the module docstring).

    Returns images ``(N, 1, 28, 28)`` float32 in [0, 1] exactly as stored, labels int64 in 0..61, and
    ``writers`` (int64, one per training sample) indexing users by first appearance across the train files.
    """
    root = Path(path)
    _require_dir(root, "a LEAF FEMNIST folder with train/ and test/ subfolders")
    train = _read_leaf_split(root / "train")
    test = _read_leaf_split(root / "test")
    return Dataset(
        name="femnist",
        x_train=_leaf_images(train.xs),
        y_train=np.concatenate(train.ys),
        x_test=_leaf_images(test.xs),
        y_test=np.concatenate(test.ys),
        num_classes=FEMNIST_CLASSES,
        writers=np.concatenate(train.writer_of_sample),
    )


# --------------------------------------------------------------------------------------------- CIFAR-10

CIFAR_SIDE = 32
CIFAR_CHANNELS = 3
CIFAR_ROW_BYTES = CIFAR_CHANNELS * CIFAR_SIDE * CIFAR_SIDE  # 3072
CIFAR_CLASSES = 10
_CIFAR_BATCHES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")  # last one is the test set

_BatchReader = Callable[[Path], tuple[np.ndarray, np.ndarray]]


def _dict_entry(batch: dict[Any, Any], key: str, file: Path) -> Any:
    """Return ``batch[b"key"]`` (Python 2 writers) or ``batch["key"]`` (Python 3 writers)."""
    for candidate in (key.encode("ascii"), key):
        if candidate in batch:
            return batch[candidate]
    raise DataError(f"{file}: missing key b{key!r}; expected a CIFAR-10 batch dict with b'data' and b'labels'")


def _read_cifar_python_batch(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 python batch via the restricted unpickler; return (uint8 (n, 3072), int64 (n,))."""
    try:
        batch = restricted_load(file, allow_numpy=True, encoding="bytes")
    except PickleFormatError as exc:
        raise DataError(f"{file}: not a readable CIFAR-10 python batch: {exc}") from exc
    except OSError as exc:
        raise DataError(f"{file}: cannot read: {exc}") from exc
    if not isinstance(batch, dict):
        raise DataError(f"{file}: expected a pickled dict, got {type(batch).__name__}")
    data = _dict_entry(batch, "data", file)
    if not isinstance(data, np.ndarray):
        raise DataError(f"{file}: b'data' must be a uint8 numpy array, got {type(data).__name__}")
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != CIFAR_ROW_BYTES:
        got = f"{data.dtype} array of shape {data.shape}"
        raise DataError(f"{file}: b'data' must be a uint8 array of shape (rows, {CIFAR_ROW_BYTES}), got {got}")
    raw_labels = _dict_entry(batch, "labels", file)
    if not isinstance(raw_labels, (list, tuple, np.ndarray)):
        raise DataError(f"{file}: b'labels' must be a list of ints, got {type(raw_labels).__name__}")
    if isinstance(raw_labels, (list, tuple)) and any(isinstance(v, bool) or not isinstance(v, int) for v in raw_labels):
        raise DataError(f"{file}: b'labels' must be a list of ints")
    labels = _check_labels(np.asarray(raw_labels), CIFAR_CLASSES, f"{file}: b'labels'")
    if labels.shape[0] != data.shape[0]:
        raise DataError(f"{file}: b'data' has {data.shape[0]} rows but b'labels' has {labels.shape[0]} entries")
    return data, labels


def _read_cifar_binary_batch(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch (3073-byte records: label, 3072 pixels); return (uint8, int64)."""
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise DataError(f"{file}: cannot read: {exc}") from exc
    record = CIFAR_ROW_BYTES + 1
    if len(raw) % record:
        raise DataError(
            f"{file}: size {len(raw)} bytes is not a multiple of the {record}-byte record "
            "(1 label byte + 3072 pixel bytes)"
        )
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, record)
    labels = records[:, 0].astype(np.int64)
    bad = np.flatnonzero(labels >= CIFAR_CLASSES)
    if bad.size:
        raise DataError(
            f"{file}: record {bad[0]} (byte offset {bad[0] * record}) has label {labels[bad[0]]}; "
            f"expected 0..{CIFAR_CLASSES - 1}"
        )
    return records[:, 1:].copy(), labels


def _cifar_layout(root: Path) -> tuple[Path, tuple[str, ...], _BatchReader]:
    """Pick python batches if any is present (in ``root`` or ``cifar-10-batches-py/``), else binary ones."""
    layouts: tuple[tuple[str, str, _BatchReader], ...] = (
        ("cifar-10-batches-py", "", _read_cifar_python_batch),
        ("cifar-10-batches-bin", ".bin", _read_cifar_binary_batch),
    )
    for subfolder, suffix, reader in layouts:
        folder = root / subfolder if (root / subfolder).is_dir() else root
        names = tuple(name + suffix for name in _CIFAR_BATCHES)
        if any((folder / name).exists() for name in names):
            missing = [name for name in names if not (folder / name).is_file()]
            if missing:
                raise DataError(f"{folder}: missing CIFAR-10 batch file(s) {', '.join(missing)}")
            return folder, names, reader
    raise DataError(
        f"{root}: no CIFAR-10 batches found; expected data_batch_1..data_batch_5 and test_batch (python "
        "version, here or in cifar-10-batches-py/) or the same names with .bin (binary version, here or in "
        "cifar-10-batches-bin/)"
    )


def _cifar_images(rows: np.ndarray) -> np.ndarray:
    """Turn uint8 rows ``(n, 3072)`` (R, G, B planes, each 32x32 row-major) into ``(n, 3, 32, 32)`` / 255."""
    images = rows.reshape(-1, CIFAR_CHANNELS, CIFAR_SIDE, CIFAR_SIDE).astype(np.float32)
    images /= np.float32(255.0)
    return images


def load_cifar10(path: str | Path) -> Dataset:
    """Load CIFAR-10 from its python batches, or its binary batches if no python batch exists.

    Python batches are unpickled only through :func:`sim.safepickle.restricted_load`; a batch that names a
    forbidden global raises :class:`sim.safepickle.UnsafePickleError` (a ``ValueError``, not a DataError).
    Returns images ``(N, 3, 32, 32)`` float32 in [0, 1] and int64 labels 0..9.
    """
    root = Path(path)
    _require_dir(root, "a CIFAR-10 folder")
    folder, names, reader = _cifar_layout(root)
    parts = [reader(folder / name) for name in names]
    train_parts, (x_test, y_test) = parts[:-1], parts[-1]
    x_train = np.concatenate([x for x, _ in train_parts])
    y_train = np.concatenate([y for _, y in train_parts])
    _require_nonempty("CIFAR-10", folder, "training", y_train.shape[0])
    _require_nonempty("CIFAR-10", folder, "test", y_test.shape[0])
    return Dataset(
        name="cifar10",
        x_train=_cifar_images(x_train),
        y_train=y_train,
        x_test=_cifar_images(x_test),
        y_test=y_test,
        num_classes=CIFAR_CLASSES,
    )
