"""Search result parameters and the other ways to search, over HTTP on the clinical record
set: ``_sort``, ``_count`` with keyset paging, ``_total``, ``_summary``, ``_elements``,
``_include``/``_revinclude`` (``:iterate``), lenient/strict handling, POST ``_search``,
system search, compartment search, ``Patient/$everything`` and the CapabilityStatement."""

from __future__ import annotations

import pytest

from fhir_server.store import includes
from tests.fhir_server.clinical_data import LOINC

pytestmark = pytest.mark.asyncio(loop_scope="module")


def names(clinical, bundle, mode: str = "match") -> list[str]:
    by_id = {v: k for k, v in clinical.ids.items()}
    return [by_id.get(e["resource"]["id"], e["resource"]["id"]) for e in bundle["entry"]
            if e["search"]["mode"] == mode]


def link(bundle, relation: str) -> str | None:
    return next((x["url"] for x in bundle["link"] if x["relation"] == relation), None)


async def follow(clinical, url: str) -> dict:
    response = await clinical.client.get(url, headers=clinical.headers)
    assert response.status_code == 200, response.text
    return response.json()


# --- _sort -----------------------------------------------------------------------------

@pytest.mark.parametrize(("sort", "expected"), [
    ("birthdate", ["chinedu", "kwame", "amina", "fatima", "zoe"]),
    ("-birthdate", ["zoe", "fatima", "amina", "kwame", "chinedu"]),
    ("family", ["fatima", "kwame", "zoe", "amina", "chinedu"]),
    ("gender,-birthdate", ["zoe", "fatima", "amina", "kwame", "chinedu"]),
    ("-gender,family", ["kwame", "chinedu", "fatima", "zoe", "amina"]),
])
async def test_sort_by_one_or_several_keys(clinical, sort, expected):
    bundle = await clinical.search("Patient", {"_sort": sort})
    assert names(clinical, bundle) == expected


async def test_sort_puts_resources_without_the_value_last(clinical):
    bundle = await clinical.search("Observation", {"_sort": "-value-quantity",
                                                   "subject": f"Patient/{clinical.ids['fatima']}"})
    assert set(names(clinical, bundle)) == {"smoking-fatima", "note-fatima"}
    bundle = await clinical.search("Patient", {"_sort": "death-date"})
    assert names(clinical, bundle)[0] == "kwame"


async def test_sort_by_last_updated_and_id(clinical):
    by_updated = names(clinical, await clinical.search("Patient", {"_sort": "-_lastUpdated"}))
    assert len(by_updated) == 5
    by_id = names(clinical, await clinical.search("Patient", {"_sort": "_id"}))
    assert by_id == sorted(by_id, key=lambda n: clinical.ids[n])


# --- paging ---------------------------------------------------------------------------------

async def walk(clinical, path: str, params: dict) -> list[list[str]]:
    pages, bundle = [], await clinical.search(path, params)
    while True:
        pages.append(names(clinical, bundle))
        url = link(bundle, "next")
        if url is None:
            return pages
        bundle = await follow(clinical, url)


@pytest.mark.parametrize("params", [
    {"_count": "2"},
    {"_count": "3", "_sort": "-date"},
    {"_count": "2", "_sort": "code,-date"},
    {"_count": "4", "category": "vital-signs"},
])
async def test_paging_visits_every_match_once(clinical, params):
    everything = set(names(clinical, await clinical.search("Observation", {"_count": "100"})))
    pages = await walk(clinical, "Observation", params)
    seen = [n for page in pages for n in page]
    assert len(seen) == len(set(seen))
    expected = everything if "category" not in params else await clinical.names(
        "Observation", {"category": "vital-signs"})
    assert set(seen) == expected
    assert all(len(p) <= int(params["_count"]) for p in pages)


async def test_previous_link_returns_the_previous_page(clinical):
    first = await clinical.search("Observation", {"_count": "3", "_sort": "date"})
    second = await follow(clinical, link(first, "next"))
    back = await follow(clinical, link(second, "previous"))
    assert names(clinical, back) == names(clinical, first)
    assert link(first, "previous") is None


async def test_paging_links_stay_stable_while_data_changes(clinical):
    first = await clinical.search("Patient", {"_count": "2", "_sort": "birthdate"})
    assert names(clinical, first) == ["chinedu", "kwame"]
    # A new oldest patient and a new youngest one arrive between the pages.
    arrived = []
    for birth in ("1930-01-01", "2020-01-01"):
        created = await clinical.client.post("/fhir/Patient", json={
            "resourceType": "Patient", "name": [{"family": "Njoroge"}], "birthDate": birth},
            headers=clinical.headers)
        assert created.status_code == 201
        arrived.append(created.json()["id"])
    second = await follow(clinical, link(first, "next"))
    third = await follow(clinical, link(second, "next"))
    assert names(clinical, second) == ["amina", "fatima"]
    assert names(clinical, third)[0] == "zoe"
    if getattr(clinical.app.state.services.store, "transactions", True):
        cleanup = await clinical.client.delete("/fhir/Patient?family=njoroge",
                                               headers=clinical.headers)
        assert cleanup.status_code == 200
        return
    # Without transactions (the MongoDB fake) a delete of several is refused as a whole.
    refused = await clinical.client.delete("/fhir/Patient?family=njoroge",
                                           headers=clinical.headers)
    assert refused.status_code == 501, refused.text
    for patient_id in arrived:
        deleted = await clinical.client.delete(f"/fhir/Patient/{patient_id}",
                                               headers=clinical.headers)
        assert deleted.status_code in (200, 204)


async def test_count_and_total(clinical):
    bundle = await clinical.search("Observation", {"_count": "2", "_total": "accurate"})
    assert bundle["total"] == 11 and len(names(clinical, bundle)) == 2
    assert "total" not in await clinical.search("Observation", {"_total": "none"})
    small = await clinical.search("Observation", {"code": "8867-4"})
    assert small["total"] == 3  # cheap: given without asking
    zero = await clinical.search("Observation", {"_count": "0", "code": "8867-4"})
    assert zero["total"] == 3 and zero["entry"] == []


# --- _summary and _elements --------------------------------------------------------------------

async def test_summary_modes(clinical):
    amina = clinical.ids["amina"]
    count = await clinical.search("Patient", {"_summary": "count"})
    assert count["total"] == 5 and count["entry"] == []
    summary = (await clinical.search("Patient", {"_id": amina, "_summary": "true"}))["entry"][0]
    resource = summary["resource"]
    assert "text" not in resource and "birthDate" in resource and "name" in resource
    assert any(t["code"] == "SUBSETTED" for t in resource["meta"]["tag"])
    text = (await clinical.search("Patient", {"_id": amina, "_summary": "text"}))["entry"][0]
    assert set(text["resource"]) == {"resourceType", "id", "meta", "text"}
    data = (await clinical.search("Patient", {"_id": amina, "_summary": "data"}))["entry"][0]
    assert "text" not in data["resource"] and "telecom" in data["resource"]


async def test_elements_keeps_what_was_asked_and_the_mandatory_elements(clinical):
    bundle = await clinical.search("Observation", {"code": "8867-4", "_elements": "subject"})
    for entry in bundle["entry"]:
        assert set(entry["resource"]) == {"resourceType", "id", "meta", "subject", "status",
                                          "code"}


# --- _include / _revinclude ----------------------------------------------------------------------

async def test_include_adds_referenced_resources_once(clinical):
    bundle = await clinical.search("Observation", {"code": "8867-4",
                                                   "_include": "Observation:subject"})
    assert set(names(clinical, bundle)) == {"hr-amina", "hr-kwame", "hr-zoe"}
    assert sorted(names(clinical, bundle, "include")) == ["amina", "kwame", "zoe"]
    typed = await clinical.search("Observation", [("subject", clinical.ids["amina"]),
                                                  ("_include", "Observation:encounter:Encounter"),
                                                  ("_include", "Observation:performer")])
    assert sorted(names(clinical, typed, "include")) == ["dr-kamau", "enc-amina"]


async def test_revinclude_and_iterate(clinical):
    bundle = await clinical.search("Patient", [("_id", clinical.ids["amina"]),
                                               ("_revinclude", "Provenance:target"),
                                               ("_revinclude", "Condition:subject")])
    assert names(clinical, bundle) == ["amina"]
    assert sorted(names(clinical, bundle, "include")) == ["dm-amina", "provenance-amina"]
    report = await clinical.search("DiagnosticReport", [
        ("_include", "DiagnosticReport:result"),
        ("_include:iterate", "Observation:subject"),
        ("_include:iterate", "Patient:organization")])
    assert sorted(names(clinical, report, "include")) == [
        "amina", "glucose-amina", "hba1c-amina", "knh"]


async def test_include_wildcard(clinical):
    bundle = await clinical.search("Encounter", {"_include": "*"})
    assert sorted(names(clinical, bundle, "include")) == ["amina", "dr-kamau", "knh"]


async def test_include_fan_out_is_capped_with_a_clear_error(clinical, monkeypatch):
    monkeypatch.setattr(includes, "MAX_INCLUDED", 2)
    response = await clinical.client.get("/fhir/Observation", params={
        "_include": "Observation:subject", "_count": "50"}, headers=clinical.headers)
    assert response.status_code == 400
    assert "_include" in response.json()["issue"][0]["diagnostics"]


# --- handling of unknown parameters ---------------------------------------------------------

async def test_unknown_and_unsupported_parameters_lenient_and_strict(clinical):
    lenient = await clinical.search("Patient", [("family", "odhiambo"), ("shoe-size", "42"),
                                                ("birthdate:exact", "1988"),
                                                ("_contained", "true"), ("_sort", "-hat")])
    assert names(clinical, lenient) == ["amina"]
    outcome = [e for e in lenient["entry"] if e["search"]["mode"] == "outcome"]
    text = outcome[0]["resource"]["issue"][0]["diagnostics"]
    assert "shoe-size" in text and "birthdate:exact" in text and "_contained" in text
    assert "_sort=-hat" in text
    assert "shoe-size" not in link(lenient, "self")
    strict = await clinical.client.get("/fhir/Patient?shoe-size=42", headers={
        **clinical.headers, "Prefer": "handling=strict"})
    assert strict.status_code == 400


async def test_post_search_takes_a_form(clinical):
    response = await clinical.client.post(
        "/fhir/Patient/_search", data={"family": "okafor"},
        headers={"Authorization": clinical.headers["Authorization"]})
    assert response.status_code == 200
    assert names(clinical, response.json()) == ["chinedu"]


# --- system, compartment, $everything ------------------------------------------------------------

async def test_system_search_with_type(clinical):
    bundle = await clinical.search("", {"_type": "Patient,Practitioner", "name": "kam"})
    assert names(clinical, bundle) == ["dr-kamau"]
    ids = f"{clinical.ids['amina']},{clinical.ids['knh']}"
    assert set(names(clinical, await clinical.search("", {"_id": ids}))) == {"amina", "knh"}
    tagged = await clinical.search("", {"_tag": "research-cohort"})
    assert names(clinical, tagged) == ["fatima"]


async def test_compartment_search(clinical):
    amina = clinical.ids["amina"]
    observations = await clinical.search(f"Patient/{amina}/Observation")
    assert set(names(clinical, observations)) == {"hr-amina", "temp-amina", "weight-amina",
                                                  "hba1c-amina", "glucose-amina"}
    heart = await clinical.search(f"Patient/{amina}/Observation", {"code": f"{LOINC}|8867-4"})
    assert names(clinical, heart) == ["hr-amina"]
    everything = await clinical.search(f"Patient/{amina}/*", {"_count": "100"})
    assert {"dm-amina", "metformin-amina", "enc-amina", "provenance-amina"} <= set(
        names(clinical, everything))
    wrong = await clinical.client.get(f"/fhir/Patient/{amina}/Organization",
                                      headers=clinical.headers)
    assert wrong.status_code == 400
    unknown = await clinical.client.get("/fhir/Patient/nobody/Observation",
                                        headers=clinical.headers)
    assert unknown.status_code == 404


async def test_patient_everything(clinical):
    amina = clinical.ids["amina"]
    bundle = await clinical.search(f"Patient/{amina}/$everything", {"_count": "100"})
    matched = set(names(clinical, bundle))
    assert {"amina", "hr-amina", "dm-amina", "metformin-amina", "report-amina",
            "provenance-amina", "enc-amina"} <= matched
    assert not matched & {"kwame", "hr-kwame", "zoe"}
    assert {"dr-kamau", "knh"} <= set(names(clinical, bundle, "include"))
    only = await clinical.search(f"Patient/{amina}/$everything", {"_type": "Condition"})
    assert names(clinical, only) == ["dm-amina"]
    later = await clinical.search(f"Patient/{amina}/$everything", {"_since": "2100-01-01"})
    assert names(clinical, later) == []
    pages = await walk(clinical, f"Patient/{amina}/$everything", {"_count": "3"})
    flat = [n for page in pages for n in page]
    assert len(flat) == len(set(flat)) and set(flat) == matched


async def test_capability_statement_lists_search_parameters_per_type(clinical):
    statement = (await clinical.client.get("/fhir/metadata")).json()
    rest = statement["rest"][0]
    assert {"transaction", "batch", "search-system", "history-system"} <= {
        i["code"] for i in rest["interaction"]}
    observation = next(r for r in rest["resource"] if r["type"] == "Observation")
    params = {p["name"]: p["type"] for p in observation["searchParam"]}
    assert params["code"] == "token" and params["code-value-quantity"] == "composite"
    assert params["_lastUpdated"] == "date" and params["date"] == "date"
    assert observation["conditionalCreate"] is True
    assert observation["conditionalDelete"] == "multiple"
    assert "Observation:subject" in observation["searchInclude"]
    patient = next(r for r in rest["resource"] if r["type"] == "Patient")
    assert "Observation:subject" in patient["searchRevInclude"]
    assert {o["name"] for o in patient["operation"]} == {"validate", "everything", "match",
                                                              "export"}
    assert {"birthdate", "family", "identifier", "_text", "_content"} <= {
        p["name"] for p in patient["searchParam"]}


async def test_offset_pages_by_position_with_offset_links(clinical):
    everyone = names(clinical, await clinical.search("Patient", {"_sort": "birthdate",
                                                                 "_count": "100"}))
    page = await clinical.search("Patient", {"_sort": "birthdate", "_count": "2",
                                             "_offset": "2"})
    assert names(clinical, page) == everyone[2:4]
    assert "_offset=4" in link(page, "next") and "_cursor" not in link(page, "next")
    assert "_offset=0" in link(page, "previous")
    following = await follow(clinical, link(page, "next"))
    assert names(clinical, following) == everyone[4:6]
    unsorted = await clinical.search("Patient", {"_count": "1", "_offset": "1"})
    assert names(clinical, unsorted) == names(clinical, await clinical.search(
        "Patient", {"_count": "2"}))[1:]


async def test_offset_beyond_the_bound_is_refused(clinical):
    response = await clinical.client.get("/fhir/Patient?_offset=10001", headers=clinical.headers)
    assert response.status_code == 400
    assert response.json()["issue"][0]["expression"] == ["_offset"]
