"""The event bus: FHIR resource events from every door, committed with their writes and
relayed through the transport to handlers subscribed by topic or pattern."""

from __future__ import annotations

from typing import Any

import pytest

from platform_api.events import InProcessTransport, topic_matches
from tests.conftest import make_clinic_admin
from tests.hl7_gateway.messages import oru

FHIR = {"Content-Type": "application/fhir+json"}
PATIENT = {"resourceType": "Patient", "name": [{"family": "Achieng", "given": ["Grace"]}],
           "identifier": [{"system": "urn:oid:2.16.404.1.1", "value": "KE-771"}]}


def record(app: Any, pattern: str = "platform.fhir.*") -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    async def handler(event: dict[str, Any]) -> None:
        seen.append(event)
    app.state.services.bus.subscribe(pattern, handler)
    return seen


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(e["topic"].rsplit(".", 1)[1], e["payload"]["resourceType"],
             e["payload"]["versionId"]) for e in events]


@pytest.mark.parametrize(("pattern", "topic", "expected"), [
    ("platform.fhir.*", "platform.fhir.resource_created", True),
    ("platform.fhir.*", "platform.fhir.resource_created.extra", False),
    ("platform.>", "platform.fhir.resource_created", True),
    ("platform.*.resource_deleted", "platform.fhir.resource_deleted", True),
    ("platform.lab.result_received", "platform.lab.result_received", True),
    ("platform.lab.*", "platform.labs.result_received", False),
])
def test_topic_patterns_read_as_nats_subjects(pattern, topic, expected):
    assert topic_matches(pattern, topic) is expected


async def test_the_in_process_transport_delivers_by_name_and_pattern_and_dead_letters():
    failures: list[tuple[str, str]] = []

    async def dead_letter(event: dict[str, Any], error: str) -> str:
        failures.append((event.get("id", "?"), error))
        return "dl-1"
    transport = InProcessTransport(dead_letter)
    got: list[str] = []

    async def exact(event: dict[str, Any]) -> None:
        got.append("exact:" + event["id"])

    async def pattern(event: dict[str, Any]) -> None:
        got.append("pattern:" + event["id"])

    async def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("pharmacy system unreachable")
    transport.subscribe("platform.fhir.resource_created", exact)
    transport.subscribe("platform.fhir.*", pattern)
    transport.subscribe("platform.fhir.resource_deleted", broken)
    event = {"id": "e1", "topic": "platform.fhir.resource_created", "timestamp": "t",
             "payload": {}}
    assert await transport.publish([event]) == [True]
    assert got == ["exact:e1", "pattern:e1"]
    deleted = {**event, "id": "e2", "topic": "platform.fhir.resource_deleted"}
    assert await transport.publish([deleted, {"id": "e3", "topic": "x"}]) == [False, False]
    assert failures == [("e2", "RuntimeError: pharmacy system unreachable"),
                        ("e3", "invalid event envelope: missing timestamp, payload")]


async def test_rest_writes_emit_resource_events_and_no_op_writes_do_not(app, client):
    seen = record(app)
    admin = await make_clinic_admin(client)
    h = {**admin["headers"], **FHIR}
    created = (await client.post("/fhir/Patient", json=PATIENT, headers=h)).json()
    url = f"/fhir/Patient/{created['id']}"
    await client.put(url, json={**created, "gender": "female"}, headers=h)
    await client.put(url, json={**created, "gender": "female"}, headers=h)  # changes nothing
    await client.post("/fhir/Patient", json=PATIENT, headers={
        **h, "If-None-Exist": "identifier=urn:oid:2.16.404.1.1|KE-771"})  # finds its match
    await client.delete(url, headers=h)
    await client.delete(url, headers=h)  # already deleted
    await app.state.services.bus.drain()
    patient_events = [e for e in seen if e["payload"]["id"] == created["id"]]
    assert summary(patient_events) == [("resource_created", "Patient", "1"),
                                       ("resource_updated", "Patient", "2"),
                                       ("resource_deleted", "Patient", "3")]
    event = patient_events[0]
    assert event["source_service"] == "fhir" and set(event) == {
        "id", "topic", "timestamp", "source_service", "payload"}
    assert event["payload"]["lastUpdated"] == created["meta"]["lastUpdated"]


async def test_every_entry_of_a_transaction_emits_in_its_commit(app, client):
    seen = record(app)
    admin = await make_clinic_admin(client)
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": "urn:uuid:p", "request": {"method": "POST", "url": "Patient"},
         "resource": PATIENT},
        {"request": {"method": "POST", "url": "Observation"}, "resource": {
            "resourceType": "Observation", "status": "final", "code": {"text": "Weight"},
            "subject": {"reference": "urn:uuid:p"}}},
    ]}
    response = await client.post("/fhir", json=bundle, headers={**admin["headers"], **FHIR})
    assert response.status_code == 200
    await app.state.services.bus.drain()
    written = {entry["response"]["location"].split("/_history")[0].split("fhir/")[-1]
               for entry in response.json()["entry"]}
    ours = [e for e in seen
            if f"{e['payload']['resourceType']}/{e['payload']['id']}" in written]
    assert sorted(summary(ours)) == [("resource_created", "Observation", "1"),
                                     ("resource_created", "Patient", "1")]
    # both in the same commit: the same instant
    assert len({e["payload"]["lastUpdated"] for e in ours}) == 1


async def test_an_hl7_message_emits_events_for_what_it_stored(app, client, admin):
    seen = record(app)
    response = await client.post("/api/lab/hl7-ingest", content=oru("EVT-1"),
                                 headers={**admin["headers"],
                                          "Content-Type": "x-application/hl7-v2+er7"})
    assert response.json()["data"]["ack_code"] == "AA"
    await app.state.services.bus.drain()
    types = {t for _kind, t, _v in summary(seen)}
    assert {"Patient", "DiagnosticReport", "Observation", "Provenance", "Binary"} <= types


async def test_api_facades_emit_the_fhir_event_and_their_own(app, client):
    fhir_events = record(app)
    members = record(app, "platform.organization.member_added")
    admin = await make_clinic_admin(client)
    patient = await client.post(f"/api/organizations/{admin['org_id']}/patients",
                                headers=admin["headers"], json={
                                    "first_name": "Grace", "last_name": "Achieng",
                                    "date_of_birth": "1980-04-12", "gender": "female"})
    await app.state.services.bus.drain()
    assert ("resource_created", "Organization", "1") in summary(fhir_events)
    assert ("resource_created", "Patient", "1") in summary(fhir_events)
    assert [e["payload"]["role"] for e in members] == ["ORG:ADMIN"]
    assert any(e["payload"]["id"] == patient.json()["data"]["id"] for e in fhir_events)
