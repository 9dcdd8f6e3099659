"""Developer API keys: create (secret once, stored hashed, scopes validated), list (no
secrets), rotate (old secret valid 24 h), revoke (at once); ``X-API-Key`` reaches the
routes its scopes name; last use recorded and audited."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from fhir_server.store.sqlite import SQLiteStore
from platform_api.auth.service import AuthService
from platform_api.auth.tokens import rfc3339
from tests.conftest import register_and_login

OBSERVATION = {
    "resourceType": "Observation", "status": "final",
    "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4",
                         "display": "Heart rate"}]},
    "valueQuantity": {"value": 72, "unit": "beats/minute",
                      "system": "http://unitsofmeasure.org", "code": "/min"},
}
PATIENT = {"resourceType": "Patient", "name": [{"family": "Odhiambo", "given": ["Amina"]}]}


async def create_key(client: httpx.AsyncClient, headers: dict[str, str], scopes: list[str],
                     name: str = "Lab results sync") -> dict[str, Any]:
    response = await client.post("/api/developer/keys", headers=headers,
                                 json={"name": name, "scopes": scopes})
    assert response.status_code == 201, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


def api_key(data: dict[str, Any]) -> dict[str, str]:
    return {"X-API-Key": data["key"]}


def refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def audit_events(app: Any) -> list[dict[str, Any]]:
    await app.state.services.auth.drain()
    return await app.state.services.fhir.search("AuditEvent", [("_count", "1000")])


# -- managing keys ---------------------------------------------------------------------
async def test_create_shows_the_secret_once_and_stores_only_its_hash(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    response = await client.post("/api/developer/keys", headers=user["headers"], json={
        "name": "Lab results sync", "scopes": ["Observation:read", "patients:read"]})
    assert response.status_code == 201
    assert response.headers["cache-control"] == "no-store"
    data = response.json()["data"]
    assert re.fullmatch(r"hpk_[A-Za-z0-9]{8}\.[A-Za-z0-9]{32}", data["key"])
    assert data["prefix"] == f"hpk_{data['id']}" and data["key"].startswith(data["prefix"])
    assert data["scopes"] == ["Observation:read", "patients:read"]
    assert data["status"] == "active" and data["last_used_at"] is None
    stored = await app.state.services.store.get_document("api_keys", data["id"])
    secret = data["key"].split(".")[1]
    assert secret not in json.dumps(stored) and len(stored["secret_hash"]) == 64


async def test_list_never_shows_secrets_and_pages(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    keys = [await create_key(client, user["headers"], ["vitals:read"], f"Key {n}")
            for n in range(3)]
    response = await client.get("/api/developer/keys?limit=2", headers=user["headers"])
    body = response.json()
    assert body["meta"] == {"page": 1, "limit": 2, "total": 3}
    assert all("key" not in k and "secret_hash" not in k for k in body["data"])
    assert not any(k["key"].split(".")[1] in response.text for k in keys)
    other = await register_and_login(client, first_name="Kwame", last_name="Mensah")
    theirs = await client.get("/api/developer/keys", headers=other["headers"])
    assert theirs.json()["meta"]["total"] == 0


@pytest.mark.parametrize(("scopes", "field"), [
    (["patients"], "scopes.0"),
    (["patients:read", "patients:delete"], "scopes.1"),
    (["spaceships:read"], "scopes.0"),
    (["Patient:read", "Patient read"], "scopes.1"),
    ([], "scopes"),
])
async def test_scopes_must_be_known_resource_and_action(
    client: httpx.AsyncClient, user: dict[str, Any], scopes: list[str], field: str
) -> None:
    response = await client.post("/api/developer/keys", headers=user["headers"],
                                 json={"name": "bad", "scopes": scopes})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == field


# -- using keys ------------------------------------------------------------------------
async def test_a_key_reaches_what_its_scopes_name_and_nothing_else(
    client: httpx.AsyncClient, clinic_admin: dict[str, Any]
) -> None:
    """A clinic's integration key: its owner's rights, within the key's scopes."""
    user = clinic_admin
    reader = api_key(await create_key(client, user["headers"], ["Patient:read"]))
    writer = api_key(await create_key(client, user["headers"], ["Patient:*", "*:read"]))
    assert (await client.get("/fhir/Patient", headers=reader)).status_code == 200
    refused = await client.post("/fhir/Patient", json=PATIENT, headers=reader)
    assert refused.status_code == 403
    assert "Patient:write" in refused.json()["issue"][0]["diagnostics"]
    assert (await client.get("/fhir/Observation", headers=reader)).status_code == 403
    created = await client.post("/fhir/Patient", json=PATIENT, headers=writer)
    assert created.status_code == 201
    assert (await client.get("/fhir/Observation", headers=writer)).status_code == 200
    assert (await client.post("/fhir/Observation", json=OBSERVATION, headers=writer)
            ).status_code == 403
    assert (await client.get("/api/patients/me", headers=writer)).status_code == 404  # no profile
    observations = api_key(await create_key(client, user["headers"], ["Observation:read"]))
    assert refusal(await client.get("/api/patients/me", headers=observations)) == (
        403, "INSUFFICIENT_SCOPE")


async def test_key_scopes_name_resource_types_not_url_prefixes(
    client: httpx.AsyncClient, clinic_admin: dict[str, Any]
) -> None:
    """Result 7 of issue 31: an organization's patient list is Patient data, whichever
    path reaches it; ``patients:read`` (the /api name) and ``Patient:read`` are one scope."""
    org = clinic_admin["org_id"]
    made = await client.post(f"/api/organizations/{org}/patients",
                             headers=clinic_admin["headers"], json={
                                 "first_name": "Amina", "last_name": "Odhiambo",
                                 "date_of_birth": "1988-04-12", "gender": "female"})
    assert made.status_code == 201, made.text
    listed = f"/api/organizations/{org}/patients"
    for scopes in (["patients:read"], ["Patient:read"], ["*:read"]):
        key = api_key(await create_key(client, clinic_admin["headers"], scopes))
        answer = await client.get(listed, headers=key)
        assert answer.status_code == 200, (scopes, answer.text)
        assert answer.json()["meta"]["total"] == 1
        assert (await client.get("/fhir/Patient", headers=key)).status_code == 200
    # The URL's first segment is no longer the scope: organizations:read is about
    # Organizations, not their patients; and reading is not writing.
    for scopes in (["organizations:read"], ["Observation:read"]):
        key = api_key(await create_key(client, clinic_admin["headers"], scopes))
        assert refusal(await client.get(listed, headers=key)) == (403, "INSUFFICIENT_SCOPE")
    reader = api_key(await create_key(client, clinic_admin["headers"], ["patients:read"]))
    assert refusal(await client.post(listed, headers=reader, json={
        "first_name": "Baraka", "last_name": "Mwangi", "date_of_birth": "1990-01-01",
        "gender": "male"})) == (403, "INSUFFICIENT_SCOPE")


async def test_keys_cannot_manage_keys_or_the_account(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    key = api_key(await create_key(client, user["headers"], ["*:*"]))
    for method, path in (("GET", "/api/developer/keys"), ("POST", "/api/developer/keys"),
                         ("GET", "/api/auth/me"), ("POST", "/api/auth/logout")):
        assert refusal(await client.request(method, path, headers=key)) == (
            403, "INSUFFICIENT_SCOPE"), path


async def test_malformed_unknown_and_wrong_keys_are_refused(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    data = await create_key(client, user["headers"], ["Patient:read"])
    for presented in ("hpk_short", "hpk_ZZZZZZZZ." + "a" * 32, data["key"][:-1] + "#",
                      data["key"][:-4] + "AAAA"):
        response = await client.get("/api/patients/me", headers={"X-API-Key": presented})
        assert refusal(response) == (401, "INVALID_API_KEY"), presented


async def test_rotation_issues_a_new_secret_and_keeps_the_old_one_for_24_hours(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    old = await create_key(client, user["headers"], ["Patient:read"])
    response = await client.post(f"/api/developer/keys/{old['id']}/rotate",
                                 headers=user["headers"])
    assert response.status_code == 200
    new = response.json()["data"]
    assert new["id"] == old["id"] and new["key"] != old["key"]
    assert new["previous_secret_valid_until"] is not None
    for key in (old, new):
        assert (await client.get("/fhir/Patient", headers=api_key(key))).status_code == 200
    store = app.state.services.store
    doc = await store.get_document("api_keys", old["id"])
    async with store.unit_of_work() as uow:  # a day later
        uow.put_document("api_keys", doc["id"], {**doc, "grace": [
            {**g, "expires_at": rfc3339(0)} for g in doc["grace"]]})
        await uow.commit()
    expired = await client.get("/api/patients/me", headers=api_key(old))
    assert refusal(expired) == (401, "INVALID_API_KEY")
    assert "rotated" in expired.json()["error"]["message"]
    assert (await client.get("/fhir/Patient", headers=api_key(new))).status_code == 200


async def test_after_five_rotations_only_the_newest_and_the_one_before_it_work(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    secrets = [await create_key(client, user["headers"], ["Patient:read"])]
    for _ in range(5):
        rotated = await client.post(f"/api/developer/keys/{secrets[0]['id']}/rotate",
                                    headers=user["headers"])
        secrets.append(rotated.json()["data"])
    answers = [(await client.get("/fhir/Patient", headers=api_key(k))).status_code
               for k in secrets]
    assert answers == [401, 401, 401, 401, 200, 200]


async def test_star_is_the_all_access_scope_as_the_readme_says(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    key = await create_key(client, user["headers"], ["*"])
    assert key["scopes"] == ["*:*"]
    assert (await client.get("/fhir/Observation", headers=api_key(key))).status_code == 200
    assert (await client.get("/api/patients/me", headers=api_key(key))).status_code == 404


async def test_revocation_is_immediate_here_and_in_other_processes(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any], tmp_path: Path
) -> None:
    data = await create_key(client, user["headers"], ["Patient:read"])
    elsewhere_store = SQLiteStore(tmp_path / "healthplatform.db")
    await elsewhere_store.open()
    try:
        elsewhere = AuthService(app.state.services.settings, elsewhere_store)
        await elsewhere.start()
        assert (await elsewhere.authenticate_api_key(data["key"])).kind == "api_key"
        response = await client.delete(f"/api/developer/keys/{data['id']}",
                                       headers=user["headers"])
        assert response.status_code == 200 and response.json()["data"]["status"] == "revoked"
        refused = await client.get("/fhir/Patient", headers=api_key(data))
        assert refused.status_code == 401
        with pytest.raises(Exception, match="revoked"):
            await elsewhere.authenticate_api_key(data["key"])
        await elsewhere.stop()
    finally:
        await elsewhere_store.close()
    rotate = await client.post(f"/api/developer/keys/{data['id']}/rotate",
                               headers=user["headers"])
    assert refusal(rotate) == (409, "KEY_REVOKED")
    listed = await client.get("/api/developer/keys?include_revoked=true", headers=user["headers"])
    assert [k["status"] for k in listed.json()["data"]] == ["revoked"]
    assert (await client.get("/api/developer/keys", headers=user["headers"])
            ).json()["meta"]["total"] == 0


async def test_another_accounts_key_is_not_found(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    data = await create_key(client, user["headers"], ["Patient:read"])
    other = await register_and_login(client, first_name="Kwame", last_name="Mensah")
    for method, path in (("DELETE", f"/api/developer/keys/{data['id']}"),
                         ("POST", f"/api/developer/keys/{data['id']}/rotate")):
        assert refusal(await client.request(method, path, headers=other["headers"])) == (
            404, "NOT_FOUND")
    assert (await client.get("/fhir/Patient", headers=api_key(data))).status_code == 200


async def test_a_suspended_owners_keys_stop_working(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    data = await create_key(client, user["headers"], ["Patient:read"])
    await app.state.services.auth.set_user_status(user["user"]["id"], "suspended")
    assert refusal(await client.get("/api/patients/me", headers=api_key(data))) == (
        403, "ACCOUNT_SUSPENDED")


async def test_last_use_is_recorded_at_most_once_a_minute_and_audited(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    data = await create_key(client, user["headers"], ["Patient:read"])
    for _ in range(3):
        assert (await client.get("/fhir/Patient", headers=api_key(data))).status_code == 200
    events = await audit_events(app)
    uses = [e for e in events if e["agent"][0]["who"].get("identifier", {}).get("value")
            == data["id"] and e["subtype"][0]["code"] == "110122" and e["outcome"] == "0"]
    assert len(uses) == 1
    assert uses[0]["agent"][0]["type"]["coding"][0]["code"] == "110150"  # Application
    listed = (await client.get("/api/developer/keys", headers=user["headers"])).json()["data"]
    assert listed[0]["last_used_at"] is not None


async def test_key_changes_and_refused_keys_are_audited(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    data = await create_key(client, user["headers"], ["Patient:read"])
    await client.post(f"/api/developer/keys/{data['id']}/rotate", headers=user["headers"])
    await client.delete(f"/api/developer/keys/{data['id']}", headers=user["headers"])
    await client.get("/fhir/Patient", headers=api_key(data))
    events = await audit_events(app)
    summaries = [(e["subtype"][0]["code"], e["action"], e["outcome"]) for e in events
                 if data["id"] in json.dumps(e)]
    assert ("110137", "C", "0") in summaries  # created
    assert ("110137", "U", "0") in summaries  # rotated
    assert ("110137", "D", "0") in summaries  # revoked
    assert ("110122", "E", "4") in summaries  # the refused use


async def test_an_administrators_key_has_no_administrator_powers(
    client: httpx.AsyncClient, user: dict[str, Any], admin: dict[str, Any]
) -> None:
    profile = await client.post("/api/patients", headers=user["headers"], json={
        "first_name": "Amina", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
        "gender": "female"})
    path = f"/api/patients/{profile.json()['data']['id']}"
    assert (await client.get(path, headers=admin["headers"])).status_code == 200
    key = api_key(await create_key(client, admin["headers"], ["patients:read"]))
    assert refusal(await client.get(path, headers=key)) == (403, "FORBIDDEN")
