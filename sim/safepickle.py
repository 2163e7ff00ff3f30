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
allocates, ``BUILD`` is given only to the dtype and array stand-ins, ``EXT1/2/4`` and out-of-band buffers
are refused, and those that make or fill objects are checked and charged (below). The whole pickle is in
memory, and a read past its end or a last line without its newline is a truncated pickle.

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
``numpy.ndarray`` class or a stand-in itself among the loaded values is refused too, and so is a ``BUILD``
on anything but a dtype or an array (a numpy scalar, say).

Caps on the sizes a file chooses: a pickle (file or bytes) may be at most :data:`MAX_PICKLE_BYTES` (1 GiB),
and what the stand-ins build from one pickle (bytes, bytearrays, arrays and scalars count their bytes, sets
16 bytes per element) at most :data:`DECODED_BYTES_PER_INPUT_BYTE` (8) times its size, at least
:data:`MIN_DECODED_BYTES` (1 MiB) and never more than :data:`MAX_DECODED_BYTES` (1 GiB). The budget is
checked before each allocation, so a 33-byte ``bytearray(2**28)`` or a loop of ``_codecs.encode`` calls on
one large string is refused without allocating. An array's shape may have at most :data:`MAX_NDIM`
dimensions, each a size from 0 to :data:`MAX_DIMENSION` (2**30), and the product of its non-zero sizes times
its item size must fit the budget. Each size is compared with that bound before any product is formed: the
file chooses how many digits an int has, and comparing it with a small int takes one step whatever its
length, while multiplying such ints takes time that grows faster than their length.

What pickle builds natively has a budget of its own, because Python objects are large next to their pickle: a
1-byte ``}`` makes a 64-byte dict, ``\\x8f`` a 216-byte set, and a FedScale trace of short sessions takes many
bytes of objects per byte (docs/performance.md, "Safe unpickling"). After each opcode, what it made is
charged: a new object its ``sys.getsizeof`` (nothing for CPython's shared ``None``, bools, small ints,
``()``...), a stack slot 8 bytes, a ``MARK`` an empty list (given back when the mark is consumed), the growth
of a list, dict, set or of the memo, and an entry of this module's own tables about 112 bytes. The total may
reach :data:`NATIVE_BYTES_PER_INPUT_BYTE` (32) times the pickle's size, at least :data:`MIN_NATIVE_BYTES`
(1 MiB), at most :data:`MAX_NATIVE_BYTES` (2 GiB). As it is charged once made, the opcode that crosses the
budget may have grown one table past it: a load holds at most the pickle, one frame's copy, the decoded budget
and twice the native one: 10 MB of ``}`` is refused at 320 MB, and a 1 GiB pickle stays under about 7 GiB
(what such loads took without these caps: docs/performance.md, "Safe unpickling"). ``PUT`` takes memo indices
below ``2**32``, those ``LONG_BINPUT`` can name, so that the memo's keys cannot collide.

Nesting: no container may be more than :data:`MAX_DEPTH` (256) deep (a flat list is 1 deep). Depth is kept
as containers are made and filled (``TUPLE*``, ``LIST``, ``DICT``, ``FROZENSET``, ``EMPTY_*``,
``APPEND(S)``, ``SETITEM(S)``, ``ADDITEMS``, the ``set``/``frozenset`` stand-ins) and checked before any
key is hashed: hashing a tuple recurses in C without a depth check, and a million nested 1-tuples as a dict
key crashed the process. A list or dict filled after it was nested in another is caught by the last walk
over the loaded value (depth-first, following no cycle twice).

Keys: hashing and comparing dict keys and set elements may take :data:`KEY_WORK_PER_INPUT_BYTE` (8) steps per
byte of pickle, at least :data:`MIN_KEY_WORK` (2**20). A file can choose keys of one hash -- ints beyond
``2**61 - 2`` (``hash(n)`` is ``n`` mod ``2**61 - 1``), complex numbers (``hash(complex(-1000003 k, k))`` is
0), tuples and frozensets of small ints (their hashes can be solved for), floats (a few dozen per hash) -- and
a dict compares each with every earlier key of its hash, n^2 / 2 comparisons for n such keys (what that took
without this charge: docs/performance.md, "Safe unpickling"). Nor is a tuple's hash cached: shared tuples
nested 60 deep take ``2**60`` steps to hash. So each key but a ``str``, ``bytes``, ``None``, bool or int below
``2**61 - 1`` (hashes a file cannot make collide: strings are hashed with a per-process random key, such ints
are their own hash) is charged the steps its hash takes (each tuple item as often as it is reached, a big
int's digits, a frozenset's elements) times one more than the keys of its hash already in the dict or set.

Errors: a forbidden global, refused arguments or a refused dtype, or a cap exceeded raise
:class:`UnsafePickleError`; truncated or otherwise malformed data raises :class:`PickleFormatError`. Both
are :class:`sim.errors.InputError` (a ``ValueError``) whose message names the source (file path, or
``source=`` for bytes). Raw ``pickle``/``EOFError``/... exceptions never escape.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import pickle
import pickletools
import reprlib
import stat
import struct
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sim.errors import InputError

__all__ = [
    "DECODED_BYTES_PER_INPUT_BYTE",
    "KEY_WORK_PER_INPUT_BYTE",
    "MAX_DECODED_BYTES",
    "MAX_DEPTH",
    "MAX_DIMENSION",
    "MAX_NATIVE_BYTES",
    "MAX_NDIM",
    "MAX_PICKLE_BYTES",
    "MIN_DECODED_BYTES",
    "MIN_KEY_WORK",
    "MIN_NATIVE_BYTES",
    "NATIVE_BYTES_PER_INPUT_BYTE",
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
"""The stand-ins may build this many bytes per byte of the pickle (what legitimate files need:
docs/performance.md, "Safe unpickling")."""
MIN_DECODED_BYTES = 1 << 20
"""...but at least this many (1 MiB), so that tiny pickles of arrays and sets load."""
MAX_NDIM = 32
"""Most dimensions a loaded array may have."""
MAX_DIMENSION = MAX_DECODED_BYTES
"""Largest size of one dimension of a loaded array (2**30): a larger one belongs only to an array over every
pickle's budget, or to an empty one. With :data:`MAX_NDIM`, it bounds the product of the sizes at 2**960."""
NATIVE_BYTES_PER_INPUT_BYTE = 32
"""What pickle builds natively (objects, stack slots, container and memo growth) may take this many bytes
per byte of the pickle (what FedScale traces take: docs/performance.md, "Safe unpickling")."""
MIN_NATIVE_BYTES = 1 << 20
"""...but at least this many (1 MiB)."""
MAX_NATIVE_BYTES = 2 << 30
"""...and never more than this many (2 GiB; what FedScale's own traces need: docs/performance.md, "Safe
unpickling")."""
MAX_DEPTH = 256
"""Deepest nesting of containers in a loaded value (a flat list is 1 deep): far below what hashing,
comparing or printing it could recurse into before the interpreter's recursion limit or the C stack."""
KEY_WORK_PER_INPUT_BYTE = 8
"""Steps that hashing and comparing dict keys and set elements may take per byte of the pickle."""
MIN_KEY_WORK = 1 << 20
"""...but at least this many."""
_HASH_MODULUS = sys.hash_info.modulus
"""``hash(n)`` of an int is ``n`` modulo this (``2**61 - 1`` on 64-bit builds), so ints of smaller magnitude
never share a hash (but -1 and -2)."""
_MAX_MEMO_INDEX = 1 << 32
"""Memo indices a ``PUT`` may name: those ``LONG_BINPUT`` can (larger ones could be chosen to collide)."""
_SLOT_BYTES = 8
"""A reference in the stack, a list or a tuple."""
_LIST_BYTES = sys.getsizeof([])
"""An empty list: what a ``MARK`` starts."""
_INT_BYTES = sys.getsizeof(1 << 40)
"""A memo index as a key of the memo dict."""
_TABLE_ENTRY_BYTES = 112
"""One entry of the bookkeeping kept by id or hash (depth of a nested container, keys per hash of a dict or
set): a bound on a dict entry with its int key over the dict's growth (docs/performance.md, "Safe
unpickling")."""
_WALK_AGAIN = 16
"""The last walk over a loaded value remembers the heights of containers that hold containers or more than
this many items; smaller flat ones are checked again each time they are met (a pickle's 1-byte references
to them cost it at least a byte each)."""
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

    __slots__ = ("_built", "_decoder", "dtype")
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

    __slots__ = ("_decoder", "array")
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

    __slots__ = ("_decoder",)

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
_BUILDABLE = (_DtypeSpec, _PendingArray, _NdarrayClass)
"""The only objects a ``BUILD`` may give a state to (the last refuses it itself)."""


def _hash_steps(value: object) -> int:
    """Steps ``hash(value)`` takes, and one comparison with a value like it: a big int's 30-bit digits, a
    frozenset's size (its first hash, and ``==``), a tuple's items -- all of them, every time: a tuple's hash
    is not cached, so a tuple held twice counts twice. Each tuple within ``value`` is worked out once, from
    the tuples it holds: shared tuples nested 60 deep cost 2**60 steps, found in 60."""
    if type(value) is int:
        return 1 + value.bit_length() // 30
    if type(value) is frozenset:
        return 1 + len(value)
    if type(value) is not tuple:
        return 1
    if not any(type(x) is tuple for x in value):  # (most tuple keys; inlined, as they can be many)
        return 1 + sum(1 + x.bit_length() // 30 if type(x) is int else _hash_steps(x) for x in value)
    steps: dict[int, int] = {}  # id of a tuple within value -> its steps
    todo: list[tuple[Any, bool]] = [(value, False)]
    while todo:
        item, ready = todo.pop()
        if ready:  # the tuples it holds are done
            steps[id(item)] = 1 + sum(steps[id(x)] if type(x) is tuple else _hash_steps(x) for x in item)
        elif id(item) not in steps:
            todo.append((item, True))
            todo.extend([(x, False) for x in item if type(x) is tuple])
    return steps[id(value)]


def _new_object_bytes(value: object) -> int:
    """What a value an opcode made takes: ``sys.getsizeof``, or nothing for the objects CPython shares
    (``None``, bools, ints -5..256, ``()``, empty and one-character latin-1 strings and bytes)."""
    if value is None or type(value) is bool:
        return 0
    if type(value) is int and -5 <= value <= 256:
        return 0
    if type(value) is tuple and not value:
        return 0
    if type(value) is bytes and len(value) <= 1:
        return 0
    if type(value) is str and (not value or (len(value) == 1 and ord(value) < 256)):
        return 0
    return sys.getsizeof(value)


class _Decoder:
    """The stand-ins for one load, and what that load may spend: its decoded-bytes budget, its native-object
    budget, the nesting depth of its containers and the work of hashing their keys.

    Depths and keys-per-hash are kept by ``id`` of the container; every container the load makes goes
    through :meth:`made`, which overwrites what a freed container at the same address left behind."""

    def __init__(self, source: str, size: int) -> None:
        self.source = source
        self.budget = min(MAX_DECODED_BYTES, max(MIN_DECODED_BYTES, DECODED_BYTES_PER_INPUT_BYTE * size))
        self.used = 0
        self.native_budget = min(MAX_NATIVE_BYTES, max(MIN_NATIVE_BYTES, NATIVE_BYTES_PER_INPUT_BYTE * size))
        self.native_left = self.native_budget  # (what is left rather than what is used: one compare per opcode)
        self.key_work_budget = max(MIN_KEY_WORK, KEY_WORK_PER_INPUT_BYTE * size)
        self.key_work = 0
        self._depths: dict[int, int] = {}  # id -> depth, for containers more than 1 deep
        self._per_hash: dict[int, dict[int, int]] = {}  # id of a dict or set -> {hash: keys of that hash}

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

    def charge_native(self, nbytes: int, what: str, global_name: str | None = None) -> None:
        """Count ``nbytes`` that pickle's own opcodes (or the stand-in ``global_name``) made (``what``) against
        the native budget."""
        self.native_left -= nbytes
        if self.native_left < 0:
            raise self.over_native(what, global_name)

    def over_native(self, what: str, global_name: str | None = None) -> UnsafePickleError:
        return self.refuse(
            global_name,
            f"refusing {what}: what this pickle builds natively (objects, stack, memo) would reach "
            f"{self.native_budget - self.native_left} bytes, over its cap of {self.native_budget} bytes "
            f"({NATIVE_BYTES_PER_INPUT_BYTE} x the pickle's size, at least {MIN_NATIVE_BYTES}, at most "
            f"{MAX_NATIVE_BYTES})",
        )

    def credit_native(self, nbytes: int) -> None:
        """Give back ``nbytes`` charged for something that is freed (a ``MARK``'s list)."""
        self.native_left += nbytes

    # -- nesting and keys -------------------------------------------------------------------------------------
    def depth(self, value: object) -> int:
        """How deep a container is (1 when flat), 0 for anything else."""
        return self._depths.get(id(value), 1) if type(value) in _CONTAINERS else 0

    def nested(self, children: Iterable[Any], depth: int = 1) -> int:
        """The depth of a container ``depth`` deep once it also holds ``children``; refused past MAX_DEPTH."""
        depths = self._depths
        for child in children:
            if type(child) in _CONTAINERS:
                below = depths.get(id(child), 1)
                if below >= depth:
                    depth = below + 1
        if depth > MAX_DEPTH:
            raise self._too_deep()
        return depth

    def made(self, container: object, depth: int, per_hash: dict[int, int] | None = None) -> None:
        """Record a new container: its depth, and for a dict or set its keys per hash (forgetting what a freed
        container at the same address left)."""
        key = id(container)
        if depth > 1:
            if key not in self._depths:
                self.charge_native(_TABLE_ENTRY_BYTES, "the depth of a nested container")
            self._depths[key] = depth
        else:
            self._depths.pop(key, None)
        if per_hash:
            self._per_hash[key] = per_hash
        else:
            self._per_hash.pop(key, None)

    def filled(self, container: object, depth: int) -> None:
        """Record the depth of a container that received items (its keys per hash are kept as they are)."""
        key = id(container)
        if depth > 1:
            if key not in self._depths:
                self.charge_native(_TABLE_ENTRY_BYTES, "the depth of a nested container")
            self._depths[key] = depth

    def admit_keys_into(self, container: object, keys: Iterable[Any]) -> None:
        """:meth:`admit_keys` for keys going into an existing dict or set."""
        per_hash = self.admit_keys(keys, self._per_hash.get(id(container)))
        if per_hash is not None:
            self._per_hash[id(container)] = per_hash

    def admit_keys(self, keys: Iterable[Any], per_hash: dict[int, int] | None) -> dict[int, int] | None:
        """Charge the work of hashing ``keys`` into a dict or set whose keys per hash are ``per_hash`` (None:
        none counted yet), before it is done; return the updated counts.

        A key is compared with every earlier key of its hash, so it costs its hash's steps times one more
        than their number. str, bytes, None, bools and ints below the hash modulus are free: their hashes
        cannot be made to collide. The caller checked depths first, so hashing here cannot recurse deep."""
        for key in keys:
            kind = type(key)
            if kind is str or kind is bytes or key is None or kind is bool:
                continue
            if kind is int and -_HASH_MODULUS < key < _HASH_MODULUS:
                continue
            steps = self._hash_steps(key)
            value = hash(key)  # TypeError for an unhashable key, as the dict or set would raise
            if per_hash is None:
                per_hash = {}
            earlier = per_hash.get(value, 0)
            self.key_work += steps * (2 + earlier)  # our hash, the container's, and one comparison per earlier key
            if self.key_work > self.key_work_budget:
                raise self._key_refusal(key, earlier)
            if not earlier:
                self.charge_native(_TABLE_ENTRY_BYTES, "keys per hash of a dict or set")
            per_hash[value] = earlier + 1
        return per_hash

    def _hash_steps(self, key: object) -> int:
        """:func:`_hash_steps` of ``key``, refused if more than is left of the budget."""
        steps = _hash_steps(key)
        if steps > self.key_work_budget - self.key_work:
            raise self._key_refusal(key, 0)
        return steps

    def _key_refusal(self, key: object, earlier: int) -> UnsafePickleError:
        why = f"{earlier} earlier keys share its hash" if earlier else "hashing it takes many steps"
        return self.refuse(
            None,
            f"refusing dict key or set element {short_repr(key)} ({why}): hashing and comparing this pickle's "
            f"keys would take more than {self.key_work_budget} steps ({KEY_WORK_PER_INPUT_BYTE} per byte of "
            f"pickle, at least {MIN_KEY_WORK}); data files have keys whose hashes differ",
        )

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
        depth = self.nested(items)
        per_hash = self.admit_keys(items, None)
        made = kind(items)
        self.made(made, depth, per_hash if kind is set else None)
        return made

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
        # Compared before they are multiplied (a comparison with a small int is one step, whatever its digits).
        big = next((d for d in shape if d > MAX_DIMENSION), None)
        if big is not None:
            raise self.refuse(
                "numpy.ndarray",
                f"refusing numpy array of shape {short_repr(shape)} and dtype {dtype}: a size of {short_repr(big)} "
                f"is over the {MAX_DIMENSION} any size may be (an array of it would be over every pickle's cap of "
                f"at most {MAX_DECODED_BYTES} bytes)",
            )
        span = math.prod(d for d in shape if d) * dtype.itemsize  # at most MAX_NDIM factors of 2**30
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
        dtype, the ndarray token, an array never given its state or anything else is refused. Containers
        may nest at most MAX_DEPTH deep here too: a list or dict filled after it was put in another escapes
        the depth kept as the pickle ran. Iterative (a depth-first walk that does not follow a cycle twice),
        so deep nesting costs no stack. Each container's height is remembered, so shared nesting costs no
        time, but for small flat ones, walked again when met again (at most _WALK_AGAIN steps each time): so
        what the walk remembers takes no more than the depth table it replaces (freed here) and a fraction of
        what the containers themselves were charged."""
        self._depths = {}
        self._per_hash = {}
        heights: dict[int, int] = {}  # id -> height, for containers walked
        walking: set[int] = set()  # ids of the containers on the current path
        frames: list[list[Any]] = []  # [container, iterator over its children, height so far]
        lists: list[list[Any]] = []
        dicts: list[dict[Any, Any]] = []
        tuples: list[tuple[Any, ...]] = []
        pending = False

        def enter(item: Any) -> int | None:
            """The height of ``item`` if known (0 for a leaf), or None once a frame is pushed to walk it."""
            nonlocal pending
            kind = type(item)
            if kind in _LEAVES:
                return 0
            if kind in _CONTAINERS:
                key = id(item)
                if key in heights:
                    return heights[key]
                if key in walking:
                    return 0  # a cycle: its container is counted where the walk first met it
                if kind is dict:
                    dicts.append(item)
                elif kind is list:
                    lists.append(item)
                elif kind is tuple:
                    tuples.append(item)
                if len(item) <= _WALK_AGAIN and not any(type(c) in _CONTAINERS for c in _children(item)):
                    for child in _children(item):
                        if type(child) not in _LEAVES:
                            enter(child)  # not a container: a check, and a height of 0
                    return 1
                walking.add(key)
                frames.append([item, iter(_children(item)), 1])
                if len(frames) > MAX_DEPTH:
                    raise self._too_deep()
                return None
            if kind is _PendingArray:
                if item.array is None:
                    raise self.refuse("numpy.ndarray", "refusing a numpy array that the pickle never gave its data")
                pending = True
                return 0
            if isinstance(item, np.generic) and item.dtype in _PLAIN_DTYPES:
                return 0  # made by self.scalar
            if kind is _DtypeSpec:
                raise self.refuse("numpy.dtype", "refusing a bare numpy dtype; only arrays and scalars are data")
            if kind is _NdarrayClass:
                raise self.refuse("numpy.ndarray", "refusing the numpy.ndarray class itself; only arrays are data")
            name = item.__class__.__name__
            raise self.refuse(None, f"refusing a loaded value of type {name}; only plain data may be loaded")

        enter(result)
        while frames:
            frame = frames[-1]
            for child in frame[1]:
                if type(child) in _LEAVES:
                    continue  # (most children: spare them a call)
                below = enter(child)
                if below is None:
                    break  # walk the child first; its height reaches this frame when it is done
                if below >= frame[2]:
                    frame[2] = below + 1
            else:
                frames.pop()
                container, _, height = frame
                if height > MAX_DEPTH:
                    raise self._too_deep()
                heights[id(container)] = height
                walking.discard(id(container))
                if frames and height >= frames[-1][2]:
                    frames[-1][2] = height + 1
        return _put_arrays(result, lists, dicts, tuples) if pending else result

    def _too_deep(self) -> UnsafePickleError:
        return self.refuse(
            None,
            f"refusing containers nested more than {MAX_DEPTH} deep (lists, tuples, dicts and sets within each "
            "other); data files nest a few levels",
        )


def _children(container: Any) -> Iterable[Any]:
    """What a container holds: a dict its keys and values."""
    return itertools.chain(container.keys(), container.values()) if type(container) is dict else container


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


# -- pickle's opcodes, charged and checked ---------------------------------------------------------------------
# Each function below replaces pickle._Unpickler's for one opcode: the same effect, plus the depth, key and
# native-budget bookkeeping of _Decoder. ``u`` is the _RestrictedUnpickler running.


def _pushed(u: Any, value: object, what: str) -> None:
    """``value`` was just pushed, as a new object (charged with its stack slot)."""
    u.decoder.charge_native(_SLOT_BYTES + _new_object_bytes(value), what)


def _pushing(load: Callable[[Any], None], name: str, *, new: bool) -> Callable[[Any], None]:
    """An opcode that pushes one value: charged its stack slot, and when ``new`` what the value takes (a
    value read from the pickle; a reference to the memo, the stack or a global's stand-in takes nothing).
    Inlined, and ints apart: these are most of a pickle's opcodes."""
    what = f"the value of a {name}" if new else f"a reference ({name})"

    def charged_int(u: Any) -> None:
        load(u)
        value = u.stack[-1]
        decoder = u.decoder
        decoder.native_left -= _SLOT_BYTES if -5 <= value <= 256 else _SLOT_BYTES + sys.getsizeof(value)
        if decoder.native_left < 0:
            raise decoder.over_native(what)

    def charged_value(u: Any) -> None:
        load(u)
        decoder = u.decoder
        decoder.native_left -= _SLOT_BYTES + _new_object_bytes(u.stack[-1])
        if decoder.native_left < 0:
            raise decoder.over_native(what)

    def charged_reference(u: Any) -> None:
        load(u)
        decoder = u.decoder
        decoder.native_left -= _SLOT_BYTES
        if decoder.native_left < 0:
            raise decoder.over_native(what)

    if not new:
        return charged_reference
    return charged_int if name in _INT_OPCODES else charged_value


def _memoizing(load: Callable[[Any], None], name: str) -> Callable[[Any], None]:
    """An opcode that puts the top of the stack in the memo: charged what the memo has grown to since last
    charged (its table, and an int per index)."""
    what = f"a memo entry ({name})"

    def charged(u: Any) -> None:
        load(u)
        memo = u.memo
        if len(memo) > u.memo_entries:
            u.memo_entries = len(memo)
            size = sys.getsizeof(memo) + _INT_BYTES * len(memo)
            u.decoder.charge_native(size - u.memo_bytes, what)
            u.memo_bytes = size

    return charged


def _load_put(u: Any) -> None:
    """``PUT``: its index is text, any size; keep it to LONG_BINPUT's range, so the memo's keys cannot collide."""
    index = int(u.readline()[:-1])
    if not 0 <= index < _MAX_MEMO_INDEX:
        raise pickle.UnpicklingError(f"PUT index {short_repr(index)} is outside 0..2**32-1")
    u.memo[index] = u.stack[-1]


def _load_mark(u: Any) -> None:
    u.metastack.append(u.stack)
    u.stack = []
    u.append = u.stack.append
    u.decoder.charge_native(_LIST_BYTES + _SLOT_BYTES, "a MARK")


def _load_empty(factory: Callable[[], Any], name: str) -> Callable[[Any], None]:
    """``EMPTY_DICT``, ``EMPTY_LIST``, ``EMPTY_SET``: a new flat container."""
    what = f"an {name}"

    def load(u: Any) -> None:
        container = factory()
        u.decoder.made(container, 1)
        u.append(container)
        _pushed(u, container, what)

    return load


def _made_tuple(u: Any, items: tuple[Any, ...]) -> None:
    u.decoder.made(items, u.decoder.nested(items))
    u.decoder.charge_native(_new_object_bytes(items), "a tuple")


def _load_tuple1(u: Any) -> None:
    made = (u.stack[-1],)
    _made_tuple(u, made)
    u.stack[-1] = made


def _load_tuple2(u: Any) -> None:
    made = (u.stack[-2], u.stack[-1])
    _made_tuple(u, made)
    u.stack[-2:] = [made]


def _load_tuple3(u: Any) -> None:
    made = (u.stack[-3], u.stack[-2], u.stack[-1])
    _made_tuple(u, made)
    u.stack[-3:] = [made]


def _load_tuple(u: Any) -> None:
    made = tuple(u.pop_mark())
    _made_tuple(u, made)
    u.append(made)
    u.decoder.charge_native(_SLOT_BYTES, "a tuple")


def _load_list(u: Any) -> None:
    made = u.pop_mark()  # the MARK's list itself, now kept: charged again as a list
    u.decoder.made(made, u.decoder.nested(made))
    u.append(made)
    _pushed(u, made, "a LIST")


def _load_dict(u: Any) -> None:
    items = u.pop_mark()
    if len(items) % 2:
        raise pickle.UnpicklingError("DICT with an odd number of items")
    depth = u.decoder.nested(items)
    keys = items[0::2]
    per_hash = u.decoder.admit_keys(keys, None)
    made = dict(zip(keys, items[1::2], strict=True))
    u.decoder.made(made, depth, per_hash)
    u.append(made)
    _pushed(u, made, "a DICT")


def _load_frozenset(u: Any) -> None:
    items = u.pop_mark()
    depth = u.decoder.nested(items)
    u.decoder.admit_keys(items, None)
    made = frozenset(items)
    u.decoder.made(made, depth)
    u.append(made)
    _pushed(u, made, "a FROZENSET")


def _load_append(u: Any) -> None:
    value = u.stack.pop()
    _append(u, u.stack[-1], [value])


def _load_appends(u: Any) -> None:
    items = u.pop_mark()
    _append(u, u.stack[-1], items)


def _append(u: Any, target: Any, items: list[Any]) -> None:
    """``APPEND(S)``: a list (or a bytearray) takes ``items``; charged what it grows by."""
    size = sys.getsizeof(target)
    if type(target) is list:
        depth = u.decoder.nested(items, u.decoder.depth(target))
        target.extend(items)
        u.decoder.filled(target, depth)
    else:  # pickle's own fallback: extend, or append one by one (AttributeError for anything else)
        try:
            extend = target.extend
        except AttributeError:
            for item in items:
                target.append(item)
        else:
            extend(items)
    u.decoder.charge_native(max(0, sys.getsizeof(target) - size), "items appended to a list")


def _load_setitem(u: Any) -> None:
    value = u.stack.pop()
    key = u.stack.pop()
    _setitems(u, u.stack[-1], [key, value])


def _load_setitems(u: Any) -> None:
    items = u.pop_mark()
    _setitems(u, u.stack[-1], items)


def _setitems(u: Any, target: Any, items: list[Any]) -> None:
    """``SETITEM(S)``: ``target[key] = value`` for each pair of ``items``; a dict's keys are admitted first."""
    if len(items) % 2:
        raise pickle.UnpicklingError("SETITEMS with an odd number of items")
    size = sys.getsizeof(target)
    kind = type(target)
    depth = u.decoder.nested(items, u.decoder.depth(target)) if kind in _CONTAINERS else 0
    if kind is dict:
        u.decoder.admit_keys_into(target, items[0::2])
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]  # a list takes int indices; anything else raises
    if depth:
        u.decoder.filled(target, depth)
    u.decoder.charge_native(max(0, sys.getsizeof(target) - size), "items set in a dict")


def _load_additems(u: Any) -> None:
    items = u.pop_mark()
    target = u.stack[-1]
    if type(target) is not set:
        raise pickle.UnpicklingError(f"ADDITEMS to a {type(target).__name__}, not a set")
    size = sys.getsizeof(target)
    depth = u.decoder.nested(items, u.decoder.depth(target))
    u.decoder.admit_keys_into(target, items)
    target.update(items)
    u.decoder.filled(target, depth)
    u.decoder.charge_native(max(0, sys.getsizeof(target) - size), "items added to a set")


def _load_build(u: Any) -> None:
    """``BUILD``: only a dtype's or an array's stand-in takes a state (pickle's own would set attributes,
    or call ``__setstate__``, of whatever is on the stack: a numpy scalar's, say)."""
    state = u.stack.pop()
    target = u.stack[-1]
    if type(target) not in _BUILDABLE:
        raise u.decoder.refuse(
            None,
            f"refusing a BUILD (a state {short_repr(state)}) for a {type(target).__name__}; only numpy dtypes and "
            "arrays are given a state",
        )
    target.__setstate__(state)
    if type(target) is _PendingArray and target.array is not None:
        u.decoder.charge_native(sys.getsizeof(target.array) - target.array.nbytes, "a numpy array")


def _load_bytearray8(u: Any) -> None:
    """``BYTEARRAY8`` that reads the bytes before making the bytearray (pickle's would allocate the length the
    pickle claims first) and counts them against the budget."""
    (length,) = struct.unpack("<Q", u.read(8))
    data = u.read(length)  # no more than the pickle holds: a short read raises
    u.decoder.charge(len(data), None, f"a bytearray of {len(data)} bytes")
    made = bytearray(data)
    u.append(made)
    _pushed(u, made, "a BYTEARRAY8")


def _refuse(message: str) -> Callable[[Any], None]:
    def refuse(u: Any) -> None:
        raise pickle.UnpicklingError(message)

    return refuse


_INT_OPCODES = frozenset({"INT", "BININT", "BININT2", "LONG", "LONG1", "LONG4"})
"""Opcodes that push an int (INT may push a bool: True and False are charged as the small ints they equal)."""
_VALUE_OPCODES = (
    *(pickle.INT, pickle.BININT, pickle.BININT2, pickle.LONG, pickle.LONG1, pickle.LONG4, pickle.FLOAT),
    pickle.BINFLOAT,
    *(pickle.STRING, pickle.BINSTRING, pickle.SHORT_BINSTRING, pickle.BINBYTES, pickle.SHORT_BINBYTES),
    *(pickle.BINBYTES8, pickle.UNICODE, pickle.BINUNICODE, pickle.SHORT_BINUNICODE, pickle.BINUNICODE8),
    *(pickle.NEWOBJ, pickle.NEWOBJ_EX),  # (never succeed: no real class is ever on the stack)
)
_REFERENCE_OPCODES = (
    *(pickle.DUP, pickle.GET, pickle.BINGET, pickle.LONG_BINGET, pickle.GLOBAL, pickle.STACK_GLOBAL),
    *(pickle.INST, pickle.OBJ),  # (their result is charged by the stand-in that makes it)
    # CPython's shared objects: BININT1's 0..255 are among the cached small ints
    *(pickle.BININT1, pickle.NONE, pickle.NEWTRUE, pickle.NEWFALSE, pickle.EMPTY_TUPLE),
)
_UNCHANGED_OPCODES = (
    *(pickle.PROTO, pickle.FRAME, pickle.STOP, pickle.POP, pickle.POP_MARK, pickle.PERSID, pickle.BINPERSID),
    pickle.REDUCE,
)
"""Opcodes kept as pickle has them: they make nothing (REDUCE's result is charged by its stand-in, POP and
POP_MARK free, ``persistent_load`` refuses every persistent id)."""
_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
_BASE = pickle._Unpickler.dispatch
# Fail closed: an opcode a later Python adds is refused until it is reviewed and charged here.
_DISPATCH = {code: _refuse(f"opcode {_NAMES.get(code, code)} is not supported") for code in _BASE}
_DISPATCH.update({op[0]: _BASE[op[0]] for op in _UNCHANGED_OPCODES})
_DISPATCH.update({op[0]: _pushing(_BASE[op[0]], _NAMES[op[0]], new=True) for op in _VALUE_OPCODES})
_DISPATCH.update({op[0]: _pushing(_BASE[op[0]], _NAMES[op[0]], new=False) for op in _REFERENCE_OPCODES})
_DISPATCH.update({op[0]: _memoizing(_BASE[op[0]], _NAMES[op[0]]) for op in (pickle.BINPUT, pickle.LONG_BINPUT)})
_DISPATCH[pickle.MEMOIZE[0]] = _memoizing(_BASE[pickle.MEMOIZE[0]], "MEMOIZE")
_DISPATCH[pickle.PUT[0]] = _memoizing(_load_put, "PUT")
_DISPATCH.update(
    {
        pickle.MARK[0]: _load_mark,
        pickle.EMPTY_DICT[0]: _load_empty(dict, "EMPTY_DICT"),
        pickle.EMPTY_LIST[0]: _load_empty(list, "EMPTY_LIST"),
        pickle.EMPTY_SET[0]: _load_empty(set, "EMPTY_SET"),
        pickle.TUPLE1[0]: _load_tuple1,
        pickle.TUPLE2[0]: _load_tuple2,
        pickle.TUPLE3[0]: _load_tuple3,
        pickle.TUPLE[0]: _load_tuple,
        pickle.LIST[0]: _load_list,
        pickle.DICT[0]: _load_dict,
        pickle.FROZENSET[0]: _load_frozenset,
        pickle.APPEND[0]: _load_append,
        pickle.APPENDS[0]: _load_appends,
        pickle.SETITEM[0]: _load_setitem,
        pickle.SETITEMS[0]: _load_setitems,
        pickle.ADDITEMS[0]: _load_additems,
        pickle.BUILD[0]: _load_build,
        pickle.BYTEARRAY8[0]: _load_bytearray8,
        pickle.NEXT_BUFFER[0]: _refuse("out-of-band buffers (NEXT_BUFFER) are not supported"),
        pickle.READONLY_BUFFER[0]: _refuse("out-of-band buffers (READONLY_BUFFER) are not supported"),
        **{
            op[0]: _refuse("extension codes (EXT1, EXT2, EXT4) are not supported")
            for op in (pickle.EXT1, pickle.EXT2, pickle.EXT4)
        },
    }
)


class _RestrictedUnpickler(pickle._Unpickler):
    """pickle's pure-Python unpickler, whose :meth:`find_class` only resolves allow-listed globals, to stand-ins.

    Not the C ``pickle.Unpickler``: that one grows its memo to twice any index a ``PUT``/``LONG_BINPUT``
    names, and zeroes it, so the 11 bytes ``\\x80\\x02K\\x01r\\xff\\xff\\xff\\x0f.`` make it allocate and
    touch 4 GiB. The Python one keeps its memo in a dict; its opcodes are replaced where they act on a
    number the pickle chooses (``BYTEARRAY8`` reads the bytes before it allocates them, ``PUT`` takes
    indices below 2**32, ``EXT1/2/4`` and out-of-band buffers are refused), where they make or fill
    containers (depth, keys and native budget, see the module's docstring), and for ``BUILD`` (stand-ins
    only); any other opcode is refused. Slower than the C unpickler on many small objects (docs/performance.md,
    "Safe unpickling"), which data files read once can afford."""

    dispatch = _DISPATCH
    stack: list[Any]  # (set by pickle's load(); declared for the type checker)
    metastack: list[list[Any]]

    def __init__(self, data: bytes, *, decoder: _Decoder, allow_numpy: bool, encoding: str) -> None:
        super().__init__(_StrictInput(data), fix_imports=False, encoding=encoding)
        self.decoder = decoder
        self._allow_numpy = allow_numpy
        self._globals: dict[tuple[str, str], Any] = {}
        self.memo_entries = 0  # the memo's size when last charged
        self.memo_bytes = 0  # ... and what it was charged

    def pop_mark(self) -> list[Any]:
        """pickle's, crediting the MARK's list back: it is consumed (``LIST`` charges it again)."""
        items: list[Any] = self.stack
        self.stack = self.metastack.pop()
        self.append = self.stack.append
        self.decoder.credit_native(_LIST_BYTES + _SLOT_BYTES * (1 + len(items)))  # every push was charged a slot
        return items

    def find_class(self, module: str, name: str) -> Any:
        """Resolve ``module.name`` to its stand-in if it is allow-listed, else raise :class:`UnsafePickleError`.

        One stand-in per global and load, so naming a global again makes nothing new."""
        key = (module, name)
        found = self._globals.get(key)
        if found is None:
            found = self._globals[key] = self._stand_in(module, name)
        return found

    def _stand_in(self, module: str, name: str) -> Any:
        key = (module, name)
        dotted = f"{module}.{name}"
        decoder = self.decoder
        if self._allow_numpy and key == ("numpy", "ndarray"):
            return decoder.ndarray_class()
        stand_in = _BASE_ALLOWED.get(key) or (_NUMPY_ALLOWED.get(key) if self._allow_numpy else None)
        if stand_in is None:
            raise decoder.refuse(
                dotted,
                f"refusing to unpickle forbidden global {dotted!r} "
                "(only plain containers, and with allow_numpy plain numpy arrays, may be loaded)",
            )
        what = f"the result of {dotted}"

        def call(*args: Any) -> Any:
            made = stand_in(decoder, dotted, *args)
            decoder.charge_native(_new_object_bytes(made), what, dotted)
            return made

        return call


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
