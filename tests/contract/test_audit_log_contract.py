"""The audit log's contract, on every store adapter: AuditEvents appended, read back as
written, found by what audits ask (patient, agent, date, action, outcome, entity,
subtype, owner), paged, limited to the caller's grants, append-only, purged only past
the retention and after their export."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from fhir_server.access import SEARCH, Grant
from fhir_server.audit_log.migration import move_stored_events
from fhir_server.audit_log.retention import expire
from fhir_server.caller import CallerFhir
from fhir_server.outcome import FhirError
from fhir_server.service import FhirService
from fhir_server.store import InvalidSearch, ResourceNotFound

JSON = dict[str, Any]
USER = "urn:healthplatform:user"
OWNER = "urn:healthplatform:organization"
REQUEST = "urn:healthplatform:request-id"
ACCOUNT = "urn:healthplatform:user"  # an account an event is about (auth events)
INTERACTION = "http://hl7.org/fhir/restful-interaction"


def event(recorded: str, *, user: str = "u-wanjiru", patient: str = "p-amina",
          resource: str = "Observation/o-1", action: str = "R", outcome: str = "0",
          subtype: str = "read", owner: str | None = "kibera", request: str = "r-1") -> JSON:
    made: JSON = {
        "resourceType": "AuditEvent",
        "type": {"system": "http://terminology.hl7.org/CodeSystem/audit-event-type",
                 "code": "rest"},
        "subtype": [{"system": INTERACTION, "code": subtype}], "action": action,
        "recorded": recorded, "outcome": outcome,
        "agent": [{"who": {"identifier": {"system": USER, "value": user}},
                   "requestor": True, "network": {"address": "10.1.2.3", "type": "2"}}],
        "source": {"observer": {"display": "healthplatform clinical data"}},
        "entity": [{"what": {"reference": resource}},
                   {"what": {"reference": f"Patient/{patient}"}},
                   {"what": {"identifier": {"system": ACCOUNT, "value": request}}},
                   {"what": {"identifier": {"system": REQUEST, "value": f"q-{request}"}}}]}
    if owner:
        made["meta"] = {"security": [{"system": OWNER, "code": owner}]}
    return made


class Owners:
    """A caller who may read the AuditEvents of some organizations (an ORG:ADMIN)."""

    def __init__(self, *owners: str, patients: frozenset[str] | None = None):
        self.grant = Grant(frozenset({"AuditEvent"}), owners=frozenset(owners) or None,
                           patients=patients)

    def grants(self, action: str) -> tuple[Grant, ...] | None:
        return (self.grant,)

    def describe(self) -> str:
        return "an administrator"

    def explain(self, action: str, resource_type: str) -> str:
        return ""


@pytest.fixture
async def trail(store: Any) -> tuple[FhirService, list[JSON]]:
    service = FhirService(store)
    events = [
        event("2026-11-20T08:00:00Z"),
        event("2026-11-20T09:30:00+03:00", user="u-otieno", action="U", subtype="update"),
        event("2026-11-21T10:00:00Z", patient="p-chebet", resource="Encounter/e-9",
              outcome="4", owner="mathare", request="r-2"),
        event("2026-12-02T07:15:00Z", action="C", subtype="create", request="r-3"),
    ]
    stored = await service.sources["AuditEvent"].append(events)
    return service, [orjson.loads(s.body) for s in stored]


async def ids(service: FhirService, params: list[tuple[str, str]]) -> list[str]:
    return [e["id"] for e in await service.search("AuditEvent", params)]


async def test_an_event_reads_back_as_written_with_its_id_and_version(trail) -> None:
    service, events = trail
    read = orjson.loads((await service.read("AuditEvent", events[0]["id"])).body)
    assert read["meta"]["versionId"] == "1" and read["meta"]["lastUpdated"]
    assert read["meta"]["security"] == [{"system": OWNER, "code": "kibera"}]
    written = event("2026-11-20T08:00:00Z")
    assert {k: v for k, v in read.items() if k not in ("id", "meta")} == {
        k: v for k, v in written.items() if k != "meta"}
    with pytest.raises(ResourceNotFound):
        await service.read("AuditEvent", "no-such-event")
    with pytest.raises(ResourceNotFound):
        await service.read("AuditEvent", events[0]["id"], 2)


async def test_found_by_patient_agent_date_action_outcome_entity_and_subtype(trail) -> None:
    service, events = trail
    e = [x["id"] for x in events]
    # 09:30+03:00 is 06:30Z: before the 08:00Z event
    assert await ids(service, [("patient", "Patient/p-amina"), ("_sort", "date")]) == [
        e[1], e[0], e[3]]
    assert await ids(service, [("agent:identifier", f"{USER}|u-otieno")]) == [e[1]]
    assert await ids(service, [("agent:identifier", "u-otieno")]) == [e[1]]
    assert await ids(service, [("date", "ge2026-11-20"), ("date", "lt2026-11-21"),
                               ("_sort", "date")]) == [e[1], e[0]]
    assert await ids(service, [("date", "gt2026-11-30"), ("action", "C")]) == [e[3]]
    assert await ids(service, [("outcome", "4")]) == [e[2]]
    assert await ids(service, [("entity", "Encounter/e-9")]) == [e[2]]
    assert await ids(service, [("entity:identifier", f"{ACCOUNT}|r-3")]) == [e[3]]
    assert await ids(service, [("type", "rest"), ("outcome", "4")]) == [e[2]]
    assert await ids(service, [("type", "http://terminology.hl7.org/CodeSystem/"
                                        "audit-event-type|rest"), ("action", "C")]) == [e[3]]
    assert await ids(service, [("type", "110114")]) == []
    with pytest.raises(InvalidSearch, match="request ids"):
        await ids(service, [("entity:identifier", f"{REQUEST}|q-r-3")])
    assert await ids(service, [("subtype", "update,create"), ("_sort", "-date")]) == [
        e[3], e[1]]
    assert await ids(service, [("subtype:not", "read"), ("patient", "Patient/p-amina"),
                               ("_sort", "-date")]) == [e[3], e[1]]
    assert await ids(service, [("_security", f"{OWNER}|mathare")]) == [e[2]]
    assert await ids(service, [("_id", e[2])]) == [e[2]]
    with pytest.raises(InvalidSearch, match="agent-name"):
        await ids(service, [("agent-name", "Wanjiru")])


async def test_pages_follow_the_date_order_without_gaps_or_repeats(store) -> None:
    service = FhirService(store)
    await service.sources["AuditEvent"].append(
        [event(f"2026-11-{day:02d}T12:00:00Z") for day in range(1, 26)])
    plan = await service.parse(["AuditEvent"], [("patient", "Patient/p-amina"),
                                                ("_sort", "-date"), ("_count", "10"),
                                                ("_total", "accurate")])
    seen: list[str] = []
    while True:
        page = await service.search_page(plan)
        assert page.total == 25
        seen += [orjson.loads(s.body)["recorded"] for s in page.resources]
        if page.next is None:
            break
        plan.cursor = page.next
    assert seen == [f"2026-11-{day:02d}T12:00:00Z" for day in range(25, 0, -1)]


async def test_a_caller_finds_and_reads_only_what_its_grants_admit(trail) -> None:
    service, events = trail
    kibera = CallerFhir(service, Owners("kibera"))
    found = {e["id"] for e in await kibera.search("AuditEvent", [])}
    assert found == {events[0]["id"], events[1]["id"], events[3]["id"]}
    await kibera.read("AuditEvent", events[0]["id"])
    with pytest.raises(FhirError) as refused:
        await kibera.read("AuditEvent", events[2]["id"])
    assert refused.value.status == 403
    chebet = CallerFhir(service, Owners(patients=frozenset({"p-chebet"})))
    assert [e["id"] for e in await chebet.search("AuditEvent", [])] == [events[2]["id"]]
    plan = await kibera.parse(["AuditEvent"], [("outcome", "4")])
    assert plan.access is not None and (await kibera.search_page(plan)).resources == []
    assert Owners("kibera").grants(SEARCH)


async def test_the_log_is_append_only_and_a_unit_that_fails_leaves_nothing(trail) -> None:
    service, events = trail
    async with service.store.unit_of_work() as uow:
        staged = service.stage_create(uow, event("2026-11-22T08:00:00Z", request="r-uow"))
        assert await ids(service, [("entity:identifier", "r-uow")]) == []
        await uow.commit()
    assert await ids(service, [("entity:identifier", "r-uow")]) == [staged.id]
    with pytest.raises(RuntimeError):
        async with service.store.unit_of_work() as uow:
            service.stage_create(uow, event("2026-11-22T09:00:00Z", request="r-failed"))
            raise RuntimeError("the change it records failed")
    assert await ids(service, [("entity:identifier", "r-failed")]) == []
    async with service.store.unit_of_work() as uow:
        for refused in (lambda: service.stage_update(uow, events[0]),
                        lambda: service.stage_delete(uow, "AuditEvent", events[0]["id"])):
            with pytest.raises(FhirError) as answer:
                refused()
            assert answer.value.status == 405


async def test_retention_exports_the_expired_entries_then_purges_them(trail, tmp_path: Path
                                                                     ) -> None:
    service, events = trail
    expired = await expire(service, 10, tmp_path / "archive",
                           now=datetime(2026, 12, 1, 12, tzinfo=UTC))
    assert expired is not None and expired.cutoff == "2026-11-21T00:00:00.000000Z"
    assert (expired.exported, expired.purged) == (2, 2)
    lines = (expired.archive / "AuditEvent.ndjson").read_bytes().splitlines()
    assert sorted(orjson.loads(line)["id"] for line in lines) == sorted(
        e["id"] for e in events[:2])
    manifest = orjson.loads((expired.archive / "manifest.json").read_bytes())
    assert manifest["output"][0]["count"] == 2
    assert sorted(await ids(service, [])) == sorted(e["id"] for e in events[2:])
    assert await expire(service, 10, tmp_path / "archive",
                        now=datetime(2026, 12, 1, 12, tzinfo=UTC)) is None  # nothing left


async def test_a_late_entry_about_the_past_is_not_purged_unexported(store) -> None:
    """An old event a client posts while the retention runs is not lost: what the
    export could not see stays."""
    service = FhirService(store)
    log = service.sources["AuditEvent"].log
    await service.sources["AuditEvent"].append([event("2026-01-05T08:00:00Z")])
    assert await log.purge("2026-02-01T00:00:00.000000Z", "2000-01-01T00:00:00.000000Z") == 0
    assert await log.oldest() == "2026-01-05T08:00:00.000000Z"
    assert await log.purge("2026-02-01T00:00:00.000000Z", "2999-01-01T00:00:00.000000Z") == 1
    assert await log.oldest() is None


async def test_audit_events_a_store_kept_as_resources_move_into_the_log(store) -> None:
    """A store of an earlier version kept AuditEvents among its resources: they move into
    the log with their ids, and leave the store."""
    service = FhirService(store)
    old = [event("2026-10-01T08:00:00Z", request="r-old-1"),
           event("2026-10-02T08:00:00Z", request="r-old-2")]
    for number, resource in enumerate(old):  # written as the earlier version did
        async with store.unit_of_work() as uow:
            uow.create("AuditEvent", f"old-{number}", {**resource, "id": f"old-{number}"},
                       index=service.indexer({**resource, "id": f"old-{number}"}))
            await uow.commit()
    assert await move_stored_events(service) == 2
    assert sorted(await ids(service, [("date", "lt2026-10-03")])) == ["old-0", "old-1"]
    read = orjson.loads((await service.read("AuditEvent", "old-1")).body)
    assert read["recorded"] == "2026-10-02T08:00:00Z"
    plan = await service.parse(["AuditEvent"], [])
    assert (await store.search(plan)).resources == []
    assert await move_stored_events(service) == 0  # nothing left: one empty search
