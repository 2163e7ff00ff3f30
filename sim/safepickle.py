"""A restricted unpickler for data files.

Why this exists: several data files the simulator reads are pickles -- the CIFAR-10 "python version"
batches, and FedScale client traces. Unpickling is not parsing: a pickle is a small program for a stack
machine, and its ``GLOBAL``/``STACK_GLOBAL``/``INST``/``OBJ``/``EXT*`` opcodes import any named callable
and its ``REDUCE`` opcode calls it. ``pickle.load`` on a file from the internet can therefore run
``os.system("...")``. This module loads such files with an allow-list instead, and no allowed global is
the real callable: every one is a stand-in written here that accepts only the arguments Python's and
numpy's own picklers write, checks them, and builds the value itself.

Every global a pickle names goes through :meth:`_RestrictedUnpickler.find_class`, which resolves only the
``(module, name)`` pairs listed here (to their stand-ins) and raises :class:`UnsafePickleError` for anything
else -- before the global is imported, so a forbidden callable is never called. The unpickler is pickle's
pure-Python one, not the C one, because the C one sizes its memo by any index a ``LONG_BINPUT`` names (11
bytes can make it zero 4 GiB); of its opcodes, ``BYTEARRAY8`` is replaced by one that reads before it
allocates, and ``EXT1/2/4`` are refused. The whole pickle is in memory, and a read past its end or a last
line without its newline is a truncated pickle.

Always allowed (``allow_numpy=False``): what pickle builds natively (``dict``, ``list``, ``tuple``,
``str``, ``bytes``, ``int``, ``float``, ``bool``, ``None``, and under protocol 4+ ``set``/``frozenset``),
plus these globals, for the same plain values under older protocols (``builtins`` is also accepted under
its Python 2 spelling ``__builtin__``):

* ``builtins.set(list)``, ``builtins.frozenset(list)`` -- sets under protocols 0-3;
* ``builtins.bytearray(bytes)`` (and Python 2's ``bytearray(str, "latin-1")``) -- bytearrays under 0-4;
* ``builtins.bytes()`` -- the empty ``bytes`` object under protocols 0-2;
* ``builtins.complex(real, imag)`` with int or float parts -- complex numbers;
* ``_codecs.encode(str, "latin1")`` -- non-empty ``bytes`` under protocols 0-2.

Any other arguments (``bytearray(2**28)``, ``_codecs.encode(s, "hex")``, ...) are refused.

With ``allow_numpy=True``, plain numpy arrays and scalars as numpy pickles them at protocols 0-4 (also
under the ``numpy.core`` spelling of numpy 1.x writers):

* ``numpy.dtype(code, align, copy)`` then ``BUILD`` with ``(3, byteorder, None, None, None, -1, -1, 0)``:
  ``code`` must be one of ``b1 i1 i2 i4 i8 u1 u2 u4 u8 f2 f4 f8 c8 c16`` (optionally prefixed by a byte
  order), and the state must be exactly that of a plain numeric dtype (no subarray, no fields, no element
  size or alignment of its own, no flags). numpy's own ``dtype.__setstate__`` trusts the flags it is given
  -- a structured dtype with an object field can claim ``hasobject`` False, so bytes the file chose would
  be read as object pointers -- and is therefore never called: the stand-in builds the dtype from the
  checked code and byte order. Structured, object, string, datetime and long-double dtypes are refused.
* ``numpy._core.multiarray._reconstruct(numpy.ndarray, (0,), b"b")`` then ``BUILD`` with
  ``(1, shape, dtype, fortran_order, data)``: the array is made here with :func:`numpy.frombuffer` after
  checking that ``data`` is exactly ``prod(shape) * itemsize`` bytes, and copied in native byte order (it
  is writeable and owns its memory, as numpy's loader gives it).
* ``numpy._core.multiarray.scalar(dtype, data)`` with ``data`` of exactly ``itemsize`` bytes.

Arrays pickled with protocol 5 (``numpy._core.numeric._frombuffer``) are refused. A bare dtype, the
``numpy.ndarray`` class or a stand-in itself among the loaded values is refused too.

Caps on the sizes a file chooses: a pickle (file or bytes) may be at most :data:`MAX_PICKLE_BYTES` (1 GiB),
and what the stand-ins build from one pickle (bytes, bytearrays, arrays and scalars count their bytes, sets
16 bytes per element) at most :data:`DECODED_BYTES_PER_INPUT_BYTE` (8) times its size, at least
:data:`MIN_DECODED_BYTES` (1 MiB) and never more than :data:`MAX_DECODED_BYTES` (1 GiB). The budget is
checked before each allocation, so a 33-byte ``bytearray(2**28)`` or a loop of ``_codecs.encode`` calls on
one large string is refused without allocating. An array's shape may have at most :data:`MAX_NDIM`
dimensions, and the product of its non-zero dimensions times its item size must fit the budget. What pickle
builds natively (lists, dicts, memo entries, ...) grows at most linearly with the size of the pickle (each
opcode makes at most one object, e.g. ``}`` one empty dict of 64 bytes).

Errors: a forbidden global, refused arguments or a refused dtype, or a cap exceeded raise
:class:`UnsafePickleError`; truncated or otherwise malformed data raises :class:`PickleFormatError`. Both
are :class:`sim.errors.InputError` (a ``ValueError``) whose message names the source (file path, or
``source=`` for bytes). Raw ``pickle``/``EOFError``/... exceptions never escape.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import reprlib
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sim.errors import InputError

__all__ = [
    "DECODED_BYTES_PER_INPUT_BYTE",
    "MAX_DECODED_BYTES",
    "MAX_NDIM",
    "MAX_PICKLE_BYTES",
    "MIN_DECODED_BYTES",
    "PickleFormatError",
    "UnsafePickleError",
    "restricted_load",
    "restricted_loads",
    "short_repr",
]

MAX_PICKLE_BYTES = 1 << 30
"""Largest pickle (file or bytes) that is read at all: 1 GiB."""
MAX_DECODED_BYTES = 1 << 30
"""Most bytes the stand-ins may build from one pickle, whatever its size: 1 GiB."""
DECODED_BYTES_PER_INPUT_BYTE = 8
"""The stand-ins may build this many bytes per byte of the pickle (legitimate files need at most about 4)."""
MIN_DECODED_BYTES = 1 << 20
"""...but at least this many (1 MiB), so that tiny pickles of arrays and sets load."""
MAX_NDIM = 32
"""Most dimensions a loaded array may have."""
_SET_ELEMENT_BYTES = 16
"""What one element of a set costs against the budget (a hash-table slot; distinct elements take at least
about 3 bytes of pickle each, so legitimate sets stay well within 8 bytes per pickle byte)."""


class UnsafePickleError(InputError):
    """A pickle asked for a global outside the allow-list, or for something the stand-ins refuse.

    ``source`` names the file (or ``"<bytes>"``); ``global_name`` is the dotted global as the pickle spelled
    it (e.g. ``"posix.system"``, or ``"numpy.dtype"`` for a refused dtype), or ``None`` when the refusal
    concerns the loaded value as a whole (a bare dtype, an array never given its data, the file's size).
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


class _ShortRepr(reprlib.Repr):
    """reprlib's bounded repr, also for the values it would print whole: long ints and bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxother = 40
        self.maxtuple = self.maxlist = self.maxdict = self.maxset = self.maxfrozenset = 9

    def repr_int(self, x: int, level: int) -> str:
        return repr(x) if x.bit_length() <= 128 else f"<int of {x.bit_length()} bits>"

    def repr_bytes(self, x: bytes | bytearray, level: int) -> str:
        head = bytes(x[: self.maxstring])
        return repr(head) if len(x) <= self.maxstring else f"{head!r}...<{len(x)} bytes>"

    def repr_bytearray(self, x: bytearray, level: int) -> str:
        return f"bytearray({self.repr_bytes(x, level)})"


_SHORT = _ShortRepr()


def short_repr(value: object) -> str:
    """A repr of file-chosen data for a message: bounded in length and depth, whatever the data (also used
    by the decoders that read what this module loads)."""
    return _SHORT.repr(value)


_PLAIN_CODES = ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16")
_PLAIN_DTYPES = frozenset(np.dtype(code) for code in _PLAIN_CODES)
_ACCEPTED = (
    "only bool, int8..int64, uint8..uint64, float16..float64, complex64 and complex128 arrays and scalars "
    "may be loaded (structured, object, string, datetime and long-double dtypes are refused)"
)
_BYTE_ORDERS = ("<", ">", "=", "|")


def _text(value: object) -> str | None:
    """``value`` as text if it is a str or ASCII bytes (Python 2 strings under ``encoding="bytes"``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes) and value.isascii():
        return value.decode("ascii")
    return None


def _raw(value: object) -> bytes | None:
    """Array or scalar data: bytes, or a str of code points < 256 (Python 2 strings read as latin-1)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            return None
    return None


def _in_order(dtype: np.dtype, order: str | None) -> np.dtype:
    """``dtype`` in byte order ``order`` when that is ``<`` or ``>`` (``=`` and ``|`` leave it native)."""
    if order == "<":
        return dtype.newbyteorder("<")
    if order == ">":
        return dtype.newbyteorder(">")
    return dtype


def _is_flag(value: object) -> bool:
    """A pickled bool: True/False, or 0/1 from Python 2's protocol 0."""
    return type(value) in (bool, int) and value in (0, 1)


class _DtypeSpec:
    """What ``numpy.dtype(...)`` gives a pickle: a checked, plain numeric dtype (never a real numpy dtype
    object, so numpy's ``__setstate__`` is never called on file data)."""

    __hash__ = None  # type: ignore[assignment]  # like an array, it may not be a dict key or set element

    def __init__(self, dtype: np.dtype, decoder: _Decoder) -> None:
        self.dtype = dtype
        self._decoder = decoder
        self._built = False

    def __setstate__(self, state: object) -> None:
        """BUILD: accept only ``(3, byteorder, None, None, None, -1, -1, 0)``; apply the byte order."""
        order = _text(state[1]) if isinstance(state, tuple) and len(state) == 8 else None
        plain = (
            not self._built
            and isinstance(state, tuple)
            and len(state) == 8
            and type(state[0]) is int
            and state[0] == 3
            and order in _BYTE_ORDERS
            and (order != "|" or self.dtype.itemsize == 1)
            and state[2:5] == (None, None, None)
            and all(type(v) is int for v in state[5:])
            and state[5:] == (-1, -1, 0)
        )
        if not plain:
            raise self._decoder.refuse(
                "numpy.dtype",
                f"refusing a numpy dtype {self.dtype.str[1:]!r} whose pickled state {short_repr(state)} is not that "
                "of a plain numeric dtype (expected (3, byteorder, None, None, None, -1, -1, 0), given once); "
                f"{_ACCEPTED}",
            )
        self.dtype = _in_order(self.dtype, order)
        self._built = True


class _PendingArray:
    """What ``_reconstruct(numpy.ndarray, (0,), b"b")`` gives a pickle: an array waiting for its BUILD
    state; the loaded value is walked afterwards and each of these is replaced by its :attr:`array`."""

    __hash__ = None  # type: ignore[assignment]  # numpy arrays are unhashable; so is this

    def __init__(self, decoder: _Decoder) -> None:
        self.array: np.ndarray | None = None
        self._decoder = decoder

    def __setstate__(self, state: object) -> None:
        """BUILD: ``(1, shape, dtype, fortran_order, data)`` (or without the leading version)."""
        if self.array is not None:
            raise self._decoder.refuse("numpy.ndarray", "refusing a second state for one numpy array")
        if isinstance(state, tuple) and len(state) == 5 and type(state[0]) is int and state[0] == 1:
            state = state[1:]
        if not (isinstance(state, tuple) and len(state) == 4):
            raise self._decoder.refuse(
                "numpy.ndarray",
                f"refusing numpy array state {short_repr(state)}; expected (1, shape, dtype, fortran_order, data)",
            )
        shape, spec, fortran, data = state
        self.array = self._decoder.make_array(shape, spec, fortran, data)


class _NdarrayClass:
    """What the global ``numpy.ndarray`` gives a pickle: a token that only :meth:`_Decoder.reconstruct`
    accepts (the real class would let ``REDUCE`` allocate an array of any shape)."""

    def __init__(self, decoder: _Decoder) -> None:
        self._decoder = decoder

    def __repr__(self) -> str:
        return "numpy.ndarray"

    def __setstate__(self, state: object) -> None:
        raise self._decoder.refuse("numpy.ndarray", "refusing a state for the numpy.ndarray class itself")

    def __call__(self, *args: object) -> None:
        raise self._decoder.refuse(
            "numpy.ndarray",
            f"refusing numpy.ndarray{short_repr(args)}: arrays are loaded only as numpy pickles them, through "
            "_reconstruct(numpy.ndarray, (0,), b'b') and their state",
        )


_LEAVES = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray})
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})


class _Decoder:
    """The stand-ins for one load, sharing its source name and its decoded-bytes budget."""

    def __init__(self, source: str, size: int) -> None:
        self.source = source
        self.budget = min(MAX_DECODED_BYTES, max(MIN_DECODED_BYTES, DECODED_BYTES_PER_INPUT_BYTE * size))
        self.used = 0

    # -- errors and the budget -------------------------------------------------------------------------------
    def refuse(self, global_name: str | None, message: str) -> UnsafePickleError:
        return UnsafePickleError(f"{self.source}: {message}", source=self.source, global_name=global_name)

    def charge(self, nbytes: int, global_name: str | None, what: str) -> None:
        """Count ``nbytes`` against the budget before they are allocated; refuse when it would be exceeded."""
        if nbytes > self.budget - self.used:
            raise self.refuse(
                global_name,
                f"refusing {what}: {nbytes} bytes would bring what this pickle decodes to {self.used + nbytes} "
                f"bytes, over its cap of {self.budget} bytes ({DECODED_BYTES_PER_INPUT_BYTE} x the pickle's size, "
                f"at least {MIN_DECODED_BYTES}, at most {MAX_DECODED_BYTES})",
            )
        self.used += nbytes

    def _bad_call(self, global_name: str, args: tuple[Any, ...], accepted: str) -> UnsafePickleError:
        kinds = ", ".join(type(a).__name__ for a in args)
        return self.refuse(global_name, f"refusing {global_name}({kinds}); only {accepted} may be loaded")

    # -- builtins ---------------------------------------------------------------------------------------------
    def make_set(self, global_name: str, *args: Any) -> set[Any] | frozenset[Any]:
        kind: type[set[Any]] | type[frozenset[Any]] = set if global_name.endswith(".set") else frozenset
        if args and not (len(args) == 1 and type(args[0]) is list):
            raise self._bad_call(global_name, args, f"{kind.__name__}() and {kind.__name__}(list)")
        items = args[0] if args else []
        self.charge(_SET_ELEMENT_BYTES * len(items), global_name, f"a {kind.__name__} of {len(items)} elements")
        return kind(items)

    def make_bytearray(self, global_name: str, *args: Any) -> bytearray:
        if not args:
            return bytearray()
        if len(args) == 1 and type(args[0]) is bytes:
            data = args[0]
        elif len(args) == 2 and type(args[0]) is str and args[1] in ("latin-1", "latin1"):
            latin = _raw(args[0])  # Python 2's bytearray(unicode, "latin-1")
            if latin is None:
                raise self._bad_call(global_name, args, "bytearray(str of code points < 256, 'latin-1')")
            data = latin
        else:
            raise self._bad_call(global_name, args, "bytearray(), bytearray(bytes) and bytearray(str, 'latin-1')")
        self.charge(len(data), global_name, f"a bytearray of {len(data)} bytes")
        return bytearray(data)

    def make_bytes(self, global_name: str, *args: Any) -> bytes:
        if args:
            raise self._bad_call(global_name, args, "bytes() (the empty bytes object)")
        return b""

    def make_complex(self, global_name: str, *args: Any) -> complex:
        if len(args) > 2 or any(type(a) not in (int, float) for a in args):
            raise self._bad_call(global_name, args, "complex(real, imag) with int or float parts")
        return complex(*args)

    def encode(self, global_name: str, *args: Any) -> bytes:
        if not (len(args) == 2 and type(args[0]) is str and args[1] in ("latin1", "latin-1")):
            raise self._bad_call(global_name, args, "_codecs.encode(str, 'latin1')")
        self.charge(len(args[0]), global_name, f"bytes of length {len(args[0])}")
        data = _raw(args[0])
        if data is None:
            raise self.refuse(global_name, "refusing _codecs.encode of a str with code points >= 256")
        return data

    # -- numpy ------------------------------------------------------------------------------------------------
    def dtype(self, global_name: str, *args: Any) -> _DtypeSpec:
        code = _text(args[0]) if args else None
        flags_ok = len(args) <= 3 and all(_is_flag(a) for a in args[1:])
        order = code[0] if code and code[0] in _BYTE_ORDERS else ""
        plain = code is not None and code[len(order) :] in _PLAIN_CODES
        if not (plain and flags_ok and code is not None):
            raise self.refuse(
                global_name,
                f"refusing numpy.dtype{short_repr(args)}: {_ACCEPTED} (type codes {' '.join(_PLAIN_CODES)})",
            )
        return _DtypeSpec(_in_order(np.dtype(code[len(order) :]), order), self)

    def reconstruct(self, global_name: str, *args: Any) -> _PendingArray:
        ok = (
            len(args) == 3
            and isinstance(args[0], _NdarrayClass)
            and type(args[1]) is tuple
            and args[1] == (0,)
            and _text(args[2]) == "b"
        )
        if not ok:
            raise self.refuse(
                global_name, f"refusing {global_name}{short_repr(args)}; only _reconstruct(numpy.ndarray, (0,), b'b')"
            )
        return _PendingArray(self)

    def scalar(self, global_name: str, *args: Any) -> np.generic:
        spec = args[0] if args else None
        data = _raw(args[1]) if len(args) == 2 else None
        if not isinstance(spec, _DtypeSpec) or data is None or len(data) != spec.dtype.itemsize:
            raise self.refuse(
                global_name,
                f"refusing numpy scalar {short_repr(args)}; expected (dtype, data of the dtype's item size); "
                f"{_ACCEPTED}",
            )
        self.charge(len(data), global_name, "a numpy scalar")
        value: np.generic = np.frombuffer(data, dtype=spec.dtype)[0]
        return value

    def make_array(self, shape: object, spec: object, fortran: object, data: object) -> np.ndarray:
        """An array from a checked BUILD state, with its own (copied, writeable) memory."""
        raw = _raw(data)
        shape_ok = type(shape) is tuple and len(shape) <= MAX_NDIM and all(type(d) is int and d >= 0 for d in shape)
        if not (isinstance(spec, _DtypeSpec) and shape_ok and _is_flag(fortran) and raw is not None):
            raise self.refuse(
                "numpy.ndarray",
                f"refusing numpy array state with shape {short_repr(shape)}, dtype {short_repr(spec)}, order "
                f"{short_repr(fortran)} and data of type {type(data).__name__}; expected a tuple of at most {MAX_NDIM} "
                f"sizes >= 0, a plain dtype, a bool and bytes; {_ACCEPTED}",
            )
        assert isinstance(shape, tuple) and raw is not None  # for mypy: checked just above
        dtype = spec.dtype
        span = math.prod(d for d in shape if d) * dtype.itemsize
        if span > self.budget:
            raise self.refuse(
                "numpy.ndarray",
                f"refusing numpy array of shape {short_repr(shape)} and dtype {dtype}: {short_repr(span)} bytes "
                f"is over this pickle's cap of {self.budget} bytes",
            )
        nbytes = math.prod(shape) * dtype.itemsize
        if len(raw) != nbytes:
            raise self.refuse(
                "numpy.ndarray",
                f"refusing numpy array of shape {short_repr(shape)} and dtype {dtype}: it needs {nbytes} bytes of "
                f"data, the pickle gives {len(raw)}",
            )
        self.charge(nbytes, "numpy.ndarray", f"a numpy array of shape {short_repr(shape)}")
        order: Literal["F", "C"] = "F" if fortran else "C"
        # A copy in native byte order, as numpy's own loader gives (it swaps non-native data on load).
        array = np.empty(shape, dtype=dtype.newbyteorder("="), order=order)
        np.copyto(array, np.frombuffer(raw, dtype=dtype).reshape(shape, order=order))
        return array

    def ndarray_class(self) -> _NdarrayClass:
        return _NdarrayClass(self)

    # -- the loaded value --------------------------------------------------------------------------------------
    def finish(self, result: Any) -> Any:
        """Check every value reachable from ``result`` and put the built arrays in place of their stand-ins.

        Reachable values must be plain (the types pickle builds natively, the stand-ins' results); a bare
        dtype, the ndarray token, an array never given its state or anything else is refused. Iterative,
        so deep nesting cannot overflow the stack."""
        seen: set[int] = set()
        stack: list[Any] = [result]
        lists: list[list[Any]] = []
        dicts: list[dict[Any, Any]] = []
        tuples: list[tuple[Any, ...]] = []
        pending = False
        while stack:
            item = stack.pop()
            kind = type(item)
            if kind in _LEAVES:
                continue
            if kind in _CONTAINERS:
                if id(item) in seen:
                    continue
                seen.add(id(item))
                if kind is dict:
                    dicts.append(item)
                    stack.extend(item.keys())
                    stack.extend(item.values())
                    continue
                if kind is list:
                    lists.append(item)
                elif kind is tuple:
                    tuples.append(item)
                stack.extend(item)
            elif kind is _PendingArray:
                if item.array is None:
                    raise self.refuse("numpy.ndarray", "refusing a numpy array that the pickle never gave its data")
                pending = True
            elif isinstance(item, np.generic) and item.dtype in _PLAIN_DTYPES:
                continue  # made by self.scalar
            elif kind is _DtypeSpec:
                raise self.refuse("numpy.dtype", "refusing a bare numpy dtype; only arrays and scalars are data")
            elif kind is _NdarrayClass:
                raise self.refuse("numpy.ndarray", "refusing the numpy.ndarray class itself; only arrays are data")
            else:
                name = item.__class__.__name__
                raise self.refuse(None, f"refusing a loaded value of type {name}; only plain data may be loaded")
        return _put_arrays(result, lists, dicts, tuples) if pending else result


def _put_arrays(result: Any, lists: list[list[Any]], dicts: list[dict[Any, Any]], tuples: list[tuple[Any, ...]]) -> Any:
    """Replace every built :class:`_PendingArray` by its array: in place in lists and dict values, and by
    rebuilding the tuples that hold one (directly or through other tuples; shared tuples stay shared).

    Stand-ins are unhashable, so none is a dict key or set element. Tuples holding tuples form no cycle
    (a tuple can only reach itself through a list or dict), so children are rebuilt before parents."""
    rebuilt: dict[int, tuple[Any, ...]] = {}
    done: set[int] = set()

    def swap(x: Any) -> Any:
        if type(x) is _PendingArray:
            return x.array
        if type(x) is tuple:
            return rebuilt.get(id(x), x)
        return x

    for top in tuples:
        work: list[tuple[tuple[Any, ...], bool]] = [(top, False)]
        while work:
            node, expanded = work.pop()
            if id(node) in done:
                continue
            if not expanded:
                work.append((node, True))
                work.extend((child, False) for child in node if type(child) is tuple and id(child) not in done)
                continue
            items = tuple(swap(x) for x in node)
            if any(new is not old for new, old in zip(items, node, strict=True)):
                rebuilt[id(node)] = items
            done.add(id(node))
    for lst in lists:
        for i, x in enumerate(lst):
            y = swap(x)
            if y is not x:
                lst[i] = y
    for dct in dicts:
        for key, x in dct.items():
            y = swap(x)
            if y is not x:
                dct[key] = y
    return swap(result)


_BUILTINS = {
    "set": _Decoder.make_set,
    "frozenset": _Decoder.make_set,
    "bytearray": _Decoder.make_bytearray,
    "bytes": _Decoder.make_bytes,
    "complex": _Decoder.make_complex,
}
_BASE_ALLOWED: dict[tuple[str, str], Callable[..., Any]] = {
    **{(module, name): f for module in ("builtins", "__builtin__") for name, f in _BUILTINS.items()},
    ("_codecs", "encode"): _Decoder.encode,
}
_NUMPY_ALLOWED: dict[tuple[str, str], Callable[..., Any]] = {
    ("numpy", "dtype"): _Decoder.dtype,
    **{(f"numpy.{core}.multiarray", "_reconstruct"): _Decoder.reconstruct for core in ("core", "_core")},
    **{(f"numpy.{core}.multiarray", "scalar"): _Decoder.scalar for core in ("core", "_core")},
}


class _StrictInput:
    """The pickle's bytes as the unpickler reads them outside frames (inside one, pickle checks its reads
    itself): a short read, or a last line without its newline, is a truncated pickle, not data."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, n: int) -> bytes:
        chunk = self._data.read(n)
        if len(chunk) < n:
            raise EOFError("pickle data was truncated")
        return chunk

    def readline(self) -> bytes:
        line = self._data.readline()
        if not line.endswith(b"\n"):
            raise EOFError("pickle data was truncated")
        return line


def _load_bytearray8(unpickler: Any) -> None:
    """``BYTEARRAY8`` that reads the bytes before making the bytearray (pickle's would allocate the length the
    pickle claims first) and counts them against the budget."""
    (length,) = struct.unpack("<Q", unpickler.read(8))
    data = unpickler.read(length)  # no more than the pickle holds: a short read raises
    unpickler._decoder.charge(len(data), None, f"a bytearray of {len(data)} bytes")
    unpickler.append(bytearray(data))


def _refuse_extension(unpickler: Any) -> None:
    raise pickle.UnpicklingError("extension codes (EXT1, EXT2, EXT4) are not supported")


_DISPATCH = dict(pickle._Unpickler.dispatch)
_DISPATCH[pickle.BYTEARRAY8[0]] = _load_bytearray8
_DISPATCH.update({opcode[0]: _refuse_extension for opcode in (pickle.EXT1, pickle.EXT2, pickle.EXT4)})


class _RestrictedUnpickler(pickle._Unpickler):
    """pickle's pure-Python unpickler, whose :meth:`find_class` only resolves allow-listed globals, to stand-ins.

    Not the C ``pickle.Unpickler``: that one grows its memo to twice any index a ``PUT``/``LONG_BINPUT``
    names, and zeroes it, so the 11 bytes ``\\x80\\x02K\\x01r\\xff\\xff\\xff\\x0f.`` make it allocate and
    touch 4 GiB. The Python one keeps its memo in a dict; its two opcodes that act on a number the pickle
    chooses are replaced: ``BYTEARRAY8`` (which would allocate the claimed length before reading) reads the
    bytes first and counts them against the budget, and ``EXT1/2/4`` (copyreg's extension registry, whose
    cache is global) are refused. About three times slower than the C unpickler, which data files read once
    can afford."""

    dispatch = _DISPATCH

    def __init__(self, data: bytes, *, decoder: _Decoder, allow_numpy: bool, encoding: str) -> None:
        super().__init__(_StrictInput(data), fix_imports=False, encoding=encoding)
        self._decoder = decoder
        self._allow_numpy = allow_numpy

    def find_class(self, module: str, name: str) -> Any:
        """Resolve ``module.name`` to its stand-in if it is allow-listed, else raise :class:`UnsafePickleError`."""
        key = (module, name)
        dotted = f"{module}.{name}"
        if self._allow_numpy and key == ("numpy", "ndarray"):
            return self._decoder.ndarray_class()
        stand_in = _BASE_ALLOWED.get(key) or (_NUMPY_ALLOWED.get(key) if self._allow_numpy else None)
        if stand_in is None:
            raise self._decoder.refuse(
                dotted,
                f"refusing to unpickle forbidden global {dotted!r} "
                "(only plain containers, and with allow_numpy plain numpy arrays, may be loaded)",
            )
        decoder = self._decoder
        return lambda *args: stand_in(decoder, dotted, *args)


def _load(data: bytes, *, allow_numpy: bool, source: str, encoding: str) -> Any:
    """Unpickle the first pickle in ``data`` with the stand-ins; wrap every failure in an InputError."""
    if len(data) > MAX_PICKLE_BYTES:
        raise UnsafePickleError(
            f"{source}: {len(data)} bytes is larger than the {MAX_PICKLE_BYTES} bytes a pickle may have",
            source=source,
        )
    decoder = _Decoder(source, len(data))
    unpickler = _RestrictedUnpickler(data, decoder=decoder, allow_numpy=allow_numpy, encoding=encoding)
    try:
        result = unpickler.load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # pickle raises many types on bad input: EOFError, KeyError, struct.error...
        message = str(exc) if len(str(exc)) <= 200 else f"{str(exc)[:200]}..."
        raise PickleFormatError(
            f"{source}: not a valid pickle ({type(exc).__name__}: {message})", source=source
        ) from exc
    return decoder.finish(result)


def restricted_loads(
    data: bytes, *, allow_numpy: bool = False, source: str = "<bytes>", encoding: str = "ASCII"
) -> Any:
    """Unpickle ``data`` allowing only plain containers (and plain numpy arrays when ``allow_numpy``).

    ``source`` is used in error messages only. ``encoding`` is how Python 2 ``str`` objects are decoded, as
    for :func:`pickle.loads`; pass ``"bytes"`` to keep them as ``bytes`` (needed for CIFAR-10 batches).
    Raises :class:`UnsafePickleError` or :class:`PickleFormatError` (both ``ValueError``).
    """
    return _load(bytes(data), allow_numpy=allow_numpy, source=source, encoding=encoding)


def restricted_load(path: str | Path, *, allow_numpy: bool = False, encoding: str = "ASCII") -> Any:
    """Unpickle the first pickle in the file at ``path``; see :func:`restricted_loads`.

    The file is read whole (so no length the pickle claims can make the reader allocate more than the file
    holds) after checking it is at most :data:`MAX_PICKLE_BYTES`. Errors name the path. A file that cannot
    be opened raises the usual :class:`OSError`.
    """
    p = Path(path)
    with p.open("rb") as file:
        info = os.fstat(file.fileno())
        if info.st_size > MAX_PICKLE_BYTES:
            raise UnsafePickleError(
                f"{p}: {info.st_size} bytes is larger than the {MAX_PICKLE_BYTES} bytes a pickle may have",
                source=str(p),
            )
        if stat.S_ISREG(info.st_mode):
            data = file.read(info.st_size)  # (a pickle ends at its STOP: bytes appended since do not matter)
        else:  # a pipe or device has no size: read it in pieces, up to one byte over the cap
            pieces: list[bytes] = []
            total = 0
            while total <= MAX_PICKLE_BYTES and (piece := file.read(1 << 20)):
                pieces.append(piece)
                total += len(piece)
            data = b"".join(pieces)
    return _load(data, allow_numpy=allow_numpy, source=str(p), encoding=encoding)
