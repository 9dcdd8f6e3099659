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
    # authenticated, but not the token's client: told nothing (RFC 7662 2.1)
    assert answer.status_code == 200 and answer.json() == {"active": False}


async def confidential_token(client: httpx.AsyncClient, clinic: Clinic) -> tuple[JSON, JSON]:
    """A confidential app (client_secret_post) and a token the doctor authorized for it."""
    app = await register(client, clinic.platform_admin["headers"],
                         token_endpoint_auth_method="client_secret_post")
    scope = "launch/patient offline_access patient/*.rs"
    authorization = await Browser(client).authorize(app["client_id"], scope,
                                                    clinic.doctor["user"]["email"],
                                                    patient=clinic.amina)
    response = await exchange(client, authorization, app["client_id"],
                              client_secret=app["client_secret"])
    assert response.status_code == 200, response.text
    return app, response.json()


async def test_only_the_tokens_own_client_or_an_administrator_learns_about_it(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    """Issue 31, result 5: who may introspect a token (RFC 7662 2.1)."""
    app, body = await confidential_token(client, clinic)
    token = {"token": body["access_token"]}
    refresh = {"token": body["refresh_token"]}

    async def ask(form: JSON, headers: dict[str, str] | None = None) -> JSON:
        answer = await client.post("/oauth2/introspect", data=form, headers=headers or {})
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]
    # the token's own client, authenticated as itself: the details
    own = await ask({**token, "client_id": app["client_id"],
                     "client_secret": app["client_secret"]})
    assert own["active"] is True and own["client_id"] == app["client_id"]
    # ... and presenting its own access token
    assert (await ask(token, bearer(body["access_token"])))["active"] is True
    # another client (its own app token, or authenticated as itself): nothing
    other = await launched(client, clinic, public_app)
    assert await ask(token, bearer(other["access_token"])) == {"active": False}
    another = await register(client, clinic.platform_admin["headers"],
                             token_endpoint_auth_method="client_secret_post")
    assert await ask({**token, "client_id": another["client_id"],
                      "client_secret": another["client_secret"]}) == {"active": False}
    # an ordinary signed-in user, even the one who authorized it: nothing
    for user in (clinic.doctor, clinic.admin):
        assert await ask(token, bearer(user["token"])) == {"active": False}
    # a platform administrator: the details
    admin = await ask(token, bearer(clinic.platform_admin["token"]))
    assert admin["active"] is True and admin["client_id"] == app["client_id"]
    # a refresh token is held to the same rule
    assert await ask(refresh, bearer(clinic.doctor["token"])) == {"active": False}
    assert (await ask(refresh, bearer(clinic.platform_admin["token"])))["active"] is True
    assert (await ask({**refresh, "client_id": app["client_id"],
                       "client_secret": app["client_secret"]}))["active"] is True


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
