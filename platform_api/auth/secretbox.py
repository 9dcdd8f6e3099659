"""Encryption at rest for secrets the service must read back (TOTP seeds).

A TOTP seed cannot be hashed like a password: verifying a code needs the seed itself.
So it is stored encrypted with AES-256-GCM under a key kept beside the signing keys
(``<data_dir>/keys/secretbox.key``, mode 0600): a copy of the database alone does not
reveal anyone's second factor. The record id is bound in as associated data, so a
ciphertext copied onto another account's record does not decrypt.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from platform_api.auth.keys import directory_lock

KEY_FILE = "secretbox.key"
VERSION = "v1"


class SecretBox:
    def __init__(self, key: bytes):
        if len(key) != 32:
            raise ValueError("a secret box key has 32 bytes")
        self._aead = AESGCM(key)

    @classmethod
    def load_or_create(cls, directory: Path) -> SecretBox:
        """The key of ``directory``, written (O_EXCL, 0600) on first start."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = directory / KEY_FILE
        with directory_lock(directory):
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(AESGCM.generate_key(bit_length=256))
        key = path.read_bytes()
        if len(key) != 32:
            raise ValueError(f"{path}: expected a 32-byte key, found {len(key)} bytes")
        return cls(key)

    def seal(self, plaintext: str, context: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, plaintext.encode(), context.encode())
        return f"{VERSION}.{base64.urlsafe_b64encode(nonce + sealed).decode()}"

    def open(self, sealed: str, context: str) -> str:
        """The plaintext; ``ValueError`` when the text was changed or belongs elsewhere."""
        version, _, payload = sealed.partition(".")
        if version != VERSION:
            raise ValueError(f"unknown secret box version {version!r}")
        raw = base64.urlsafe_b64decode(payload)
        try:
            return self._aead.decrypt(raw[:12], raw[12:], context.encode()).decode()
        except InvalidTag:
            raise ValueError("sealed secret does not open with this key and context") from None
