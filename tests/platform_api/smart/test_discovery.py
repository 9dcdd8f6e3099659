"""Discovery: /.well-known/smart-configuration (both paths), OpenID Connect discovery, the
JWKS, the style, and the SMART security of the CapabilityStatement."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.smart.discovery import CAPABILITIES
from tests.conftest import make_settings

HERE = Path(__file__).parent
# The IG's sample response (conformance.md), for the fields it shows.
SPEC_EXAMPLE = json.loads((HERE / "smart-configuration.hl7-spec-example.json").read_text())
REQUIRED = ("grant_types_supported", "token_endpoint", "capabilities",
            "code_challenge_methods_supported")
RECOMMENDED = ("authorization_endpoint", "introspection_endpoint", "revocation_endpoint",
               "registration_endpoint", "management_endpoint", "scopes_supported",
               "response_types_supported", "token_endpoint_auth_methods_supported",
               "token_endpoint_auth_signing_alg_values_supported", "issuer", "jwks_uri")


@pytest.mark.parametrize("path", ["/.well-known/smart-configuration",
                                  "/fhir/.well-known/smart-configuration"])
async def test_smart_configuration_is_json_with_every_field_and_absolute_urls(
        client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(path, headers={"Accept": "application/xml"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    config = response.json()
    for field in (*REQUIRED, *RECOMMENDED):
        assert field in config, field
    assert set(SPEC_EXAMPLE) - {"associated_endpoints"} <= set(config)
    for field, value in config.items():
        if field.endswith("_endpoint") or field in ("issuer", "jwks_uri"):
            assert value.startswith("http://testserver/"), (field, value)
    assert config["code_challenge_methods_supported"] == ["S256"]
    assert set(config["grant_types_supported"]) == {
        "authorization_code", "client_credentials", "refresh_token"}
    assert {"RS384", "ES384"} <= set(config["token_endpoint_auth_signing_alg_values_supported"])
    assert config["capabilities"] == list(CAPABILITIES)
    assert config["issuer"] == "http://testserver/fhir"


async def test_openid_configuration_and_jwks_publish_the_rs256_id_token_key(
        client: httpx.AsyncClient) -> None:
    oidc = (await client.get("/fhir/.well-known/openid-configuration")).json()
    assert oidc["issuer"] == "http://testserver/fhir"
    assert "RS256" in oidc["id_token_signing_alg_values_supported"]
    assert oidc["subject_types_supported"] == ["public"]
    keys = (await client.get(oidc["jwks_uri"].removeprefix("http://testserver"))).json()
    key = keys["keys"][0]
    assert key["kty"] == "RSA" and key["alg"] == "RS256" and {"n", "e", "kid"} <= set(key)
    assert "d" not in key


async def test_the_style_of_launches_is_served(client: httpx.AsyncClient) -> None:
    style = (await client.get("/oauth2/smart-style.json")).json()
    assert style["color_background"].startswith("#")


async def test_the_capability_statement_carries_the_oauth_uris_and_smart_service(
        client: httpx.AsyncClient) -> None:
    statement = (await client.get("/fhir/metadata")).json()
    security = statement["rest"][0]["security"]
    assert security["service"][0]["coding"][0]["code"] == "SMART-on-FHIR"
    uris = {e["url"]: e["valueUri"] for e in security["extension"][0]["extension"]}
    assert security["extension"][0]["url"] == \
        "http://fhir-registry.smarthealthit.org/StructureDefinition/oauth-uris"
    assert uris["authorize"] == "http://testserver/oauth2/authorize"
    assert uris["token"] == "http://testserver/oauth2/token"
    assert {"register", "manage", "introspect", "revoke"} <= set(uris)


async def test_the_host_header_never_makes_the_public_urls(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 32 result 9: without HEALTHPLATFORM_BASE_URL the URLs are the bind address
    (said in the log at start); a request's Host changes nothing."""
    caplog.set_level("WARNING", "healthplatform.app")
    app = create_app(make_settings(tmp_path, http_host="127.0.0.1", http_port=8123))
    assert "HEALTHPLATFORM_BASE_URL is not set" in caplog.text
    async with LifespanManager(app, startup_timeout=30), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
        found = await http.get("/.well-known/smart-configuration",
                               headers={"Host": "evil.example"})
        assert found.status_code == 200
        assert found.json()["token_endpoint"] == "http://127.0.0.1:8123/oauth2/token"
        assert "evil.example" not in found.text
    configured = create_app(make_settings(tmp_path / "b", base_url="https://ehr.example.org"))
    async with LifespanManager(configured, startup_timeout=30), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=configured), base_url="http://testserver") as http:
        found = await http.get("/.well-known/smart-configuration",
                               headers={"Host": "evil.example"})
        assert found.json()["token_endpoint"] == "https://ehr.example.org/oauth2/token"
