"""A restricted unpickler for data files.

Why this exists: several data files the simulator reads are pickles -- the CIFAR-10 "python version"
batches, and FedScale client traces. Unpickling is not parsing: a pickle is a small program for a stack
machine, and its ``GLOBAL``/``STACK_GLOBAL``/``INST``/``OBJ``/``EXT*`` opcodes import any named callable
and its ``REDUCE`` opcode calls it. ``pickle.load`` on a file from the internet can therefore run
``os.system("...")``. This module loads such files with an allow-list instead.

Every global a pickle names goes through :meth:`_RestrictedUnpickler.find_class`, which resolves only the
``(module, name)`` pairs listed here and raises :class:`UnsafePickleError` for anything else -- before the
global is imported, so a forbidden callable is never called.

Always allowed (``allow_numpy=False``): what pickle builds natively (``dict``, ``list``, ``tuple``,
``str``, ``bytes``, ``int``, ``float``, ``bool``, ``None``, and under protocol 4+ ``set``/``frozenset``),
plus the few globals that older protocols need for the same plain values:

* ``builtins.set``, ``builtins.frozenset`` -- sets under protocols 0-3;
* ``builtins.bytearray`` -- bytearrays under protocols 0-4;
* ``builtins.bytes`` -- the empty ``bytes`` object under protocols 0-2;
* ``builtins.complex`` -- complex numbers (all protocols);
* ``_codecs.encode`` -- non-empty ``bytes`` under protocols 0-2 (Python 3 writes them as
  ``_codecs.encode(<latin-1 str>, "latin1")``); allowed under that exact name only.

Python 2 (and Python 3 at protocol <= 2, which maps names back for Python 2 readers) spells the
``builtins`` module ``__builtin__``; the same five names are accepted under that spelling.

With ``allow_numpy=True`` the globals numpy uses to rebuild plain arrays, dtypes and scalars are allowed too:
``numpy.core.multiarray._reconstruct``, ``numpy._core.multiarray._reconstruct``, ``numpy.ndarray``,
``numpy.dtype``, ``numpy.core.multiarray.scalar`` and ``numpy._core.multiarray.scalar`` (the ``numpy.core``
spellings come from numpy 1.x writers; both resolve to whichever module the installed numpy has, without
importing the deprecated ``numpy.core`` alias). Nothing else -- in particular arrays pickled with protocol 5
(``numpy._core.numeric._frombuffer``) are refused. Object arrays could carry arbitrary objects, so after
loading the result is walked and any array whose dtype holds Python objects is rejected.

Errors: a forbidden global or an object array raises :class:`UnsafePickleError`; truncated or otherwise
malformed data raises :class:`PickleFormatError`. Both are :class:`ValueError` subclasses whose message names
the source (file path, or ``source=`` for bytes). Raw ``pickle``/``EOFError``/... exceptions never escape.
"""

from __future__ import annotations

import importlib
import io
import pickle
from pathlib import Path
from typing import IO, Any

import numpy as np

from sim.errors import InputError

__all__ = ["PickleFormatError", "UnsafePickleError", "restricted_load", "restricted_loads"]


class UnsafePickleError(InputError):
    """A pickle asked for a global outside the allow-list (or held an object array).

    ``source`` names the file (or ``"<bytes>"``); ``global_name`` is the dotted global as the pickle spelled
    it (e.g. ``"posix.system"``), or ``None`` when the rejection was for an object-dtype array.
    """

    def __init__(self, message: str, *, source: str, global_name: str | None = None) -> None:
        super().__init__(message)
        self.source = source
        self.global_name = global_name


class PickleFormatError(InputError):
    """Data that is not a complete, well-formed pickle (truncated, garbage, unsupported opcode...)."""

    def __init__(self, message: str, *, source: str) -> None:
        super().__init__(message)
        self.source = source


_BUILTIN_NAMES = ("set", "frozenset", "bytearray", "bytes", "complex")
_BASE_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {(module, name) for module in ("builtins", "__builtin__") for name in _BUILTIN_NAMES} | {("_codecs", "encode")}
)
_NUMPY_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }
)


def _numpy_multiarray_attr(name: str) -> Any:
    """Return ``name`` from numpy's multiarray module (``numpy._core`` on numpy 2, ``numpy.core`` on 1.x)."""
    major = int(np.__version__.split(".", 1)[0])
    module = importlib.import_module("numpy._core.multiarray" if major >= 2 else "numpy.core.multiarray")
    return getattr(module, name)


def _resolve_allowed(module: str, name: str) -> Any:
    """Return the object for an allow-listed ``(module, name)`` pair (the caller has checked the list)."""
    if module in ("builtins", "__builtin__"):
        return importlib.import_module("builtins").__dict__[name]
    if module == "_codecs":
        return importlib.import_module("_codecs").encode
    if module == "numpy":
        return np.ndarray if name == "ndarray" else np.dtype
    return _numpy_multiarray_attr(name)


class _RestrictedUnpickler(pickle.Unpickler):
    """An :class:`pickle.Unpickler` whose :meth:`find_class` only resolves allow-listed globals."""

    def __init__(self, file: IO[bytes], *, allow_numpy: bool, source: str, encoding: str) -> None:
        super().__init__(file, fix_imports=False, encoding=encoding)
        self._allowed = (_BASE_ALLOWED | _NUMPY_ALLOWED) if allow_numpy else _BASE_ALLOWED
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        """Resolve ``module.name`` if it is allow-listed, else raise :class:`UnsafePickleError`."""
        if (module, name) not in self._allowed:
            dotted = f"{module}.{name}"
            raise UnsafePickleError(
                f"{self._source}: refusing to unpickle forbidden global {dotted!r} "
                "(only plain containers, and with allow_numpy plain numpy arrays, may be loaded)",
                source=self._source,
                global_name=dotted,
            )
        return _resolve_allowed(module, name)


def _reject_object_arrays(obj: Any, source: str) -> None:
    """Walk containers reachable from ``obj``; raise if any ndarray has a dtype that holds Python objects."""
    stack: list[Any] = [obj]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, np.ndarray):
            if item.dtype.hasobject:
                raise UnsafePickleError(
                    f"{source}: refusing numpy array with object dtype {item.dtype} (shape {item.shape})",
                    source=source,
                )
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)


def _load_stream(file: IO[bytes], *, allow_numpy: bool, source: str, encoding: str) -> Any:
    """Unpickle one object from ``file`` with the allow-list; wrap every failure in a ValueError subclass."""
    unpickler = _RestrictedUnpickler(file, allow_numpy=allow_numpy, source=source, encoding=encoding)
    try:
        result = unpickler.load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # pickle raises many types on bad input: EOFError, KeyError, struct.error...
        raise PickleFormatError(f"{source}: not a valid pickle ({type(exc).__name__}: {exc})", source=source) from exc
    if allow_numpy:
        _reject_object_arrays(result, source)
    return result


def restricted_loads(
    data: bytes, *, allow_numpy: bool = False, source: str = "<bytes>", encoding: str = "ASCII"
) -> Any:
    """Unpickle ``data`` allowing only plain containers (and plain numpy arrays when ``allow_numpy``).

    ``source`` is used in error messages only. ``encoding`` is how Python 2 ``str`` objects are decoded, as
    for :func:`pickle.loads`; pass ``"bytes"`` to keep them as ``bytes`` (needed for CIFAR-10 batches).
    Raises :class:`UnsafePickleError` or :class:`PickleFormatError` (both ``ValueError``).
    """
    return _load_stream(io.BytesIO(data), allow_numpy=allow_numpy, source=source, encoding=encoding)


def restricted_load(path: str | Path, *, allow_numpy: bool = False, encoding: str = "ASCII") -> Any:
    """Unpickle the first pickle in the file at ``path``; see :func:`restricted_loads`.

    Errors name the path. A file that cannot be opened raises the usual :class:`OSError`.
    """
    with Path(path).open("rb") as file:
        return _load_stream(file, allow_numpy=allow_numpy, source=str(path), encoding=encoding)
