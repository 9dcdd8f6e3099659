"""The SQLite store's group commit: units of work that reach commit together share one
transaction, batches follow one another while units keep coming, a COMMIT that fails
fails its own batch only, and maintenance writes get their turn under sustained load."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from fhir_server.search.extract import IndexExtractor
from fhir_server.search.registry import builtin_registry
from fhir_server.store import sqlite as sqlite_store

EXTRACT = IndexExtractor(builtin_registry())


def patient(i: int) -> dict:
    return {"resourceType": "Patient", "id": f"p{i}", "name": [{"family": f"Family{i}"}],
            "identifier": [{"system": "urn:example", "value": str(i)}]}


async def create(store: sqlite_store.SQLiteStore, i: int, *, event: bool = False) -> None:
    body = patient(i)
    async with store.unit_of_work() as uow:
        uow.create("Patient", body["id"], body, index=EXTRACT(body))
        if event:
            uow.emit("test.created", {"id": body["id"]}, source_service="tests")
        await uow.commit()


@pytest.fixture
async def store(tmp_path):
    store = sqlite_store.SQLiteStore(tmp_path / "store.db")
    await store.open()
    yield store
    await store.close()


def record_batch_sizes(store: sqlite_store.SQLiteStore) -> list[int]:
    """The size of every batch the store begins from now on."""
    batches: list[int] = []
    begin = store._begin_batch

    def counting(conn, batch):
        batches.append(len(batch))
        return begin(conn, batch)

    store._begin_batch = counting
    return batches


async def test_writes_arriving_while_a_batch_commits_form_the_next_batches(store):
    batches = record_batch_sizes(store)

    async def writer(n: int) -> None:  # eight clients, each writing as soon as answered
        for i in range(n, 400, 8):
            await create(store, i)

    await asyncio.gather(*(writer(n) for n in range(8)))
    assert sum(batches) == 400
    assert len(batches) < 400  # grouped: several units share a commit
    assert await store.read_current("Patient", "p399") is not None
    page = await store.search(await _plan(store, "identifier", "urn:example|123"))
    assert [s.id for s in page.resources] == ["p123"]


async def test_many_writers_at_once_commit_in_groups_of_at_most_max_batch(store):
    batches = record_batch_sizes(store)
    count = 3 * sqlite_store.MAX_BATCH + 5
    await asyncio.gather(*(create(store, i) for i in range(count)))  # all in one turn
    assert batches == [sqlite_store.MAX_BATCH] * 3 + [5]
    assert all([await store.read_current("Patient", f"p{i}") is not None
                for i in range(count)])


async def _plan(store, name: str, value: str):
    from fhir_server.search.plan import parse_search

    return parse_search(builtin_registry(), ["Patient"], [(name, value)])


async def test_a_failed_commit_fails_its_batch_only_and_the_store_goes_on(store, monkeypatch):
    finish = sqlite_store._finish
    failures = []

    def failing_once(conn, bulk, checkpointer=None):
        if not failures:
            failures.append(True)
            raise sqlite3.OperationalError("disk I/O error")
        finish(conn, bulk, checkpointer)

    monkeypatch.setattr(sqlite_store, "_finish", failing_once)
    results = await asyncio.gather(*(create(store, i) for i in range(5)),
                                   return_exceptions=True)
    # the five reached commit in the same turn: one batch, one COMMIT, failed for all
    assert all(isinstance(r, sqlite3.OperationalError) for r in results), results
    assert all([await store.read_current("Patient", f"p{i}") is None for i in range(5)])
    assert not store.writer_conn.in_transaction  # rolled back
    await asyncio.gather(*(create(store, i) for i in range(5)))  # the store goes on
    assert all([await store.read_current("Patient", f"p{i}") is not None for i in range(5)])


async def test_a_unit_whose_index_rows_sqlite_cannot_bind_fails_alone(store):
    """Every per-write step of a batch fails its own unit only, the index rows included:
    a number beyond SQLite's 64-bit integers fails the unit that carries it (the batch
    starts over with a savepoint per unit), the units beside it commit."""
    async def poisoned() -> None:
        body = {**patient(99), "id": "p99"}
        rows = EXTRACT(body)
        rows.rows["number"] = [("length", 2**70, 2**70)]
        async with store.unit_of_work() as uow:
            uow.create("Patient", "p99", body, index=rows)
            await uow.commit()

    results = await asyncio.gather(*(create(store, i) for i in range(4)), poisoned(),
                                   *(create(store, i) for i in range(4, 8)),
                                   return_exceptions=True)
    assert isinstance(results[4], OverflowError), results
    assert [r for i, r in enumerate(results) if i != 4] == [None] * 8
    assert all([await store.read_current("Patient", f"p{i}") is not None for i in range(8)])
    assert await store.read_current("Patient", "p99") is None
    page = await store.search(await _plan(store, "identifier", "urn:example|6"))
    assert [s.id for s in page.resources] == ["p6"]  # indexed, inside their savepoints


async def test_a_maintenance_write_gets_its_turn_while_batches_keep_coming(store):
    await create(store, 1_000_000, event=True)
    [event] = await store.pending_events()
    stop = asyncio.Event()
    in_flight: set[asyncio.Task] = set()
    written = 0
    flowing = asyncio.Event()

    async def one(i: int) -> None:
        nonlocal written
        await create(store, i)
        written += 1
        if written >= 100:  # batches are following one another now
            flowing.set()

    async def producer() -> None:  # units reach commit every turn of the loop
        i = 0
        while not stop.is_set():
            if len(in_flight) < 1000:
                task = asyncio.create_task(one(i))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                i += 1
            await asyncio.sleep(0)

    feeding = asyncio.create_task(producer())
    try:
        await asyncio.wait_for(flowing.wait(), timeout=30)
        before = written
        await asyncio.wait_for(store.mark_dispatched([event["id"]]), timeout=30)
        assert written - before < 1000  # served between two batches, not after the load
        assert await store.pending_events() == []
    finally:
        stop.set()
        await feeding
        await asyncio.gather(*in_flight)


async def test_a_write_to_a_closed_store_fails_instead_of_waiting(tmp_path):
    store = sqlite_store.SQLiteStore(tmp_path / "store.db")
    await store.open()
    await create(store, 1)
    await store.close()
    with pytest.raises(RuntimeError, match="not open"):
        await asyncio.wait_for(create(store, 2), timeout=5)


async def test_a_fault_of_the_chain_itself_does_not_hold_the_write_gate(store, caplog):
    settle = store._settle
    faults = []

    def faulty(batch, outcomes):
        if not faults:
            faults.append(True)
            raise RuntimeError("bug while answering a batch")
        settle(batch, outcomes)

    store._settle = faulty
    with caplog.at_level("ERROR"):
        first = await asyncio.gather(*(create(store, i) for i in range(3)),
                                     return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in first), first  # answered, not left
    assert "group commit failed" in caplog.text
    # the writes after it commit: the chain ended and the gate was released
    await asyncio.wait_for(asyncio.gather(*(create(store, i) for i in range(10, 13))),
                           timeout=5)
    assert await store.read_current("Patient", "p12") is not None
    await asyncio.wait_for(store.mark_dispatched([]), timeout=5)  # a maintenance write too


async def test_relayed_events_are_marked_by_the_next_batches_not_by_writes_of_their_own(store):
    """The relay marks what it relayed while writers keep committing: the marks ride on
    the group commit (a write of their own would stall it), a relayed event is never
    pending again, and all of them end up marked."""
    own_writes = 0
    write = store._write

    async def counting(work, **options):
        nonlocal own_writes
        own_writes += 1
        return await write(work, **options)
    store._write = counting
    seen: list[str] = []
    marks = 0
    writing = True

    async def writer(n: int) -> None:
        for i in range(n, 600, 8):
            await create(store, i, event=True)

    async def relay() -> None:
        nonlocal marks
        while writing or await store.pending_events(1):
            events = await store.pending_events(50)
            if events:
                seen.extend(e["id"] for e in events)
                await store.mark_dispatched([e["id"] for e in events])
                marks += 1
            await asyncio.sleep(0)

    relaying = asyncio.create_task(relay())
    await asyncio.gather(*[writer(n) for n in range(8)])
    writing = False
    await relaying
    assert len(seen) == len(set(seen)) == 600  # every event relayed once
    assert await store.pending_events(1000) == []
    assert own_writes < marks / 2, (own_writes, marks)
    await store.close()
    await store.open()
    assert await store.pending_events(1000) == []  # the marks were stored, not only kept
