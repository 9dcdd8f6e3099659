"""The contract every store adapter must pass: versioned resources, tombstones, history,
documents, the outbox, and an all-or-nothing unit of work."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from fhir_server.store import (
    DuplicateDocument,
    ResourceExists,
    ResourceGone,
    ResourceNotFound,
    StoreError,
    UnstorableResource,
    VersionConflict,
)
from tests.contract.conftest import needs_transactions


def patient(family: str, given: str = "Amina") -> dict:
    return {"resourceType": "Patient", "name": [{"family": family, "given": [given]}],
            "gender": "female", "birthDate": "1988-04-12"}


async def write(store, op: str, rid: str, body: dict | None = None, **kw):
    async with store.unit_of_work() as uow:
        if op == "create":
            staged = uow.create("Patient", rid, body)
        elif op == "update":
            staged = uow.update("Patient", rid, body, **kw)
        else:
            staged = uow.delete("Patient", rid, **kw)
        await uow.commit()
    return staged.result


async def test_create_assigns_version_1_and_meta(store):
    stored = await write(store, "create", "p1", patient("Odhiambo"))
    assert stored.version == 1 and not stored.deleted
    body = orjson.loads((await store.read("Patient", "p1")).body)
    assert body["id"] == "p1"
    assert body["meta"]["versionId"] == "1"
    assert body["meta"]["lastUpdated"] == stored.last_updated


async def test_create_with_taken_id_is_refused(store):
    await write(store, "create", "p1", patient("Odhiambo"))
    with pytest.raises(ResourceExists):
        await write(store, "create", "p1", patient("Mensah"))


async def test_an_update_that_changes_nothing_keeps_the_current_version(store):
    first = await write(store, "create", "p1", patient("Odhiambo"))
    async with store.unit_of_work() as uow:
        staged = uow.update("Patient", "p1", patient("Odhiambo"))
        await uow.commit()
    assert staged.unchanged and staged.result.version == 1
    assert staged.result.last_updated == first.last_updated
    assert (await store.history("Patient", "p1")).total == 1
    changed = await write(store, "update", "p1", patient("Odhiambo", given="Wanjiru"))
    assert changed.version == 2


async def test_every_version_stays_readable(store):
    await write(store, "create", "p1", patient("Odhiambo"))
    await write(store, "update", "p1", patient("Mensah"))
    await write(store, "update", "p1", patient("Okafor"))
    families = [orjson.loads((await store.read("Patient", "p1", v)).body)["name"][0]["family"]
                for v in (1, 2, 3)]
    assert families == ["Odhiambo", "Mensah", "Okafor"]
    assert (await store.read("Patient", "p1")).version == 3


async def test_created_instants_are_when_each_first_version_was_written(store):
    first = await write(store, "create", "p1", patient("Odhiambo"))
    await write(store, "update", "p1", patient("Odhiambo", given="Wanjiru"))
    second = await write(store, "create", "p2", patient("Mensah", given="Kwame"))
    await write(store, "delete", "p2")
    created = await store.created_instants("Patient", ["p2", "p1", "p1", "unknown"])
    assert created == {"p1": first.last_updated, "p2": second.last_updated}
    assert await store.created_instants("Observation", ["p1"]) == {}
    assert await store.created_instants("Patient", []) == {}


async def test_update_with_stale_version_conflicts(store):
    await write(store, "create", "p1", patient("Odhiambo"))
    await write(store, "update", "p1", patient("Mensah"), if_match=1)
    with pytest.raises(VersionConflict) as info:
        await write(store, "update", "p1", patient("Okafor"), if_match=1)
    assert info.value.current == 2


async def test_delete_leaves_a_tombstone_and_history(store):
    await write(store, "create", "p1", patient("Odhiambo"))
    tombstone = await write(store, "delete", "p1")
    assert tombstone.version == 2 and tombstone.deleted
    with pytest.raises(ResourceGone):
        await store.read("Patient", "p1")
    assert (await store.read("Patient", "p1", 1)).version == 1
    with pytest.raises(ResourceGone):
        await store.read("Patient", "p1", 2)
    recreated = await write(store, "update", "p1", patient("Mensah"))
    assert recreated.version == 3


async def test_unknown_resource_and_version(store):
    with pytest.raises(ResourceNotFound):
        await store.read("Patient", "nope")
    await write(store, "create", "p1", patient("Odhiambo"))
    with pytest.raises(ResourceNotFound):
        await store.read("Patient", "p1", 7)


async def test_history_newest_first_with_since_and_cursor(store):
    await write(store, "create", "p1", patient("A"))
    await write(store, "create", "p2", patient("B"))
    await write(store, "update", "p1", patient("C"))
    await write(store, "delete", "p2")
    everything = await store.history(None, None)
    assert [(e.id, e.version) for e in everything.entries] == [
        ("p2", 2), ("p1", 2), ("p2", 1), ("p1", 1)]
    assert everything.total == 4
    instance = await store.history("Patient", "p1")
    assert [e.version for e in instance.entries] == [2, 1]
    since = await store.history("Patient", None, since=everything.entries[1].last_updated)
    assert [(e.id, e.version) for e in since.entries] == [("p2", 2), ("p1", 2)]
    first = await store.history("Patient", None, count=2)
    # A write between pages must not shift the second page.
    await write(store, "update", "p1", patient("D"))
    second = await store.history("Patient", None, count=2, before_seq=first.entries[-1].seq)
    assert [(e.id, e.version) for e in second.entries] == [("p2", 1), ("p1", 1)]


async def test_unit_of_work_is_all_or_nothing(store):
    needs_transactions(store)
    await write(store, "create", "p1", patient("Odhiambo"))
    with pytest.raises(ResourceExists):
        async with store.unit_of_work() as uow:
            uow.create("Patient", "p2", patient("Mensah"))
            uow.put_document("users", "u1", {"id": "u1", "email": "a@example.org"})
            uow.emit("platform.test.happened", {"x": 1})
            uow.create("Patient", "p1", patient("Clash"))
            await uow.commit()
    assert await store.read_current("Patient", "p2") is None
    assert await store.get_document("users", "u1") is None
    assert await store.pending_events() == []


async def test_after_writes_stages_with_the_results_in_the_same_commit(store):
    seen = []

    def record(staging):
        seen.append(staged.result.version)
        staging.put_document("receipts", "r1", {"id": "r1", "version": staged.result.version})
        staging.emit("platform.test.recorded", {"patient": staged.result.id},
                     event_id="evt-1")

    async with store.unit_of_work() as uow:
        staged = uow.create("Patient", "p1", patient("Odhiambo"))
        uow.after_writes(record)
        await uow.commit()
    assert seen == [1]
    assert (await store.get_document("receipts", "r1"))["version"] == 1
    assert [e["payload"] for e in await store.pending_events()] == [{"patient": "p1"}]


async def test_after_writes_commits_nothing_when_the_unit_fails(store):
    await write(store, "create", "p1", patient("Odhiambo"))
    with pytest.raises(ResourceExists):
        async with store.unit_of_work() as uow:
            uow.create("Patient", "p1", patient("Clash"))
            uow.after_writes(lambda staging: staging.put_document("receipts", "r2", {}))
            await uow.commit()
    assert await store.get_document("receipts", "r2") is None

    def broken(staging):
        raise ValueError("cannot record")

    with pytest.raises(StoreError, match="cannot record"):
        async with store.unit_of_work() as uow:
            uow.create("Patient", "p2", patient("Mensah"))
            uow.after_writes(broken)
            await uow.commit()
    assert await store.read_current("Patient", "p2") is None  # the writes went with it


async def test_documents_find_count_and_unique_fields(store):
    async with store.unit_of_work() as uow:
        uow.put_document("users", "u1", {"id": "u1", "email": "a@example.org", "n": 1})
        uow.put_document("users", "u2", {"id": "u2", "email": "b@example.org", "n": 2})
        await uow.commit()
    assert (await store.get_document("users", "u1"))["n"] == 1
    assert [d["id"] for d in await store.find_documents("users", {"email": "b@example.org"})] \
        == ["u2"]
    assert await store.count_documents("users") == 2
    assert [d["id"] for d in await store.find_documents("users", order_by="n",
                                                         descending=True)] == ["u2", "u1"]
    with pytest.raises(DuplicateDocument):
        async with store.unit_of_work() as uow:
            uow.put_document("users", "u3", {"id": "u3", "email": "a@example.org"})
            await uow.commit()
    with pytest.raises(DuplicateDocument):
        async with store.unit_of_work() as uow:
            uow.insert_document("users", "u1", {"id": "u1", "email": "c@example.org"})
            await uow.commit()
    async with store.unit_of_work() as uow:
        uow.delete_document("users", "u1")
        await uow.commit()
    assert await store.get_document("users", "u1") is None
    # The unique value is free again once its document is gone.
    async with store.unit_of_work() as uow:
        uow.put_document("users", "u4", {"id": "u4", "email": "a@example.org"})
        await uow.commit()


async def test_outbox_is_written_with_the_commit_and_drained(store):
    async with store.unit_of_work() as uow:
        uow.create("Patient", "p1", patient("Odhiambo"))
        event_id = uow.emit("platform.patient.created", {"patient_id": "p1"},
                            source_service="patients")
        await uow.commit()
    pending = await store.pending_events()
    assert [e["id"] for e in pending] == [event_id]
    assert pending[0]["payload"] == {"patient_id": "p1"}
    assert pending[0]["source_service"] == "patients"
    await store.mark_dispatched([event_id])
    assert await store.pending_events() == []


async def test_documents_are_purged_by_age_with_their_companions(store, monkeypatch):
    monkeypatch.setattr(type(store), "PURGE_CHUNK", 2, raising=False)  # several chunks
    async with store.unit_of_work() as uow:
        for n in range(5):  # u0..u4 expire at 2026-01-0n; users has a unique field
            uow.put_document("users", f"u{n}", {"id": f"u{n}", "email": f"{n}@example.org",
                                                "expires_at": f"2026-01-0{n + 1}T00:00:00Z"})
            uow.insert_document("users_uses", f"u{n}", {"id": f"u{n}"})
        uow.put_document("users", "never", {"id": "never", "email": "x@example.org"})
        uow.put_document("other", "u0", {"id": "u0", "expires_at": "2000-01-01T00:00:00Z"})
        await uow.commit()
    purged = await store.purge_documents("users", "expires_at", "2026-01-04T00:00:00Z",
                                         companions=["users_uses"])
    assert purged == 3
    assert sorted(d["id"] for d in await store.find_documents("users")) == ["never", "u3", "u4"]
    assert sorted(d["id"] for d in await store.find_documents("users_uses")) == ["u3", "u4"]
    assert await store.get_document("other", "u0") is not None  # another collection
    # the unique values of purged documents are free again
    async with store.unit_of_work() as uow:
        uow.put_document("users", "new", {"id": "new", "email": "0@example.org"})
        await uow.commit()
    assert await store.purge_documents("users", "expires_at", "2026-01-04T00:00:00Z") == 0


async def test_only_dispatched_events_are_purged_by_age(store):
    async with store.unit_of_work() as uow:
        sent = uow.emit("platform.test", {"n": 1})
        kept = uow.emit("platform.test", {"n": 2})
        await uow.commit()
    await store.mark_dispatched([sent])
    assert await store.purge_dispatched_events("2000-01-01T00:00:00Z") == 0  # too recent
    assert await store.purge_dispatched_events("9999-01-01T00:00:00Z") == 1
    assert [e["id"] for e in await store.pending_events()] == [kept]  # never purged
    await store.mark_dispatched([kept])
    assert await store.purge_dispatched_events("9999-01-01T00:00:00Z") == 1


def deeply_nested_patient(levels: int) -> dict:
    """A Patient whose extension nests ``levels`` deep: more than the JSON encoder takes."""
    extension: dict = {"url": "http://example.org/fhir/StructureDefinition/nested"}
    for _ in range(levels):
        extension = {"url": "http://example.org/fhir/StructureDefinition/nested",
                     "extension": [extension]}
    return {**patient("Kiprono"), "extension": [extension]}


async def test_a_write_the_encoder_refuses_fails_its_own_unit_alone(store):
    """Units committing at the same moment share one group commit: the poisoned one
    (nested past the JSON encoder's depth) fails, every other one is stored."""
    async def create(rid: str, body: dict) -> None:
        async with store.unit_of_work() as uow:
            uow.create("Patient", rid, body)
            uow.emit("platform.test.created", {"id": rid})
            await uow.commit()

    families = ["Odhiambo", "Mensah", "Wanjiru", "Achieng", "Otieno", "Kamau"]
    outcomes = await asyncio.gather(
        *(create(f"p{i}", patient(f)) for i, f in enumerate(families[:3])),
        create("poisoned", deeply_nested_patient(300)),
        *(create(f"p{i + 3}", patient(f)) for i, f in enumerate(families[3:])),
        return_exceptions=True)
    assert isinstance(outcomes[3], UnstorableResource)
    assert "Patient/poisoned" in str(outcomes[3])
    assert [o for i, o in enumerate(outcomes) if i != 3] == [None] * len(families)
    for i, family in enumerate(families):
        body = orjson.loads((await store.read("Patient", f"p{i}")).body)
        assert body["name"][0]["family"] == family
    with pytest.raises(ResourceNotFound):
        await store.read("Patient", "poisoned")
    created = {e["payload"]["id"] for e in await store.pending_events()}
    assert created == {f"p{i}" for i in range(len(families))}  # the poisoned unit's went too


async def test_expunging_history_keeps_only_the_current_version(store):
    needs_transactions(store)  # the rewrite and the erasure commit together
    await write(store, "create", "p1", patient("Odhiambo"))
    await write(store, "update", "p1", patient("Mensah"))
    async with store.unit_of_work() as uow:
        # The rewritten current version and the erasure of what came before: one commit.
        uow.update("Patient", "p1", patient("Erased", given="Anonymous"))
        staged = uow.expunge("Patient", "p1", history_only=True)
        await uow.commit()
    assert staged.result.version == 3 and not staged.unchanged
    history = await store.history("Patient", "p1")
    assert [e.version for e in history.entries] == [3] and history.total == 1
    for version in (1, 2):
        with pytest.raises(ResourceNotFound):
            await store.read("Patient", "p1", version)
    current = orjson.loads((await store.read("Patient", "p1")).body)
    assert current["name"][0]["family"] == "Erased"
    async with store.unit_of_work() as uow:
        again = uow.expunge("Patient", "p1", history_only=True)
        await uow.commit()
    assert again.unchanged  # nothing left to erase


async def test_expunging_a_resource_erases_every_version_as_if_never_written(store):
    await write(store, "create", "p1", patient("Odhiambo"))
    await write(store, "update", "p1", patient("Mensah"))
    await write(store, "create", "p2", patient("Okafor"))
    async with store.unit_of_work() as uow:
        staged = uow.expunge("Patient", "p1")
        await uow.commit()
    assert staged.result.version == 2 and staged.result.deleted
    assert await store.read_current("Patient", "p1") is None
    with pytest.raises(ResourceNotFound):
        await store.read("Patient", "p1", 1)
    assert (await store.history("Patient", "p1")).total == 0
    assert [e.id for e in (await store.history("Patient", None)).entries] == ["p2"]
    assert (await store.read("Patient", "p2")).version == 1  # nothing else touched
    async with store.unit_of_work() as uow:
        unknown = uow.expunge("Patient", "never-written")
        await uow.commit()
    assert unknown.unchanged
