"""The OpenAPI documents say what the server answers: ``/openapi.json`` (the /api routes
and the FHIR interactions) and ``/openapi/fhir.json`` (the FHIR API by resource type).

The walk sends every documented operation of both (the per-type FHIR paths for a sample
of types) what a new client gets wrong (no credentials, an unknown id, an empty,
malformed or non-JSON body, a caller without the role) and what an administrator sends,
and checks that each answer's status is documented for that operation and its body
matches the documented schema. It reads the documents, so routes added later are walked
too. A second walk does the same with valid requests of a sample of routes, for their
success answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest

from fhir_server.validation import resource_types
from platform_api.settings import Settings
from tests.conftest import make_admin, make_settings, register_and_login

UNKNOWN_ID = "00000000-0000-4000-8000-00000000beef"
DOCUMENTS = ("/openapi.json", "/openapi/fhir.json")
SAMPLE_TYPES = ("Patient", "Observation", "Organization")
FHIR_JSON = "application/fhir+json"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # The walk makes many refused requests from one address; rate limits are documented
    # as 429 everywhere and tested in test_rate_limit.
    return make_settings(tmp_path, rate_limit_enabled=False)


# -- reading the document ------------------------------------------------------------------------
def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        segments = path.split("/")
        if len(segments) > 2 and segments[1] == "fhir" and segments[2][:1].isupper() \
                and segments[2] not in SAMPLE_TYPES and segments[2] != "Patient":
            continue  # the per-type FHIR paths are one template: a sample of types
        for method, operation in item.items():
            yield path, method.upper(), operation


def match(spec: dict[str, Any], method: str, path: str) -> tuple[str, dict[str, Any]]:
    """The documented operation of a request: a path without parameters first, then the
    template with the most fixed segments (as OpenAPI tools match)."""
    parts = path.split("?")[0].rstrip("/").split("/")
    candidates = []
    for template, item in spec["paths"].items():
        fixed = template.split("/")
        if len(fixed) != len(parts) or method.lower() not in item:
            continue
        if all(f == p or (f.startswith("{") and p) for f, p in zip(fixed, parts, strict=True)):
            candidates.append((sum(not f.startswith("{") for f in fixed), template))
    assert candidates, f"{method} {path} is not documented"
    template = max(candidates)[1]
    return template, spec["paths"][template][method.lower()]


def documented(spec: dict[str, Any], operation: dict[str, Any], status: int
               ) -> dict[str, Any] | None:
    response = operation["responses"].get(str(status))
    if response is not None and "$ref" in response:
        response = spec["components"]["responses"][response["$ref"].rsplit("/", 1)[-1]]
    return response  # type: ignore[no-any-return]


def check(spec: dict[str, Any], method: str, path: str, response: httpx.Response,
          seen: set[tuple[str, str, int]]) -> None:
    template, operation = match(spec, method, path)
    status = response.status_code
    said = f"{method} {path} answered {status}: {response.text[:300]}"
    assert status < 500, said
    described = documented(spec, operation, status)
    assert described is not None, f"{said}\n(documented: {sorted(operation['responses'])})"
    seen.add((method, template, status))
    if not response.content:
        return
    kind = response.headers["content-type"].split(";")[0]
    content = described.get("content", {})
    assert kind in content, f"{said}: documented as {sorted(content)}, sent {kind}"
    schema = content[kind].get("schema")
    if schema:
        validator = jsonschema_rs.validator_for({**schema, "components": spec["components"]})
        errors = [e.message for e in validator.iter_errors(response.json())]
        assert not errors, f"{said}: the body does not match the documented schema: {errors}"


# -- the walk ----------------------------------------------------------------------------------
def url_of(path: str) -> str:
    filled = []
    for segment in path.split("/"):
        if segment in ("{resource_type}", "{compartment_type}"):
            filled.append("Patient")
        elif segment.startswith("{"):
            filled.append(UNKNOWN_ID)
        else:
            filled.append(segment)
    return "/".join(filled)


def bodies(operation: dict[str, Any]) -> list[tuple[str | None, bytes]]:
    """(Content-Type, body) to send: none; and for an operation with a body, an empty
    object, malformed JSON and a body that is not JSON."""
    body = operation.get("requestBody")
    if body is None:
        return [(None, b"")]
    if "$ref" in body:
        kinds = ["application/json", FHIR_JSON]
    else:
        kinds = list(body.get("content", {}))
    json_kind = next((k for k in kinds if k.endswith("json")), kinds[0])
    return [(json_kind, b"{}"), (json_kind, b'{"name": "Kibera'),
            ("text/plain", b"name=Kibera")]


async def session(client: httpx.AsyncClient, app: Any, who: dict[str, Any]) -> dict[str, str]:
    """The caller's headers, logged in again if a walked route ended the session."""
    if (await client.get("/api/auth/me", headers=who["headers"])).status_code == 401:
        login = await client.post("/api/auth/login", json={
            "email": who["user"]["email"], "password": "correct horse battery"})
        who["headers"] = {"Authorization": f"Bearer {login.json()['data']['token']}"}
    return who["headers"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("document", DOCUMENTS)
async def test_every_answer_to_a_mistaken_or_refused_request_is_documented(app, client,
                                                                          document):
    spec = (await client.get(document)).json()
    admin = await make_admin(app, client)
    patient_account = await register_and_login(client, first_name="Baraka",
                                               last_name="Otieno")
    seen: set[tuple[str, str, int]] = set()
    for path, method, operation in operations(spec):
        url = url_of(path)
        for content_type, body in bodies(operation):
            headers = {"Content-Type": content_type} if content_type else {}
            anonymous = await client.request(method, url, content=body, headers=headers)
            check(spec, method, url, anonymous, seen)
            for who in (admin, patient_account):
                caller = await session(client, app, who)
                answer = await client.request(method, url, content=body,
                                              headers={**caller, **headers})
                check(spec, method, url, answer, seen)
    statuses = {status for _, _, status in seen}
    # The walk did reach every kind of refusal it is meant to check.
    if document == "/openapi.json":
        assert {400, 401, 403, 404, 415, 422} <= statuses, statuses
        assert ("POST", "/api/organizations", 415) in seen
        assert ("GET", "/fhir/{resource_type}", 200) in seen
    else:
        assert {400, 401, 404, 415} <= statuses, statuses
        assert ("GET", "/fhir/Observation", 200) in seen


async def test_the_answers_of_valid_requests_are_documented(app, client):
    specs = [(await client.get(document)).json() for document in DOCUMENTS]
    seen: set[tuple[str, str, int]] = set()

    async def send(method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = await client.request(method, url, **kwargs)
        for spec in specs:
            if url.startswith("/fhir") or spec is specs[0]:
                check(spec, method, url, response, seen)
        return response

    account = {"email": "wanjiru@clinic.example.org", "password": "correct horse battery",
               "first_name": "Wanjiru", "last_name": "Kamau", "registration_role": "DOCTOR"}
    await send("POST", "/api/auth/register", json=account)
    again = await send("POST", "/api/auth/register", json=account)
    assert again.status_code == 201  # the same answer: no telling which addresses exist
    login = await send("POST", "/api/auth/login", json={"email": account["email"],
                                                       "password": account["password"]})
    h = {"Authorization": f"Bearer {login.json()['data']['token']}"}
    await send("GET", "/api/auth/me", headers=h)
    org = (await send("POST", "/api/organizations", headers=h,
                      json={"name": "Kibera Community Clinic", "country": "KE"})).json()
    patients = f"/api/organizations/{org['data']['id']}/patients"
    amina = {"first_name": "Amina", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
             "gender": "female", "mrn": "KCC-0001"}
    created = (await send("POST", patients, headers=h, json=amina)).json()["data"]
    assert (await send("POST", patients, headers=h, json=amina)).status_code == 409
    await send("GET", patients, headers=h)
    await send("GET", f"{patients}/search", params={"mrn": "KCC-0001"}, headers=h)
    await send("GET", f"{patients}/{created['id']}", headers=h)
    await send("GET", "/api/patients/me", headers=h)  # no profile yet: 404
    await send("GET", "/healthz")

    fhir = {**h, "Content-Type": FHIR_JSON}
    kwame = {"resourceType": "Patient", "name": [{"family": "Mensah", "given": ["Kwame"]}],
             "identifier": [{"system": "urn:oid:2.16.404.1.1", "value": "KE-1975"}],
             "gender": "male", "birthDate": "1975-09-30"}
    stored = (await send("POST", "/fhir/Patient", headers=fhir, json=kwame)).json()
    matched = await send("POST", "/fhir/Patient", json=kwame,
                         headers={**fhir, "If-None-Exist": "identifier=KE-1975"})
    assert matched.status_code == 200
    read = await send("GET", f"/fhir/Patient/{stored['id']}", headers=h)
    await send("GET", f"/fhir/Patient/{stored['id']}",
               headers={**h, "If-None-Match": read.headers["etag"]})
    await send("GET", "/fhir/Patient", params={"family": "mensah"}, headers=h)
    await send("POST", "/fhir/Patient/_search", data={"birthdate": "1975-09-30"}, headers=h)
    await send("PATCH", f"/fhir/Patient/{stored['id']}", json={"active": True},
               headers={**h, "Content-Type": "application/merge-patch+json"})
    await send("PUT", f"/fhir/Patient/{stored['id']}", json={**read.json(), "active": False},
               headers={**fhir, "If-Match": 'W/"1"'})  # stale: 412
    await send("GET", f"/fhir/Patient/{stored['id']}/_history", headers=h)
    await send("GET", f"/fhir/Patient/{stored['id']}/$everything", headers=h)
    await send("DELETE", f"/fhir/Patient/{stored['id']}", headers=h)
    await send("GET", f"/fhir/Patient/{stored['id']}", headers=h)  # 410
    await send("GET", "/fhir/metadata", params={"_summary": "true"})
    await send("GET", "/fhir/Patient", params={"_format": "xml"}, headers=h)  # 406
    statuses = {(method, status) for method, _, status in seen}
    assert {("POST", 201), ("POST", 200), ("GET", 304), ("GET", 410), ("PUT", 412),
            ("GET", 406), ("POST", 409)} <= statuses, statuses


# -- what the document holds -------------------------------------------------------------------
async def test_no_api_operation_documents_fastapis_validation_error(client):
    spec = (await client.get("/openapi.json")).json()
    for path, method, operation in operations(spec):
        text = json.dumps(operation)
        assert "HTTPValidationError" not in text, (method, path)
        if not path.startswith("/fhir") and "422" in operation["responses"]:
            schema = operation["responses"]["422"]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorEnvelope"}, (method, path)
    assert "HTTPValidationError" not in spec["components"]["schemas"]


async def test_fhir_search_documents_each_types_parameters_and_the_resource_types(client):
    spec = (await client.get("/openapi/fhir.json")).json()
    types = spec["components"]["schemas"]["ResourceType"]["enum"]
    assert types == sorted(resource_types()) and "Patient" in types
    search = spec["paths"]["/fhir/Patient"]["get"]
    names = {p.get("name") for p in search["parameters"]}
    assert {"family", "birthdate", "identifier", "general-practitioner"} <= names
    refs = {p.get("$ref", "").rsplit("/", 1)[-1] for p in search["parameters"]}
    assert {"_id", "_lastUpdated", "_count", "_sort", "_include", "_revinclude"} <= refs
    observation = {p.get("name") for p in spec["paths"]["/fhir/Observation"]["get"][
        "parameters"]}
    assert {"code", "value-quantity", "subject"} <= observation and "family" not in observation
    form = spec["paths"]["/fhir/Patient/_search"]["post"]["requestBody"]["content"][
        "application/x-www-form-urlencoded"]["schema"]["properties"]
    assert {"family", "birthdate", "_count"} <= set(form)
    create = spec["paths"]["/fhir/Patient"]["post"]["responses"]
    assert "201" in create and create["201"]["content"][FHIR_JSON]["schema"] == {
        "$ref": "#/components/schemas/FhirPatient"}
    patch = spec["paths"]["/fhir/{resource_type}/{resource_id}"]["patch"]
    assert {"application/json-patch+json", "application/merge-patch+json", FHIR_JSON} <= set(
        spec["components"]["requestBodies"]["Patch"]["content"])
    assert patch["requestBody"] == {"$ref": "#/components/requestBodies/Patch"}


async def test_the_api_document_describes_fhir_once_for_every_type(client):
    """The docs page renders /openapi.json; per-type paths would take it ~18 s to."""
    spec = (await client.get("/openapi.json")).json()
    assert "/fhir/Patient" not in spec["paths"]
    search = spec["paths"]["/fhir/{resource_type}"]["get"]
    assert "search parameters of the type" in search["description"]
    refs = {p.get("$ref", "").rsplit("/", 1)[-1] for p in search["parameters"]}
    assert {"_id", "_lastUpdated", "_count", "_include"} <= refs
    create = spec["paths"]["/fhir/{resource_type}"]["post"]["responses"]
    assert {"200", "201", "401", "403", "429"} <= set(create)
    # FHIR takes a few paths whatever the number of types (the /api operations grow the
    # rest of the document, one path each); the terminology operations are 11 of them,
    # the SQL on FHIR operations 7.
    fhir_paths = {path: item for path, item in spec["paths"].items() if path.startswith("/fhir")}
    assert len(fhir_paths) < 55 and len(json.dumps(fhir_paths)) < 100_000


async def test_the_fhir_document_has_its_docs_page(client):
    page = await client.get("/docs/fhir")
    assert page.status_code == 200 and "/openapi/fhir.json" in page.text
    assert "/docs/fhir" in (await client.get("/openapi.json")).json()["info"]["description"]


@pytest.mark.parametrize("document", DOCUMENTS)
async def test_every_path_parameter_is_declared_and_every_reference_resolves(client,
                                                                            document):
    spec = (await client.get(document)).json()
    for path, item in spec["paths"].items():
        template = {part[1:-1] for part in path.split("/") if part.startswith("{")}
        for method, operation in item.items():
            declared = {p["name"] for p in operation.get("parameters", [])
                        if p.get("in") == "path"}
            assert declared == template, (method, path, declared)
    text = json.dumps(spec)
    for ref in set(re.findall(r'"\$ref": "#/components/([^/]+)/([^"]+)"', text)):
        assert ref[1] in spec["components"][ref[0]], ref
