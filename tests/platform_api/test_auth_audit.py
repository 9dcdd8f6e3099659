"""Auth events become FHIR AuditEvents (DICOM/HL7 codes), written through the FHIR
service and readable at /fhir/AuditEvent."""

from __future__ import annotations

from typing import Any

import httpx
import pyotp

from fhir_server.validation import validate_resource
from platform_api.audit import EVENTS, AuditRecord, ClientInfo, audit_event
from tests.conftest import register_and_login

DCM = "http://dicom.nema.org/resources/ontology/DCM"
PASSWORD = "correct horse battery"


async def audit_trail(client: httpx.AsyncClient, admin: dict[str, Any]) -> list[dict[str, Any]]:
    response = await client.get("/fhir/AuditEvent?_count=200", headers=admin["headers"])
    assert response.status_code == 200, response.text
    return [entry["resource"] for entry in response.json().get("entry", [])]


def about(events: list[dict[str, Any]], subtype: str, outcome: str) -> list[dict[str, Any]]:
    return [e for e in events if e["subtype"][0]["code"] == subtype and e["outcome"] == outcome]


def test_every_event_kind_makes_a_valid_audit_event() -> None:
    for kind in EVENTS:
        resource = audit_event(AuditRecord(
            kind, user_id="u-1", user_email="amina@kliniki.example", api_key_id="Ab3dE6gH",
            client=ClientInfo("203.0.113.5", "KlinikiApp/2.1"), subject_id="u-2",
            details={"method": "password"}), "healthplatform")
        validate_resource(resource)
        assert resource["type"]["system"] == DCM
        assert resource["source"]["type"][0]["code"] == "4"


async def test_a_login_is_recorded_with_who_from_where_and_how(
    client: httpx.AsyncClient, admin: dict[str, Any]
) -> None:
    person = await register_and_login(client, email="amina.odhiambo@kliniki.example")
    events = about(await audit_trail(client, admin), "110122", "0")
    [login] = [e for e in events if e["agent"][0]["who"].get("display")
               == "amina.odhiambo@kliniki.example"]
    assert login["type"] == {"system": DCM, "code": "110114", "display": "User Authentication"}
    assert login["subtype"] == [{"system": DCM, "code": "110122", "display": "Login"}]
    assert login["action"] == "E"
    agent = login["agent"][0]
    assert agent["who"]["identifier"] == {"system": "urn:healthplatform:user",
                                          "value": person["user"]["id"]}
    assert agent["requestor"] is True and agent["network"] == {"address": "127.0.0.1",
                                                                "type": "2"}
    assert login["source"]["observer"]["display"] == "healthplatform auth"
    assert login["entity"][0]["detail"] == [{"type": "method", "valueString": "password"}]


async def test_failed_and_refused_logins_are_recorded_as_failures(
    app: Any, client: httpx.AsyncClient, admin: dict[str, Any]
) -> None:
    person = await register_and_login(client, email="kwame.mensah@kliniki.example")
    await client.post("/api/auth/login", json={"email": "kwame.mensah@kliniki.example",
                                               "password": "wrong-password"})
    await client.post("/api/auth/login", json={"email": "ghost@kliniki.example",
                                               "password": "wrong-password"})
    await app.state.services.auth.set_user_status(person["user"]["id"], "suspended")
    await client.post("/api/auth/login", json={"email": "kwame.mensah@kliniki.example",
                                               "password": PASSWORD})
    events = await audit_trail(client, admin)
    failures = about(events, "110122", "4")
    assert {e["agent"][0]["who"]["display"] for e in failures} >= {
        "kwame.mensah@kliniki.example", "ghost@kliniki.example"}
    assert all(e["outcomeDesc"] == "wrong e-mail or password" for e in failures)
    [suspended] = about(events, "110122", "8")
    assert suspended["outcomeDesc"] == "suspended account"


async def test_logout_and_a_reused_refresh_token_are_recorded(
    client: httpx.AsyncClient, admin: dict[str, Any]
) -> None:
    person = await register_and_login(client)
    session = (await client.post("/api/auth/login", json={
        "email": person["user"]["email"], "password": PASSWORD})).json()["data"]
    await client.post("/api/auth/refresh", json={"refresh_token": session["refresh_token"]})
    await client.post("/api/auth/refresh", json={"refresh_token": session["refresh_token"]})
    await client.post("/api/auth/logout", headers=person["headers"])
    events = await audit_trail(client, admin)
    [logout] = about(events, "110123", "0")
    assert logout["agent"][0]["who"]["identifier"]["value"] == person["user"]["id"]
    [reuse] = about(events, "110122", "8")
    assert "reused" in reuse["outcomeDesc"]
    assert reuse["agent"][0]["who"]["identifier"]["value"] == person["user"]["id"]


async def test_audit_events_are_ordinary_fhir_resources(
    client: httpx.AsyncClient, admin: dict[str, Any]
) -> None:
    [first, *_] = await audit_trail(client, admin)
    read = await client.get(f"/fhir/AuditEvent/{first['id']}", headers=admin["headers"])
    assert read.status_code == 200 and read.json()["meta"]["versionId"] == "1"


async def test_mfa_changes_and_failed_codes_are_recorded(
    client: httpx.AsyncClient, admin: dict[str, Any]
) -> None:
    person = await register_and_login(client)
    secret = (await client.post("/api/auth/mfa/enroll", headers=person["headers"])
              ).json()["data"]["secret"]
    await client.post("/api/auth/mfa/verify", headers=person["headers"],
                      json={"code": pyotp.TOTP(secret).now()})
    pending = (await client.post("/api/auth/login", json={
        "email": person["user"]["email"], "password": PASSWORD})).json()["data"]
    await client.post("/api/auth/mfa/challenge", json={"code": "000000"},
                      headers={"Authorization": f"Bearer {pending['mfa_token']}"})
    events = [e for e in await audit_trail(client, admin)
              if person["user"]["id"] in str(e["agent"])]
    [enabled] = about(events, "110137", "0")
    assert enabled["type"]["code"] == "110113" and enabled["outcomeDesc"] == "MFA enabled"
    [refused] = about(events, "110122", "4")
    assert refused["outcomeDesc"].startswith("MFA code refused")


async def test_an_auth_event_joins_the_audit_log_only_with_the_change_it_records(
    app: Any, client: httpx.AsyncClient, admin: dict[str, Any]
) -> None:
    """Staged in a unit of work, an event is appended once the unit commits: a change
    that fails leaves no record of itself; the log, not the clinical store, keeps it."""
    services = app.state.services
    person = await register_and_login(client, email="baraka.mwangi@kliniki.example")
    record = AuditRecord("password-reset", user_id=person["user"]["id"],
                         description="reset that never happened")
    try:
        async with services.store.unit_of_work() as uow:
            services.auth.audit.stage(uow, record)
            raise RuntimeError("the reset failed before it was stored")
    except RuntimeError:
        pass
    async with services.store.unit_of_work() as uow:
        services.auth.audit.stage(uow, AuditRecord(
            "password-reset", user_id=person["user"]["id"], description="reset done"))
        await uow.commit()
    mine = [e for e in await audit_trail(client, admin)
            if e.get("outcomeDesc", "").startswith("reset")]
    assert [e["outcomeDesc"] for e in mine] == ["reset done"]
    plan = await services.fhir.parse(["AuditEvent"], [])
    assert (await services.store.search(plan)).resources == []  # not a clinical resource
