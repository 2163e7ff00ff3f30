"""Long-term identities of the deployment's parties: each party's own Ed25519 key pair, drawn by that party.

Every party (the server, and each worker) draws its signing key from the operating system's CSPRNG
(:func:`new_identity`); only verification keys ever leave it. A worker's key signs its handshakes
(:mod:`sim.deploy.framing`) and, in the malicious variant, its protocol messages: nobody else, the server
included, can derive it.

How verification keys are provisioned (the testbed's stand-in for a PKI):

- workers that ``dropsim deploy`` starts here draw their key at start-up and announce the verification key
  to the launcher through a private pipe (:func:`announce`, ``--announce-fd``); the launcher hands them
  the server's verification key (:data:`SERVER_KEY_ENV`, public);
- workers on other hosts keep a key folder (``--keys DIR``): ``worker-J.key`` (the signing key, mode
  0600, made by ``dropsim worker --keygen``) and ``server.pub``; the server's folder holds ``server.key``
  and every ``worker-J.pub``. Only ``.pub`` files are copied between hosts.

Key files are 64 hex digits and a newline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sim.crypto import signatures
from sim.crypto.randomness import SystemRandom

KEY_BYTES = 32
DEPLOYMENT_ID_BYTES = 16
"""A deployment's random id, to which every protocol signature is bound."""
SERVER_KEY_ENV = "DROPSIM_SERVER_KEY"
"""Environment variable through which ``dropsim deploy`` gives the workers it starts the server's
verification key (hex; public)."""


class IdentityError(ValueError):
    """A key file or key folder that cannot be used, with what to do."""


@dataclass(frozen=True, repr=False)
class Identity:
    """A party's long-term key pair (``repr`` shows the verification key only)."""

    signing: bytes
    verification: bytes

    def __repr__(self) -> str:
        return f"Identity(verification={self.verification.hex()})"


def new_identity() -> Identity:
    """A key pair from the operating system's CSPRNG."""
    signing, verification = signatures.generate(SystemRandom())
    return Identity(signing, verification)


def identity_from(signing: bytes) -> Identity:
    if len(signing) != KEY_BYTES:
        raise IdentityError(f"a signing key is {KEY_BYTES} bytes, not {len(signing)}")
    return Identity(signing, signatures.public(signing))


def server_key_file(folder: Path) -> Path:
    return folder / "server.key"


def worker_key_file(folder: Path, index: int) -> Path:
    return folder / f"worker-{index}.key"


def public_file(key_file: Path) -> Path:
    return key_file.with_suffix(".pub")


def _read_hex(path: Path, what: str) -> bytes:
    try:
        text = path.read_text(encoding="ascii").strip()
        key = bytes.fromhex(text)
    except (OSError, ValueError) as exc:
        raise IdentityError(f"{path}: not a {what} (64 hex digits): {exc}") from None
    if len(key) != KEY_BYTES:
        raise IdentityError(f"{path}: a {what} is {KEY_BYTES} bytes (64 hex digits), not {len(key)}")
    return key


def _write_hex(path: Path, key: bytes, mode: int) -> None:
    """Write ``key`` as hex, readable as ``mode`` says, replacing nothing (O_EXCL)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as out:
        out.write(key.hex() + "\n")


def read_public(path: Path) -> bytes:
    """A verification key file."""
    key = _read_hex(path, "verification key")
    if not signatures.valid_public(key):
        raise IdentityError(f"{path}: not a valid Ed25519 verification key")
    return key


def read_identity(key_file: Path) -> Identity:
    """A signing key file (its verification key is derived from it)."""
    return identity_from(_read_hex(key_file, "signing key"))


def create_identity(key_file: Path) -> Identity:
    """A new key pair written to ``key_file`` (mode 0600) and its ``.pub`` beside it; refuses to replace one."""
    if key_file.exists():
        raise IdentityError(f"{key_file}: exists already; a key is never replaced (delete it to make a new one)")
    key_file.parent.mkdir(parents=True, exist_ok=True)
    identity = new_identity()
    _write_hex(key_file, identity.signing, 0o600)
    pub = public_file(key_file)
    pub.unlink(missing_ok=True)
    _write_hex(pub, identity.verification, 0o644)
    return identity


def load_or_create(key_file: Path) -> tuple[Identity, bool]:
    """The identity in ``key_file``, made there first if it does not exist; ``(identity, made)``."""
    if key_file.exists():
        return read_identity(key_file), False
    return create_identity(key_file), True


def worker_directory(folder: Path, workers: int) -> dict[int, bytes]:
    """Every worker's verification key from ``folder/worker-J.pub``, J < ``workers``; names every missing one."""
    missing = [public_file(worker_key_file(folder, j)).name for j in range(workers)]
    missing = [name for name in missing if not (folder / name).exists()]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise IdentityError(
            f"{folder}: no verification key of {shown}; on each worker's host run "
            f"`dropsim worker --keygen --index J --keys DIR` and copy its worker-J.pub here"
        )
    directory = {j: read_public(public_file(worker_key_file(folder, j))) for j in range(workers)}
    seen: dict[bytes, int] = {}
    for j, key in directory.items():
        if key in seen:
            raise IdentityError(f"{folder}: worker-{seen[key]}.pub and worker-{j}.pub hold the same key")
        seen[key] = j
    return directory


def known_workers(folder: Path) -> frozenset[bytes]:
    """Every worker verification key in ``folder`` (its ``worker-*.pub`` files), for a worker to check the
    keys a server lists against (an empty set when it holds only its own: it then trusts the server's)."""
    keys = frozenset(read_public(path) for path in sorted(folder.glob("worker-*.pub")))
    return keys if len(keys) > 1 else frozenset()


def new_deployment_id() -> bytes:
    return os.urandom(DEPLOYMENT_ID_BYTES)


def sessions_file(key_file: Path) -> Path:
    """Where a lasting key records the deployment ids it has signed for."""
    return key_file.with_suffix(".sessions")


def remember_deployment(record: Path, deployment: bytes) -> None:
    """Record ``deployment`` in ``record`` (one hex id a line); IdentityError if it is there already: a server
    that presents an old id could replay this key's signatures of that deployment."""
    seen = set()
    if record.exists():
        seen = {line.strip() for line in record.read_text(encoding="ascii", errors="replace").splitlines()}
    if deployment.hex() in seen:
        raise IdentityError(
            f"the server presents deployment id {deployment.hex()}, which this key ({record}) has signed for "
            "before: refused (its old signatures could be replayed)"
        )
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as out:
        out.write(deployment.hex() + "\n")


def announce(fd: int, identity: Identity) -> None:
    """Give the launcher this worker's verification key through the pipe ``fd`` (hex and a newline)."""
    with os.fdopen(fd, "w", closefd=True) as out:
        out.write(identity.verification.hex() + "\n")


def parse_announcement(line: bytes) -> bytes:
    """The verification key a worker announced; IdentityError if it is not one."""
    try:
        key = bytes.fromhex(line.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES or not signatures.valid_public(key):
        raise IdentityError(f"a worker announced {line[:80]!r}, not a verification key")
    return key
