"""The RSA key that signs OpenID Connect ``id_token``\\ s (RS256, which SMART's
``sso-openid-connect`` requires), published as a bare JWK at ``jwks_uri``.

Kept like the PASETO keys (:mod:`platform_api.auth.keys`): ``<data_dir>/keys/rsa-<UTC
stamp>.pem`` (PKCS#8, mode 0600), created on first start, the newest signs, every one
is published so tokens signed before a rotation still verify. The ``kid`` is the key's
RFC 7638 thumbprint.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from platform_api.auth.keys import directory_lock

KEY_GLOB = "rsa-*.pem"
ID_TOKEN_ALGORITHM = "RS256"


@dataclass(frozen=True, slots=True)
class IdTokenKey:
    kid: str
    private: rsa.RSAPrivateKey
    jwk: dict[str, Any]  # the public key, bare (n, e), with kid, use, alg


def _thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638: SHA-256 of the required members in lexicographic order, no spaces."""
    canonical = json.dumps({k: jwk[k] for k in ("e", "kty", "n")}, separators=(",", ":"),
                           sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _load(path: Path) -> IdTokenKey:
    private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(private, rsa.RSAPrivateKey):
        raise ValueError(f"{path}: not an RSA private key")
    public = jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
    jwk = {"kty": "RSA", "n": public["n"], "e": public["e"]}
    kid = _thumbprint(jwk)
    return IdTokenKey(kid, private, {**jwk, "kid": kid, "use": "sig",
                                     "alg": ID_TOKEN_ALGORITHM})


def generate_key_file(directory: Path) -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = directory / f"rsa-{stamp}.pem"
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return path


class IdTokenKeys:
    """Every RSA key of the directory: the newest signs, all are published."""

    def __init__(self, keys: list[IdTokenKey]):
        if not keys:
            raise RuntimeError("no id_token signing key")
        self.keys = keys

    @classmethod
    def load_or_create(cls, directory: Path) -> IdTokenKeys:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with directory_lock(directory):
            if not any(directory.glob(KEY_GLOB)):
                generate_key_file(directory)
        return cls([_load(p) for p in sorted(directory.glob(KEY_GLOB), key=lambda p: p.name)])

    @property
    def signing(self) -> IdTokenKey:
        return self.keys[-1]

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.jwk for key in self.keys]}

    def sign(self, claims: dict[str, Any]) -> str:
        key = self.signing
        return jwt.encode(claims, key.private, algorithm=ID_TOKEN_ALGORITHM,
                          headers={"kid": key.kid, "typ": "JWT"})
