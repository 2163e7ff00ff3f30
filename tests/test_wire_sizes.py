"""The message sizes documented in docs/protocols.md, checked against the codec."""

from __future__ import annotations

import numpy as np
import pytest

from sim.protocol.messages import AdvertiseKeys, KeyList, MaskedInput, ShareKeys, UnmaskShares
from sim.protocol.suite import CIPHERTEXT_BYTES, SHARE_BYTES
from sim.protocol.wire import ModVector


@pytest.mark.parametrize("n", [3, 10, 100])
def test_documented_sizes(n):
    d = 1001
    assert CIPHERTEXT_BYTES == 132 and SHARE_BYTES == 44
    assert len(AdvertiseKeys(1, 2, bytes(32), bytes(32), b"").encode()) == 88
    assert len(KeyList(1, tuple((i, bytes(32), bytes(32), b"") for i in range(n))).encode()) == 16 + 76 * n
    assert len(ShareKeys(1, 2, tuple((i, bytes(132)) for i in range(n - 1))).encode()) == 24 + 144 * (n - 1)
    assert len(MaskedInput(1, 2, ModVector(20, np.zeros(d, np.uint32))).encode()) == 29 + -(-d * 20 // 8)
    assert len(UnmaskShares(1, 2, tuple((i, 0, bytes(44)) for i in range(n))).encode()) == 24 + 57 * n
