"""The clinical audit trail: AuditEvents the platform records for reads, searches, writes
and refusals of clinical data, events apps report, and who may query them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from fhir_server.audit_log.entry import keys_of
from fhir_server.validation import validate_resource
from tests.platform_api.sessions.conftest import data, refusal

JSON = dict[str, Any]


async def flushed(app: Any) -> int:
    return await app.state.services.extras["sessions.clinical_audit"].flush()  # type: ignore[no-any-return]


async def observation(client, clinic) -> str:  # type: ignore[no-untyped-def]
    made = await client.post("/fhir/Observation", headers=clinic["doctor"]["headers"], json={
        "resourceType": "Observation", "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4",
                             "display": "Heart rate"}]},
        "subject": {"reference": f"Patient/{clinic['patient_id']}"},
        "valueQuantity": {"value": 88, "unit": "beats/minute",
                          "system": "http://unitsofmeasure.org", "code": "/min"}})
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


async def test_reads_writes_and_refusals_of_clinical_data_are_audited(
        client, clinic, other_clinic, app) -> None:
    observation_id = await observation(client, clinic)
    read = await client.get(f"/fhir/Observation/{observation_id}",
                            headers={**clinic["nurse"]["headers"], "User-Agent": "ward-tablet/2"})
    assert read.status_code == 200
    refused = await client.get(f"/fhir/Observation/{observation_id}",
                               headers=other_clinic["admin"]["headers"])
    assert refused.status_code == 403
    searched = await client.get(f"/fhir/Observation?subject=Patient/{clinic['patient_id']}",
                                headers=clinic["doctor"]["headers"])
    assert searched.status_code == 200
    assert await flushed(app) >= 4
    trail = data(await client.get(f"/api/clinical/audit/resource/Observation/{observation_id}",
                                  headers=clinic["admin"]["headers"]))
    by_kind = {(e["subtype"], e["outcome"], e["user_id"]): e for e in trail}
    created = by_kind[("create", "success", clinic["doctor"]["user"]["id"])]
    assert (created["action"], created["patient_ids"]) == ("C", [clinic["patient_id"]])
    nurse = by_kind[("read", "success", clinic["nurse"]["user"]["id"])]
    assert nurse["network_address"] == "127.0.0.1"
    assert nurse["entities"][0]["version"] == "1"
    outsider = by_kind[("read", "minor_failure", other_clinic["admin"]["user"]["id"])]
    assert "may not read" in outsider["description"]
    assert all(e["organization_ids"] == [clinic["org_id"]] for e in trail)
    # the search is one event naming the patient
    searches = data(await client.get(
        f"/api/clinical/audit/search?subtype=search-type&patient_id={clinic['patient_id']}",
        headers=clinic["admin"]["headers"]))
    assert searches and searches[0]["user_id"] == clinic["doctor"]["user"]["id"]
    stored = (await client.get(f"/fhir/AuditEvent/{nurse['id']}",
                               headers=clinic["admin"]["headers"])).json()
    validate_resource(stored, "AuditEvent")
    assert stored["agent"][0]["name"] == "ward-tablet/2"


async def test_an_app_reports_an_event_in_its_users_name(client, clinic, app) -> None:
    events: list[JSON] = []

    async def seen(event: JSON) -> None:
        events.append(event)
    app.state.services.bus.subscribe("platform.clinical.audit_recorded", seen)
    note = data(await client.post("/api/clinical/notes", headers=clinic["doctor"]["headers"],
                                  json={"patient_id": clinic["patient_id"],
                                        "plan": "Review in one week."}), 201)
    reported = data(await client.post("/api/clinical/audit",
                                      headers=clinic["doctor"]["headers"], json={
        "action": "R", "resource_type": "Composition", "resource_id": note["id"],
        "subtype": "print", "description": "Printed for the referral letter",
        "purpose_of_use": "TREAT", "occurred_at": "2026-11-20T10:15:00+03:00"}), 201)
    assert (reported["user_id"], reported["subtype"], reported["type"]) == (
        clinic["doctor"]["user"]["id"], "print", "110110")
    assert (reported["resource"], reported["patient_ids"]) == (f"Composition/{note['id']}",
                                                               [clinic["patient_id"]])
    assert reported["purpose_of_use"] == "TREAT"
    assert reported["organization_ids"] == [clinic["org_id"]]
    one = data(await client.get(f"/api/clinical/audit/{reported['id']}",
                                headers=clinic["admin"]["headers"]))
    assert one["description"] == "Printed for the referral letter"
    await flushed(app)
    mine = await client.get(f"/api/clinical/audit/user/{clinic['doctor']['user']['id']}"
                            "?limit=100", headers=clinic["admin"]["headers"])
    assert reported["id"] in [e["id"] for e in mine.json()["data"]]
    assert mine.json()["meta"]["total"] >= 2  # the note's creation too
    prints = data(await client.get("/api/clinical/audit/search?subtype=print&action=R"
                                   "&outcome=success&from=2020-01-01T00:00:00Z",
                                   headers=clinic["admin"]["headers"]))
    assert [e["id"] for e in prints] == [reported["id"]]
    none_later = data(await client.get("/api/clinical/audit/search?subtype=print"
                                       "&from=2099-01-01T00:00:00Z",
                                       headers=clinic["admin"]["headers"]))
    assert none_later == []
    await app.state.services.bus.drain()
    assert events[0]["payload"]["audit_event_id"] == reported["id"]


async def test_api_keys_are_recorded_as_applications_for_their_owner(client, clinic, app
                                                                     ) -> None:
    key = data(await client.post("/api/developer/keys", headers=clinic["doctor"]["headers"],
                                 json={"name": "ward-dashboard",
                                       "scopes": ["Observation:read"]}), 201)
    observation_id = await observation(client, clinic)
    read = await client.get(f"/fhir/Observation/{observation_id}",
                            headers={"X-API-Key": key["key"]})
    assert read.status_code == 200
    await flushed(app)
    trail = data(await client.get(f"/api/clinical/audit/resource/Observation/{observation_id}"
                                  "?limit=50", headers=clinic["admin"]["headers"]))
    by_key = [e for e in trail if e["agent_kind"] == "api_key"]
    assert len(by_key) == 1 and by_key[0]["user_id"] == clinic["doctor"]["user"]["id"]


async def test_only_administrators_read_the_trail(client, clinic, other_clinic, admin, app
                                                  ) -> None:
    observation_id = await observation(client, clinic)
    await flushed(app)
    path = f"/api/clinical/audit/resource/Observation/{observation_id}"
    assert (await client.get(path, headers=clinic["doctor"]["headers"])).status_code == 403
    assert (await client.get("/api/clinical/audit/search",
                             headers=clinic["nurse"]["headers"])).status_code == 403
    theirs = await client.get(path, headers=other_clinic["admin"]["headers"])
    assert theirs.json()["meta"]["total"] == 0
    everything = await client.get(path, headers=admin["headers"])
    assert everything.json()["meta"]["total"] >= 1
    event_id = everything.json()["data"][0]["id"]
    assert (await client.get(f"/api/clinical/audit/{event_id}",
                             headers=clinic["doctor"]["headers"])).status_code == 403
    assert (await client.get(f"/api/clinical/audit/{event_id}")).status_code == 401
    assert refusal(await client.get("/api/clinical/audit/resource/Nonsense/1",
                                    headers=admin["headers"])) == (422, "VALIDATION_ERROR")
    assert refusal(await client.get("/api/clinical/audit/nothing",
                                    headers=admin["headers"])) == (404, "NOT_FOUND")


async def test_reports_need_a_resource_the_caller_may_read(client, clinic, other_clinic
                                                           ) -> None:
    observation_id = await observation(client, clinic)
    body = {"action": "R", "resource_type": "Observation", "resource_id": observation_id}
    outsider = await client.post("/api/clinical/audit", headers=other_clinic["admin"]["headers"],
                                 json=body)
    assert outsider.status_code == 403
    missing = await client.post("/api/clinical/audit", headers=clinic["doctor"]["headers"],
                                json={**body, "resource_id": "nothing"})
    assert refusal(missing) == (404, "NOT_FOUND")
    nonsense = await client.post("/api/clinical/audit", headers=clinic["doctor"]["headers"],
                                 json={**body, "resource_type": "Nonsense"})
    assert refusal(nonsense) == (422, "VALIDATION_ERROR")
    bad_action = await client.post("/api/clinical/audit", headers=clinic["doctor"]["headers"],
                                   json={**body, "action": "X"})
    assert refusal(bad_action) == (422, "VALIDATION_ERROR")
    assert (await client.post("/api/clinical/audit", json=body)).status_code == 401


async def test_a_delete_is_audited_with_the_version_it_removed(client, clinic, app) -> None:
    observation_id = await observation(client, clinic)
    deleted = await client.delete(f"/fhir/Observation/{observation_id}",
                                  headers=clinic["doctor"]["headers"])
    assert deleted.status_code in (200, 204)
    await flushed(app)
    trail = data(await client.get(f"/api/clinical/audit/resource/Observation/{observation_id}"
                                  "?limit=50", headers=clinic["admin"]["headers"]))
    removal = next(e for e in trail if e["action"] == "D")
    assert (removal["entities"][0]["version"], removal["patient_ids"]) == (
        "1", [clinic["patient_id"]])
    assert removal["organization_ids"] == [clinic["org_id"]]


async def test_one_api_request_is_one_event_naming_what_it_read(client, clinic, app) -> None:
    note = data(await client.post("/api/clinical/notes", headers=clinic["doctor"]["headers"],
                                  json={"patient_id": clinic["patient_id"],
                                        "encounter_id": clinic["encounter_id"],
                                        "plan": "Review in one week."}), 201)
    await flushed(app)
    reads = data(await client.get(
        f"/api/clinical/audit/search?subtype=read&user_id={clinic['doctor']['user']['id']}"
        f"&patient_id={clinic['patient_id']}", headers=clinic["admin"]["headers"]))
    # the create's checks read the patient and the encounter: one event, both entities
    latest = reads[0]
    assert {e["reference"] for e in latest["entities"]
            if e["reference"] and e["role"] != "Patient"} == {
        f"Patient/{clinic['patient_id']}", f"Encounter/{clinic['encounter_id']}"}
    created = data(await client.get(f"/api/clinical/audit/resource/Composition/{note['id']}",
                                    headers=clinic["admin"]["headers"]))
    assert [e["action"] for e in created] == ["C"]


async def test_the_trail_is_kept_in_its_own_log_and_served_as_fhir_audit_event(
        client, clinic, other_clinic, admin, app, settings) -> None:
    observation_id = await observation(client, clinic)
    read = await client.get(f"/fhir/Observation/{observation_id}",
                            headers=clinic["nurse"]["headers"])
    assert read.status_code == 200
    await flushed(app)
    services = app.state.services
    # not a resource of the clinical store: its own log (on SQLite, its own file)
    plan = await services.fhir.parse(["AuditEvent"], [])
    assert (await services.store.search(plan)).resources == []
    if settings.store_url.startswith("sqlite"):
        assert (settings.data_dir / "healthplatform-audit.db").exists()
    query = f"/fhir/AuditEvent?entity=Observation/{observation_id}&_sort=-date"
    found = (await client.get(query, headers=clinic["admin"]["headers"])).json()
    events = [e["resource"] for e in found["entry"]]
    assert [e["action"] for e in events] == ["R", "C"]
    for stored in events:
        validate_resource(stored, "AuditEvent")
    theirs = (await client.get(query, headers=other_clinic["admin"]["headers"])).json()
    assert theirs.get("entry", []) == []
    assert (await client.get(query, headers=clinic["doctor"]["headers"])).status_code == 403
    one = await client.get(f"/fhir/AuditEvent/{events[0]['id']}",
                           headers=other_clinic["admin"]["headers"])
    assert one.status_code == 403
    by_patient = (await client.get(
        f"/fhir/AuditEvent?patient=Patient/{clinic['patient_id']}&action=R"
        f"&agent:identifier=urn:healthplatform:user|{clinic['nurse']['user']['id']}",
        headers=clinic["admin"]["headers"])).json()
    assert [e["resource"]["id"] for e in by_patient["entry"]] == [events[0]["id"]]
    unkept = await client.get("/fhir/AuditEvent?agent-name=nurse",
                              headers=clinic["admin"]["headers"])
    assert unkept.status_code == 400 and "agent-name" in unkept.text


async def test_audit_events_are_never_changed_or_deleted(client, clinic, admin, app) -> None:
    await observation(client, clinic)
    await flushed(app)
    found = (await client.get("/fhir/AuditEvent?_count=1", headers=admin["headers"])).json()
    event = found["entry"][0]["resource"]
    path = f"/fhir/AuditEvent/{event['id']}"
    fhir = {**admin["headers"], "Content-Type": "application/fhir+json"}
    changed = await client.put(path, headers=fhir, json={**event, "outcome": "4"})
    assert changed.status_code == 405, changed.text
    assert (await client.delete(path, headers=admin["headers"])).status_code == 405
    again = (await client.get(path, headers=admin["headers"])).json()
    assert again["outcome"] == event["outcome"]
    # a client's own AuditEvent (an ATNA source) is appended like the platform's
    posted = await client.post("/fhir/AuditEvent", headers=fhir, json={
        k: v for k, v in event.items() if k not in ("id", "meta")})
    assert posted.status_code == 201, posted.text
    assert (await client.get(f"/fhir/AuditEvent/{posted.json()['id']}",
                             headers=admin["headers"])).status_code == 200


async def test_events_past_the_retention_are_exported_then_removed(client, clinic, app,
                                                                   settings) -> None:
    observation_id = await observation(client, clinic)
    await flushed(app)
    recorder = app.state.services.extras["sessions.clinical_audit"]
    recorder.settings = settings.model_copy(update={"audit_retention_days": 30})
    assert await recorder.expire() is None  # nothing is 30 days old
    later = datetime.now(UTC) + timedelta(days=31)
    expired = await recorder.expire(now=later)
    assert expired is not None and expired.purged == expired.exported >= 1
    assert expired.archive == settings.data_dir / "audit-archive" / expired.cutoff[:10]
    archived = [orjson.loads(line) for line in
                (expired.archive / "AuditEvent.ndjson").read_bytes().splitlines()]
    assert f"Observation/{observation_id}" in {
        (entity.get("what") or {}).get("reference") for e in archived for entity in e["entity"]}
    left = data(await client.get(f"/api/clinical/audit/resource/Observation/{observation_id}",
                                 headers=clinic["admin"]["headers"]))
    assert left == []


async def test_the_keys_of_each_entry_are_those_of_its_event(client, clinic, app) -> None:
    """The recorder writes the log's keys itself (not by reading the event back): they
    must be what the event says, or searches would miss it."""
    key = data(await client.post("/api/developer/keys", headers=clinic["doctor"]["headers"],
                                 json={"name": "ward-dashboard",
                                       "scopes": ["Observation:read"]}), 201)
    observation_id = await observation(client, clinic)
    await client.get(f"/fhir/Observation/{observation_id}", headers={"X-API-Key": key["key"]})
    await client.get(f"/fhir/Observation?subject=Patient/{clinic['patient_id']}",
                     headers=clinic["nurse"]["headers"])
    await client.get(f"/fhir/Patient/{clinic['patient_id']}",
                     headers=clinic["receptionist"]["headers"]
                     if "receptionist" in clinic else clinic["admin"]["headers"])
    recorder = app.state.services.extras["sessions.clinical_audit"]
    entries = recorder.entries_of(list(recorder._notes))
    assert len(entries) >= 4
    for entry in entries:
        assert set(entry.keys) == set(keys_of(orjson.loads(entry.body))), entry.body
