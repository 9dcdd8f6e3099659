"""Client registration (RFC 7591 at /oauth2/register) and /api/smart/clients: who may
register what, the metadata rules, secrets shown once and hashed at rest, and disabling."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from platform_api.smart.oauth import CLIENTS
from tests.conftest import register_and_login
from tests.platform_api.smart.support import (
    REDIRECT_URI,
    Browser,
    Clinic,
    bearer,
    register,
    smart_token,
)

JSON = dict[str, Any]
BACKEND = {"client_name": "Kisumu Lab Sync", "grant_types": ["client_credentials"],
           "token_endpoint_auth_method": "private_key_jwt", "redirect_uris": [],
           "launch_uri": None, "jwks_uri": "https://lab-sync.example.org/jwks.json",
           "scope": "system/Observation.rs system/Patient.rs"}


async def api_key(client: httpx.AsyncClient, user: JSON, *scopes: str) -> dict[str, str]:
    created = await client.post("/api/developer/keys", headers=user["headers"],
                                json={"name": "SMART apps", "scopes": list(scopes)})
    assert created.status_code == 201, created.text
    return {"X-API-Key": created.json()["data"]["key"]}


async def test_a_symmetric_client_gets_its_secret_once_and_it_is_hashed_at_rest(
        app: Any, client: httpx.AsyncClient, clinic: Clinic) -> None:
    registered = await register(client, clinic.platform_admin["headers"],
                                token_endpoint_auth_method="client_secret_basic")
    secret = registered["client_secret"]
    assert secret.startswith("hps_") and registered["client_secret_expires_at"] == 0
    stored = await app.state.services.store.get_document(CLIENTS, registered["client_id"])
    assert secret not in str(stored) and stored["secret_hash"]
    listed = await client.get(f"/api/smart/clients/{registered['client_id']}",
                              headers=clinic.platform_admin["headers"])
    assert listed.status_code == 200
    assert "client_secret" not in listed.json()["data"] and secret not in listed.text


async def test_a_public_client_registers_without_a_secret(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    registered = await register(client, clinic.platform_admin["headers"])
    assert "client_secret" not in registered
    assert registered["token_endpoint_auth_method"] == "none"
    assert registered["redirect_uris"] == [REDIRECT_URI]


async def test_an_api_key_with_smart_register_registers_apps_but_not_platform_wide_ones(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    developer = await register_and_login(client, first_name="Juma", last_name="Otieno")
    key = await api_key(client, developer, "smart:register")
    assert (await client.post("/oauth2/register", headers=key, json={
        "redirect_uris": [REDIRECT_URI], "token_endpoint_auth_method": "none",
        "scope": "launch/patient patient/*.rs"})).status_code == 201
    wide = await client.post("/oauth2/register", headers=key,
                             json={**BACKEND, "platform_wide": True})
    assert wide.status_code == 403 and wide.json()["error"] == "insufficient_scope"
    for_clinic = await client.post("/oauth2/register", headers=key,
                                   json={**BACKEND, "organization_id": clinic.org_id})
    assert for_clinic.status_code == 403  # not the clinic's ORG:ADMIN
    admin_key = await api_key(client, clinic.admin, "smart:register")
    accepted = await client.post("/oauth2/register", headers=admin_key,
                                 json={**BACKEND, "organization_id": clinic.org_id})
    assert accepted.status_code == 201, accepted.text
    other_key = await api_key(client, developer, "Patient:read")
    assert (await client.post("/oauth2/register", headers=other_key, json=BACKEND)
            ).status_code == 403


async def test_only_administrators_and_keys_register(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    body = {"redirect_uris": [REDIRECT_URI], "scope": "patient/*.rs"}
    assert (await client.post("/oauth2/register", json=body)).status_code == 401
    refused = await client.post("/oauth2/register", headers=clinic.doctor["headers"],
                                json=body)
    assert refused.status_code == 403 and refused.json()["error"] == "insufficient_scope"


@pytest.mark.parametrize(("metadata", "error"), [
    ({"redirect_uris": []}, "invalid_redirect_uri"),
    ({"redirect_uris": ["http://amani.example.org/cb"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["https://amani.example.org/cb#top"]}, "invalid_redirect_uri"),
    ({"grant_types": ["client_credentials"], "token_endpoint_auth_method":
      "client_secret_basic", "scope": "system/*.rs"}, "invalid_client_metadata"),
    ({"token_endpoint_auth_method": "private_key_jwt"}, "invalid_client_metadata"),
    ({"token_endpoint_auth_method": "private_key_jwt", "jwks": {"keys": [
        {"kty": "EC", "kid": "k1", "crv": "P-384", "x": "AA", "y": "AA", "d": "AA"}]}},
     "invalid_client_metadata"),
    ({"scope": "system/*.rs"}, "invalid_client_metadata"),
    ({"scope": "patient/Observation.dus"}, "invalid_client_metadata"),
    ({"token_endpoint_auth_method": "client_secret_jwt"}, "invalid_client_metadata"),
])
async def test_metadata_that_breaks_a_rule_is_refused_naming_it(
        client: httpx.AsyncClient, clinic: Clinic, metadata: JSON, error: str) -> None:
    body = {"redirect_uris": [REDIRECT_URI], "token_endpoint_auth_method": "none",
            "scope": "patient/*.rs", **metadata}
    refused = await client.post("/oauth2/register", headers=clinic.platform_admin["headers"],
                                json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] == error and refused.json()["error_description"]


async def test_administrators_list_update_and_disable_clients(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    admin = clinic.platform_admin["headers"]
    listed = (await client.get("/api/smart/clients?limit=10", headers=admin)).json()
    assert listed["meta"]["total"] == 1
    assert listed["data"][0]["client_id"] == public_app["client_id"]
    url = f"/api/smart/clients/{public_app['client_id']}"
    renamed = await client.patch(url, headers=admin, json={"client_name": "Amani Charts 2"})
    assert renamed.status_code == 200 and renamed.json()["data"]["client_name"] == \
        "Amani Charts 2"
    bad = await client.patch(url, headers=admin, json={"redirect_uris": ["ftp://x"]})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "redirect_uris"
    token = await smart_token(client, public_app["client_id"], "user/Patient.rs",
                              clinic.doctor["user"]["email"])
    disabled = await client.patch(url, headers=admin, json={"status": "disabled"})
    assert disabled.json()["data"]["status"] == "disabled"
    refused = await client.get("/fhir/Patient", headers=bearer(token["access_token"]))
    assert refused.status_code == 401
    params, _ = Browser(client).params(public_app["client_id"], "user/Patient.rs")
    page = await Browser(client).start(params)
    assert page.status_code == 400 and "Unknown or disabled app" in page.text


async def test_client_administration_is_for_platform_administrators(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    url = f"/api/smart/clients/{public_app['client_id']}"
    assert (await client.get(url)).status_code == 401
    for who in (clinic.admin, clinic.doctor):
        assert (await client.get(url, headers=who["headers"])).status_code == 403
        assert (await client.patch(url, headers=who["headers"], json={"status": "disabled"})
                ).status_code == 403
    assert (await client.get("/api/smart/clients/unknown", headers=clinic.platform_admin[
        "headers"])).status_code == 404


async def test_client_metadata_and_registrations_are_bounded(
        app: Any, client: httpx.AsyncClient, clinic: Clinic) -> None:
    """Issue 32 result 4: the key set's size, the redirect URIs, and how many clients
    one account's keys may register; within them a registration is accepted."""
    developer = await register_and_login(client, first_name="Juma", last_name="Otieno")
    key = await api_key(client, developer, "smart:register")
    public = {"redirect_uris": [REDIRECT_URI], "token_endpoint_auth_method": "none",
              "scope": "launch/patient patient/*.rs"}
    big_key = {"kty": "RSA", "kid": "k", "e": "AQAB", "n": "A" * 40_000}
    for body in ({**BACKEND, "jwks_uri": None, "jwks": {"keys": [big_key]}},
                 {**BACKEND, "jwks_uri": None, "jwks": {"keys": [
                     {**big_key, "n": "AQAB", "kid": f"k{i}"} for i in range(11)]}},
                 {**public, "redirect_uris": [f"{REDIRECT_URI}{i}" for i in range(21)]},
                 {**public, "redirect_uris": ["https://a.example/" + "x" * 2001]},
                 {**public, "client_name": "x" * 201}):
        body = {k: v for k, v in body.items() if v is not None}
        refused = await client.post("/oauth2/register", headers=key, json=body)
        assert refused.status_code == 400, refused.text
    app.state.services.settings.smart_max_clients_per_account = 2
    for _ in range(2):
        assert (await client.post("/oauth2/register", headers=key, json=public)
                ).status_code == 201
    over = await client.post("/oauth2/register", headers=key, json=public)
    assert over.status_code == 400 and "2 clients" in over.json()["error_description"]
    other = await api_key(client, developer, "smart:register")  # the account counts
    assert (await client.post("/oauth2/register", headers=other, json=public)
            ).status_code == 400
    assert (await client.post("/oauth2/register", headers=clinic.platform_admin["headers"],
                              json=public)).status_code == 201
