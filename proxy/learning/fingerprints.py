"""Message fingerprints keyed with a deployment secret (docs/design.md#erasure).

A fingerprint is HMAC-SHA256 under the deployment's key of (tenant, user, role,
normalised text, image digests), 32 hex digits. The key is never stored beside the
fingerprints, so a copy of the store alone cannot confirm that a user said a guessed
sentence. Where the key comes from:

- ``learning.fingerprint_key`` (``os.environ/NAME``; a Secret in the Helm chart);
- unset, with the SQLite backend: a random key generated once into
  :func:`key_file_for` — a file next to the database, mode 0600 — and read from there by
  every process sharing the database;
- unset, with the Redis backend and learning on: a startup error (a key kept in Redis
  would lie beside the fingerprints; each pod generating its own would break dedup).

Fingerprints that may already be stored under another key are *aliases*: those under
``learning.fingerprint_previous_keys`` (rotation) and the unkeyed SHA-256 of releases
before keying (old stores). The queue treats a message as seen when its fingerprint or an
alias is recorded, and records only the current fingerprint, so resent history is never
learned twice across a rotation or an upgrade; aliases stop mattering once the old
entries expire (``learning.seen_message_ttl_days``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

FINGERPRINT_HEX = 32  # 128 bits: the length fingerprints always had
KEY_FILE_SUFFIX = ".fingerprint-key"
KEY_FILE_MODE = 0o600


class Fingerprinter:
    """Fingerprints of one deployment: ``current`` key (``None``: unkeyed SHA-256, only
    for callers that configured no key) and the ``previous`` keys still recognised."""

    def __init__(self, current: bytes | None, previous: Sequence[bytes] = ()) -> None:
        self._current = current
        self._previous = tuple(k for k in previous if k != current)

    @property
    def keyed(self) -> bool:
        return self._current is not None

    def __call__(self, material: str) -> str:
        """The fingerprint of ``material`` (32 hex digits)."""
        return _digest(self._current, material)

    def aliases(self, material: str) -> tuple[str, ...]:
        """Fingerprints ``material`` may be stored under from before a rotation or before
        keying (unkeyed SHA-256); empty for an unkeyed fingerprinter."""
        if self._current is None:
            return ()
        return (*(_digest(k, material) for k in self._previous), _digest(None, material))


UNKEYED = Fingerprinter(None)


def _digest(key: bytes | None, material: str) -> str:
    if key is None:
        return hashlib.sha256(material.encode()).hexdigest()[:FINGERPRINT_HEX]
    return hmac.new(key, material.encode(), hashlib.sha256).hexdigest()[:FINGERPRINT_HEX]


def key_file_for(database: Path) -> Path:
    """The generated key's file: next to the SQLite database, ``<name>.fingerprint-key``."""
    return database.with_name(database.name + KEY_FILE_SUFFIX)


def load_or_create_key(path: Path) -> bytes:
    """The key in ``path``; a new random one (32 bytes, hex) written there with mode 0600
    when the file does not exist. Two processes starting at once agree: the file is
    created exclusively and the loser reads the winner's. Raises ``OSError``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
    except FileExistsError:
        return _read_key(path)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    for _ in range(50):  # the creating process may not have written it yet (~0.5 s)
        text = path.read_text().strip()
        if text:
            return text.encode()
        time.sleep(0.01)
    raise OSError(f"{path} is empty: delete it to generate a new fingerprint key")


__all__: Sequence[str] = ("UNKEYED", "Fingerprinter", "key_file_for", "load_or_create_key")
