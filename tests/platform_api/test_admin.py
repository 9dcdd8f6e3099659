"""Administration (Super Admin): list users with filters, suspend and reactivate
(effective from the next request, tokens and API keys included), system health."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiosmtpd.controller import Controller
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from tests.conftest import make_settings, register_and_login

PASSWORD = "correct horse battery"


def refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


@pytest.fixture
async def clinic(app: Any, client: httpx.AsyncClient) -> dict[str, Any]:
    """A small clinic: two doctors (one with ORG:DOCTOR), a nurse, a patient."""
    people = {
        "wanjiru": await register_and_login(client, first_name="Wanjiru", last_name="Kamau",
                                            role="DOCTOR", email="wanjiru.kamau@nairobi.example"),
        "kofi": await register_and_login(client, first_name="Kofi", last_name="Boateng",
                                         role="DOCTOR", email="kofi.boateng@accra.example"),
        "halima": await register_and_login(client, first_name="Halima", last_name="Said",
                                           role="NURSE", email="halima.said@nairobi.example"),
        "amina": await register_and_login(client, email="amina.odhiambo@kisumu.example"),
    }
    await app.state.services.auth.set_roles(people["wanjiru"]["user"]["id"], ["ORG:DOCTOR"])
    return people


async def test_super_admin_lists_users_newest_first_with_pages(
    client: httpx.AsyncClient, admin: dict[str, Any], clinic: dict[str, Any]
) -> None:
    response = await client.get("/api/admin/users?limit=2", headers=admin["headers"])
    assert response.status_code == 200
    body = response.json()
    assert body["meta"] == {"page": 1, "limit": 2, "total": 5}
    first = body["data"][0]
    assert {"mfa_enabled", "last_login_at", "email_verified", "status", "roles"} <= set(first)
    assert first["last_login_at"] is not None
    assert "password_hash" not in response.text
    pages = [(await client.get(f"/api/admin/users?limit=2&page={n}", headers=admin["headers"])
              ).json()["data"] for n in (1, 2, 3)]
    listed = [u for page in pages for u in page]
    assert [len(page) for page in pages] == [2, 2, 1]
    assert len({u["id"] for u in listed}) == 5
    created = [u["created_at"] for u in listed]
    assert created == sorted(created, reverse=True)  # newest first


async def test_filters_by_status_role_and_part_of_the_address(
    app: Any, client: httpx.AsyncClient, admin: dict[str, Any], clinic: dict[str, Any]
) -> None:
    await app.state.services.auth.set_user_status(clinic["kofi"]["user"]["id"], "suspended")

    async def emails(query: str) -> list[str]:
        answer = await client.get(f"/api/admin/users?{query}", headers=admin["headers"])
        assert answer.status_code == 200, answer.text
        return sorted(u["email"] for u in answer.json()["data"])

    assert await emails("status=suspended") == ["kofi.boateng@accra.example"]
    assert await emails("role=ORG:DOCTOR") == ["wanjiru.kamau@nairobi.example"]
    assert await emails("email=NAIROBI") == ["halima.said@nairobi.example",
                                            "wanjiru.kamau@nairobi.example"]
    assert await emails("email=nairobi&status=active&role=ORG:DOCTOR") == [
        "wanjiru.kamau@nairobi.example"]
    paged = await client.get("/api/admin/users?email=nairobi&limit=1&page=2",
                             headers=admin["headers"])
    assert paged.json()["meta"]["total"] == 2 and len(paged.json()["data"]) == 1
    assert refusal(await client.get("/api/admin/users?status=gone",
                                    headers=admin["headers"])) == (422, "VALIDATION_ERROR")


async def test_only_the_super_admin_administers_users(
    app: Any, client: httpx.AsyncClient, clinic: dict[str, Any]
) -> None:
    await app.state.services.auth.set_roles(clinic["kofi"]["user"]["id"], ["APP:ADMIN"])
    for who in ("amina", "kofi"):
        headers = clinic[who]["headers"]
        assert refusal(await client.get("/api/admin/users", headers=headers)) == (
            403, "FORBIDDEN")
        assert refusal(await client.get("/api/admin/health", headers=headers)) == (
            403, "FORBIDDEN")
    assert refusal(await client.get("/api/admin/users")) == (401, "UNAUTHORIZED")


async def test_suspension_takes_effect_on_the_next_request_and_reactivation_restores(
    app: Any, client: httpx.AsyncClient, admin: dict[str, Any], clinic: dict[str, Any]
) -> None:
    halima = clinic["halima"]
    key = (await client.post("/api/developer/keys", headers=halima["headers"], json={
        "name": "ward tablet", "scopes": ["Patient:read"]})).json()["data"]["key"]
    login = (await client.post("/api/auth/login", json={
        "email": halima["user"]["email"], "password": PASSWORD})).json()["data"]
    assert (await client.get("/fhir/Patient", headers=halima["headers"])).status_code == 200
    response = await client.patch(f"/api/admin/users/{halima['user']['id']}/status",
                                  headers=admin["headers"],
                                  json={"status": "suspended", "reason": "left the ward"})
    assert response.status_code == 200 and response.json()["data"]["status"] == "suspended"
    assert refusal(await client.get("/api/auth/me", headers=halima["headers"])) == (
        403, "ACCOUNT_SUSPENDED")
    assert (await client.get("/fhir/Patient", headers={"X-API-Key": key})).status_code == 403
    assert refusal(await client.post("/api/auth/refresh", json={
        "refresh_token": login["refresh_token"]})) == (401, "INVALID_REFRESH_TOKEN")
    assert refusal(await client.post("/api/auth/login", json={
        "email": halima["user"]["email"], "password": PASSWORD})) == (403, "ACCOUNT_SUSPENDED")

    await client.patch(f"/api/admin/users/{halima['user']['id']}/status",
                       headers=admin["headers"], json={"status": "active"})
    assert (await client.get("/fhir/Patient", headers={"X-API-Key": key})).status_code == 200
    assert (await client.post("/api/auth/login", json={
        "email": halima["user"]["email"], "password": PASSWORD})).status_code == 200


async def test_status_changes_are_audited_with_who_and_why(
    app: Any, client: httpx.AsyncClient, admin: dict[str, Any], clinic: dict[str, Any]
) -> None:
    target = clinic["kofi"]["user"]["id"]
    await client.patch(f"/api/admin/users/{target}/status", headers=admin["headers"],
                       json={"status": "suspended", "reason": "licence expired"})
    search = await client.get("/fhir/AuditEvent", headers=admin["headers"])
    events = [e["resource"] for e in search.json().get("entry", [])]
    [event] = [e for e in events if e["subtype"][0]["code"] == "110137"
               and e.get("entity", [{}])[0].get("what", {}).get("identifier", {})
               .get("value") == target]
    assert event["type"]["code"] == "110113" and event["outcome"] == "0"
    assert event["agent"][0]["who"]["identifier"]["value"] == admin["user"]["id"]
    details = {d["type"]: d["valueString"] for d in event["entity"][0]["detail"]}
    assert details == {"status": "suspended", "reason": "licence expired"}


async def test_status_change_refusals(
    client: httpx.AsyncClient, admin: dict[str, Any], clinic: dict[str, Any]
) -> None:
    self_suspend = await client.patch(f"/api/admin/users/{admin['user']['id']}/status",
                                      headers=admin["headers"], json={"status": "suspended"})
    assert refusal(self_suspend) == (409, "CANNOT_SUSPEND_SELF")
    unknown = await client.patch("/api/admin/users/no-such-user/status",
                                 headers=admin["headers"], json={"status": "suspended"})
    assert refusal(unknown) == (404, "NOT_FOUND")
    invalid = await client.patch(f"/api/admin/users/{clinic['amina']['user']['id']}/status",
                                 headers=admin["headers"], json={"status": "deleted"})
    assert refusal(invalid) == (422, "VALIDATION_ERROR")


# -- health ----------------------------------------------------------------------------
async def test_health_reports_every_part_and_disabled_email(
    client: httpx.AsyncClient, admin: dict[str, Any]
) -> None:
    response = await client.get("/api/admin/health", headers=admin["headers"])
    assert response.status_code == 200
    health = response.json()["data"]
    assert health["status"] == "ok" and health["failing"] == []
    assert health["version"] == "0.1.0" and health["uptime_seconds"] >= 0
    checks = health["checks"]
    assert set(checks) == {"store", "bus", "smtp", "disk", "rate_limiter"}
    assert checks["store"]["status"] == "ok" and checks["store"]["latency_ms"] >= 0
    assert checks["bus"]["status"] == "ok" and checks["bus"]["dead_letters"] == 0
    assert checks["smtp"] == {"status": "disabled"}
    assert checks["disk"]["status"] == "ok" and checks["disk"]["free_bytes"] > 0
    assert checks["rate_limiter"] == {"status": "ok", "backend": "memory"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Sink:
    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        return "250 OK"


@pytest.fixture
def smtp_port() -> Iterator[int]:
    port = _free_port()
    controller = Controller(_Sink(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


async def admin_client(tmp_path: Path, **overrides: Any
                       ) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    application = create_app(make_settings(tmp_path, **overrides))
    async with LifespanManager(application, startup_timeout=30):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            person = await register_and_login(c)
            await application.state.services.auth.create_admin(
                person["user"]["email"], PASSWORD, "Grace", "Admin")
            token = (await c.post("/api/auth/login", json={
                "email": person["user"]["email"], "password": PASSWORD})).json()["data"]["token"]
            yield c, {"Authorization": f"Bearer {token}"}


async def test_health_checks_the_smtp_server(tmp_path: Path, smtp_port: int) -> None:
    async for client, headers in admin_client(tmp_path, smtp_host="127.0.0.1",
                                              smtp_port=smtp_port, smtp_tls="none"):
        smtp = (await client.get("/api/admin/health", headers=headers)).json()["data"]
        assert smtp["checks"]["smtp"]["status"] == "ok"
        assert smtp["checks"]["smtp"]["host"] == f"127.0.0.1:{smtp_port}"


async def test_health_is_degraded_when_the_smtp_server_is_unreachable(tmp_path: Path) -> None:
    async for client, headers in admin_client(tmp_path, smtp_host="127.0.0.1",
                                              smtp_port=_free_port(), smtp_tls="none",
                                              smtp_timeout_seconds=1.0):
        health = (await client.get("/api/admin/health", headers=headers)).json()["data"]
        assert health["status"] == "degraded" and health["failing"] == ["smtp"]
        assert health["checks"]["smtp"]["status"] == "unavailable"
        assert json.dumps(health["checks"]["smtp"]).count("error") == 1
