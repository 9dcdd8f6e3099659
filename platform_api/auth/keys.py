"""Ed25519 signing keys for PASETO v4.public access tokens, kept as PEM files on disk.

Layout: ``<data_dir>/keys/ed25519-<UTC timestamp>.pem`` (PKCS#8, unencrypted, mode
0600, directory 0700). The file names sort chronologically, so the *last* name is the
newest key and signs new tokens; every key in the directory still verifies. Rotating
is adding a file (:func:`generate_key_file`); retiring is deleting one once the tokens
it signed have expired.

A key is identified by its PASERK id (``k4.pid.…``, a BLAKE2b hash of the public key),
which goes into the token footer as ``{"kid": ...}``. The verifier looks the key up by
that id itself and fails closed on an unknown id: pyseto, given several keys, would
try them all and never look at the footer (SMART-CDS-NOTES.md section 3).

Retirement: once a newer key exists, an older key only has to verify the tokens it
signed before, and those expire within the access-token lifetime. With
:meth:`KeyRing.retire_after` set, a key whose successor is older than that lifetime
(plus a minute of clock skew) verifies nothing more, even while its file is still on
disk. Every process notices a new key file within ``RESCAN_INTERVAL_SECONDS`` and
starts signing with it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pyseto import Key
from pyseto.key_interface import KeyInterface

log = logging.getLogger(__name__)

KEY_GLOB = "ed25519-*.pem"
# Another process may add a key (rotation, or a concurrent first start); an unknown kid
# rescans the directory at most this often before the token is refused, and signing
# looks for a newer key as often.
RESCAN_INTERVAL_SECONDS = 30.0
RETIREMENT_LEEWAY_SECONDS = 60.0
_STAMP_FORMAT = "%Y%m%dT%H%M%S%fZ"


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One Ed25519 key pair as pyseto keys (version 4, purpose public)."""

    kid: str  # PASERK id of the public key, k4.pid.…
    path: Path
    secret: KeyInterface  # signs
    public: KeyInterface  # verifies

    @property
    def created_at(self) -> float:
        """Epoch seconds from the file name's stamp (the file's mtime if renamed)."""
        stamp = self.path.stem.removeprefix("ed25519-")
        try:
            return datetime.strptime(stamp, _STAMP_FORMAT).replace(tzinfo=UTC).timestamp()
        except ValueError:
            return self.path.stat().st_mtime


def generate_key_file(directory: Path) -> Path:
    """Write a new Ed25519 private key as PEM (mode 0600) and return its path."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = directory / f"ed25519-{stamp}.pem"
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # O_EXCL: never overwrite a key; the mode is set at creation, not after a chmod race.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return path


def load_key_file(path: Path) -> SigningKey:
    """Read one PEM private key; raises ``ValueError`` naming the file if it is unusable."""
    pem = path.read_bytes()
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 key (PASETO v4.public needs Ed25519)")
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    public = Key.new(4, "public", public_pem)
    if path.stat().st_mode & 0o077:
        log.warning("signing key %s is readable by group or others; chmod 600 it", path)
    return SigningKey(public.to_paserk_id(), path, Key.new(4, "public", pem), public)


@contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Serialize first-start key creation between processes sharing the directory."""
    fd = os.open(directory / ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class KeyRing:
    """All signing keys of the directory: the newest signs, any of them verifies."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._by_kid: dict[str, SigningKey] = {}
        self._retired_at: dict[str, float] = {}  # kid -> epoch when a newer key appeared
        self._signing: SigningKey | None = None
        self._last_scan = 0.0
        self._names: list[str] = []
        self._retire_grace: float | None = None
        self.clock = time.time  # wall clock of retirement (tests move it)

    @classmethod
    def load_or_create(cls, directory: Path) -> KeyRing:
        """Load the keys of ``directory``, creating the first one if there is none."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with directory_lock(directory):
            if not any(directory.glob(KEY_GLOB)):
                log.info("no signing key in %s: generating one", directory)
                generate_key_file(directory)
        ring = cls(directory)
        ring.reload()
        return ring

    def reload(self) -> None:
        """Re-read the directory (after a rotation)."""
        paths = sorted(self.directory.glob(KEY_GLOB), key=lambda p: p.name)
        if not paths:
            raise RuntimeError(f"no signing key ({KEY_GLOB}) in {self.directory}")
        keys = [load_key_file(p) for p in paths]
        self._by_kid = {k.kid: k for k in keys}
        self._retired_at = {old.kid: new.created_at for old, new in pairwise(keys)}
        self._signing = keys[-1]
        self._names = [p.name for p in paths]
        self._last_scan = time.monotonic()

    def retire_after(self, token_ttl_seconds: float) -> None:
        """Stop verifying with a key once its tokens must have expired (module doc)."""
        self._retire_grace = token_ttl_seconds + RETIREMENT_LEEWAY_SECONDS

    def retired(self, kid: str) -> bool:
        retired_at = self._retired_at.get(kid)
        return (self._retire_grace is not None and retired_at is not None
                and self.clock() > retired_at + self._retire_grace)

    def rotate(self) -> SigningKey:
        """Add a new key and make it the signing key; older keys keep verifying."""
        generate_key_file(self.directory)
        self.reload()
        return self.signing_key

    @property
    def signing_key(self) -> SigningKey:
        if self._signing is None:
            raise RuntimeError("key ring is not loaded")
        if time.monotonic() - self._last_scan > RESCAN_INTERVAL_SECONDS:
            self._rescan_if_changed()
        return self._signing

    def _rescan_if_changed(self) -> None:
        """Pick up a key another process added; cheap when nothing changed (a listing)."""
        names = sorted(p.name for p in self.directory.glob(KEY_GLOB))
        if names != self._names:
            self._rescan()
        else:
            self._last_scan = time.monotonic()

    @property
    def kids(self) -> list[str]:
        return list(self._by_kid)

    def verifying_key(self, kid: str) -> KeyInterface | None:
        """The public key with this PASERK id, or ``None`` (the caller refuses the token):
        unknown, or retired (:meth:`retired` tells which)."""
        key = self._by_kid.get(kid)
        if key is None and time.monotonic() - self._last_scan > RESCAN_INTERVAL_SECONDS:
            self._rescan()
            key = self._by_kid.get(kid)
        if key is None or self.retired(kid):
            return None
        return key.public

    def _rescan(self) -> None:
        """Reload for an unknown kid; a broken directory keeps the keys already loaded."""
        try:
            self.reload()
        except (OSError, ValueError, RuntimeError):
            # The token is refused either way (fail closed); the operator must see why.
            log.exception("rescanning signing keys in %s failed", self.directory)
            self._last_scan = time.monotonic()
