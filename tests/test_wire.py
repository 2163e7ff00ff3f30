"""Tests for sim.protocol.wire with the FedAvg messages: exact round trips, sizes, and fail-closed decoding.

A frame is ``'DS' | version u8 | type u8 | body length u32 | body`` (8 header bytes), little-endian; a
float32 vector field is ``dtype code u8 | count u64 | count * 4 bytes``.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sim.protocol.fedavg import ClientUpdate
from sim.protocol.messages import MaskedInput, ModelDownload
from sim.protocol.wire import (
    HEADER,
    MAGIC,
    VERSION,
    Blank,
    Message,
    ModVector,
    Vector,
    WireError,
    decode,
    peek_header,
)

# ------------------------------------------------------------------------------------------- helpers

ROUNDS = st.integers(0, 2**32 - 1)
CLIENTS = st.integers(0, 2**64 - 1)
WEIGHTS = st.floats(allow_nan=True, allow_infinity=True)
F32 = np.dtype("<f4")
F32_VECTORS = hnp.arrays(np.float32, st.integers(0, 50), elements=st.floats(width=32))


def _array(vector: Vector) -> np.ndarray:
    assert isinstance(vector, np.ndarray), vector
    return vector


@st.composite
def messages(draw: st.DrawFn) -> Message:
    if draw(st.booleans()):
        return ModelDownload(draw(ROUNDS), draw(F32_VECTORS))
    return ClientUpdate(draw(ROUNDS), draw(CLIENTS), draw(WEIGHTS), draw(F32_VECTORS))


def _update() -> ClientUpdate:
    return ClientUpdate(7, 3, 12.5, np.array([1.0, -2.0, 0.5], dtype=np.float32))


def _with_header(frame: bytes, *, magic: bytes = MAGIC, version: int = VERSION, mtype: int | None = None) -> bytes:
    _, _, old_type, length = HEADER.unpack_from(frame, 0)
    return HEADER.pack(magic, version, old_type if mtype is None else mtype, length) + frame[HEADER.size :]


# -------------------------------------------------------------------------------------- round trips


def test_client_update_layout_known_answer() -> None:
    frame = _update().encode()
    body = (
        struct.pack("<I", 7)  # round
        + struct.pack("<Q", 3)  # client
        + struct.pack("<d", 12.5)  # weight
        + struct.pack("<BQ", 1, 3)  # float32 code 1, 3 values
        + np.array([1.0, -2.0, 0.5], dtype="<f4").tobytes()
    )
    # 4 + 8 + 8 + 9 + 3 * 4 = 41 body bytes
    assert frame == b"DS" + bytes([1, 2]) + struct.pack("<I", 41) + body
    assert len(frame) == 8 + 41
    assert peek_header(frame) == (2, 41)


@settings(max_examples=200, deadline=None)
@given(round_=ROUNDS, params=F32_VECTORS)
def test_model_download_round_trip(round_: int, params: np.ndarray) -> None:
    message = ModelDownload(round_, params)
    frame = message.encode()
    assert message.wire_size() == len(frame)
    back = decode(frame)
    assert isinstance(back, ModelDownload)
    assert back.round == round_
    assert _array(back.params).dtype == F32
    assert _array(back.params).tobytes() == params.tobytes()  # bit-exact, NaN payloads and -0.0 included


@settings(max_examples=200, deadline=None)
@given(round_=ROUNDS, client=CLIENTS, weight=WEIGHTS, delta=F32_VECTORS)
def test_client_update_round_trip(round_: int, client: int, weight: float, delta: np.ndarray) -> None:
    message = ClientUpdate(round_, client, weight, delta)
    frame = message.encode()
    assert message.wire_size() == len(frame)
    back = decode(frame)
    assert isinstance(back, ClientUpdate)
    assert (back.round, back.client) == (round_, client)
    assert struct.pack("<d", back.weight) == struct.pack("<d", weight)
    assert _array(back.delta).dtype == F32
    assert _array(back.delta).tobytes() == delta.tobytes()
    assert back.encode() == frame


def test_encode_rejects_out_of_range_integers() -> None:
    with pytest.raises(ValueError, match="u32"):
        ModelDownload(2**32, np.zeros(1, np.float32)).encode()
    with pytest.raises(ValueError, match="u64"):
        ClientUpdate(0, -1, 1.0, np.zeros(1, np.float32)).encode()


def test_encode_rejects_other_vector_dtypes() -> None:
    with pytest.raises(ValueError, match="dtype"):
        ModelDownload(0, np.zeros(2, np.float64)).encode()


# ---------------------------------------------------------------------------------- Blank vectors


@pytest.mark.parametrize("length", [0, 1, 7, 1000])
def test_blank_has_the_size_of_the_real_vector(length: int) -> None:
    real = np.zeros(length, np.float32)
    blank = Blank(length, F32)
    assert (
        ModelDownload(4, blank).wire_size()
        == ModelDownload(4, real).wire_size()
        == len(ModelDownload(4, real).encode())
    )
    # 8 header + 4 round + 9 vector header + 4 * length
    assert ModelDownload(4, blank).wire_size() == 21 + 4 * length
    assert ClientUpdate(4, 1, 2.0, blank).wire_size() == len(ClientUpdate(4, 1, 2.0, real).encode())


def test_packed_elements_counts_values_packed_at_other_widths_than_whole_bytes() -> None:
    """The values costly to pack (``wire.encode``'s ``packed`` feature): a 20-bit vector's, not a 16-bit one's;
    counted once per message, the same when asked again."""
    for bits, expected in ((20, 1000), (16, 0), (1, 1000), (32, 0)):
        message = MaskedInput(1, 2, ModVector(bits, Blank(1000, np.uint32)))
        assert message.packed_elements() == expected
        assert message.packed_elements() == expected
    assert ModelDownload(1, Blank(1000, np.float32)).packed_elements() == 0


def test_blank_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="Blank"):
        ModelDownload(4, Blank(3, F32)).encode()
    with pytest.raises(ValueError, match="Blank"):
        ClientUpdate(4, 1, 2.0, Blank(3, F32)).encode()


def test_blank_validates_its_length() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Blank(-1, F32)


# ----------------------------------------------------------------------------------- decode errors


def test_every_prefix_of_a_frame_is_rejected() -> None:
    frame = _update().encode()
    for n in range(len(frame)):
        with pytest.raises(WireError) as info:
            decode(frame[:n])
        if n < HEADER.size:
            assert str(info.value) == f"frame of {n} bytes is shorter than the 8-byte header"
        else:
            assert str(info.value) == f"header announces a body of 41 bytes, frame has {n - 8}"


def test_truncated_field_inside_a_consistent_frame_names_the_field() -> None:
    frame = _update().encode()
    # cut the last float but fix the header's length, so the vector itself is short of bytes
    body = frame[HEADER.size : -4]
    short = HEADER.pack(MAGIC, VERSION, 2, len(body)) + body
    with pytest.raises(
        WireError, match=r"^ClientUpdate\.delta: truncated vector: needs 12 bytes at offset 37, 8 left$"
    ):
        decode(short)


def test_bad_magic() -> None:
    with pytest.raises(WireError, match=r"bad magic b'XS'; expected b'DS'"):
        decode(_with_header(_update().encode(), magic=b"XS"))


@pytest.mark.parametrize("version", [0, 2, 255])
def test_other_version(version: int) -> None:
    with pytest.raises(WireError, match=f"protocol version {version} is not supported"):
        decode(_with_header(_update().encode(), version=version))


@pytest.mark.parametrize("mtype", [0, 200, 255])
def test_unknown_type(mtype: int) -> None:
    with pytest.raises(WireError, match=f"unknown message type {mtype}"):
        decode(_with_header(_update().encode(), mtype=mtype))


@pytest.mark.parametrize("delta", [-1, 1, 1000])
def test_header_length_mismatch(delta: int) -> None:
    frame = _update().encode()
    bad = HEADER.pack(MAGIC, VERSION, 2, 41 + delta) + frame[HEADER.size :]
    with pytest.raises(WireError, match=f"header announces a body of {41 + delta} bytes, frame has 41"):
        decode(bad)


def test_trailing_bytes() -> None:
    frame = _update().encode()
    body = frame[HEADER.size :] + b"\x00\x00\x00"
    with pytest.raises(WireError, match="ClientUpdate: 3 bytes left over after the last field"):
        decode(HEADER.pack(MAGIC, VERSION, 2, len(body)) + body)


@pytest.mark.parametrize(
    ("code", "count", "itemsize"),
    [(6, 3, 8), (5, 3, 1), (2, 3, 4), (0, 3, 4), (7, 3, 4), (255, 0, 0)],
)
def test_vector_dtype_not_allowed(code: int, count: int, itemsize: int) -> None:
    # a ModelDownload whose params claim another dtype (known but not float32, or unknown), sized consistently
    body = struct.pack("<I", 1) + struct.pack("<BQ", code, count) + bytes(count * itemsize)
    frame = HEADER.pack(MAGIC, VERSION, ModelDownload.TYPE, len(body)) + body
    with pytest.raises(WireError, match=rf"^ModelDownload\.params: vector dtype code {code} is not allowed here$"):
        decode(frame)


def test_peek_header_rejects_short_and_foreign_headers() -> None:
    with pytest.raises(WireError, match="incomplete header"):
        peek_header(b"DS\x01")
    with pytest.raises(WireError, match="bad magic or version"):
        peek_header(_with_header(_update().encode(), version=9))


# ----------------------------------------------------------------------------------- fuzzing decode


def _decodes_or_wire_error(data: bytes) -> None:
    """Decoding either fails with WireError or yields a message that re-encodes to the same bytes."""
    try:
        message = decode(data)
    except WireError:
        return
    # any registered type may decode (the registry holds every module's messages imported so far, the
    # deployment's control messages among them); whatever decodes must re-encode to the same bytes
    assert isinstance(message, Message)
    assert message.encode() == data


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_wire_error(data: bytes) -> None:
    _decodes_or_wire_error(data)


@settings(max_examples=200, deadline=None)
@given(mtype=st.integers(0, 255), body=st.binary(max_size=120))
def test_random_body_behind_a_valid_header_only_raises_wire_error(mtype: int, body: bytes) -> None:
    _decodes_or_wire_error(HEADER.pack(MAGIC, VERSION, mtype, len(body)) + body)


@settings(max_examples=200, deadline=None)
@given(
    message=messages(),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 10_000)),
    extra=st.binary(max_size=8),
    fix_length=st.booleans(),
)
def test_mutated_frames_only_raise_wire_error(
    message: Message, edits: list[tuple[int, int]], cut: int | None, extra: bytes, fix_length: bool
) -> None:
    data = bytearray(message.encode())
    for position, value in edits:
        data[position % len(data)] = value
    if cut is not None:
        del data[cut % len(data) :]
    data += extra
    if fix_length and len(data) >= HEADER.size:
        struct.pack_into("<I", data, 4, len(data) - HEADER.size)
    _decodes_or_wire_error(bytes(data))
