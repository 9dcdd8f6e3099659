"""The event bus: FHIR resource events from every door, committed with their writes and
relayed through the transport to handlers subscribed by topic or pattern."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from fhir_server.store import store_from_url
from platform_api.events import (
    DEAD_LETTERS,
    EventBus,
    InProcessTransport,
    RejectedEvent,
    bus_from_settings,
    mark_handled,
    topic_matches,
)
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


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Any]:
    opened = store_from_url(f"sqlite:///{tmp_path / 'events.db'}")
    await opened.open()
    yield opened
    await opened.close()


def envelope(event_id: str, topic: str, **payload: Any) -> dict[str, Any]:
    return {"id": event_id, "topic": topic, "timestamp": "2026-11-24T08:15:00Z",
            "payload": payload}


async def dead_letters(store: Any) -> list[tuple[str | None, str | None, str]]:
    entries = await store.find_documents(DEAD_LETTERS, order_by="created_at")
    return [(e["event_id"], e["consumer"], e["error"]) for e in entries]


async def test_the_in_process_transport_delivers_by_name_and_pattern_and_dead_letters(store):
    bus = EventBus(store)
    got: list[str] = []

    async def exact(event: dict[str, Any]) -> None:
        got.append("exact:" + event["id"])

    async def pattern(event: dict[str, Any]) -> None:
        got.append("pattern:" + event["id"])

    async def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("pharmacy system unreachable")
    bus.subscribe("platform.fhir.resource_created", exact, consumer="exact")
    bus.subscribe("platform.fhir.*", pattern, consumer="pattern")
    bus.subscribe("platform.fhir.resource_deleted", broken, consumer="pharmacy")
    event = envelope("e1", "platform.fhir.resource_created")
    assert await bus.transport.publish([event]) == [True]
    assert got == ["exact:e1", "pattern:e1"]
    deleted = envelope("e2", "platform.fhir.resource_deleted")
    assert await bus.transport.publish([deleted, {"id": "e3", "topic": "x"}]) == [False, False]
    assert sorted(await dead_letters(store)) == [
        ("e2", "pharmacy", "RuntimeError: pharmacy system unreachable"),
        ("e3", None, "invalid event envelope: missing timestamp, payload")]
    assert got[-1] == "pattern:e2"  # the other consumer of the topic still had it


async def test_a_consumer_never_handles_an_event_twice_even_after_a_restart(store, tmp_path):
    handled: list[str] = []

    async def count(event: dict[str, Any]) -> None:
        handled.append(event["id"])
    first = EventBus(store)
    first.subscribe("platform.appointment.*", count, consumer="reminders")
    booked = envelope("evt-booked-1", "platform.appointment.booked", appointment_id="a-1")
    await first.transport.publish([booked])
    await first.transport.publish([booked])  # a redelivery
    second = EventBus(store)  # another process, or the same after a restart
    second.subscribe("platform.appointment.*", count, consumer="reminders")
    await second.transport.publish([booked])
    assert handled == ["evt-booked-1"]
    other = EventBus(store)  # another consumer has its own record
    other.subscribe("platform.appointment.booked", count, consumer="sms")
    await other.transport.publish([booked])
    assert handled == ["evt-booked-1", "evt-booked-1"]


async def test_a_handler_records_its_event_in_the_unit_of_work_of_its_effect(store):
    bus = EventBus(store)

    async def book(event: dict[str, Any]) -> None:
        async with store.unit_of_work() as uow:
            uow.put_document("reminders", event["payload"]["appointment_id"], {"sent": True})
            mark_handled(uow, "reminders", event)
            await uow.commit()
    bus.subscribe("platform.appointment.booked", book, consumer="reminders")
    await bus.transport.publish([envelope("evt-2", "platform.appointment.booked",
                                          appointment_id="a-2")])
    assert await bus.deliveries.already_handled("reminders", "evt-2")
    assert await store.get_document("reminders", "a-2") == {"sent": True}


async def test_the_short_envelope_is_accepted_and_a_mistyped_one_is_a_dead_letter(store):
    bus = EventBus(store)
    seen: list[str] = []

    async def handler(event: dict[str, Any]) -> None:
        seen.append(event["id"])
    bus.subscribe("platform.auth.user_created", handler, consumer="doctors")
    short = envelope("evt-short", "platform.auth.user_created", user_id="u-1",
                     email="amina@clinic.example.org", registration_role="DOCTOR")
    assert await bus.deliver_raw(orjson.dumps(short)) is True
    mistyped = {**short, "id": "evt-bad", "payload": "not an object"}
    assert await bus.deliver_raw(orjson.dumps(mistyped)) is False
    assert seen == ["evt-short"]
    [(_, _, error)] = await dead_letters(store)
    assert error == "invalid event envelope: wrong type of payload"
    entry = (await store.find_documents(DEAD_LETTERS))[0]
    assert entry["original_payload"] == orjson.dumps(mistyped).decode()


async def test_a_rejected_event_is_dead_lettered_and_retry_runs_only_the_failed_consumer(
        store):
    bus = EventBus(store)
    calls: list[str] = []
    broken = True

    async def billing(event: dict[str, Any]) -> None:
        calls.append("billing")
        if broken:
            raise RejectedEvent("no organization in the event")

    async def audit(event: dict[str, Any]) -> None:
        calls.append("audit")
    bus.subscribe("platform.billing.payment_failed", billing, consumer="billing")
    bus.subscribe("platform.billing.>", audit, consumer="audit")
    event = envelope("evt-3", "platform.billing.payment_failed", invoice_id="in_1")
    assert await bus.transport.publish([event]) == [False]
    [(_, consumer, error)] = await dead_letters(store)
    assert (consumer, error) == ("billing", "rejected: no organization in the event")
    entry = (await store.find_documents(DEAD_LETTERS))[0]
    assert await bus.retry(entry["original_payload"], "billing") == \
        "rejected: no organization in the event"
    broken = False
    assert await bus.retry(entry["original_payload"], "billing") is None
    assert calls == ["billing", "audit", "billing", "billing"]
    assert await bus.retry(entry["original_payload"], "billing") is None  # handled: skipped
    assert calls.count("billing") == 3
    assert await bus.retry(entry["original_payload"], "gone") == \
        "the consumer gone does not run in this process"


def test_consumer_names_are_durable_names():
    bus = EventBus(store=None)  # type: ignore[arg-type]

    async def reminders(event: dict[str, Any]) -> None:
        return None
    first = bus.subscribe("platform.appointment.booked", reminders)
    second = bus.subscribe("platform.appointment.cancelled", reminders)
    assert first.consumer == \
        "tests_platform_api_test_events_test_consumer_names_are_durable_names_reminders"
    assert second.consumer == first.consumer + "_2"
    with pytest.raises(ValueError, match="letters, digits"):
        bus.subscribe("platform.x.y", reminders, consumer="has.dots")
    with pytest.raises(ValueError, match="already subscribed"):
        bus.subscribe("platform.x.y", reminders, consumer=first.consumer)


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


def test_the_bus_is_chosen_by_its_url(store):
    assert isinstance(bus_from_settings(store, "").transport, InProcessTransport)
    nats_bus = bus_from_settings(store, "nats://127.0.0.1:4222", namespace="prod_ke")
    assert nats_bus.transport.subject("platform.fhir.resource_created") == \
        "prod_ke.platform.fhir.resource_created"
    with pytest.raises(ValueError, match="not a nats:// URL"):
        bus_from_settings(store, "amqp://127.0.0.1:5672")
