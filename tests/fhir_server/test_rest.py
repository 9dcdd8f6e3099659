"""FHIR R4 REST interactions over HTTP through the whole app (real SQLite store)."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

FHIR = {"Content-Type": "application/fhir+json"}


def amina() -> dict[str, Any]:
    return {
        "resourceType": "Patient",
        "identifier": [{"system": "urn:oid:2.16.404.1.1", "value": "KE-29384756"}],
        "name": [{"use": "official", "family": "Odhiambo", "given": ["Amina", "Wanjiru"]}],
        "gender": "female",
        "birthDate": "1988-04-12",
        "telecom": [{"system": "phone", "value": "+254712345678", "use": "mobile"}],
    }


@pytest.fixture
def h(clinic_admin: dict[str, Any]) -> dict[str, str]:
    return {**clinic_admin["headers"], **FHIR}


async def create(client: httpx.AsyncClient, h: dict[str, str], body: dict | None = None,
                 **headers: str) -> httpx.Response:
    return await client.post("/fhir/Patient", json=body or amina(), headers={**h, **headers})


async def test_metadata_is_a_capability_statement_listing_interactions(client):
    response = await client.get("/fhir/metadata")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/fhir+json")
    statement = response.json()
    assert statement["resourceType"] == "CapabilityStatement"
    assert statement["fhirVersion"] == "4.0.1"
    patient = next(r for r in statement["rest"][0]["resource"] if r["type"] == "Patient")
    codes = {i["code"] for i in patient["interaction"]}
    assert {"read", "vread", "update", "patch", "delete", "create", "history-instance",
            "history-type", "search-type"} <= codes
    assert {p["name"] for p in patient["searchParam"]} >= {"_id", "_lastUpdated"}


async def test_fhir_requires_a_token(client):
    response = await client.get("/fhir/Patient/anything")
    assert response.status_code == 401
    assert response.json()["resourceType"] == "OperationOutcome"


async def test_create_returns_201_location_etag_and_body(client, h):
    response = await create(client, h)
    assert response.status_code == 201
    body = response.json()
    assert body["meta"]["versionId"] == "1"
    assert response.headers["etag"] == 'W/"1"'
    assert response.headers["location"].endswith(f"/fhir/Patient/{body['id']}/_history/1")
    # Last-Modified is meta.lastUpdated as an HTTP date (RFC 9110 IMF-fixdate).
    updated = datetime.fromisoformat(body["meta"]["lastUpdated"].replace("Z", "+00:00"))
    assert response.headers["last-modified"] == format_datetime(
        updated.replace(microsecond=0), usegmt=True)


async def test_create_ignores_a_client_id(client, h):
    response = await create(client, h, {**amina(), "id": "chosen-by-client"})
    assert response.json()["id"] != "chosen-by-client"


@pytest.mark.parametrize(("prefer", "check"), [
    ("return=minimal", lambda r: r.content == b""),
    ("return=representation", lambda r: r.json()["resourceType"] == "Patient"),
    ("return=OperationOutcome", lambda r: r.json()["resourceType"] == "OperationOutcome"),
])
async def test_create_honours_prefer_return(client, h, prefer, check):
    response = await create(client, h, Prefer=prefer)
    assert response.status_code == 201
    assert check(response)
    assert response.headers["location"]


async def test_read_vread_and_unknown(client, h):
    created = (await create(client, h)).json()
    read = await client.get(f"/fhir/Patient/{created['id']}", headers=h)
    assert read.status_code == 200 and read.json()["name"][0]["family"] == "Odhiambo"
    vread = await client.get(f"/fhir/Patient/{created['id']}/_history/1", headers=h)
    assert vread.status_code == 200 and vread.json()["meta"]["versionId"] == "1"
    missing = await client.get("/fhir/Patient/does-not-exist", headers=h)
    assert missing.status_code == 404
    assert missing.json()["issue"][0]["code"] == "not-found"
    assert (await client.get(f"/fhir/Patient/{created['id']}/_history/9",
                             headers=h)).status_code == 404


async def test_update_bumps_version_and_keeps_the_old_one(client, h):
    created = (await create(client, h)).json()
    changed = {**created, "gender": "other"}
    response = await client.put(f"/fhir/Patient/{created['id']}", json=changed, headers=h)
    assert response.status_code == 200
    assert response.headers["etag"] == 'W/"2"'
    old = await client.get(f"/fhir/Patient/{created['id']}/_history/1", headers=h)
    assert old.json()["gender"] == "female"


async def test_update_with_stale_if_match_returns_412(client, h):
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    changed = {**created, "gender": "other"}
    ok = await client.put(url, json=changed, headers={**h, "If-Match": 'W/"1"'})
    assert ok.status_code == 200
    stale = await client.put(url, json=created, headers={**h, "If-Match": 'W/"1"'})
    assert stale.status_code == 412
    assert stale.json()["resourceType"] == "OperationOutcome"


async def test_concurrent_updates_without_if_match_all_succeed(client, h):
    """An organization member's update is checked against the version it read and pinned
    to it; a concurrent change makes it check and write again, never a 412 the client did
    not ask for (last write wins, as without access checks)."""
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    genders = ["male", "female", "other", "unknown"] * 4
    answers = await asyncio.gather(*[client.put(url, json={**created, "gender": g}, headers=h)
                                     for g in genders])
    assert [a.status_code for a in answers] == [200] * len(genders)
    final = (await client.get(url, headers=h)).json()
    assert int(final["meta"]["versionId"]) > 1


async def test_an_update_that_changes_nothing_writes_no_version(client, h):
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    # the same content: keys in another order, the server's own meta left out or stale
    same = dict(reversed(list(created.items())))
    same["meta"] = {"versionId": "7", "lastUpdated": "2020-01-01T00:00:00Z"}
    for body in (created, same, {k: v for k, v in created.items() if k != "meta"}):
        response = await client.put(url, json=body, headers=h)
        assert response.status_code == 200, response.text
        assert response.headers["etag"] == 'W/"1"'
        assert response.json()["meta"] == created["meta"]
    history = (await client.get(f"{url}/_history", headers=h)).json()
    assert history["total"] == 1
    # a stale If-Match still fails, and any real change (a tag too) is a new version
    stale = await client.put(url, json=created, headers={**h, "If-Match": 'W/"0"'})
    assert stale.status_code == 412
    tagged = {**created, "meta": {"tag": [{"system": "urn:example", "code": "vip"}]}}
    response = await client.put(url, json=tagged, headers=h)
    assert response.headers["etag"] == 'W/"2"'
    patched = await client.patch(url, json=[{"op": "replace", "path": "/gender",
                                             "value": "female"}],
                                 headers={**h, "Content-Type": "application/json-patch+json"})
    assert patched.status_code == 200 and patched.headers["etag"] == 'W/"2"'


async def test_a_deleted_resource_written_again_with_its_old_content_comes_back(client, h):
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    assert (await client.delete(url, headers=h)).status_code in (200, 204)
    response = await client.put(url, json=created, headers=h)
    assert response.headers["etag"] == 'W/"3"'
    assert (await client.get(url, headers=h)).status_code == 200


async def test_update_as_create_with_client_id(client, h):
    response = await client.put("/fhir/Patient/kenya-29384756",
                                json={**amina(), "id": "kenya-29384756"}, headers=h)
    assert response.status_code == 201
    assert response.headers["etag"] == 'W/"1"'


async def test_update_id_mismatch_and_wrong_type_are_400(client, h):
    mismatch = await client.put("/fhir/Patient/a1", json={**amina(), "id": "b2"}, headers=h)
    assert mismatch.status_code == 400
    missing_id = await client.put("/fhir/Patient/a1", json=amina(), headers=h)
    assert missing_id.status_code == 400
    wrong = await client.post("/fhir/Observation", json=amina(), headers=h)
    assert wrong.status_code == 400
    assert "resourceType" in wrong.json()["issue"][0]["expression"][0]


async def test_invalid_json_and_invalid_resource_name_the_problem(client, h):
    broken = await client.post("/fhir/Patient", content=b"{not json", headers=h)
    assert broken.status_code == 400
    assert broken.json()["issue"][0]["code"] == "structure"
    invalid = await create(client, h, {**amina(), "birthDate": "12/04/1988",
                                       "favouriteColour": "blue"})
    assert invalid.status_code == 400
    expressions = {e for i in invalid.json()["issue"] for e in i.get("expression", [])}
    assert {"Patient.birthDate", "Patient.favouriteColour"} <= expressions
    nested = await create(client, h, {**amina(), "name": [{"given": "Amina"}]})
    assert "Patient.name[0].given" in str(nested.json())


async def test_paths_no_interaction_serves_are_404_or_405_outcomes(client, h):
    for path in ("/fhir/Patient/1/_history/1/extra/segments", "/fhir/Patient//_history",
                 "/fhir/Patient/1/$nonsense/more"):
        response = await client.get(path, headers=h)
        assert response.status_code == 404, path
        assert response.json()["resourceType"] == "OperationOutcome"
    wrong_method = await client.post("/fhir/Patient/1/_history", headers=h)
    assert wrong_method.status_code == 405
    assert wrong_method.json()["resourceType"] == "OperationOutcome"
    assert wrong_method.headers["allow"] == "GET, HEAD, OPTIONS"
    # A trailing slash is the same path.
    created = await client.post("/fhir/Patient", json=amina(), headers=h)
    again = await client.get(f"/fhir/Patient/{created.json()['id']}/", headers=h)
    assert again.status_code == 200


async def test_a_method_the_capability_statement_does_not_take_is_405_with_allow(client, h):
    """``/metadata``, ``_search``, ``_history`` and ``$everything`` are served by their own
    routes only: another method there is a 405, not an interaction on a type or id of that
    name (a conditional delete of the type "metadata" answered 404)."""
    for method, path, allow in (("DELETE", "/fhir/metadata", "GET, HEAD, OPTIONS"),
                                ("PUT", "/fhir/metadata", "GET, HEAD, OPTIONS"),
                                ("GET", "/fhir/Patient/_search", "POST, OPTIONS"),
                                ("DELETE", "/fhir/Patient/_history", "GET, HEAD, OPTIONS"),
                                ("POST", "/fhir/Patient/1/$everything", "GET, HEAD, OPTIONS")):
        response = await client.request(method, path, headers=h)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["allow"] == allow
        assert response.json()["resourceType"] == "OperationOutcome"
    assert (await client.get("/fhir/metadata")).status_code == 200
    assert (await client.post("/fhir/Patient/_search", headers=h)).status_code == 200


async def test_unknown_type_is_404_and_xml_is_refused(client, h):
    assert (await client.get("/fhir/Spaceship/1", headers=h)).status_code == 404
    xml = await client.get("/fhir/Patient?_format=xml", headers=h)
    assert xml.status_code == 406
    wrong_type = await client.post("/fhir/Patient", content=b"<Patient/>",
                                   headers={**h, "Content-Type": "application/fhir+xml"})
    assert wrong_type.status_code == 415


async def test_patch_with_json_patch(client, h):
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    patch = [{"op": "replace", "path": "/gender", "value": "unknown"},
             {"op": "add", "path": "/active", "value": True}]
    response = await client.patch(
        url, json=patch, headers={**h, "Content-Type": "application/json-patch+json"})
    assert response.status_code == 200, response.text
    assert response.json()["gender"] == "unknown" and response.json()["meta"]["versionId"] == "2"
    invalid = await client.patch(
        url, json=[{"op": "replace", "path": "/gender", "value": 42}],
        headers={**h, "Content-Type": "application/json-patch+json"})
    assert invalid.status_code == 400
    stale = await client.patch(
        url, json=patch, headers={**h, "Content-Type": "application/json-patch+json",
                                  "If-Match": 'W/"1"'})
    assert stale.status_code == 412
    bad_path = await client.patch(
        url, json=[{"op": "remove", "path": "/nothing/here"}],
        headers={**h, "Content-Type": "application/json-patch+json"})
    assert bad_path.status_code == 422


async def test_no_wrongly_shaped_resource_is_stored_by_create_update_or_transaction(
        client, h):
    from tests.fhir_server.test_validation import WRONG_SHAPES

    for resource, element in WRONG_SHAPES:
        kind = resource["resourceType"]
        created = await client.post(f"/fhir/{kind}", json=resource, headers=h)
        assert created.status_code == 400, (element, created.text)
        assert element in str(created.json()), element
        updated = await client.put(f"/fhir/{kind}/wrong-shape", headers=h,
                                   json={**resource, "id": "wrong-shape"})
        assert updated.status_code == 400, (element, updated.text)
        bundled = await client.post("/fhir", headers=h, json={
            "resourceType": "Bundle", "type": "transaction", "entry": [
                {"resource": amina(), "request": {"method": "POST", "url": "Patient"}},
                {"resource": resource, "request": {"method": "POST", "url": kind}}]})
        assert bundled.status_code == 400, (element, bundled.text)
        assert "Bundle.entry[1]" in str(bundled.json())
    for kind in ("Observation", "Patient"):
        search = await client.get(f"/fhir/{kind}?_total=accurate", headers=h)
        assert search.json().get("total") == 0, (kind, search.text[:300])


async def test_a_patch_whose_result_has_a_wrong_shape_is_refused(client, h):
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    for patch in ([{"op": "replace", "path": "/name/0", "value": ["Amina", "Odhiambo"]}],
                  [{"op": "add", "path": "/extension", "value": [1]}],
                  [{"op": "replace", "path": "/telecom", "value": ["+254712345678"]}],
                  [{"op": "add", "path": "/managingOrganization", "value": None}]):
        response = await client.patch(
            url, json=patch, headers={**h, "Content-Type": "application/json-patch+json"})
        assert response.status_code == 400, (patch, response.text)
    current = await client.get(url, headers=h)
    assert current.json()["meta"]["versionId"] == "1"
    assert current.json()["name"] == amina()["name"]


async def test_numbers_beyond_the_stores_integers_are_400_or_404_not_500(client, h):
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    for version in ("9223372036854775808", "99999999999999999999999", "0", "\u00b2"):
        response = await client.get(f"{url}/_history/{version}", headers=h)
        assert response.status_code == 404, (version, response.text)
    for query in ("_cursor=9223372036854775808", "_count=\u00b2", "_cursor=-1"):
        response = await client.get(f"{url}/_history?{query}", headers=h)
        assert response.status_code == 400, (query, response.text)
    search = await client.get("/fhir/Patient?_count=\u00b2", headers=h)
    assert search.status_code == 400
    bundled = await client.post("/fhir", headers=h, json={
        "resourceType": "Bundle", "type": "batch", "entry": [
            {"request": {"method": "GET", "url": f"Patient/{created['id']}/_history/"
                                                 "9223372036854775808"}}]})
    assert bundled.status_code == 200
    assert bundled.json()["entry"][0]["response"]["status"].startswith("404")


async def test_a_large_resource_is_validated_and_indexed_off_the_event_loop(app, client, h):
    """A resource of hundreds of KB costs tens of ms to index (seconds for megabytes):
    that work runs in a worker thread, so the event loop serves the other requests."""
    import threading

    service = app.state.services.fhir
    indexer, where = service.indexer, []

    def recording(resource):
        where.append((len(resource.get("name", [])), threading.current_thread().name))
        return indexer(resource)

    service.indexer = recording
    names = [{"family": f"Ochieng{i}", "given": ["Baraka"]} for i in range(3000)]
    large = await client.post("/fhir/Patient", json={**amina(), "name": names}, headers=h)
    small = await client.post("/fhir/Patient", json=amina(), headers=h)
    assert large.status_code == small.status_code == 201
    main = threading.current_thread().name
    assert where[0][0] == 3000 and where[0][1] != main
    assert where[1] == (1, main)
    found = await client.get("/fhir/Patient?family=Ochieng2999", headers=h)
    assert [e["resource"]["id"] for e in found.json()["entry"]] == [large.json()["id"]]
async def test_patch_with_json_merge_patch(client, h):
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    response = await client.patch(url, json={"active": True, "gender": None},
                                  headers={**h, "Content-Type": "application/merge-patch+json"})
    assert response.status_code == 200, response.text
    patched = response.json()
    assert patched["active"] is True and "gender" not in patched
    assert patched["name"] == amina()["name"] and patched["meta"]["versionId"] == "2"
    invalid = await client.patch(url, json={"gender": "robot"},
                                 headers={**h, "Content-Type": "application/merge-patch+json"})
    assert invalid.status_code == 400
    assert "Patient.gender" in invalid.json()["issue"][0]["expression"]


async def test_patch_with_a_plain_json_object_is_a_merge_patch(client, h):
    """What fhirpy's patch() and save(fields=...) send (see test_fhirpy_client)."""
    created = (await create(client, h)).json()
    response = await client.patch(f"/fhir/Patient/{created['id']}",
                                  json={"birthDate": "1988-04-13"},
                                  headers={**h, "Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["birthDate"] == "1988-04-13"


async def test_patch_with_fhirpath_patch_parameters(client, h):
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    parameters = {"resourceType": "Parameters", "parameter": [
        {"name": "operation", "part": [
            {"name": "type", "valueCode": "replace"},
            {"name": "path", "valueString": "Patient.telecom.where(system = 'phone').value"},
            {"name": "value", "valueString": "+254722000111"}]},
        {"name": "operation", "part": [
            {"name": "type", "valueCode": "add"},
            {"name": "path", "valueString": "Patient"},
            {"name": "name", "valueString": "maritalStatus"},
            {"name": "value", "valueCodeableConcept": {"coding": [{
                "system": "http://terminology.hl7.org/CodeSystem/v3-MaritalStatus",
                "code": "M"}]}}]},
        {"name": "operation", "part": [
            {"name": "type", "valueCode": "delete"},
            {"name": "path", "valueString": "Patient.name[0].given[1]"}]}]}
    response = await client.patch(url, json=parameters, headers=h)  # application/fhir+json
    assert response.status_code == 200, response.text
    patched = response.json()
    assert patched["telecom"][0]["value"] == "+254722000111"
    assert patched["maritalStatus"]["coding"][0]["code"] == "M"
    assert patched["name"][0]["given"] == ["Amina"]
    nothing = {"resourceType": "Parameters", "parameter": [{"name": "operation", "part": [
        {"name": "type", "valueCode": "replace"},
        {"name": "path", "valueString": "Patient.deceased"},
        {"name": "value", "valueBoolean": True}]}]}
    refused = await client.patch(url, json=nothing, headers=h)
    assert refused.status_code == 422
    assert refused.json()["issue"][0]["expression"] == ["Parameters.parameter[0]"]
    text = await client.patch(url, content=b"gender=male",
                              headers={**h, "Content-Type": "text/plain"})
    assert text.status_code == 415


async def test_a_transaction_patches_with_fhirpath_and_merge_patch(client, h):
    first = (await create(client, h)).json()
    second = (await create(client, h, {**amina(), "identifier": []})).json()
    merge = base64.b64encode(json.dumps({"active": False}).encode()).decode()
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"resource": {"resourceType": "Parameters", "parameter": [{"name": "operation", "part": [
            {"name": "type", "valueCode": "add"}, {"name": "path", "valueString": "Patient"},
            {"name": "name", "valueString": "active"},
            {"name": "value", "valueBoolean": True}]}]},
         "request": {"method": "PATCH", "url": f"Patient/{first['id']}"}},
        {"resource": {"resourceType": "Binary", "contentType": "application/merge-patch+json",
                      "data": merge},
         "request": {"method": "PATCH", "url": f"Patient/{second['id']}"}}]}
    response = await client.post("/fhir", json=bundle, headers=h)
    assert response.status_code == 200, response.text
    assert (await client.get(f"/fhir/Patient/{first['id']}", headers=h)).json()["active"]
    assert (await client.get(f"/fhir/Patient/{second['id']}", headers=h)).json()[
        "active"] is False


async def test_delete_then_read_is_410_and_history_keeps_it(client, h):
    created = (await create(client, h)).json()
    url = f"/fhir/Patient/{created['id']}"
    deleted = await client.delete(url, headers=h)
    assert deleted.status_code == 200
    assert deleted.headers["etag"] == 'W/"2"'
    assert (await client.get(url, headers=h)).status_code == 410
    again = await client.delete(url, headers=h)
    assert again.status_code == 200
    history = (await client.get(f"{url}/_history", headers=h)).json()
    assert [e["request"]["method"] for e in history["entry"]] == ["DELETE", "POST"]
    assert "resource" not in history["entry"][0]
    assert (await client.delete("/fhir/Patient/never-was", headers=h)).status_code == 404


async def test_conditional_read(client, h):
    response = await create(client, h)
    url = f"/fhir/Patient/{response.json()['id']}"
    same = await client.get(url, headers={**h, "If-None-Match": 'W/"1"'})
    assert same.status_code == 304 and same.content == b""
    assert (await client.get(url, headers={**h, "If-None-Match": 'W/"0"'})).status_code == 200
    later = await client.get(url, headers={**h, "If-Modified-Since":
                                           "Fri, 01 Jan 2100 00:00:00 GMT"})
    assert later.status_code == 304
    earlier = await client.get(url, headers={**h, "If-Modified-Since":
                                             "Mon, 01 Jan 2001 00:00:00 GMT"})
    assert earlier.status_code == 200


async def test_history_type_system_since_count_and_paging(client, h):
    ids = [(await create(client, h)).json()["id"] for _ in range(3)]
    await client.put(f"/fhir/Patient/{ids[0]}", json={**amina(), "id": ids[0], "gender": "other"},
                     headers=h)
    type_history = (await client.get("/fhir/Patient/_history", headers=h)).json()
    assert type_history["type"] == "history" and type_history["total"] == 4
    assert type_history["entry"][0]["response"]["etag"] == 'W/"2"'
    system = (await client.get("/fhir/_history", headers=h)).json()
    assert system["total"] >= 4
    since = type_history["entry"][0]["response"]["lastModified"]
    recent = (await client.get("/fhir/Patient/_history", params={"_since": since},
                               headers=h)).json()
    assert recent["total"] == 1
    seen: list[str] = []
    url: str | None = "/fhir/Patient/_history?_count=3"
    while url:
        page = (await client.get(url, headers=h)).json()
        seen += [f"{e['fullUrl']}|{e['response']['etag']}" for e in page["entry"]]
        url = next((link["url"] for link in page["link"] if link["relation"] == "next"), None)
    assert len(seen) == 4 and len(set(seen)) == 4
    bad = await client.get("/fhir/Patient/_history?_since=yesterday", headers=h)
    assert bad.status_code == 400


async def test_search_by_id_and_last_updated(client, h):
    first = (await create(client, h)).json()
    second = (await create(client, h)).json()
    by_id = (await client.get(f"/fhir/Patient?_id={first['id']}", headers=h)).json()
    assert by_id["type"] == "searchset" and by_id["total"] == 1
    assert by_id["entry"][0]["resource"]["id"] == first["id"]
    newer = (await client.get("/fhir/Patient", params={
        "_lastUpdated": f"gt{first['meta']['lastUpdated']}"}, headers=h)).json()
    assert [e["resource"]["id"] for e in newer["entry"]] == [second["id"]]
    today = first["meta"]["lastUpdated"][:10]
    assert (await client.get(f"/fhir/Patient?_lastUpdated={today}", headers=h)).json()[
        "total"] == 2


async def test_unknown_search_parameter_lenient_and_strict(client, h):
    lenient = (await client.get("/fhir/Patient?shoe-size=42", headers=h)).json()
    outcome = [e for e in lenient["entry"] if e["search"]["mode"] == "outcome"]
    assert outcome and "shoe-size" in outcome[0]["resource"]["issue"][0]["diagnostics"]
    strict = await client.get("/fhir/Patient?shoe-size=42",
                              headers={**h, "Prefer": "handling=strict"})
    assert strict.status_code == 400
