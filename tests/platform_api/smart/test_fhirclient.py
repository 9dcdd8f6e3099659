"""The SMART on FHIR Python client library (``fhirclient``) completes a standalone launch
against the server served by uvicorn: it finds the OAuth endpoints in the
CapabilityStatement, sends the user to /authorize with PKCE, exchanges the code, reads
the patient, and refreshes."""

from __future__ import annotations

from pathlib import Path

import httpx
from fhirclient import client as smart_client
from fhirclient.models.observation import Observation

from platform_api.app import create_app
from tests.browser_support import run_server
from tests.conftest import make_settings, served_at
from tests.platform_api.smart.support import PASSWORD, REDIRECT_URI, hidden_fields, seed_now


def test_fhirclient_completes_a_standalone_launch_and_reads_the_patient(
        tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    seeded = seed_now(settings)
    clinic = seeded.clinic
    with run_server(create_app(settings)) as base:
        served_at(settings, base)
        smart = smart_client.FHIRClient(settings={
            "app_id": seeded.app["client_id"], "api_base": f"{base}/fhir",
            "redirect_uri": REDIRECT_URI,
            "scope": "openid fhirUser offline_access patient/*.rs"})
        authorize_url = smart.authorize_url
        assert authorize_url.startswith(f"{base}/oauth2/authorize?")
        with httpx.Client(base_url=base) as browser:
            page = browser.get(authorize_url)
            assert page.status_code == 200, page.text
            page = browser.post("/oauth2/authorize/sign-in", data={
                **hidden_fields(page.text, "/oauth2/authorize/sign-in"),
                "email": clinic.doctor["user"]["email"], "password": PASSWORD})
            page = browser.post("/oauth2/authorize/patient", data={
                **hidden_fields(page.text, "/oauth2/authorize/patient"),
                "patient": clinic.amina})
            consent = hidden_fields(page.text, "/oauth2/authorize/consent")
            answer = browser.post("/oauth2/authorize/consent", data={
                **consent, "decision": "allow",
                "scope": ["openid", "offline_access", "patient/*.rs", "launch/patient"]})
            assert answer.status_code == 303, answer.text
        smart.handle_callback(answer.headers["location"])
        assert smart.ready and smart.patient_id == clinic.amina
        patient = smart.patient
        assert patient is not None and patient.name[0].family == "Odhiambo"
        found = list(Observation.where({"patient": clinic.amina}).perform_resources_iter(
            smart.server))
        assert {o.id for o in found} == set(clinic.observations[clinic.amina])
        assert smart.reauthorize() and smart.ready
        assert smart.server.request_json(f"Patient/{clinic.amina}")["id"] == clinic.amina
