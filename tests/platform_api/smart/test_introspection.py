"""Token introspection (RFC 7662) and revocation (RFC 7009)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import httpx

from tests.platform_api.smart.support import Browser, Clinic, bearer, exchange, register

JSON = dict[str, Any]
HERE = Path(__file__).parent
# The IG's example (published with a trailing comma): the fields an answer carries.
EXAMPLE_FIELDS = set(re.findall(r'"(\w+)":', (
    HERE / "introspection-response.hl7-spec-example.json").read_text()))


async def launched(client: httpx.AsyncClient, clinic: Clinic, app: JSON,
                   scope: str = "launch/patient openid fhirUser offline_access patient/*.rs"
                   ) -> JSON:
    zawadi = await client.post("/fhir/Practitioner", headers=clinic.admin["headers"], json={
        "resourceType": "Practitioner", "identifier": [{
            "system": "urn:healthplatform:user", "value": clinic.doctor["user"]["id"]}]})
    assert zawadi.status_code == 201
    authorization = await Browser(client).authorize(app["client_id"], scope,
                                                    clinic.doctor["user"]["email"],
                                                    patient=clinic.amina)
    return (await exchange(client, authorization, app["client_id"])).json()  # type: ignore[no-any-return]


async def test_an_active_token_introspects_with_its_grant_and_launch_context(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    body = await launched(client, clinic, public_app)
    answer = await client.post("/oauth2/introspect", data={"token": body["access_token"]},
                               headers=bearer(body["access_token"]))
    assert answer.status_code == 200 and answer.headers["cache-control"] == "no-store"
    info = answer.json()
    assert EXAMPLE_FIELDS <= set(info)
    assert info["active"] is True and info["scope"] == body["scope"]
    assert info["client_id"] == public_app["client_id"] and info["patient"] == clinic.amina
    assert isinstance(info["exp"], int) and info["sub"] == clinic.doctor["user"]["id"]
    assert info["iss"] == "http://testserver/fhir" and info["fhirUser"] == body["fhirUser"]


async def test_anything_not_a_live_smart_token_is_exactly_inactive(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    body = await launched(client, clinic, public_app)
    for token in ("v4.public.garbage", "rt_unknown", clinic.doctor["token"], ""):
        answer = await client.post("/oauth2/introspect", data={"token": token},
                                   headers=bearer(body["access_token"]))
        if token:
            assert answer.json() == {"active": False}, token
        else:
            assert answer.status_code == 400


async def test_introspection_needs_a_bearer_token_or_a_confidential_client(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    body = await launched(client, clinic, public_app)
    anonymous = await client.post("/oauth2/introspect", data={"token": body["access_token"]})
    assert anonymous.status_code == 401
    confidential = await register(client, clinic.platform_admin["headers"],
                                  token_endpoint_auth_method="client_secret_basic")
    basic = base64.b64encode(f"{confidential['client_id']}:"
                             f"{confidential['client_secret']}".encode()).decode()
    answer = await client.post("/oauth2/introspect", data={"token": body["access_token"]},
                               headers={"Authorization": f"Basic {basic}"})
    assert answer.json()["active"] is True


async def test_revoking_an_access_token_stops_it_and_a_refresh_token_its_whole_grant(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    body = await launched(client, clinic, public_app)
    form = {"client_id": public_app["client_id"]}
    revoked = await client.post("/oauth2/revoke", data={**form, "token": body["access_token"]})
    assert revoked.status_code == 200
    assert (await client.get("/fhir/Patient", headers=bearer(body["access_token"]))
            ).status_code == 401
    refreshed = (await client.post("/oauth2/token", data={
        **form, "grant_type": "refresh_token", "refresh_token": body["refresh_token"]})).json()
    assert (await client.get("/fhir/Patient", headers=bearer(refreshed["access_token"]))
            ).status_code == 200
    await client.post("/oauth2/revoke", data={**form, "token": refreshed["refresh_token"]})
    assert (await client.get("/fhir/Patient", headers=bearer(refreshed["access_token"]))
            ).status_code == 401
    assert (await client.post("/oauth2/token", data={
        **form, "grant_type": "refresh_token", "refresh_token": refreshed["refresh_token"]})
            ).status_code == 400
    unknown = await client.post("/oauth2/revoke", data={**form, "token": "rt_unknown"})
    assert unknown.status_code == 200


async def test_a_client_cannot_revoke_another_clients_token(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    body = await launched(client, clinic, public_app)
    other = await register(client, clinic.platform_admin["headers"], client_name="Tumaini")
    refused = await client.post("/oauth2/revoke", data={
        "client_id": other["client_id"], "token": body["access_token"]})
    assert refused.status_code == 400
    assert (await client.get("/fhir/Patient", headers=bearer(body["access_token"]))
            ).status_code == 200
