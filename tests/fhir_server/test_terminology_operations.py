"""The terminology operations over HTTP: CodeSystem $lookup, $validate-code, $subsumes,
ValueSet $expand, $validate-code, ConceptMap $translate, over the shipped R4 content and
over CodeSystems, ValueSets and ConceptMaps stored on the server; who may call them."""

from __future__ import annotations

from typing import Any

import pytest

FHIR = {"Content-Type": "application/fhir+json"}
ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
GENDER_VS = "http://hl7.org/fhir/ValueSet/administrative-gender"
TRIAGE = "http://clinic.example.org/fhir/CodeSystem/triage"


@pytest.fixture
def h(clinic_admin: dict[str, Any]) -> dict[str, str]:
    return {**clinic_admin["headers"], **FHIR}


def values(parameters: dict[str, Any]) -> dict[str, Any]:
    """name → value of the first parameter of each name (parts as lists)."""
    found: dict[str, Any] = {}
    for parameter in parameters["parameter"]:
        value = next((v for k, v in parameter.items() if k.startswith("value")),
                     parameter.get("part"))
        found.setdefault(parameter["name"], value)
    return found


def params(**values: Any) -> dict[str, Any]:
    items = []
    for name, value in values.items():
        key = {"coding": "valueCoding", "codeableConcept": "valueCodeableConcept",
               "valueSet": "resource", "codingA": "valueCoding", "codingB": "valueCoding"
               }.get(name, "valueString")
        items.append({"name": name, key: value})
    return {"resourceType": "Parameters", "parameter": items}


TRIAGE_SYSTEM = {
    "resourceType": "CodeSystem", "id": "triage", "url": TRIAGE, "version": "2024",
    "name": "ClinicTriage", "status": "active", "content": "complete",
    "hierarchyMeaning": "is-a", "property": [{"code": "colour", "type": "string"}],
    "concept": [
        {"code": "urgent", "display": "Urgent", "concept": [
            {"code": "red", "display": "Immediate", "property": [
                {"code": "colour", "valueString": "red"}]},
            {"code": "orange", "display": "Very urgent", "designation": [
                {"language": "sw", "value": "Haraka sana"}]}]},
        {"code": "routine", "display": "Routine", "concept": [
            {"code": "green", "display": "Standard"}]}]}
TRIAGE_URGENT = {
    "resourceType": "ValueSet", "id": "triage-urgent",
    "url": "http://clinic.example.org/fhir/ValueSet/triage-urgent", "status": "active",
    "compose": {"include": [{"system": TRIAGE, "filter": [
        {"property": "concept", "op": "is-a", "value": "urgent"}]}]}}
TRIAGE_TO_ESI = {
    "resourceType": "ConceptMap", "id": "triage-to-esi",
    "url": "http://clinic.example.org/fhir/ConceptMap/triage-to-esi", "status": "active",
    "group": [{"source": TRIAGE, "target": "http://example.org/esi", "element": [
        {"code": "red", "target": [{"code": "1", "display": "ESI 1",
                                    "equivalence": "equivalent"}]},
        {"code": "orange", "target": [{"code": "2", "equivalence": "wider"}]}]}]}


async def store_triage(client: Any, h: dict[str, str]) -> None:
    for resource in (TRIAGE_SYSTEM, TRIAGE_URGENT, TRIAGE_TO_ESI):
        response = await client.put(f"/fhir/{resource['resourceType']}/{resource['id']}",
                                    json=resource, headers=h)
        assert response.status_code in (200, 201), response.text


# -- CodeSystem ---------------------------------------------------------------------------
async def test_lookup_answers_display_designations_and_hierarchy(client, h):
    response = await client.get("/fhir/CodeSystem/$lookup",
                                params={"system": ACT_CODE, "code": "IMP"}, headers=h)
    assert response.status_code == 200, response.text
    found = values(response.json())
    assert found["display"] == "inpatient encounter"
    assert found["name"] == "v3.ActCode"
    parents = [p for p in response.json()["parameter"] if p["name"] == "property"
               and p["part"][0]["valueCode"] == "parent"]
    assert parents[0]["part"][1]["valueCode"] == "_ActEncounterCode"

    await store_triage(client, h)
    stored = await client.post("/fhir/CodeSystem/$lookup", headers=h,
                               json=params(coding={"system": TRIAGE, "code": "orange"}))
    assert stored.status_code == 200, stored.text
    parameter = stored.json()["parameter"]
    designation = next(p for p in parameter if p["name"] == "designation")
    assert {"name": "value", "valueString": "Haraka sana"} in designation["part"]
    unknown = await client.get("/fhir/CodeSystem/$lookup",
                               params={"system": TRIAGE, "code": "blue"}, headers=h)
    assert unknown.status_code == 404
    assert unknown.json()["issue"][0]["expression"] == ["code"]
    missing = await client.get("/fhir/CodeSystem/$lookup", params={"system": TRIAGE},
                               headers=h)
    assert missing.status_code == 400


async def test_codesystem_validate_code_and_subsumes(client, h):
    ok = await client.get("/fhir/CodeSystem/$validate-code", headers=h, params={
        "url": "http://hl7.org/fhir/administrative-gender", "code": "female"})
    assert values(ok.json()) == {"result": True, "display": "Female"}
    wrong_display = await client.get("/fhir/CodeSystem/$validate-code", headers=h, params={
        "url": "http://hl7.org/fhir/administrative-gender", "code": "female",
        "display": "Woman"})
    assert values(wrong_display.json())["result"] is False
    await store_triage(client, h)
    instance = await client.get("/fhir/CodeSystem/triage/$validate-code",
                                params={"code": "purple"}, headers=h)
    assert values(instance.json())["result"] is False

    for code_a, code_b, outcome in (("urgent", "red", "subsumes"),
                                    ("green", "routine", "subsumed-by"),
                                    ("red", "red", "equivalent"),
                                    ("red", "green", "not-subsumed")):
        response = await client.get("/fhir/CodeSystem/$subsumes", headers=h, params={
            "system": TRIAGE, "codeA": code_a, "codeB": code_b})
        assert values(response.json()) == {"outcome": outcome}, (code_a, code_b)
    shipped = await client.post("/fhir/CodeSystem/$subsumes", headers=h, json=params(
        codingA={"system": ACT_CODE, "code": "_ActEncounterCode"},
        codingB={"system": ACT_CODE, "code": "IMP"}))
    assert values(shipped.json()) == {"outcome": "subsumes"}
    bad = await client.get("/fhir/CodeSystem/triage/$subsumes", headers=h,
                           params={"codeA": "red", "codeB": "violet"})
    assert bad.status_code == 400 and bad.json()["issue"][0]["expression"] == ["codeB"]


# -- ValueSet -----------------------------------------------------------------------------
async def test_expand_with_filter_paging_and_designations(client, h):
    whole = await client.get("/fhir/ValueSet/$expand", params={"url": GENDER_VS}, headers=h)
    assert whole.status_code == 200, whole.text
    expansion = whole.json()["expansion"]
    assert expansion["total"] == 4
    assert {c["code"] for c in expansion["contains"]} == {"male", "female", "other",
                                                          "unknown"}
    page = await client.get("/fhir/ValueSet/$expand", headers=h, params={
        "url": "http://terminology.hl7.org/ValueSet/v3-ActCode", "count": "10",
        "offset": "20"})
    body = page.json()["expansion"]
    assert body["total"] > 1000 and body["offset"] == 20 and len(body["contains"]) == 10
    filtered = await client.get("/fhir/ValueSet/$expand", headers=h, params={
        "url": "http://terminology.hl7.org/ValueSet/v3-ActCode", "filter": "inpatient"})
    assert all("inpatient" in (c.get("display") or "").lower() or "inpatient" in c["code"]
               .lower() for c in filtered.json()["expansion"]["contains"])
    assert filtered.json()["expansion"]["total"] >= 1

    await store_triage(client, h)
    stored = await client.get("/fhir/ValueSet/triage-urgent/$expand", headers=h,
                              params={"includeDesignations": "true"})
    contains = {c["code"]: c for c in stored.json()["expansion"]["contains"]}
    assert set(contains) == {"urgent", "red", "orange"}
    assert contains["orange"]["designation"][0]["value"] == "Haraka sana"
    inline = await client.post("/fhir/ValueSet/$expand", headers=h, json=params(
        valueSet=TRIAGE_URGENT, filter="immediate"))
    assert [c["code"] for c in inline.json()["expansion"]["contains"]] == ["red"]


async def test_expand_refuses_what_it_cannot_list(client, h):
    loinc = await client.get("/fhir/ValueSet/$expand", headers=h,
                             params={"url": "http://hl7.org/fhir/ValueSet/observation-codes"})
    assert loinc.status_code == 422
    assert loinc.json()["issue"][0]["code"] == "too-costly"
    unknown = await client.get("/fhir/ValueSet/$expand", headers=h,
                               params={"url": "http://example.org/ValueSet/none"})
    assert unknown.status_code == 404
    bad_count = await client.get("/fhir/ValueSet/$expand", headers=h,
                                 params={"url": GENDER_VS, "count": "many"})
    assert bad_count.status_code == 400
    assert bad_count.json()["issue"][0]["expression"] == ["count"]


async def test_valueset_validate_code(client, h):
    ok = await client.get("/fhir/ValueSet/$validate-code", headers=h, params={
        "url": GENDER_VS, "system": "http://hl7.org/fhir/administrative-gender",
        "code": "female"})
    assert values(ok.json()) == {"result": True, "display": "Female"}
    concept = {"coding": [{"system": "http://hl7.org/fhir/administrative-gender",
                           "code": "woman"}]}
    bad = await client.post("/fhir/ValueSet/$validate-code", headers=h,
                            json=params(url=GENDER_VS, codeableConcept=concept))
    found = values(bad.json())
    assert found["result"] is False and "woman" in found["message"]
    await store_triage(client, h)
    stored = await client.get("/fhir/ValueSet/triage-urgent/$validate-code", headers=h,
                              params={"system": TRIAGE, "code": "green"})
    assert values(stored.json())["result"] is False
    stored_ok = await client.get("/fhir/ValueSet/triage-urgent/$validate-code", headers=h,
                                 params={"system": TRIAGE, "code": "red"})
    assert values(stored_ok.json()) == {"result": True, "display": "Immediate"}


# -- ConceptMap -------------------------------------------------------------------------
async def test_translate_over_shipped_and_stored_maps(client, h):
    shipped = await client.get("/fhir/ConceptMap/$translate", headers=h, params={
        "url": "http://hl7.org/fhir/ConceptMap/cm-administrative-gender-v2",
        "system": "http://hl7.org/fhir/administrative-gender", "code": "female"})
    assert shipped.status_code == 200, shipped.text
    found = values(shipped.json())
    assert found["result"] is True
    match = dict((p["name"], p) for p in found["match"])
    assert match["concept"]["valueCoding"]["code"] == "F"

    await store_triage(client, h)
    stored = await client.get("/fhir/ConceptMap/triage-to-esi/$translate", headers=h,
                              params={"system": TRIAGE, "code": "orange"})
    match = dict((p["name"], p) for p in values(stored.json())["match"])
    assert match["equivalence"]["valueCode"] == "wider"
    assert match["concept"]["valueCoding"]["code"] == "2"
    anywhere = await client.get("/fhir/ConceptMap/$translate", headers=h, params={
        "system": TRIAGE, "code": "red", "targetsystem": "http://example.org/esi"})
    assert values(anywhere.json())["result"] is True
    back = await client.get("/fhir/ConceptMap/triage-to-esi/$translate", headers=h, params={
        "system": "http://example.org/esi", "code": "1", "reverse": "true"})
    match = dict((p["name"], p) for p in values(back.json())["match"])
    assert match["concept"]["valueCoding"]["code"] == "red"
    none = await client.get("/fhir/ConceptMap/triage-to-esi/$translate", headers=h,
                            params={"system": TRIAGE, "code": "green"})
    assert values(none.json())["result"] is False


# -- who may call them ------------------------------------------------------------------------
OPERATIONS = [("GET", "/fhir/CodeSystem/$lookup?system=http://hl7.org/fhir/administrative-"
               "gender&code=female", "CodeSystem"),
              ("GET", f"/fhir/ValueSet/$expand?url={GENDER_VS}", "ValueSet"),
              ("GET", f"/fhir/ValueSet/$validate-code?url={GENDER_VS}&code=female",
               "ValueSet"),
              ("GET", "/fhir/ConceptMap/$translate?system=http://hl7.org/fhir/administrative-"
               "gender&code=female", "ConceptMap")]


async def test_terminology_operations_need_a_caller_and_the_types_read_scope(client, user):
    patient_user = user["headers"]
    keys = {}
    for scopes in (["Patient:read"], ["ValueSet:read", "CodeSystem:read", "ConceptMap:read"]):
        created = await client.post("/api/developer/keys", headers=patient_user,
                                    json={"name": "terminology", "scopes": scopes})
        assert created.status_code == 201, created.text
        keys[scopes[0]] = {"X-API-Key": created.json()["data"]["key"]}
    for method, path, _ in OPERATIONS:
        assert (await client.request(method, path)).status_code == 401
        allowed = await client.request(method, path, headers=patient_user)
        assert allowed.status_code == 200, (path, allowed.text)
        refused = await client.request(method, path, headers=keys["Patient:read"])
        assert refused.status_code == 403, path
        assert (await client.request(method, path, headers=keys["ValueSet:read"])
                ).status_code == 200, path


async def test_instance_operations_read_the_resource_as_the_caller(client, h, user):
    await store_triage(client, h)
    other = await client.get("/fhir/ValueSet/triage-urgent/$expand", headers=user["headers"])
    own = await client.get("/fhir/ValueSet/triage-urgent/$expand", headers=h)
    assert own.status_code == 200
    # what the policy lets a patient user read of another organization's ValueSet
    read = await client.get("/fhir/ValueSet/triage-urgent", headers=user["headers"])
    assert other.status_code == read.status_code


async def test_the_capability_statement_lists_the_operations(client):
    statement = (await client.get("/fhir/metadata")).json()
    by_type = {r["type"]: r for r in statement["rest"][0]["resource"]}
    assert {o["name"] for o in by_type["ValueSet"]["operation"]} >= {"expand",
                                                                     "validate-code"}
    assert {o["name"] for o in by_type["CodeSystem"]["operation"]} >= {
        "lookup", "validate-code", "subsumes"}
    assert "translate" in {o["name"] for o in by_type["ConceptMap"]["operation"]}
    assert "http://hl7.org/fhir/StructureDefinition/vitalsigns" in \
        by_type["Observation"]["supportedProfile"]
