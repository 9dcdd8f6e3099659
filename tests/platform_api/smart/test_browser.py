"""A standalone patient launch driven end to end in a real browser (Debian's Chromium).

A tiny SMART app (Starlette, served by uvicorn like the platform) registers itself with
RFC 7591 using a developer's API key, then, when the browser opens it, reads the
server's discovery document and sends the browser to /authorize with PKCE. The user signs
in, picks the patient, consents; the app exchanges the code, reads the patient's record
and observations, and shows whether it could read another patient's record (it cannot).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import Browser, expect
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from platform_api.app import create_app
from tests.browser_support import chromium, run_server
from tests.conftest import make_settings, served_at
from tests.platform_api.smart.support import PASSWORD, seed_now

pytestmark = pytest.mark.browser
SCOPE = "launch/patient openid fhirUser patient/Patient.rs patient/Observation.rs"


class GrowthChartApp:
    """The tiny SMART app: ``/`` starts a launch, ``/callback`` finishes it."""

    def __init__(self, fhir_base: str, api_key: str, other_patient: str):
        self.fhir_base, self.api_key, self.other_patient = fhir_base, api_key, other_patient
        self.base = ""
        self.client_id: str | None = None
        self.pending: dict[str, str] = {}  # state -> code_verifier
        self.app = Starlette(routes=[Route("/", self.start), Route("/callback", self.callback)])

    async def config(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"{self.fhir_base}/.well-known/smart-configuration")
            return answer.json()  # type: ignore[no-any-return]

    async def register(self, config: dict[str, Any]) -> str:
        async with httpx.AsyncClient() as http:
            answer = await http.post(config["registration_endpoint"], headers={
                "X-API-Key": self.api_key}, json={
                "client_name": "Mtoto Growth Chart", "token_endpoint_auth_method": "none",
                "redirect_uris": [f"{self.base}/callback"], "scope": SCOPE,
                "grant_types": ["authorization_code"]})
            assert answer.status_code == 201, answer.text
            return str(answer.json()["client_id"])

    async def start(self, request: Request) -> Response:
        config = await self.config()
        if self.client_id is None:
            self.client_id = await self.register(config)
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        state = secrets.token_urlsafe(24)
        self.pending[state] = verifier
        query = urlencode({"response_type": "code", "client_id": self.client_id,
                           "redirect_uri": f"{self.base}/callback", "scope": SCOPE,
                           "state": state, "aud": self.fhir_base,
                           "code_challenge": challenge.decode().rstrip("="),
                           "code_challenge_method": "S256"})
        return RedirectResponse(f"{config['authorization_endpoint']}?{query}", 302)

    async def callback(self, request: Request) -> Response:
        verifier = self.pending.pop(request.query_params.get("state", ""), None)
        if verifier is None:
            return HTMLResponse("<p id=error>unknown state</p>", 400)
        config = await self.config()
        async with httpx.AsyncClient() as http:
            token = (await http.post(config["token_endpoint"], data={
                "grant_type": "authorization_code", "code": request.query_params["code"],
                "redirect_uri": f"{self.base}/callback", "code_verifier": verifier,
                "client_id": self.client_id})).json()
            headers = {"Authorization": f"Bearer {token['access_token']}"}
            patient = (await http.get(f"{self.fhir_base}/Patient/{token['patient']}",
                                      headers=headers)).json()
            observations = (await http.get(
                f"{self.fhir_base}/Observation?patient={token['patient']}",
                headers=headers)).json()
            other = await http.get(f"{self.fhir_base}/Patient/{self.other_patient}",
                                   headers=headers)
        name = patient["name"][0]
        rows = "".join(
            f"<li>{escape(e['resource']['code']['coding'][0]['display'])}: "
            f"{e['resource']['valueQuantity']['value']}</li>"
            for e in observations.get("entry", []))
        return HTMLResponse(
            f"<h1 id=patient>{escape(' '.join([*name['given'], name['family']]))}</h1>"
            f"<ul id=observations>{rows}</ul>"
            f"<p id=other>Another patient's record: {other.status_code}</p>")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def developer_key(base: str, headers: dict[str, str]) -> str:
    answer = httpx.post(f"{base}/api/developer/keys", headers=headers,
                        json={"name": "Mtoto app registration", "scopes": ["smart:register"]})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["data"]["key"])


def test_a_standalone_patient_launch_in_a_browser_reads_only_the_chosen_patient(
        tmp_path: Path, browser: Browser) -> None:
    settings = make_settings(tmp_path)
    clinic = seed_now(settings).clinic
    with run_server(create_app(settings)) as server:
        served_at(settings, server)
        growth = GrowthChartApp(f"{server}/fhir", developer_key(server, clinic.admin["headers"]),
                                clinic.baraka)
        with run_server(growth.app) as app_base:
            growth.base = app_base
            context = browser.new_context()
            page = context.new_page()
            page.goto(app_base)
            expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
            page.get_by_label("E-mail").fill(clinic.doctor["user"]["email"])
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_role("heading", name="Choose the patient")).to_be_visible()
            page.get_by_label("Amina Odhiambo").check()
            page.get_by_role("button", name="Continue").click()
            expect(page.get_by_role("heading", name="Allow Mtoto Growth Chart?")
                   ).to_be_visible()
            page.get_by_role("button", name="Allow").click()
            expect(page.locator("#patient")).to_have_text("Amina Odhiambo")
            expect(page.locator("#observations li")).to_have_count(2)
            expect(page.locator("#observations")).to_contain_text("Heart rate: 72")
            expect(page.locator("#other")).to_have_text("Another patient's record: 403")
            context.close()
