"""A finished run's tables as it left them: their SHA-256 in the manifest, checked wherever they are read back.

When a run completes, its manifest records under ``tables_sha256`` the SHA-256 of every table (``*.csv``) in
its folder, computed once over the final bytes: its own ``rounds.csv``, ``clients.csv`` and ``stages.csv``, and
any a driver wrote beside them (a deployment's ``operations.csv``). A table read back from a complete run is
checked against its digest first, so that a table edited or damaged since is refused (naming the file, and
``--force``, which runs the run again) rather than shown as the run's result.

A manifest without digests (written by a dropsim older than this check) is read as before, unverified: its
run is still found finished, and a command that shows it says so. Refusing it would make every earlier result
run again; recording digests for it now would vouch for tables nobody checked.

This is a check against accidental and naive edits, not a signature: whoever rewrites a table can rewrite the
manifest too (docs/security.md, "The results' integrity").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.results.writer import DIGESTS, MANIFEST, ResultsError, sha256

AGAIN = "--force runs it again"
"""What a user can do about a table that changed (``dropsim run`` and ``dropsim sweep`` take ``--force``)."""


class ChangedTableError(ResultsError):
    """A complete run's table is not the one its run wrote (edited, damaged, replaced or missing)."""


def is_verifiable(manifest: Mapping[str, Any]) -> bool:
    """Whether ``manifest`` is a complete run's with the digests of its tables (False: an unfinished run, or
    one written before digests were recorded)."""
    return manifest.get("status") == "complete" and isinstance(manifest.get(DIGESTS), dict)


def check_table(path: Path, data: bytes, manifest: Mapping[str, Any]) -> None:
    """Refuse ``data``, the bytes of table ``path``, unless the complete run's manifest records its digest
    (nothing to check for a manifest without digests, or a file it records none for)."""
    if not is_verifiable(manifest):
        return
    expected = manifest[DIGESTS].get(path.name)
    if expected is not None and sha256(data) != expected:
        raise ChangedTableError(
            f"{path}: changed since its run completed (its SHA-256 is not the one {MANIFEST} records), so it is "
            f"not shown as the run's result; {AGAIN}"
        )


def check_run(directory: Path, manifest: Mapping[str, Any]) -> bool:
    """Check every table ``manifest`` records a digest for; True when all match, False when the manifest
    holds no digests (unverified). Raises :class:`ChangedTableError` naming the first table that changed or
    is missing."""
    if not is_verifiable(manifest):
        return False
    for name in sorted(manifest[DIGESTS]):
        if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
            raise ChangedTableError(
                f"{directory / MANIFEST}: lists {name!r} among its tables, which is no file of the run folder; {AGAIN}"
            )
        path = directory / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ChangedTableError(
                f"{path}: cannot be read ({exc.strerror}), though its run completed with it; {AGAIN}"
            ) from None
        check_table(path, data, manifest)
    return True
