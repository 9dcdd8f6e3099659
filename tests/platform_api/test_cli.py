"""The ``healthplatform`` command: administration commands against a real data dir."""

from __future__ import annotations

import asyncio

from typer.testing import CliRunner

from fhir_server.store.sqlite import SQLiteStore
from platform_api.auth.keys import KeyRing
from platform_api.cli import app


def test_rotate_signing_key_adds_a_newer_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))
    first = KeyRing.load_or_create(tmp_path / "keys").signing_key.kid
    result = CliRunner().invoke(app, ["rotate-signing-key"])
    assert result.exit_code == 0, result.output
    ring = KeyRing.load_or_create(tmp_path / "keys")
    assert ring.signing_key.kid != first and ring.signing_key.kid in result.output


def test_create_admin_makes_a_super_admin(tmp_path, monkeypatch):
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HEALTHPLATFORM_ARGON2_MEMORY_KIB", "8192")
    monkeypatch.setenv("HEALTHPLATFORM_ADMIN_PASSWORD", "correct horse battery")
    result = CliRunner().invoke(app, ["create-admin", "--email", "root@example.org"])
    assert result.exit_code == 0, result.output
    assert "SUPER:ADMIN" in result.output

    async def stored_roles() -> list[str]:
        store = SQLiteStore(tmp_path / "healthplatform.db")
        await store.open()
        try:
            users = await store.find_documents("users", {"email": "root@example.org"})
            return users[0]["roles"]
        finally:
            await store.close()

    assert "SUPER:ADMIN" in asyncio.run(stored_roles())
