"""/oauth2/token: the authorization code grant with PKCE, refresh, confidential symmetric
clients, and every refusal of them."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import jwt
import pytest

from platform_api.smart.oauth import CODES
from platform_api.smart.token import code_hash
from tests.platform_api.smart.support import (
    Authorization,
    Browser,
    Clinic,
    bearer,
    exchange,
    register,
)

JSON = dict[str, Any]
SCOPE = "launch/patient openid fhirUser profile offline_access patient/*.rs"


async def authorized(client: httpx.AsyncClient, clinic: Clinic, app: JSON,
                     scope: str = SCOPE) -> Authorization:
    return await Browser(client).authorize(app["client_id"], scope,
                                           clinic.doctor["user"]["email"],
                                           patient=clinic.amina)


async def test_standalone_patient_launch_gives_a_token_for_the_chosen_patient(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    authorization = await authorized(client, clinic, public_app)
    response = await exchange(client, authorization, public_app["client_id"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["pragma"] == "no-cache"
    assert body["token_type"] == "Bearer" and isinstance(body["expires_in"], int)
    assert 0 < body["expires_in"] <= 3600
    assert body["patient"] == clinic.amina
    # The doctor has no FHIR record yet: fhirUser cannot be granted (scopes-and-launch-
    # context.md: "If the EHR cannot represent the user ... it cannot support fhirUser").
    assert body["scope"] == SCOPE.replace(" fhirUser", "")
    assert body["need_patient_banner"] is True
    assert body["smart_style_url"] == "http://testserver/oauth2/smart-style.json"
    assert body["refresh_token"].startswith("rt_")
    assert body["access_token"].startswith("v4.public.")
    read = await client.get(f"/fhir/Patient/{clinic.amina}", headers=bearer(body["access_token"]))
    assert read.status_code == 200, read.text
    other = await client.get(f"/fhir/Patient/{clinic.baraka}",
                             headers=bearer(body["access_token"]))
    assert other.status_code == 403, other.text


async def test_the_id_token_is_rs256_with_the_users_fhir_record(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    doctor_record = await client.post("/fhir/Practitioner", headers=clinic.admin["headers"],
                                      json={"resourceType": "Practitioner", "identifier": [{
                                          "system": "urn:healthplatform:user",
                                          "value": clinic.doctor["user"]["id"]}],
                                          "name": [{"family": "Mwangi", "given": ["Otieno"]}]})
    assert doctor_record.status_code == 201, doctor_record.text
    body = (await exchange(client, await authorized(client, clinic, public_app),
                           public_app["client_id"])).json()
    keys = (await client.get("/oauth2/jwks")).json()["keys"]
    header = jwt.get_unverified_header(body["id_token"])
    assert header["alg"] == "RS256"
    key = jwt.PyJWK(next(k for k in keys if k["kid"] == header["kid"])).key
    claims = jwt.decode(body["id_token"], key, algorithms=["RS256"],
                        audience=public_app["client_id"], issuer="http://testserver/fhir")
    assert claims["sub"] == clinic.doctor["user"]["id"] and len(claims["sub"]) < 256
    practitioner = f"http://testserver/fhir/Practitioner/{doctor_record.json()['id']}"
    assert claims["fhirUser"] == practitioner == body["fhirUser"]
    assert claims["given_name"] == "Otieno"
    me = await client.get(practitioner.removeprefix("http://testserver"),
                          headers=bearer(body["access_token"]))
    assert me.status_code == 200, me.text


async def test_a_wrong_or_missing_code_verifier_is_refused(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    authorization = await authorized(client, clinic, public_app)
    for verifier in ("x" * 43, None, "short"):
        refused = await exchange(client, authorization, public_app["client_id"],
                                 code_verifier=verifier)
        assert refused.status_code == 400
        assert refused.json()["error"] == "invalid_grant"
        assert refused.headers["cache-control"] == "no-store"
    assert (await exchange(client, authorization, public_app["client_id"])).status_code == 200


async def test_a_reused_code_is_refused_and_revokes_what_it_issued(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    authorization = await authorized(client, clinic, public_app)
    first = (await exchange(client, authorization, public_app["client_id"])).json()
    assert (await client.get("/fhir/Patient", headers=bearer(first["access_token"]))
            ).status_code == 200
    again = await exchange(client, authorization, public_app["client_id"])
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    revoked = await client.get("/fhir/Patient", headers=bearer(first["access_token"]))
    assert revoked.status_code == 401
    refreshed = await client.post("/oauth2/token", data={
        "grant_type": "refresh_token", "refresh_token": first["refresh_token"],
        "client_id": public_app["client_id"]})
    assert refreshed.status_code == 400


async def test_a_code_is_bound_to_its_client_redirect_uri_and_lifetime(
        app: Any, client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    other_app = await register(client, clinic.platform_admin["headers"],
                               client_name="Tumaini Diary")
    authorization = await authorized(client, clinic, public_app)
    stolen = await exchange(client, authorization, other_app["client_id"])
    assert stolen.json()["error"] == "invalid_grant"
    moved = await exchange(client, authorization, public_app["client_id"],
                           redirect_uri="https://amani.example.org/other")
    assert moved.json()["error"] == "invalid_grant"
    store = app.state.services.store
    grant = await store.get_document(CODES, code_hash(authorization.code))
    async with store.unit_of_work() as uow:
        uow.put_document(CODES, grant["id"], {**grant, "expires_at": "2020-01-01T00:00:00+00:00"})
        await uow.commit()
    expired = await exchange(client, authorization, public_app["client_id"])
    assert expired.json() == {"error": "invalid_grant",
                              "error_description": "the authorization code expired"}


async def refresh_grant(client: httpx.AsyncClient, app: JSON, token: str,
                        scope: str | None = None) -> httpx.Response:
    """RFC 6749 6: grant_type=refresh_token, the refresh_token, optionally a scope; a
    public client identifies itself with client_id (2.3, 3.2.1)."""
    form = {"grant_type": "refresh_token", "refresh_token": token,
            "client_id": app["client_id"]}
    if scope is not None:
        form["scope"] = scope
    return await client.post("/oauth2/token", data=form)


async def test_refresh_rotates_and_a_narrower_scope_narrows_only_that_access_token(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    first = (await exchange(client, await authorized(client, clinic, public_app),
                            public_app["client_id"])).json()
    narrowed = await refresh_grant(client, public_app, first["refresh_token"],
                                   "patient/Observation.rs offline_access")
    assert narrowed.status_code == 200, narrowed.text
    body = narrowed.json()
    assert body["scope"] == "patient/Observation.rs offline_access"
    assert body["refresh_token"] != first["refresh_token"] and body["patient"] == clinic.amina
    headers = bearer(body["access_token"])
    assert (await client.get("/fhir/Observation", headers=headers)).status_code == 200
    assert (await client.get(f"/fhir/Patient/{clinic.amina}", headers=headers)
            ).status_code == 403
    # RFC 6749 6: the new refresh token's scope is identical to the one presented, and an
    # omitted scope is "the scope originally granted by the resource owner"
    whole = await refresh_grant(client, public_app, body["refresh_token"])
    assert whole.status_code == 200 and whole.json()["scope"] == first["scope"]
    beyond = await refresh_grant(client, public_app, whole.json()["refresh_token"],
                                 first["scope"] + " patient/Condition.cruds")
    assert beyond.status_code == 400 and beyond.json()["error"] == "invalid_scope"
    reused = await refresh_grant(client, public_app, first["refresh_token"])
    assert reused.status_code == 400  # a rotated token used again: the session is revoked
    assert (await refresh_grant(client, public_app, whole.json()["refresh_token"])
            ).status_code == 400


async def test_a_refresh_for_a_subset_without_offline_access_gets_an_access_token_only(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    """RFC 6749 6: "The requested scope MUST NOT include any scope not originally granted"
    is the only limit; the server MAY issue a new refresh token, and the client discards
    the old one only when it does."""
    first = (await exchange(client, await authorized(client, clinic, public_app),
                            public_app["client_id"])).json()
    subset = await refresh_grant(client, public_app, first["refresh_token"],
                                 "patient/Observation.rs")
    assert subset.status_code == 200, subset.text
    body = subset.json()
    assert body["scope"] == "patient/Observation.rs"
    assert "refresh_token" not in body and "id_token" not in body
    assert body["token_type"] == "Bearer" and body["patient"] == clinic.amina
    headers = bearer(body["access_token"])
    assert (await client.get("/fhir/Observation", headers=headers)).status_code == 200
    assert (await client.get(f"/fhir/Patient/{clinic.amina}", headers=headers)
            ).status_code == 403
    # no new refresh token was issued: the one presented is still the client's to use
    again = await refresh_grant(client, public_app, first["refresh_token"])
    assert again.status_code == 200, again.text
    assert again.json()["scope"] == first["scope"] and "refresh_token" in again.json()


async def test_a_refresh_token_is_bound_to_its_client_and_never_a_platform_session(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    other_app = await register(client, clinic.platform_admin["headers"],
                               client_name="Tumaini Diary")
    body = (await exchange(client, await authorized(client, clinic, public_app),
                           public_app["client_id"])).json()
    stolen = await client.post("/oauth2/token", data={
        "grant_type": "refresh_token", "refresh_token": body["refresh_token"],
        "client_id": other_app["client_id"]})
    assert stolen.json()["error"] == "invalid_grant"
    platform = await client.post("/api/auth/refresh",
                                 json={"refresh_token": body["refresh_token"]})
    assert platform.status_code == 401


async def test_online_access_refresh_tokens_end_with_the_working_session(
        app: Any, client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    online = (await exchange(client, await authorized(
        client, clinic, public_app, "launch/patient online_access patient/*.rs"),
        public_app["client_id"])).json()
    offline = (await exchange(client, await authorized(client, clinic, public_app),
                              public_app["client_id"])).json()
    lifetimes = {}
    for name, body in (("online", online), ("offline", offline)):
        introspected = (await client.post("/oauth2/introspect", data={
            "token": body["refresh_token"]}, headers=bearer(body["access_token"]))).json()
        lifetimes[name] = introspected["exp"]
    settings = app.state.services.settings
    assert lifetimes["offline"] - lifetimes["online"] >= (
        settings.smart_offline_access_ttl_seconds
        - settings.smart_online_access_ttl_seconds - 60)


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
async def test_a_confidential_symmetric_client_authenticates_with_its_secret(
        client: httpx.AsyncClient, clinic: Clinic, method: str) -> None:
    confidential = await register(client, clinic.platform_admin["headers"],
                                  token_endpoint_auth_method=method,
                                  client_name="Mwangaza Referrals")
    client_id, secret = confidential["client_id"], confidential["client_secret"]

    def credentials(secret_value: str) -> tuple[dict[str, str], dict[str, str]]:
        if method == "client_secret_basic":
            basic = base64.b64encode(f"{client_id}:{secret_value}".encode()).decode()
            return {"Authorization": f"Basic {basic}"}, {}
        return {}, {"client_id": client_id, "client_secret": secret_value}

    authorization = await authorized(client, clinic, confidential)
    form = {"grant_type": "authorization_code", "code": authorization.code,
            "redirect_uri": "https://amani.example.org/callback",
            "code_verifier": authorization.verifier}
    headers, extra = credentials("hps_wrong")
    wrong = await client.post("/oauth2/token", data={**form, **extra}, headers=headers)
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_client"
    public_style = await exchange(client, authorization, client_id)
    assert public_style.status_code == 401
    headers, extra = credentials(secret)
    accepted = await client.post("/oauth2/token", data={**form, **extra}, headers=headers)
    assert accepted.status_code == 200, accepted.text


async def test_malformed_token_requests_get_oauth_errors(
        client: httpx.AsyncClient, public_app: JSON) -> None:
    unknown = await client.post("/oauth2/token", data={"grant_type": "password"})
    assert unknown.status_code == 400 and unknown.json()["error"] == "unsupported_grant_type"
    as_json = await client.post("/oauth2/token", json={"grant_type": "authorization_code"})
    assert as_json.json()["error"] == "invalid_request"
    no_code = await client.post("/oauth2/token", data={
        "grant_type": "authorization_code", "client_id": public_app["client_id"]})
    assert no_code.json()["error"] == "invalid_request"
    backend = await client.post("/oauth2/token", data={
        "grant_type": "client_credentials", "client_id": public_app["client_id"],
        "scope": "system/*.rs"})
    assert backend.json()["error"] == "unauthorized_client"
