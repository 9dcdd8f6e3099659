"""/oauth2/authorize and its pages: every refusal before and after the redirect URI is
known good, GET and form POST, sign-in with MFA, the patient picker, consent."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import register_and_login
from tests.platform_api.smart.support import (
    PASSWORD,
    REDIRECT_URI,
    Browser,
    Clinic,
    exchange,
    hidden_fields,
    query_of,
    register,
)
from tests.platform_api.smart.test_registration import api_key
from tests.platform_api.test_auth_mfa import code as totp_code
from tests.platform_api.test_auth_mfa import enable, fixed_totp_clock  # noqa: F401

JSON = dict[str, Any]
SCOPE = "launch/patient openid fhirUser offline_access patient/*.rs"


async def test_an_unknown_client_or_redirect_uri_is_an_html_page_never_a_redirect(
        browser: Browser, public_app: JSON) -> None:
    params, _ = browser.params(public_app["client_id"], SCOPE)
    for wrong in ({"client_id": "no-such-app"},
                  {"redirect_uri": "https://attacker.example.net/callback"},
                  {"redirect_uri": ""}):
        page = await browser.start({**params, **wrong})
        assert page.status_code == 400
        assert "location" not in page.headers
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["x-frame-options"] == "DENY"


async def test_an_unreviewed_apps_error_is_a_page_here_not_a_redirect(
        client: httpx.AsyncClient, browser: Browser, clinic: Clinic) -> None:
    """Issue 32 result 8 (RFC 9700 4.11.2): an app a developer's key registered, with any
    redirect URI, does not turn /authorize into an open redirector before sign-in; once an
    administrator reviewed it, RFC 6749 4.1.2.1's error redirect applies."""
    developer = await register_and_login(client, first_name="Juma", last_name="Otieno")
    key = await api_key(client, developer, "smart:register")
    app = await register(client, key)
    assert app["reviewed"] is False
    params, _ = browser.params(app["client_id"], SCOPE, response_type="x")
    page = await browser.start(params)
    assert page.status_code == 400 and "location" not in page.headers
    assert page.headers["content-type"].startswith("text/html")
    assert f'href="{REDIRECT_URI}?error=unsupported_response_type' in page.text
    reviewed = await client.patch(f"/api/smart/clients/{app['client_id']}",
                                  headers=clinic.platform_admin["headers"],
                                  json={"reviewed": True})
    assert reviewed.status_code == 200 and reviewed.json()["data"]["reviewed"] is True
    answer = await browser.start(params)
    assert answer.status_code == 303
    assert query_of(answer.headers["location"])["error"] == "unsupported_response_type"


@pytest.mark.parametrize(("change", "error", "says"), [
    ({"code_challenge_method": "plain"}, "invalid_request", "plain is not supported"),
    ({"code_challenge_method": None}, "invalid_request", "S256"),
    ({"code_challenge": None}, "invalid_request", "code_challenge"),
    ({"aud": "https://other-ehr.example.org/fhir"}, "invalid_request", "aud"),
    ({"aud": None}, "invalid_request", "aud"),
    ({"response_type": "token"}, "unsupported_response_type", "code"),
    ({"scope": "system/*.rs"}, "invalid_scope", "none of the requested scopes"),
    ({"launch": "not-a-launch"}, "invalid_request", "unknown launch"),
])
async def test_refusals_after_the_redirect_uri_go_back_to_the_app_with_the_state(
        browser: Browser, public_app: JSON, change: dict[str, str | None], error: str,
        says: str) -> None:
    params, _ = browser.params(public_app["client_id"], SCOPE)
    asked = {k: v for k, v in {**params, **change}.items() if v is not None}
    answer = await browser.start(asked)
    assert answer.status_code == 303
    assert answer.headers["location"].startswith(REDIRECT_URI)
    redirect = query_of(answer.headers["location"])
    assert redirect["error"] == error and says in redirect["error_description"]
    assert redirect["state"] == params["state"]


async def test_the_authorize_request_can_be_a_form_post(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON, browser: Browser) -> None:
    params, verifier = browser.params(public_app["client_id"], "user/Patient.rs")
    page = await browser.start(params, post=True)
    assert page.status_code == 200 and "Sign in" in page.text
    page = await browser.sign_in(page, clinic.doctor["user"]["email"])
    authorization = await browser.allow(page, params, verifier)
    assert (await exchange(client, authorization, public_app["client_id"])).status_code == 200


async def test_a_wrong_password_shows_the_page_again(
        clinic: Clinic, public_app: JSON, browser: Browser) -> None:
    params, _ = browser.params(public_app["client_id"], SCOPE)
    page = await browser.start(params)
    again = await browser.submit(page, "/oauth2/authorize/sign-in",
                                 email=clinic.doctor["user"]["email"], password="wrong guess")
    assert again.status_code == 400 and "incorrect" in again.text
    assert hidden_fields(again.text, "/oauth2/authorize/sign-in")["request"]


async def test_a_page_posted_from_another_browser_is_refused(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON, browser: Browser) -> None:
    params, _ = browser.params(public_app["client_id"], SCOPE)
    page = await browser.start(params)
    client.cookies.clear()
    stolen = await browser.submit(page, "/oauth2/authorize/sign-in",
                                  email=clinic.doctor["user"]["email"], password=PASSWORD)
    assert stolen.status_code == 400 and "not the one this browser started" in stolen.text


async def test_users_with_mfa_enter_their_code_before_consenting(
        app: Any, client: httpx.AsyncClient, clinic: Clinic, public_app: JSON,
        browser: Browser) -> None:
    secret, _codes = await enable(client, clinic.doctor["headers"])
    params, verifier = browser.params(public_app["client_id"], "user/Patient.rs")
    page = await browser.sign_in(await browser.start(params), clinic.doctor["user"]["email"])
    assert "Two-step verification" in page.text
    wrong = await browser.submit(page, "/oauth2/authorize/mfa", code="000000")
    assert wrong.status_code == 400
    page = await browser.submit(page, "/oauth2/authorize/mfa", code=totp_code(secret, 1))
    assert page.status_code == 200 and "Allow" in page.text
    authorization = await browser.allow(page, params, verifier)
    assert (await exchange(client, authorization, public_app["client_id"])).status_code == 200


async def test_the_patient_picker_lists_the_patients_the_user_may_see_and_finds_by_name(
        clinic: Clinic, public_app: JSON, browser: Browser) -> None:
    params, _ = browser.params(public_app["client_id"], SCOPE)
    page = await browser.sign_in(await browser.start(params), clinic.doctor["user"]["email"])
    assert "Amina Odhiambo" in page.text and "Baraka Kiptoo" in page.text
    found = await browser.submit(page, "/oauth2/authorize/patient-search", name="kiptoo")
    assert "Baraka Kiptoo" in found.text and "Amina" not in found.text
    refused = await browser.submit(page, "/oauth2/authorize/patient", patient="no-such")
    assert "Choose one of the patients listed" in refused.text


async def test_a_patient_user_picks_only_their_own_record(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON, browser: Browser) -> None:
    from tests.conftest import register_and_login

    zawadi = await register_and_login(client, first_name="Zawadi", last_name="Wekesa")
    own = await client.post("/api/patients", headers=zawadi["headers"], json={
        "first_name": "Zawadi", "last_name": "Wekesa", "date_of_birth": "1995-06-21",
        "gender": "female"})
    assert own.status_code == 201, own.text
    params, _ = browser.params(public_app["client_id"], SCOPE)
    page = await browser.sign_in(await browser.start(params), zawadi["user"]["email"])
    assert "Zawadi Wekesa" in page.text and "Amina" not in page.text


async def test_unticked_scopes_are_not_granted(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON, browser: Browser) -> None:
    authorization = await browser.authorize(
        public_app["client_id"], SCOPE + " patient/Condition.rs",
        clinic.doctor["user"]["email"], patient=clinic.amina,
        untick=("offline_access", "patient/Condition.rs"))
    body = (await exchange(client, authorization, public_app["client_id"])).json()
    assert body["scope"].split() == ["launch/patient", "openid", "patient/*.rs"]
    assert "refresh_token" not in body and "fhirUser" not in body


async def test_denying_redirects_with_access_denied(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON, browser: Browser) -> None:
    params, _ = browser.params(public_app["client_id"], "user/Patient.rs")
    page = await browser.sign_in(await browser.start(params), clinic.doctor["user"]["email"])
    answer = await client.post("/oauth2/authorize/consent", data={
        **hidden_fields(page.text, "/oauth2/authorize/consent"), "decision": "deny"})
    redirect = query_of(answer.headers["location"])
    assert redirect["error"] == "access_denied" and redirect["state"] == params["state"]
    again = await client.post("/oauth2/authorize/consent", data={
        **hidden_fields(page.text, "/oauth2/authorize/consent"), "decision": "allow"})
    assert again.status_code == 400  # a request is answered once
