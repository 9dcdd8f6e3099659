"""EHR launch: POST /api/smart/launch, then the app's authorization with ``launch``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.conftest import register_and_login
from tests.platform_api.smart.support import (
    LAUNCH_URI,
    Browser,
    Clinic,
    bearer,
    exchange,
    query_of,
)

JSON = dict[str, Any]
SCOPE = "launch openid fhirUser patient/*.rs user/Encounter.rs"


async def encounter_of(client: httpx.AsyncClient, clinic: Clinic, patient: str) -> str:
    created = await client.post("/fhir/Encounter", headers=clinic.admin["headers"], json={
        "resourceType": "Encounter", "status": "in-progress",
        "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                  "code": "AMB", "display": "ambulatory"},
        "subject": {"reference": f"Patient/{patient}"},
        "period": {"start": "2026-03-02T09:00:00+03:00"}})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


async def launch(client: httpx.AsyncClient, headers: dict[str, str], app: JSON, **body: Any
                 ) -> httpx.Response:
    return await client.post("/api/smart/launch", headers=headers,
                             json={"client_id": app["client_id"], **body})


async def test_an_ehr_launch_hands_the_app_its_patient_and_encounter(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON, browser: Browser) -> None:
    encounter = await encounter_of(client, clinic, clinic.amina)
    created = await launch(client, clinic.doctor["headers"], public_app,
                           patient_id=clinic.amina, encounter_id=encounter)
    assert created.status_code == 201, created.text
    data = created.json()["data"]
    url = urlsplit(data["launch_url"])
    assert data["launch_url"].startswith(LAUNCH_URI)
    assert query_of(data["launch_url"]) == {"iss": "http://testserver/fhir",
                                            "launch": data["launch"]} and url.query
    authorization = await browser.authorize(public_app["client_id"], SCOPE,
                                            clinic.doctor["user"]["email"],
                                            launch=data["launch"])
    body = (await exchange(client, authorization, public_app["client_id"])).json()
    assert body["patient"] == clinic.amina and body["encounter"] == encounter
    assert body["need_patient_banner"] is False
    assert "launch" in body["scope"].split()
    headers = bearer(body["access_token"])
    assert (await client.get(f"/fhir/Encounter/{encounter}", headers=headers)
            ).status_code == 200
    assert (await client.get(f"/fhir/Observation/{clinic.observations[clinic.baraka][0]}",
                             headers=headers)).status_code == 403


async def test_a_launch_is_single_use_and_for_its_user_only(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON, browser: Browser) -> None:
    data = (await launch(client, clinic.doctor["headers"], public_app,
                         patient_id=clinic.amina)).json()["data"]
    params, _ = browser.params(public_app["client_id"], SCOPE, launch=data["launch"])
    page = await browser.start(params)
    assert page.status_code == 200
    reused = await browser.start(params)
    assert query_of(reused.headers["location"])["error"] == "invalid_request"
    answer = await browser.sign_in(page, clinic.admin["user"]["email"])
    denied = query_of(answer.headers["location"])
    assert denied["error"] == "access_denied" and denied["state"] == params["state"]


async def test_a_launch_needs_a_patient_the_clinician_may_reach(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    stranger = await register_and_login(client, first_name="Halima", last_name="Njeri")
    refused = await launch(client, stranger["headers"], public_app, patient_id=clinic.amina)
    assert refused.status_code == 403
    missing = await launch(client, clinic.doctor["headers"], public_app, patient_id="nobody")
    assert missing.status_code == 404
    encounter = await encounter_of(client, clinic, clinic.baraka)
    mismatched = await launch(client, clinic.doctor["headers"], public_app,
                              patient_id=clinic.amina, encounter_id=encounter)
    assert mismatched.status_code == 422
    assert mismatched.json()["error"]["field"] == "encounter_id"
    unknown_app = await client.post("/api/smart/launch", headers=clinic.doctor["headers"],
                                    json={"client_id": "nope", "patient_id": clinic.amina})
    assert unknown_app.status_code == 404
    assert (await client.post("/api/smart/launch", json={})).status_code == 401
    key = await client.post("/api/developer/keys", headers=clinic.doctor["headers"],
                            json={"name": "EHR bridge", "scopes": ["smart:write"]})
    by_key = await client.post("/api/smart/launch", headers={
        "X-API-Key": key.json()["data"]["key"]}, json={
        "client_id": public_app["client_id"], "patient_id": clinic.amina})
    assert by_key.status_code == 403  # a launch is a clinician's, in a user's session
