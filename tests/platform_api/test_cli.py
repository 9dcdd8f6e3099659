"""The ``healthplatform`` command: administration commands against a real data dir."""

from __future__ import annotations

import asyncio
import socket

import pytest
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


def _account_settings(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HEALTHPLATFORM_ARGON2_MEMORY_KIB", "8192")
    monkeypatch.delenv("HEALTHPLATFORM_ADMIN_PASSWORD", raising=False)


def test_create_admin_with_a_short_password_says_why_in_one_line(tmp_path, monkeypatch):
    _account_settings(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["create-admin", "--email", "root@example.org"],
                                env={"HEALTHPLATFORM_ADMIN_PASSWORD": "kamau"})
    assert result.exit_code == 1
    assert result.output.strip() == "error: password must have at least 8 characters"
    assert "Traceback" not in result.output


def test_create_admin_reads_the_password_from_stdin_for_scripts(tmp_path, monkeypatch):
    _account_settings(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["create-admin", "--email", "root@example.org",
                                      "--password-stdin"], input="correct horse battery\n")
    assert result.exit_code == 0, result.output
    assert "created" in result.output

    async def verifies() -> bool:
        from platform_api.auth.service import AuthService
        from platform_api.settings import Settings

        store = SQLiteStore(tmp_path / "healthplatform.db")
        await store.open()
        try:
            auth = AuthService(Settings(), store)
            await auth.start()
            user = await auth.find_user_by_email("root@example.org")
            return await auth.passwords.verify_async(user["password_hash"],
                                                     "correct horse battery")
        finally:
            await store.close()

    assert asyncio.run(verifies())


def test_create_admin_without_a_terminal_says_how_to_give_what_is_missing(tmp_path,
                                                                         monkeypatch):
    _account_settings(tmp_path, monkeypatch)
    no_password = CliRunner().invoke(app, ["create-admin", "--email", "root@example.org"])
    assert no_password.exit_code == 1
    assert "use --password-stdin or set HEALTHPLATFORM_ADMIN_PASSWORD" in no_password.output
    assert "Aborted" not in no_password.output
    no_email = CliRunner().invoke(app, ["create-admin", "--password-stdin"],
                                  input="correct horse battery\n")
    assert no_email.exit_code == 1 and "--email" in no_email.output


def test_promoting_an_existing_user_asks_for_no_password(tmp_path, monkeypatch):
    _account_settings(tmp_path, monkeypatch)
    first = CliRunner().invoke(app, ["create-admin", "--email", "wanjiru@clinic.example.org",
                                     "--password-stdin"], input="correct horse battery\n")
    assert first.exit_code == 0, first.output
    # No terminal, no --password-stdin, no variable: nothing to ask, so it works.
    again = CliRunner().invoke(app, ["create-admin", "--email", "wanjiru@clinic.example.org"])
    assert again.exit_code == 0, again.output
    assert "promoted (the password is unchanged)" in again.output


def test_help_names_values_instead_of_python_types():
    helps = {name: CliRunner().invoke(app, [*name.split(), "--help"], env={"COLUMNS": "120"})
             for name in ("serve", "create-admin", "rotate-signing-key", "reindex", "purge",
                          "hl7 send")}
    for name, result in helps.items():
        assert result.exit_code == 0, (name, result.output)
        assert "<" not in result.output and "list[" not in result.output, (name, result.output)
    assert "HOST" in helps["hl7 send"].output and "PORT" in helps["hl7 send"].output
    assert "SECONDS" in helps["hl7 send"].output and "FILE" in helps["hl7 send"].output
    assert "HEALTHPLATFORM_MLLP_PORT" in helps["hl7 send"].output


def test_serve_help_says_it_starts_the_mllp_listener_too():
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert "HL7v2 MLLP listener" in result.output
    assert "HEALTHPLATFORM_MLLP_ENABLED=false" in result.output


def _listening_socket() -> socket.socket:
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    return taken


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_fails_in_one_line_before_its_banner_when_the_mllp_port_is_busy(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("HEALTHPLATFORM_MLLP_ENABLED", raising=False)
    with _listening_socket() as taken:
        busy = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--port", str(_free_port())],
                                    env={"HEALTHPLATFORM_MLLP_PORT": str(busy)})
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: cannot listen for MLLP on 127.0.0.1:{busy}: address already in use "
        "(another server running? see HEALTHPLATFORM_MLLP_PORT, or "
        "HEALTHPLATFORM_MLLP_ENABLED=false)"]
    assert not (tmp_path / "healthplatform.db").exists()  # nothing was started


def test_serve_fails_the_same_way_when_the_http_port_is_busy(tmp_path, monkeypatch):
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))
    with _listening_socket() as taken:
        busy = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--port", str(busy)],
                                    env={"HEALTHPLATFORM_MLLP_ENABLED": "false"})
    assert result.exit_code == 1
    assert result.output.startswith(f"error: cannot listen for HTTP on 127.0.0.1:{busy}")
    assert "healthplatform on" not in result.output


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("HEALTHPLATFORM_TRUSTED_PROXIES", "[127.0.0.1]", "not valid JSON"),
    ("HEALTHPLATFORM_HTTP_PORT", "eighty", "valid integer"),
    ("HEALTHPLATFORM_OUTBOUND_ALLOW", "10.0.0.0/8", "not valid JSON"),
])
def test_a_malformed_setting_stops_serve_with_one_line(tmp_path, monkeypatch, variable,
                                                        value, says):
    """Issue 32 result 13: the setting, what was wrong, an example; no traceback."""
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["serve"], env={variable: value,
                                                     "HEALTHPLATFORM_MLLP_ENABLED": "false"})
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith(f"error: {variable}: ") and says in line
    assert f"for example {variable}='" in line
    assert not (tmp_path / "healthplatform.db").exists()
