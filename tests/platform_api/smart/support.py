"""What the SMART tests share: a clinic with patients and their records, registered apps,
PKCE, and a driver that walks the /authorize pages as a browser would (reading each
page's form, posting it), over the ASGI app or a real socket."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass, field
from html import unescape
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx

from tests.conftest import make_admin, register_and_login

JSON = dict[str, Any]
APP = "https://amani.example.org"
REDIRECT_URI = f"{APP}/callback"
LAUNCH_URI = f"{APP}/launch"
LOINC = "http://loinc.org"
CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"
PASSWORD = "correct horse battery"
_INPUT = re.compile(r"<input([^>]*)>")
_ATTRIBUTE = re.compile(r'(\w[\w-]*)="([^"]*)"')
_FORM = re.compile(r'<form method="post" action="([^"]+)">(.*?)</form>', re.S)


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).decode().rstrip("=")


def forms(html: str) -> list[tuple[str, list[dict[str, str]]]]:
    """(action, inputs) of each form of a page."""
    found = []
    for action, body in _FORM.findall(html):
        inputs = [{k: unescape(v) for k, v in _ATTRIBUTE.findall(attrs)}
                  for attrs in _INPUT.findall(body)]
        found.append((unescape(action), inputs))
    return found


def hidden_fields(html: str, action: str) -> dict[str, str]:
    for form_action, inputs in forms(html):
        if form_action == action:
            return {i["name"]: i.get("value", "") for i in inputs
                    if i.get("type") == "hidden"}
    raise AssertionError(f"no form posting to {action} in the page:\n{html[:2000]}")


def query_of(location: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


@dataclass
class Clinic:
    """A clinic (ORG:ADMIN Wanjiku), its doctor, two of its patients with vital signs
    and lab results, and a patient user with their own record."""

    admin: JSON
    org_id: str
    doctor: JSON
    amina: str  # Patient ids
    baraka: str
    observations: dict[str, list[str]] = field(default_factory=dict)
    platform_admin: JSON = field(default_factory=dict)


async def observation(client: httpx.AsyncClient, headers: dict[str, str], patient: str,
                      code: str, display: str, category: str, value: float, unit: str
                      ) -> str:
    body = {"resourceType": "Observation", "status": "final",
            "category": [{"coding": [{"system": CATEGORY, "code": category}]}],
            "code": {"coding": [{"system": LOINC, "code": code, "display": display}]},
            "subject": {"reference": f"Patient/{patient}"},
            "effectiveDateTime": "2026-03-02T09:30:00+03:00",
            "valueQuantity": {"value": value, "unit": unit,
                              "system": "http://unitsofmeasure.org", "code": unit}}
    response = await client.post("/fhir/Observation", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def make_clinic(app: Any, client: httpx.AsyncClient) -> Clinic:
    from tests.conftest import add_member, make_clinic_admin

    admin = await make_clinic_admin(client)
    # Registered without the DOCTOR role: the Doctors area would make a Practitioner for
    # them in the background, and the tests say when the doctor has a FHIR record.
    doctor = await register_and_login(client, first_name="Otieno", last_name="Mwangi")
    await add_member(app, admin["org_id"], doctor, "ORG:DOCTOR")
    patients = []
    for first, last, born in (("Amina", "Odhiambo", "1988-04-12"),
                              ("Baraka", "Kiptoo", "1979-11-03")):
        created = await client.post(
            f"/api/organizations/{admin['org_id']}/patients", headers=admin["headers"],
            json={"first_name": first, "last_name": last, "date_of_birth": born,
                  "gender": "female" if first == "Amina" else "male",
                  "mrn": f"KCC-{first.upper()}"})
        assert created.status_code == 201, created.text
        patients.append(created.json()["data"]["id"])
    clinic = Clinic(admin, admin["org_id"], doctor, *patients)
    for patient in patients:
        clinic.observations[patient] = [
            await observation(client, admin["headers"], patient, "8867-4", "Heart rate",
                              "vital-signs", 72, "/min"),
            await observation(client, admin["headers"], patient, "2339-0",
                              "Glucose [Mass/volume] in Blood", "laboratory", 5.4,
                              "mmol/L"),
        ]
    clinic.platform_admin = await make_admin(app, client)
    return clinic


async def register(client: httpx.AsyncClient, headers: dict[str, str], **metadata: Any
                   ) -> JSON:
    body = {"client_name": "Amani Growth Charts", "redirect_uris": [REDIRECT_URI],
            "launch_uri": LAUNCH_URI, "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "scope": "launch launch/patient launch/encounter openid fhirUser profile "
                     "offline_access online_access patient/*.cruds user/*.cruds",
            **metadata}
    response = await client.post("/oauth2/register", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


@dataclass
class Authorization:
    """What a walk through /authorize gave: the redirect's query and the verifier."""

    redirect: dict[str, str]
    verifier: str
    state: str

    @property
    def code(self) -> str:
        return self.redirect["code"]


class Browser:
    """Walks the /authorize pages with an httpx client (cookies kept, like a browser)."""

    def __init__(self, client: httpx.AsyncClient, fhir_base: str = "http://testserver/fhir"):
        self.client = client
        self.fhir_base = fhir_base

    def params(self, client_id: str, scope: str, **extra: str) -> tuple[dict[str, str], str]:
        verifier, challenge = pkce()
        params = {"response_type": "code", "client_id": client_id,
                  "redirect_uri": REDIRECT_URI, "scope": scope,
                  "state": secrets.token_urlsafe(24), "aud": self.fhir_base,
                  "code_challenge": challenge, "code_challenge_method": "S256", **extra}
        return params, verifier

    async def start(self, params: dict[str, str], *, post: bool = False) -> httpx.Response:
        if post:
            return await self.client.post("/oauth2/authorize", data=params)
        return await self.client.get(f"/oauth2/authorize?{urlencode(params)}")

    async def submit(self, page: httpx.Response, action: str, **fields: Any) -> httpx.Response:
        data: dict[str, Any] = {**hidden_fields(page.text, action), **fields}
        return await self.client.post(action, data=data)

    async def sign_in(self, page: httpx.Response, email: str) -> httpx.Response:
        return await self.submit(page, "/oauth2/authorize/sign-in", email=email,
                                 password=PASSWORD)

    async def authorize(self, client_id: str, scope: str, email: str, *,
                        patient: str | None = None, untick: tuple[str, ...] = (),
                        **extra: str) -> Authorization:
        """The whole walk: sign in, pick ``patient`` if asked, allow."""
        params, verifier = self.params(client_id, scope, **extra)
        page = await self.start(params)
        assert page.status_code == 200, page.text
        page = await self.sign_in(page, email)
        assert page.status_code == 200, page.text
        if "/oauth2/authorize/patient" in page.text and 'name="patient"' in page.text:
            assert patient is not None, "the server asked for a patient"
            page = await self.submit(page, "/oauth2/authorize/patient", patient=patient)
        return await self.allow(page, params, verifier, untick)

    async def allow(self, page: httpx.Response, params: dict[str, str], verifier: str,
                    untick: tuple[str, ...] = ()) -> Authorization:
        offered = [i["value"] for _, inputs in forms(page.text) for i in inputs
                   if i.get("name") == "scope" and i.get("type") == "checkbox"]
        assert offered, page.text
        ticked = [s for s in offered if s not in untick]
        answer = await self.client.post("/oauth2/authorize/consent", data={
            **hidden_fields(page.text, "/oauth2/authorize/consent"), "decision": "allow",
            "scope": ticked})
        assert answer.status_code == 303, answer.text
        redirect = query_of(answer.headers["location"])
        assert redirect.get("state") == params["state"], redirect
        return Authorization(redirect, verifier, params["state"])


async def exchange(client: httpx.AsyncClient, authorization: Authorization, client_id: str,
                   **extra: Any) -> httpx.Response:
    form = {"grant_type": "authorization_code", "code": authorization.code,
            "redirect_uri": REDIRECT_URI, "code_verifier": authorization.verifier,
            "client_id": client_id}
    form.update(extra)
    return await client.post("/oauth2/token", data={k: v for k, v in form.items()
                                                    if v is not None})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def smart_token(client: httpx.AsyncClient, client_id: str, scope: str, email: str,
                      patient: str | None = None) -> JSON:
    """A token response for ``scope``, authorized by ``email`` (and ``patient``)."""
    authorization = await Browser(client).authorize(client_id, scope, email, patient=patient)
    response = await exchange(client, authorization, client_id)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@dataclass
class Seeded:
    """A clinic and a registered app written to a data directory, for tests that then
    serve the app with uvicorn (browsers and client libraries need real HTTP)."""

    clinic: Clinic
    app: JSON


async def seed(settings: Any, **metadata: Any) -> Seeded:
    """Write a clinic and register an app (``metadata``) in ``settings.data_dir``."""
    from asgi_lifespan import LifespanManager

    from platform_api.app import create_app

    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            clinic = await make_clinic(application, c)
            app = await register(c, clinic.platform_admin["headers"], **metadata)
    return Seeded(clinic, app)


def seed_now(settings: Any, **metadata: Any) -> Seeded:
    """:func:`seed` from synchronous code, in a thread of its own (a Playwright test's
    thread already runs an event loop)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, seed(settings, **metadata)).result()
