"""ViewDefinition as a stored resource: create, read, update, delete, search by name,
resource, status and url, validated on write (a 400 OperationOutcome naming each element
at fault), and listed in the CapabilityStatement with its operations."""

from __future__ import annotations

import copy
from typing import Any

import httpx

from tests.conftest import add_member, make_admin, make_clinic_admin, register_and_login
from tests.fhir_server.views.support import BLOOD_PRESSURE

JSON = dict[str, Any]


def _issues(response: httpx.Response) -> list[tuple[str, str]]:
    assert response.status_code == 400, response.text
    outcome = response.json()
    assert outcome["resourceType"] == "OperationOutcome"
    return [(issue["expression"][0], issue["diagnostics"]) for issue in outcome["issue"]]


async def test_a_platform_administrator_creates_reads_updates_searches_and_deletes_a_view(
        app: Any, client: httpx.AsyncClient) -> None:
    admin = (await make_admin(app, client))["headers"]
    created = await client.post("/fhir/ViewDefinition", json=BLOOD_PRESSURE, headers=admin)
    assert created.status_code == 201, created.text
    view_id = created.json()["id"]
    read = await client.get(f"/fhir/ViewDefinition/{view_id}", headers=admin)
    assert read.json()["select"] == BLOOD_PRESSURE["select"]

    changed = {**read.json(), "status": "retired", "title": "Blood pressure (retired)"}
    updated = await client.put(f"/fhir/ViewDefinition/{view_id}", json=changed, headers=admin)
    assert updated.status_code == 200, updated.text
    assert updated.json()["meta"]["versionId"] == "2"

    for query, expected in (("name=blood_pressure", 1), ("name=blood", 1),
                            ("resource=Observation", 1), ("resource=Patient", 0),
                            ("status=retired", 1), ("status=active", 0),
                            (f"url={BLOOD_PRESSURE['url']}", 1),
                            ("url=https://elsewhere.example.org/v", 0)):
        found = await client.get(f"/fhir/ViewDefinition?{query}", headers=admin)
        assert found.status_code == 200, found.text
        assert found.json().get("total", len(found.json().get("entry", []))) == expected, query

    deleted = await client.delete(f"/fhir/ViewDefinition/{view_id}", headers=admin)
    assert deleted.status_code == 200
    assert (await client.get(f"/fhir/ViewDefinition/{view_id}", headers=admin)
            ).status_code == 410


async def test_a_role_without_rights_to_definitions_may_not_store_a_view(
        app: Any, client: httpx.AsyncClient) -> None:
    clinic = await make_clinic_admin(client)
    nurse = await register_and_login(client, first_name="Mercy", last_name="Achieng")
    await add_member(app, clinic["org_id"], nurse, "ORG:NURSE")
    refused = await client.post("/fhir/ViewDefinition", json=BLOOD_PRESSURE,
                                headers=nurse["headers"])
    assert refused.status_code == 403, refused.text
    assert refused.json()["issue"][0]["code"] == "forbidden"


async def test_an_invalid_view_is_refused_naming_each_element(
        app: Any, client: httpx.AsyncClient) -> None:
    admin = (await make_admin(app, client))["headers"]

    def view(**changes: Any) -> JSON:
        body = copy.deepcopy(BLOOD_PRESSURE)
        body.update(changes)
        return body

    unknown = view()
    unknown["select"][0]["colums"] = []
    assert _issues(await client.post("/fhir/ViewDefinition", json=unknown, headers=admin)) \
        == [("ViewDefinition.select[0].colums",
             "ViewDefinition.select[0].colums: unknown element (not defined in FHIR R4 for "
             "ViewDefinition.select[0])")]

    bad_name = view()
    bad_name["select"][0]["column"][1]["name"] = "patient id"
    [(where, why)] = _issues(await client.post("/fhir/ViewDefinition", json=bad_name,
                                               headers=admin))
    assert where == "ViewDefinition.select[0].column[1].name" and "SQL name" in why

    duplicate = view()
    duplicate["select"][1]["column"][0]["name"] = "id"
    [(where, why)] = _issues(await client.post("/fhir/ViewDefinition", json=duplicate,
                                               headers=admin))
    assert where == "ViewDefinition.select[1].column[0].name" and "already defined" in why

    unsupported = view()
    unsupported["select"][0]["column"][2]["path"] = "effective.ofType(dateTime).aggregate(1)"
    [(where, why)] = _issues(await client.post("/fhir/ViewDefinition", json=unsupported,
                                               headers=admin))
    assert where == "ViewDefinition.select[0].column[2].path"
    assert "aggregate() is not supported" in why

    broken = view(where=[{"path": "code.coding.exists(system = "}])
    [(where, _)] = _issues(await client.post("/fhir/ViewDefinition", json=broken,
                                             headers=admin))
    assert where == "ViewDefinition.where[0].path"

    repeating = view()
    repeating["select"][0]["column"].append({"name": "codes", "path": "code.coding.code"})
    [(where, why)] = _issues(await client.post("/fhir/ViewDefinition", json=repeating,
                                               headers=admin))
    assert where == "ViewDefinition.select[0].column[3].collection"
    assert "collection: true" in why
    repeating["select"][0]["column"][3]["collection"] = True
    assert (await client.post("/fhir/ViewDefinition", json=repeating, headers=admin)
            ).status_code == 201

    union = view(select=[{"unionAll": [
        {"column": [{"name": "id", "path": "id"}]},
        {"column": [{"name": "key", "path": "id"}]}]}])
    [(where, why)] = _issues(await client.post("/fhir/ViewDefinition", json=union,
                                               headers=admin))
    assert where == "ViewDefinition.select[0].unionAll[1]" and "same columns" in why

    no_type = view(resource="Bloodpressure")
    [(where, _)] = _issues(await client.post("/fhir/ViewDefinition", json=no_type,
                                             headers=admin))
    assert where == "ViewDefinition.resource"

    several = view(resource="Patient", select=[{"column": [
        {"name": "id", "path": "id"}, {"name": "family", "path": "name.family"},
        {"name": "born", "path": "birthDate.lowBoundary(1, 2, 3)"}]}])
    assert [w for w, _ in _issues(await client.post("/fhir/ViewDefinition", json=several,
                                                    headers=admin))] == [
        "ViewDefinition.select[0].column[1].collection",
        "ViewDefinition.select[0].column[2].path"]


async def test_validate_reports_a_views_problems_without_storing(
        app: Any, client: httpx.AsyncClient) -> None:
    admin = (await make_admin(app, client))["headers"]
    valid = await client.post("/fhir/ViewDefinition/$validate", json=BLOOD_PRESSURE,
                              headers=admin)
    assert [i["severity"] for i in valid.json()["issue"]] == ["information"], valid.text
    body = copy.deepcopy(BLOOD_PRESSURE)
    body["select"][0]["column"][0]["path"] = "id.nonsense("
    checked = await client.post("/fhir/ViewDefinition/$validate", json=body, headers=admin)
    assert checked.status_code == 200
    issues = checked.json()["issue"]
    expressions = [i.get("expression") for i in issues]
    assert ["ViewDefinition.select[0].column[0].path"] in expressions, issues
    found = await client.get("/fhir/ViewDefinition", headers=admin)
    assert found.json().get("entry", []) == []


async def test_the_capability_statement_lists_viewdefinition_and_its_operations(
        client: httpx.AsyncClient) -> None:
    statement = (await client.get("/fhir/metadata")).json()
    rest = statement["rest"][0]
    [view] = [r for r in rest["resource"] if r["type"] == "ViewDefinition"]
    assert view["profile"] == "https://sql-on-fhir.org/ig/StructureDefinition/ViewDefinition"
    assert {p["name"] for p in view["searchParam"]} >= {"name", "resource", "status", "url"}
    assert {o["name"] for o in view["operation"]} >= {"run", "viewdefinition-export"}
    assert {o["name"] for o in rest["operation"]} >= {"viewdefinition-run",
                                                      "viewdefinition-export"}
