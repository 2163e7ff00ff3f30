"""Versioned binary encoding of protocol messages (no pickle, ever).

A frame is ``magic (2 bytes 'DS') | version (u8) | type (u8) | body length (u32) | body``, all integers
little-endian. A message type is a frozen dataclass deriving :class:`Message` with a unique ``TYPE``
number and a ``FIELDS`` list of ``(attribute, codec)``; the body is the fields' encodings in order.
Decoding checks the magic, version, type, body length, every field's bounds and that no bytes are left
over, and raises :class:`WireError` naming what is wrong: the real-socket mode sends exactly these bytes.
A receiver that knows how large a legal message can be passes :class:`Limits` (``max_elements``: values in
any vector, ``max_items``: items in any list), or a round's :class:`RoundLimits`, from which each message
type's bounds follow (every type with a list declares what bounds it: :attr:`Message.ITEMS`); each count is
checked against them before anything is allocated or read. Otherwise what a frame makes the decoder
allocate is at most the decoded values plus a few times the frame.

In ``timing`` fidelity a vector is a :class:`Blank` (length and dtype, no data), and keys, shares,
ciphertexts and signatures are :class:`Opaque` (length only; also in ``learning`` fidelity, beside real
vectors): :meth:`Message.wire_size` gives the same size the real values would encode to, without making
them.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from typing import Any, ClassVar

import numpy as np
from numpy.typing import DTypeLike

MAGIC = b"DS"
VERSION = 1
HEADER = struct.Struct("<2sBBI")


class WireError(ValueError):
    """Bytes that are not a valid message of this protocol version."""


@dataclass(frozen=True)
class Blank:
    """A vector known only by its length and dtype (``timing`` fidelity): sized, never encoded."""

    length: int
    dtype: DTypeLike

    def __post_init__(self) -> None:
        if self.length < 0:
            raise ValueError(f"Blank length must be >= 0, not {self.length}")
        object.__setattr__(self, "dtype", np.dtype(self.dtype))


Vector = np.ndarray | Blank
"""A payload vector: real data (full fidelity) or its shape only (timing fidelity)."""


def vector_length(v: Vector) -> int:
    return v.length if isinstance(v, Blank) else int(v.shape[0])


@dataclass(frozen=True)
class Opaque:
    """Bytes known only by their length (``timing`` and ``learning`` fidelity): keys, ciphertexts, shares,
    signatures."""

    length: int

    def __len__(self) -> int:
        return self.length


Data = bytes | Opaque
"""A byte string, or its length only in timing and learning fidelity."""


@dataclass(frozen=True, eq=False)
class ModVector:
    """A vector over Z_(2^bits), 1 <= bits <= 32, sent bit-packed: ``ceil(length * bits / 8)`` bytes.

    ``values`` is a uint32 array with every value below 2^bits, or a :class:`Blank` in timing fidelity.
    """

    bits: int
    values: Vector

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 32:
            raise ValueError(f"ModVector bits must be in 1..32, not {self.bits}")

    @property
    def length(self) -> int:
        return vector_length(self.values)


@lru_cache(maxsize=32)
def _layout(bits: int) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """How ``bits``-bit values fill 64-bit words: a period of lcm(bits, 64) bits holds ``per`` values in
    ``words`` words, value j of a period starting at bit ``64 * word + shift`` of it (``(word, shift)`` each)."""
    g = math.gcd(bits, 64)
    per, words = 64 // g, bits // g
    return per, words, tuple(divmod(j * bits, 64) for j in range(per))


def pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Little-endian bit packing of values < 2^bits, ``bits`` bits each, zero-padded to a whole byte.

    Value i occupies bits ``[i * bits, (i + 1) * bits)`` of the little-endian bit string (higher bits of a
    value are dropped). Other widths than 8, 16 and 32 go in two moves over 64-bit words: each pair of
    values becomes one unit of ``2 * bits`` bits (whole-array shifts of the pairs read as 64-bit words), and
    the units are shifted into the packed words one position of the period at a time (:func:`_layout`).
    No array is larger than 8 bytes per value.
    """
    v = np.ascontiguousarray(values, dtype="<u4").reshape(-1)
    if bits == 32:
        return v.tobytes()
    if bits in (8, 16):
        return v.astype(f"<u{bits // 8}").tobytes()
    per, words, layout = _layout(2 * bits)  # per units (2 * per values) fill ``words`` words
    rows = -(-v.size // (2 * per))
    flat = np.zeros(rows * 2 * per, dtype="<u4")
    np.bitwise_and(v, np.uint32((1 << bits) - 1), out=flat[: v.size])
    units = flat.view("<u8")  # pair k: value 2k in the low 32 bits, value 2k + 1 in the high ones
    for start in range(0, units.size, _PAIRS):  # each pair to its unit, in place
        pairs = units[start : start + _PAIRS]
        high = pairs >> np.uint64(32 - bits)  # value 2k + 1 to bit ``bits``...
        high &= np.uint64(((1 << bits) - 1) << bits)  # ...without value 2k's bits shifted down
        pairs &= np.uint64((1 << bits) - 1)
        pairs |= high
    cols = units.reshape(rows, per)
    out = np.zeros((rows, words), dtype="<u8")
    for j, (word, shift) in enumerate(layout):
        out[:, word] |= cols[:, j] << np.uint64(shift)
        if shift + 2 * bits > 64:  # the unit runs into the next word
            out[:, word + 1] |= cols[:, j] >> np.uint64(64 - shift)
    return out.reshape(-1).view(np.uint8)[: -(-v.size * bits // 8)].tobytes()


def unpack_bits(data: bytes | memoryview, count: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``count`` values as uint32; bits after the last value must be zero.

    Works on 64-bit words as :func:`pack_bits` does (units of two values, then the pair split by whole-array
    shifts, in blocks): besides the result (4 bytes per value, which holds the units first), it allocates one
    zero-padded copy of the packed bytes and a word per period at a time.
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    if bits in (8, 16, 32):
        return raw.view(f"<u{bits // 8}").astype(np.uint32)
    if not 1 <= bits <= 32:
        raise WireError(f"packed vector bit width {bits} is not in 1..32")
    used = count * bits
    need = -(-used // 8)
    if raw.size < need:
        raise WireError(f"{count} values of {bits} bits need {need} packed bytes, not {raw.size}")
    if raw[need:].any() or (used % 8 and int(raw[used // 8]) >> (used % 8)):
        raise WireError("non-zero padding bits after a packed vector")
    per, words, layout = _layout(2 * bits)
    rows = -(-count // (2 * per))
    padded = np.zeros(rows * words * 8, dtype=np.uint8)
    padded[:need] = raw[:need]
    packed = padded.view("<u8").reshape(rows, words)
    out = np.empty(rows * 2 * per, dtype="<u4")
    units = out.view("<u8")  # unit k in the result's memory, then split into values 2k and 2k + 1 in place
    cols = units.reshape(rows, per)
    for j, (word, shift) in enumerate(layout):
        col = cols[:, j]
        np.right_shift(packed[:, word], np.uint64(shift), out=col)
        if shift + 2 * bits > 64:
            col |= packed[:, word + 1] << np.uint64(64 - shift)
    for start in range(0, units.size, _PAIRS):
        pairs = units[start : start + _PAIRS]
        high = pairs << np.uint64(32 - bits)  # value 2k + 1 to the high 32 bits...
        high &= np.uint64(((1 << bits) - 1) << 32)  # ...alone
        pairs &= np.uint64((1 << bits) - 1)
        pairs |= high
    return out[:count].astype(np.uint32, copy=False)


_PAIRS = 1 << 14
"""Pairs of values per block when they become units or units become them: 128 KiB of temporaries."""


@dataclass(frozen=True)
class Limits:
    """What one decode may allocate, checked against each count a frame announces before allocating.

    ``elements`` bounds the values of any vector or packed vector (a receiver passes the dimension it
    expects), ``items`` the items of any list (e.g. the clients of a round); None leaves the codec's own
    limit. A frame over a limit raises :class:`WireError`.
    """

    elements: int | None = None
    items: int | None = None


UNLIMITED = Limits()


class Items(enum.Enum):
    """What bounds the items of a message type's lists (:attr:`Message.ITEMS`)."""

    CLIENTS = enum.auto()
    """One item per client of the round at most (keys, ciphertexts, shares, survivors, signatures)."""
    CLIENT_COMPONENTS = enum.auto()
    """One per client and noise component at most (shares of noise seeds; a client's own seeds)."""
    OWN = enum.auto()
    """The lists' own codec limits (control messages, whose size is checked before they are decoded)."""


@dataclass(frozen=True)
class RoundLimits:
    """What a legal message of one round holds at most: ``elements`` values in any vector, and, in its lists,
    items for ``clients`` sampled clients with ``components`` noise components each (0 without DP). Each
    message type's item bound follows from its :attr:`Message.ITEMS` (:meth:`limits`)."""

    elements: int
    clients: int
    components: int = 0

    def limits(self, cls: type[Message]) -> Limits:
        if cls.ITEMS is Items.CLIENTS:
            return Limits(self.elements, self.clients)
        if cls.ITEMS is Items.CLIENT_COMPONENTS:
            return Limits(self.elements, self.clients * (self.components + 1))
        return Limits(self.elements)


class Codec:
    """Encoding of one field type: size, write, read."""

    name = "value"
    fixed: int | None = None
    """Bytes of every value, where all take the same (a list of such items is sized by its length)."""

    def size(self, value: Any) -> int:
        raise NotImplementedError

    def size_all(self, values: Sequence[Any]) -> int:
        """The sizes of ``values`` added up (a list's items): :meth:`size` of each, or where the codec can,
        in fewer Python steps (timing fidelity sizes every client's lists of ciphertexts)."""
        if self.fixed is not None:
            return len(values) * self.fixed
        return sum(map(self.size, values))

    def write(self, value: Any, out: list[bytes]) -> None:
        raise NotImplementedError

    def read(self, buf: memoryview, offset: int, limits: Limits = UNLIMITED) -> tuple[Any, int]:
        raise NotImplementedError

    def _need(self, buf: memoryview, offset: int, n: int) -> None:
        if offset + n > len(buf):
            raise WireError(f"truncated {self.name}: needs {n} bytes at offset {offset}, {len(buf) - offset} left")


class _Int(Codec):
    def __init__(self, fmt: str, name: str) -> None:
        self.struct = struct.Struct("<" + fmt)
        self.name = name
        self.lo, self.hi = _int_range(fmt)
        self.fixed = self.struct.size

    def size(self, value: Any) -> int:
        return self.struct.size

    def write(self, value: Any, out: list[bytes]) -> None:
        if not self.lo <= int(value) <= self.hi:
            raise ValueError(f"{self.name} value {value} is out of range [{self.lo}, {self.hi}]")
        out.append(self.struct.pack(int(value)))

    def read(self, buf: memoryview, offset: int, limits: Limits = UNLIMITED) -> tuple[Any, int]:
        self._need(buf, offset, self.struct.size)
        return self.struct.unpack_from(buf, offset)[0], offset + self.struct.size


def _int_range(fmt: str) -> tuple[int, int]:
    bits = struct.calcsize(fmt) * 8
    if fmt.isupper():
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


class _Float(Codec):
    name = "f64"
    fixed = 8
    _s = struct.Struct("<d")

    def size(self, value: Any) -> int:
        return 8

    def write(self, value: Any, out: list[bytes]) -> None:
        out.append(self._s.pack(float(value)))

    def read(self, buf: memoryview, offset: int, limits: Limits = UNLIMITED) -> tuple[Any, int]:
        self._need(buf, offset, 8)
        return self._s.unpack_from(buf, offset)[0], offset + 8


class _Bytes(Codec):
    name = "bytes"

    def __init__(self, limit: int = 1 << 30) -> None:
        self.limit = limit

    def size(self, value: Any) -> int:
        return 4 + len(value)

    def size_all(self, values: Sequence[Any]) -> int:
        return 4 * len(values) + sum(map(len, values))

    def write(self, value: Any, out: list[bytes]) -> None:
        if isinstance(value, Opaque):
            raise ValueError("an Opaque value (timing fidelity) has no bytes to encode")
        out.append(struct.pack("<I", len(value)))
        out.append(bytes(value))

    def read(self, buf: memoryview, offset: int, limits: Limits = UNLIMITED) -> tuple[Any, int]:
        self._need(buf, offset, 4)
        (n,) = struct.unpack_from("<I", buf, offset)
        if n > self.limit:
            raise WireError(f"{self.name} of {n} bytes exceeds the limit of {self.limit}")
        self._need(buf, offset + 4, n)
        return bytes(buf[offset + 4 : offset + 4 + n]), offset + 4 + n


DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype("<f4"),
    2: np.dtype("<u4"),
    3: np.dtype("<u8"),
    4: np.dtype("<i8"),
    5: np.dtype("<u1"),
    6: np.dtype("<f8"),
}
_DTYPE_CODES = {dt: code for code, dt in DTYPES.items()}


class _Vector(Codec):
    """``dtype code (u8) | count (u64) | count * itemsize bytes`` little-endian."""

    name = "vector"

    def __init__(self, dtypes: Sequence[str] | None = None) -> None:
        self.allowed = None if dtypes is None else {np.dtype(d).newbyteorder("<") for d in dtypes}

    def _dtype(self, value: Vector) -> np.dtype[Any]:
        dt = np.dtype(value.dtype).newbyteorder("<")
        if dt not in _DTYPE_CODES or (self.allowed is not None and dt not in self.allowed):
            raise ValueError(f"vector dtype {value.dtype} cannot be encoded here")
        return dt

    def size(self, value: Any) -> int:
        return 9 + vector_length(value) * self._dtype(value).itemsize

    def write(self, value: Any, out: list[bytes]) -> None:
        if isinstance(value, Blank):
            raise ValueError("a Blank vector (timing fidelity) has no bytes to encode")
        dt = self._dtype(value)
        arr = np.ascontiguousarray(value, dtype=dt)
        if arr.ndim != 1:
            raise ValueError(f"vectors must be one-dimensional, not of shape {arr.shape}")
        out.append(struct.pack("<BQ", _DTYPE_CODES[dt], arr.shape[0]))
        out.append(arr.tobytes())

    def read(self, buf: memoryview, offset: int, limits: Limits = UNLIMITED) -> tuple[Any, int]:
        self._need(buf, offset, 9)
        code, count = struct.unpack_from("<BQ", buf, offset)
        dt = DTYPES.get(code)
        if dt is None or (self.allowed is not None and dt not in self.allowed):
            raise WireError(f"vector dtype code {code} is not allowed here")
        if limits.elements is not None and count > limits.elements:
            raise WireError(f"vector of {count} values exceeds the limit of {limits.elements}")
        n = count * dt.itemsize
        self._need(buf, offset + 9, n)
        arr = np.frombuffer(buf, dtype=dt, count=count, offset=offset + 9).copy()
        return arr, offset + 9 + n


class _FixedBytes(Codec):
    """Exactly ``n`` bytes (keys, signatures)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.name = f"{n}-byte string"
        self.fixed = n

    def size(self, value: Any) -> int:
        return self.n

    def write(self, value: Any, out: list[bytes]) -> None:
        if isinstance(value, Opaque):
            raise ValueError("an Opaque value (timing fidelity) has no bytes to encode")
        if len(value) != self.n:
            raise ValueError(f"expected {self.n} bytes, got {len(value)}")
        out.append(bytes(value))

    def read(self, buf: memoryview, offset: int, limits: Limits = UNLIMITED) -> tuple[Any, int]:
        self._need(buf, offset, self.n)
        return bytes(buf[offset : offset + self.n]), offset + self.n


class _List(Codec):
    """``count (u32) | items``."""

    def __init__(self, item: Codec, limit: int = 1 << 24) -> None:
        self.item = item
        self.limit = limit
        self.name = f"list of {item.name}"

    def size(self, value: Any) -> int:
        return 4 + self.item.size_all(value)

    def write(self, value: Any, out: list[bytes]) -> None:
        out.append(struct.pack("<I", len(value)))
        for v in value:
            self.item.write(v, out)

    def read(self, buf: memoryview, offset: int, limits: Limits = UNLIMITED) -> tuple[Any, int]:
        self._need(buf, offset, 4)
        (n,) = struct.unpack_from("<I", buf, offset)
        limit = self.limit if limits.items is None else min(self.limit, limits.items)
        if n > limit:
            raise WireError(f"{self.name} of {n} items exceeds the limit of {limit}")
        offset += 4
        items = []
        for _ in range(n):
            item, offset = self.item.read(buf, offset, limits)
            items.append(item)
        return tuple(items), offset


class _Tuple(Codec):
    """Fields in order, as a Python tuple."""

    def __init__(self, *items: Codec) -> None:
        self.items = items
        self.name = "(" + ", ".join(i.name for i in items) + ")"
        sizes = [i.fixed for i in items]
        self.fixed = None if None in sizes else sum(s for s in sizes if s is not None)
        self._fixed_part = sum(s for s in sizes if s is not None)
        self._sized = tuple((k, c) for k, c in enumerate(items) if c.fixed is None)
        """The fields whose size depends on their value, by position (sized one by one)."""

    def size(self, value: Any) -> int:
        if len(value) != len(self.items):
            raise ValueError(f"{self.name} needs {len(self.items)} values, not {len(value)}")
        return self._fixed_part + sum(c.size(value[k]) for k, c in self._sized)

    def size_all(self, values: Sequence[Any]) -> int:
        """The tuples' sizes field by field: each variable field's values sized together."""
        if not set(map(len, values)) <= {len(self.items)}:
            wrong = next(v for v in values if len(v) != len(self.items))
            raise ValueError(f"{self.name} needs {len(self.items)} values, not {len(wrong)}")
        total = len(values) * self._fixed_part
        for k, c in self._sized:
            total += c.size_all(list(map(itemgetter(k), values)))
        return total

    def write(self, value: Any, out: list[bytes]) -> None:
        if len(value) != len(self.items):
            raise ValueError(f"{self.name} needs {len(self.items)} values, not {len(value)}")
        for c, v in zip(self.items, value, strict=True):
            c.write(v, out)

    def read(self, buf: memoryview, offset: int, limits: Limits = UNLIMITED) -> tuple[Any, int]:
        values = []
        for c in self.items:
            v, offset = c.read(buf, offset, limits)
            values.append(v)
        return tuple(values), offset


class _Packed(Codec):
    """A :class:`ModVector`: ``bits (u8) | count (u64) | ceil(count * bits / 8) packed bytes``."""

    name = "packed vector"

    def size(self, value: Any) -> int:
        return 9 + -(-value.length * value.bits // 8)

    def write(self, value: Any, out: list[bytes]) -> None:
        if isinstance(value.values, Blank):
            raise ValueError("a Blank vector (timing fidelity) has no bytes to encode")
        values = np.asarray(value.values)
        if values.ndim != 1:
            raise ValueError(f"packed vectors must be one-dimensional, not of shape {values.shape}")
        if values.size and int(values.max()) >> value.bits:
            raise ValueError(f"a value does not fit in {value.bits} bits")
        out.append(struct.pack("<BQ", value.bits, values.shape[0]))
        out.append(pack_bits(values, value.bits))

    def read(self, buf: memoryview, offset: int, limits: Limits = UNLIMITED) -> tuple[Any, int]:
        self._need(buf, offset, 9)
        bits, count = struct.unpack_from("<BQ", buf, offset)
        if not 1 <= bits <= 32:
            raise WireError(f"packed vector bit width {bits} is not in 1..32")
        if limits.elements is not None and count > limits.elements:
            raise WireError(f"packed vector of {count} values exceeds the limit of {limits.elements}")
        n = -(-count * bits // 8)
        self._need(buf, offset + 9, n)
        values = unpack_bits(buf[offset + 9 : offset + 9 + n], count, bits)
        return ModVector(bits, values), offset + 9 + n


U8 = _Int("B", "u8")
U32 = _Int("I", "u32")
U64 = _Int("Q", "u64")
F64 = _Float()
BYTES = _Bytes()
F32_VECTOR = _Vector(["<f4"])
PACKED = _Packed()
KEY = _FixedBytes(32)
SIGNATURE = _FixedBytes(64)


def list_of(item: Codec, limit: int = 1 << 24) -> Codec:
    return _List(item, limit)


def tuple_of(*items: Codec) -> Codec:
    return _Tuple(*items)


_REGISTRY: dict[int, type[Message]] = {}


class Message:
    """Base of every wire message: subclasses are frozen dataclasses with ``TYPE`` and ``FIELDS``."""

    TYPE: ClassVar[int]
    FIELDS: ClassVar[tuple[tuple[str, Codec], ...]]
    ITEMS: ClassVar[Items | None] = None
    """What bounds the items of its lists in a round (:class:`RoundLimits`); a type with a list must say."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "TYPE" not in cls.__dict__:
            return
        if cls.ITEMS is None and any(_has_list(codec) for _, codec in cls.FIELDS):
            raise TypeError(f"message type {cls.__name__} has a list but no ITEMS bound")
        if cls.TYPE in _REGISTRY and _REGISTRY[cls.TYPE].__qualname__ != cls.__qualname__:
            raise TypeError(f"message type {cls.TYPE} is taken by {_REGISTRY[cls.TYPE].__name__}")
        if not 0 < cls.TYPE < 256:
            raise TypeError(f"message type must be in 1..255, not {cls.TYPE}")
        _REGISTRY[cls.TYPE] = cls

    def body_size(self) -> int:
        return sum(codec.size(getattr(self, name)) for name, codec in self.FIELDS)

    def packed_elements(self) -> int:
        """Values of this message that are bit-packed at a width other than 8, 16 or 32 (costly to pack;
        counted once, as :meth:`wire_size`)."""
        count = self.__dict__.get("_packed_elements")
        if count is None:
            count = sum(
                getattr(self, name).length
                for name, codec in self.FIELDS
                if isinstance(codec, _Packed) and getattr(self, name).bits not in (8, 16, 32)
            )
            object.__setattr__(self, "_packed_elements", count)
        return int(count)

    def wire_size(self) -> int:
        """Bytes of the encoded frame (header included), computed without encoding (once: a message is
        immutable, and a broadcast is sized for every recipient)."""
        size = self.__dict__.get("_wire_size")
        if size is None:
            size = HEADER.size + self.body_size()
            object.__setattr__(self, "_wire_size", size)
        return int(size)

    def encode(self) -> bytes:
        parts: list[bytes] = []
        for name, codec in self.FIELDS:
            codec.write(getattr(self, name), parts)
        body = b"".join(parts)
        return HEADER.pack(MAGIC, VERSION, self.TYPE, len(body)) + body


def _has_list(codec: Codec) -> bool:
    if isinstance(codec, _List):
        return True
    return isinstance(codec, _Tuple) and any(map(_has_list, codec.items))


def decode(
    data: bytes | memoryview,
    *,
    max_elements: int | None = None,
    max_items: int | None = None,
    round: RoundLimits | None = None,
) -> Message:
    """Decode one whole frame; raises :class:`WireError` on anything malformed or over the :class:`Limits`
    ``max_elements`` (values of any vector) and ``max_items`` (items of any list), or, given a ``round``,
    over that round's limits for the frame's type (:meth:`RoundLimits.limits`)."""
    limits = Limits(max_elements, max_items) if max_elements is not None or max_items is not None else UNLIMITED
    buf = memoryview(data)
    if len(buf) < HEADER.size:
        raise WireError(f"frame of {len(buf)} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, mtype, length = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r}; expected {MAGIC!r}")
    if version != VERSION:
        raise WireError(f"protocol version {version} is not supported (this is version {VERSION})")
    cls = _REGISTRY.get(mtype)
    if cls is None:
        raise WireError(f"unknown message type {mtype}")
    if length != len(buf) - HEADER.size:
        raise WireError(f"header announces a body of {length} bytes, frame has {len(buf) - HEADER.size}")
    if round is not None:
        limits = round.limits(cls)
    offset = HEADER.size
    values: dict[str, Any] = {}
    for name, codec in cls.FIELDS:
        try:
            values[name], offset = codec.read(buf, offset, limits)
        except WireError as exc:
            raise WireError(f"{cls.__name__}.{name}: {exc}") from None
    if offset != len(buf):
        raise WireError(f"{cls.__name__}: {len(buf) - offset} bytes left over after the last field")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise WireError(f"{cls.__name__}: invalid field values: {exc}") from None


def peek_header(data: bytes | memoryview) -> tuple[int, int]:
    """``(message type, body length)`` of a frame header, checked; for stream framing."""
    buf = memoryview(data)
    if len(buf) < HEADER.size:
        raise WireError("incomplete header")
    magic, version, mtype, length = HEADER.unpack_from(buf, 0)
    if magic != MAGIC or version != VERSION:
        raise WireError(f"bad magic or version in header: {bytes(magic)!r} v{version}")
    return mtype, length


def message_name(data: bytes | memoryview) -> str:
    """The message type a frame's header names (for logs), without decoding its body; or why it names none."""
    try:
        mtype, _ = peek_header(data)
    except WireError as exc:
        return f"malformed: {exc}"
    cls = _REGISTRY.get(mtype)
    return cls.__name__ if cls is not None else f"unknown message type {mtype}"
