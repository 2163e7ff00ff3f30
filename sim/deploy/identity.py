"""Long-term keys of the testbed's parties, derived from a deployment secret (the testbed's PKI).

A real deployment provisions each party's Ed25519 key and distributes the verification keys. The
testbed derives them instead from one 32-byte secret that ``dropsim deploy`` draws from the operating
system and hands to the worker processes it starts (environment), or writes to ``--secret-file`` for
workers started on other hosts: whoever holds the secret can act as any party, so keep it to the testbed.
Party -1 is the server, workers are 0, 1, ...
"""

from __future__ import annotations

import os
from pathlib import Path

from sim.crypto import signatures
from sim.crypto.agreement import hkdf
from sim.crypto.randomness import SeededRandom

SECRET_BYTES = 32
SECRET_ENV = "DROPSIM_DEPLOY_SECRET"
"""Environment variable through which ``dropsim deploy`` gives its workers the secret (hex)."""


def party_identity(secret: bytes, party: int) -> tuple[bytes, bytes]:
    """``(signing seed, verification key)`` of ``party`` (-1: the server)."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a deployment secret is {SECRET_BYTES} bytes, not {len(secret)}")
    if party < -1:
        raise ValueError(f"party must be -1 (the server) or a worker index >= 0, not {party}")
    seed = hkdf(secret, b"dropsim-deploy-1 identity " + str(party).encode())
    return signatures.generate(SeededRandom(seed))


def new_secret() -> bytes:
    return os.urandom(SECRET_BYTES)


def read_secret(path: Path) -> bytes:
    """A secret file: 64 hex digits (whitespace ignored)."""
    try:
        text = path.read_text().strip()
        secret = bytes.fromhex(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a deployment secret (64 hex digits): {exc}") from None
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"{path}: a deployment secret is {SECRET_BYTES} bytes (64 hex digits), not {len(secret)}")
    return secret


def write_secret(path: Path, secret: bytes) -> None:
    """Write ``secret`` readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret.hex() + "\n")
