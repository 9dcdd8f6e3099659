"""/oauth2/manage (the SMART management_endpoint): a user sees and revokes their apps."""

from __future__ import annotations

from typing import Any

import httpx

from tests.platform_api.smart.support import (
    PASSWORD,
    Clinic,
    bearer,
    hidden_fields,
    smart_token,
)

JSON = dict[str, Any]


async def test_a_user_lists_their_authorized_apps_and_revokes_one(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    body = await smart_token(client, public_app["client_id"], "user/Patient.rs offline_access",
                             clinic.doctor["user"]["email"])
    page = await client.get("/oauth2/manage")
    assert page.status_code == 200 and page.headers["x-frame-options"] == "DENY"
    listing = await client.post("/oauth2/manage", data={
        "email": clinic.doctor["user"]["email"], "password": PASSWORD})
    assert listing.status_code == 200
    assert "Amani Growth Charts" in listing.text and "user/Patient.rs" in listing.text
    form = hidden_fields(listing.text, "/oauth2/manage/apps")
    revoked = await client.post("/oauth2/manage/apps", data=form)
    assert "Access revoked." in revoked.text and "No app can reach" in revoked.text
    assert (await client.get("/fhir/Patient", headers=bearer(body["access_token"]))
            ).status_code == 401


async def test_the_list_shows_only_the_signed_in_users_apps(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    await smart_token(client, public_app["client_id"], "user/Patient.rs",
                      clinic.doctor["user"]["email"])
    listing = await client.post("/oauth2/manage", data={
        "email": clinic.admin["user"]["email"], "password": PASSWORD})
    assert "No app can reach your records" in listing.text
    wrong = await client.post("/oauth2/manage", data={
        "email": clinic.admin["user"]["email"], "password": "guess"})
    assert wrong.status_code == 400
