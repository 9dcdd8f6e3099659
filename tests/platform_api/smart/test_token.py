"""/oauth2/token: the authorization code grant with PKCE, refresh, and their refusals."""

from __future__ import annotations

from typing import Any

import httpx

from tests.platform_api.smart.support import Browser, Clinic, bearer, exchange


async def test_standalone_patient_launch_gives_a_token_for_the_chosen_patient(
        client: httpx.AsyncClient, clinic: Clinic, public_app: dict[str, Any],
        browser: Browser) -> None:
    scope = "launch/patient openid fhirUser patient/Patient.rs patient/Observation.rs"
    authorization = await browser.authorize(public_app["client_id"], scope,
                                            clinic.doctor["user"]["email"],
                                            patient=clinic.amina)
    response = await exchange(client, authorization, public_app["client_id"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["pragma"] == "no-cache"
    assert body["token_type"] == "Bearer" and isinstance(body["expires_in"], int)
    assert body["patient"] == clinic.amina
    read = await client.get(f"/fhir/Patient/{clinic.amina}", headers=bearer(body["access_token"]))
    assert read.status_code == 200, read.text
    other = await client.get(f"/fhir/Patient/{clinic.baraka}",
                             headers=bearer(body["access_token"]))
    assert other.status_code == 403, other.text
