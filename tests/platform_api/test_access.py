"""The access table: it transcribes the spec, covers every route of the app, and the
middleware enforces it (401 without credentials, 403 for a role or scope that may not,
public routes open). The route walk reads ``app.routes``, so routes added later are
checked without touching this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import Depends

from platform_api.access import (
    ACCESS_TABLE,
    AUTHENTICATED,
    CDS_JWT,
    MFA_TOKEN,
    OVERRIDES,
    PUBLIC,
    WEBHOOK,
    AccessControl,
    Rule,
    app_route_templates,
    derived_scope,
    normalize,
    scope_granted,
    unlisted_routes,
)
from platform_api.access_rules import OPERATIONS
from platform_api.app import create_app
from platform_api.auth.dependencies import current_principal
from platform_api.auth.principal import Principal
from platform_api.settings import Settings
from tests.conftest import make_settings, register_and_login

SPEC_TSV = Path(__file__).resolve().parents[1] / "data" / "spec" / "operations.tsv"
SAMPLE_ID = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # The walk answers many 401s from one address: keep it under the failure budget.
    return make_settings(tmp_path, rate_limits={"auth_failure": "100000/60"})


# -- the table -------------------------------------------------------------------------
def test_the_transcription_matches_the_spec_operations_tsv() -> None:
    in_spec = set()
    for line in SPEC_TSV.read_text(encoding="utf-8").splitlines():
        if line.strip():
            area, method, path, access = line.split("\t")
            in_spec.add((area, method, path, access))
    transcribed = {(area, m, p, a) for area, ops in OPERATIONS.items() for m, p, a in ops}
    assert transcribed == in_spec, "regenerate: python scripts/generate_access_rules.py"


def test_every_spec_operation_has_a_rule_of_its_access() -> None:
    expected = {"public": PUBLIC, "auth": AUTHENTICATED, "admin": AUTHENTICATED,
                "webhook": WEBHOOK}
    for operations in OPERATIONS.values():
        for method, path, access in operations:
            rule = ACCESS_TABLE[(method, normalize(path))]
            if (method, path) in OVERRIDES:
                assert rule.reason, f"override of {method} {path} must say why"
                continue
            assert rule.access == expected[access], (method, path)
            assert bool(rule.roles) == (access == "admin"), (method, path)


def test_admin_operations_need_platform_admins_and_user_administration_super_admin() -> None:
    assert ACCESS_TABLE[("POST", "/api/mpi/match")].roles == {"SUPER:ADMIN", "APP:ADMIN"}
    assert ACCESS_TABLE[("GET", "/admin/dlq")].roles == {"SUPER:ADMIN", "APP:ADMIN"}
    assert ACCESS_TABLE[("GET", "/api/admin/users")].roles == {"SUPER:ADMIN"}
    assert ACCESS_TABLE[("GET", "/api/admin/health")].roles == {"SUPER:ADMIN"}


def test_api_key_scopes_follow_the_path_and_stay_off_account_routes() -> None:
    assert ACCESS_TABLE[("GET", "/api/vitals/{}")].scope == "vitals:read"
    assert ACCESS_TABLE[("GET", "/api/organizations/{}")].scope == "organizations:read"
    assert ACCESS_TABLE[("GET", "/fhir/{}/{}")].required_scope(["Patient", "p1"]) == (
        "Patient:read")
    for keyless in (("POST", "/api/developer/keys"), ("GET", "/api/auth/me"),
                    ("GET", "/api/admin/users"), ("POST", "/api/auth/mfa/enroll")):
        assert ACCESS_TABLE[keyless].scope is None, keyless
    assert derived_scope("DELETE", "/cds-hooks/:hook_id") == "cds-hooks:write"


def test_scope_wildcards_cover_resource_or_action() -> None:
    assert scope_granted(frozenset({"Patient:read"}), "Patient:read")
    assert not scope_granted(frozenset({"Patient:read"}), "Patient:write")
    assert not scope_granted(frozenset({"Patient:read"}), "Observation:read")
    assert scope_granted(frozenset({"Patient:*"}), "Patient:write")
    assert scope_granted(frozenset({"*:read"}), "Observation:read")
    assert scope_granted(frozenset({"*:*"}), "vitals:write")


def test_matcher_prefers_static_segments_and_backtracks_by_method() -> None:
    table = {
        ("GET", "/api/organizations/me"): Rule(AUTHENTICATED, limit="read"),
        ("GET", "/api/organizations/{}"): Rule(PUBLIC, limit="public"),
        ("PUT", "/api/organizations/{}"): Rule(AUTHENTICATED, limit="write"),
        ("GET", "/docs/static/{path}"): Rule(PUBLIC, limit="public"),
    }
    control = AccessControl(table)
    assert control.match("GET", "/api/organizations/me") == (table[table_key("me")], [])
    assert control.match("PUT", "/api/organizations/me") == (
        table[("PUT", "/api/organizations/{}")], ["me"])
    assert control.match("GET", "/api/organizations/org-7")[1] == ["org-7"]  # type: ignore[index]
    assert control.match("HEAD", "/api/organizations/org-7") is not None
    assert control.match("GET", "/docs/static/swagger-ui.css")[1] == [  # type: ignore[index]
        "swagger-ui.css"]
    assert control.match("DELETE", "/api/organizations/org-7") is None
    assert control.match("GET", "/api/unknown") is None


def table_key(last: str) -> tuple[str, str]:
    return ("GET", f"/api/organizations/{last}")


# -- walking the app -------------------------------------------------------------------
def concrete(path: str) -> str:
    """A request path for a template: /fhir types become Patient, other ids a UUID."""
    parts, out = path.split("/"), []
    for index, part in enumerate(parts):
        if part == "{}":
            out.append("Patient" if parts[1] == "fhir" and index == 2 else SAMPLE_ID)
        elif part == "{path}":
            out.append("swagger-ui.css")
        else:
            out.append(part)
    return "/".join(out)


def cases(app: Any) -> list[tuple[str, str, Rule]]:
    found = []
    for method, template in app_route_templates(app.routes):
        rule = ACCESS_TABLE.get((method, template))
        assert rule is not None, (
            f"{method} {template} is not in the access table: add its rule to "
            "platform_api/access.py (or regenerate access_rules.py from the spec)")
        found.append((method, concrete(template), rule))
    return sorted(found)


def refusal_code(response: httpx.Response) -> str | None:
    body = response.json() if response.headers.get("content-type", "").startswith(
        ("application/json", "application/fhir+json")) else {}
    if body.get("resourceType") == "OperationOutcome":
        return str(body["issue"][0]["code"])
    return (body.get("error") or {}).get("code")


async def test_every_route_of_the_app_is_in_the_access_table(app: Any) -> None:
    unlisted = unlisted_routes(ACCESS_TABLE, app.routes)
    assert unlisted == [], (
        "routes missing from the access table (platform_api/access.py): "
        + ", ".join(f"{m} {p}" for m, p in unlisted))


async def test_without_credentials_protected_routes_answer_401_and_public_ones_do_not(
    app: Any, client: httpx.AsyncClient
) -> None:
    wrong = []
    for method, path, rule in cases(app):
        response = await client.request(method, path)
        challenged = "bearer" in response.headers.get("www-authenticate", "").lower()
        if rule.access in (AUTHENTICATED, MFA_TOKEN, CDS_JWT):
            if response.status_code != 401 or not challenged:
                wrong.append(f"{method} {path}: {response.status_code}, expected 401")
        elif rule.access == PUBLIC and response.status_code in (401, 403):
            wrong.append(f"{method} {path}: {response.status_code}, public route")
        elif rule.access == WEBHOOK and challenged:
            wrong.append(f"{method} {path}: asked for a token, webhooks are signed instead")
    assert not wrong, "\n".join(wrong)


async def test_routes_with_roles_refuse_other_users_with_403_and_admit_their_roles(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any], admin: dict[str, Any]
) -> None:
    app_admin = await register_and_login(client, first_name="Kofi", last_name="Boateng")
    await app.state.services.auth.set_roles(app_admin["user"]["id"], ["APP:ADMIN"])
    wrong = []
    for method, path, rule in cases(app):
        if not rule.roles:
            continue
        for who, headers, allowed in (
            ("patient", user["headers"], False),
            ("APP:ADMIN", app_admin["headers"], "APP:ADMIN" in rule.roles),
            ("SUPER:ADMIN", admin["headers"], True),
        ):
            response = await client.request(method, path, headers=headers)
            if allowed and response.status_code in (401, 403):
                wrong.append(f"{method} {path} as {who}: {response.status_code}")
            if not allowed and (response.status_code, refusal_code(response)) not in (
                (403, "FORBIDDEN"), (403, "forbidden")):
                wrong.append(f"{method} {path} as {who}: {response.status_code}, expected 403")
    assert not wrong, "\n".join(wrong)


async def create_key(client: httpx.AsyncClient, headers: dict[str, str], scopes: list[str]
                     ) -> dict[str, str]:
    response = await client.post("/api/developer/keys", headers=headers,
                                 json={"name": "walk", "scopes": scopes})
    assert response.status_code == 201, response.text
    return {"X-API-Key": response.json()["data"]["key"]}


async def test_api_keys_reach_only_the_routes_their_scopes_name(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    unrelated = await create_key(client, user["headers"], ["Basic:read"])
    everything = await create_key(client, user["headers"], ["*:*"])
    wrong = []
    for method, path, rule in cases(app):
        if rule.access != AUTHENTICATED:
            continue
        refused = await client.request(method, path, headers=unrelated)
        expected = ("FORBIDDEN", "INSUFFICIENT_SCOPE") if rule.roles else ("INSUFFICIENT_SCOPE",)
        if refused.status_code != 403 or refusal_code(refused) not in (*expected, "forbidden"):
            wrong.append(f"{method} {path} with an unrelated scope: {refused.status_code}")
        answer = await client.request(method, path, headers=everything)
        keyless = rule.scope is None
        if keyless and answer.status_code != 403:
            wrong.append(f"{method} {path}: API keys must be refused, got {answer.status_code}")
        if not keyless and answer.status_code in (401, 403) and refusal_code(answer) in (
            "INSUFFICIENT_SCOPE", "UNAUTHORIZED", "INVALID_API_KEY", "forbidden", "login"):
            wrong.append(f"{method} {path} with *:*: {answer.status_code} {answer.text}")
    assert not wrong, "\n".join(wrong)


async def test_a_route_missing_from_the_table_is_reported_and_closed_to_api_keys(
    tmp_path: Path,
) -> None:
    application = create_app(make_settings(tmp_path))

    @application.get("/api/experimental/whoami")
    async def whoami(principal: Principal = Depends(current_principal)) -> dict[str, str]:
        return {"user_id": principal.user_id}

    assert ("GET", "/api/experimental/whoami") in unlisted_routes(ACCESS_TABLE,
                                                                   application.routes)
    async with LifespanManager(application, startup_timeout=30):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            # Its own dependency still asks for a token...
            assert (await c.get("/api/experimental/whoami")).status_code == 401
            person = await register_and_login(c)
            assert (await c.get("/api/experimental/whoami",
                                headers=person["headers"])).status_code == 200
            # ...but no API key reaches it, whatever its scopes.
            key = await create_key(c, person["headers"], ["*:*"])
            refused = await c.get("/api/experimental/whoami", headers=key)
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "INSUFFICIENT_SCOPE"


async def test_fhir_refusals_are_operation_outcomes(client: httpx.AsyncClient) -> None:
    response = await client.get("/fhir/Patient")
    assert response.status_code == 401
    body = response.json()
    assert body["resourceType"] == "OperationOutcome"
    assert body["issue"][0]["code"] == "login"
    assert (await client.get("/fhir/metadata")).status_code == 200


def test_facade_routes_name_their_scope_by_fhir_type(tmp_path) -> None:
    from platform_api.access import bind_resource_routes
    from platform_api.app import create_app
    from tests.conftest import make_settings

    table = bind_resource_routes(create_app(make_settings(tmp_path)).routes)
    assert table[("POST", "/api/organizations/{}/patients")].scope == "Patient:write"
    assert table[("GET", "/api/organizations/{}/patients")].scope == "Patient:read"
    assert table[("GET", "/api/patients/{}/allergies")].scope == "AllergyIntolerance:read"
    assert scope_granted(frozenset({"patients:read"}), "Patient:read")
    assert scope_granted(frozenset({"Patient:read"}), "patients:read")
    assert not scope_granted(frozenset({"organizations:read"}), "Patient:read")
