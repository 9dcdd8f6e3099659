"""CORS: any origin may read discovery and /fhir/metadata; only the configured origins
reach /api and /fhir; preflights are answered before the access table."""

from __future__ import annotations

from pathlib import Path

import pytest

from platform_api.app import create_app
from platform_api.settings import Settings
from tests.conftest import make_settings

CLINIC_APP = "https://app.kibera-clinic.example.org"
STRANGER = "https://phishing.example.net"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, cors_origins=[CLINIC_APP])


def preflight(origin: str, method: str = "GET", headers: str = "authorization") -> dict:
    return {"Origin": origin, "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": headers}


async def test_any_origin_reads_the_capability_statement(client):
    answer = await client.options("/fhir/metadata", headers=preflight(STRANGER))
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == "*"
    read = await client.get("/fhir/metadata", headers={"Origin": STRANGER})
    assert read.status_code == 200 and read.headers["access-control-allow-origin"] == "*"
    assert (await client.options("/fhir/.well-known/smart-configuration",
                                 headers=preflight(STRANGER))).status_code == 200
    keys = await client.get("/oauth2/jwks", headers={"Origin": STRANGER})
    assert keys.headers["access-control-allow-origin"] == "*"


async def test_a_configured_browser_smart_app_may_call_the_token_endpoint(client):
    allowed = await client.options("/oauth2/token", headers=preflight(
        CLINIC_APP, "POST", "content-type"))
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == CLINIC_APP
    refused = await client.options("/oauth2/token", headers=preflight(STRANGER, "POST"))
    assert refused.status_code == 400


async def test_a_configured_origin_reaches_fhir_and_api_with_credentials(client, clinic_admin):
    answer = await client.options("/fhir/Patient", headers=preflight(
        CLINIC_APP, "POST", "authorization, content-type, if-match, prefer"))
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == CLINIC_APP
    assert answer.headers["access-control-allow-credentials"] == "true"
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert "If-Match" in answer.headers["access-control-allow-headers"]
    read = await client.get("/api/auth/me", headers={**clinic_admin["headers"],
                                                     "Origin": CLINIC_APP})
    assert read.status_code == 200
    assert read.headers["access-control-allow-origin"] == CLINIC_APP
    assert "ETag" in read.headers["access-control-expose-headers"]
    refused = await client.get("/fhir/Patient", headers={"Origin": CLINIC_APP})
    assert refused.status_code == 401  # the app can read why
    assert refused.headers["access-control-allow-origin"] == CLINIC_APP


async def test_another_origin_gets_no_cors_on_api_and_fhir(client, clinic_admin):
    answer = await client.options("/api/auth/login", headers=preflight(STRANGER, "POST"))
    assert answer.status_code == 400
    assert "access-control-allow-origin" not in answer.headers
    read = await client.get("/api/auth/me", headers={**clinic_admin["headers"],
                                                     "Origin": STRANGER})
    assert "access-control-allow-origin" not in read.headers


async def test_pages_outside_api_and_discovery_get_no_cors(client):
    docs = await client.get("/docs", headers={"Origin": CLINIC_APP})
    assert "access-control-allow-origin" not in docs.headers


def test_a_wildcard_or_malformed_origin_is_refused_at_start(tmp_path: Path) -> None:
    for origin in ("*", "app.example.org", "https://app.example.org/"):
        with pytest.raises(ValueError, match="CORS origin"):
            create_app(make_settings(tmp_path, cors_origins=[origin]))


async def test_options_on_fhir_paths_lists_their_methods(client):
    metadata = await client.options("/fhir/metadata")
    assert metadata.status_code == 204
    assert metadata.headers["allow"] == "GET, HEAD, OPTIONS"
    instance = await client.options("/fhir/Patient/amina-odhiambo")
    assert instance.headers["allow"] == "GET, PUT, PATCH, DELETE, HEAD, OPTIONS"
    assert (await client.head("/fhir/metadata")).status_code == 200
