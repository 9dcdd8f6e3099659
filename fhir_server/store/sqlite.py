"""SQLite adapter of the store port: the embedded, zero-setup system of record.

Layout (see ARCHITECTURE.md, The store):

- ``resources``: one row per logical resource pointing at its current version, with an
  integer ``rid`` that the search-index tables (``idx_*``) reference;
- ``versions``: every version ever written (bodies as JSON text), tombstones included,
  ordered by a global ``seq`` that history paging relies on;
- ``documents``: platform bookkeeping (users, tokens, keys, dead letters...);
- ``outbox``: events committed in the same transaction as the writes that caused them;
- ``idx_<type>``: search-index rows per parameter type (see ``INDEX_TABLES``), written in
  the same transaction as the resource version they describe, and ``idx_text`` (FTS5) for
  ``_text``/``_content``. Searches compile to SQL over them in
  :mod:`fhir_server.store.sqlite_search`.

Threads: statements run inline on the event loop: each is an indexed lookup or a small
write of microseconds, far less than a thread hand-off costs, and a thread would make it
worse: every statement hands the GIL back and forth, and the writer waits up to the
interpreter's switch interval (5 ms) to get it back while the loop is busy (measured:
a thread issuing small inserts beside a busy loop ran 17x slower). The exception is the
end of a batch, made of two long calls: the bulk changes of most of its search-index
rows (one statement, see ``_BULK_APPLY``) and the COMMIT, in which SQLite writes every
dirty page to the WAL. Those run in a writer thread, with the GIL released, while
the loop goes on validating and indexing the next requests on the other core. WAL
checkpoints (copying pages back into the database file, with two fsyncs) run in a thread
of their own, off every request's path (see ``_Checkpointer``). Writes use their own
connection (reads go on on the first one meanwhile: WAL snapshots); staging a batch
inline also keeps a commit's precondition checks (versions, conditions, unique keys) and
its writes in one ``BEGIN IMMEDIATE`` that nothing else interleaves with. Readers see a
commit once it is complete, before its caller resumes. An in-memory store
(``:memory:``) has one connection and commits inline.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import orjson

from fhir_server.audit_log.sqlite import SQLiteAuditLog, log_path
from fhir_server.search.matching import plain_token, system_matches
from fhir_server.search.phonetic import PARAM as PHONETIC
from fhir_server.search.phonetic import phonetic_code
from fhir_server.search.plan import AccessGrant, SearchPlan
from fhir_server.store.includes import collect_includes
from fhir_server.store.index import FIELDS
from fhir_server.store.port import (
    JSON,
    ConditionChanged,
    DuplicateDocument,
    HistoryPage,
    IndexRows,
    MultipleMatches,
    ResourceExists,
    ResourceGone,
    ResourceNotFound,
    SearchPage,
    StagedWrite,
    Staging,
    StoredResource,
    StoreError,
)
from fhir_server.store.sqlite_access import compile_access
from fhir_server.store.sqlite_search import Compiler, SQLiteIncludes, SQLiteSearch
from fhir_server.store.unit_of_work import (
    OutboxEvent,
    StagedDocument,
    StagedUnit,
    reset,
    run_callbacks,
)
from fhir_server.store.writes import (
    NEVER_WRITTEN,
    CurrentState,
    content_digest,
    decide,
    versioned_body,
)

log = logging.getLogger(__name__)

# Index tables idx_<kind>: (rid, type, param) and the other fields of the kind's rows
# (fhir_server.store.index.FIELDS, the rows the FHIR service extracts); idx_text is FTS5.
INDEX_TABLES: dict[str, tuple[str, ...]] = {
    kind: fields[1:] for kind, fields in FIELDS.items() if kind != "text"}
# Lookup indexes (besides (rid, param) on every table): each leads with the columns a
# search compares for equality and ends with rid, so one value's matches come out in rid
# order (keyset paging streams) and sorted scans walk (type, param, value, rid).
_LOOKUPS: dict[str, list[str]] = {
    "string": ["type, param, value, rid"],
    "token": ["type, param, code, rid"],
    "date": ["type, param, lo, rid", "type, param, hi, rid"],
    "number": ["type, param, lo, rid"],
    "quantity": ["type, param, ncode, nlo"],
    # target_id first: chains and _has look up many targets at once, compartments all the
    # references to one target whatever the parameter.
    "reference": ["target_id, type, param, rid"],
    "uri": ["type, param, value, rid"],
    "composite": ["type, param, code, lo"],  # quantity/number values are points: lo = hi
}
# Bumped when the index tables change: a store older than _REBUILT_BELOW gets them rebuilt
# empty and is asked for ``healthplatform reindex``; a newer one is migrated in place by
# the steps of _MIGRATIONS (version → the change to the next).
INDEX_SCHEMA_VERSION = 3
_REBUILT_BELOW = 2

# Page cache of each of the two connections (reads, writes), in MiB: the index B-trees
# stay hot. It fills as the store grows (RSS with it); ``?cache_mb=`` in the store URL
# sets less for a small machine, more for a large store.
DEFAULT_CACHE_MB = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
    rid INTEGER PRIMARY KEY,
    type TEXT NOT NULL,
    id TEXT NOT NULL,
    version INTEGER NOT NULL,
    last_updated TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    index_digest BLOB,  -- see _digest: which index tables an update must rewrite
    content_digest BLOB,  -- see store.writes: an update that changes nothing is no version
    UNIQUE (type, id)
);
CREATE INDEX IF NOT EXISTS resources_type_updated ON resources (type, last_updated);
CREATE INDEX IF NOT EXISTS resources_type_live ON resources (type, deleted);
CREATE TABLE IF NOT EXISTS versions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    type TEXT NOT NULL,
    id TEXT NOT NULL,
    version INTEGER NOT NULL,
    last_updated TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    method TEXT NOT NULL,
    body BLOB NOT NULL,
    UNIQUE (type, id, version)
);
CREATE INDEX IF NOT EXISTS versions_type_seq ON versions (type, seq);
CREATE INDEX IF NOT EXISTS versions_updated ON versions (last_updated);
CREATE TABLE IF NOT EXISTS documents (
    collection TEXT NOT NULL,
    id TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (collection, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS document_keys (
    collection TEXT NOT NULL,
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    PRIMARY KEY (collection, field, value)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY,
    topic TEXT NOT NULL,
    timestamp TEXT NOT NULL,
    source_service TEXT NOT NULL,
    payload TEXT NOT NULL,
    dispatched INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (dispatched, timestamp);
"""


def _index_schema() -> str:
    statements = []
    for name, columns in INDEX_TABLES.items():
        cols = ", ".join(f"{c}" for c in columns)
        statements.append(
            f"CREATE TABLE IF NOT EXISTS idx_{name} "
            f"(rid INTEGER NOT NULL, type TEXT NOT NULL, param TEXT NOT NULL, {cols});"
        )
        statements.append(
            f"CREATE INDEX IF NOT EXISTS idx_{name}_rid ON idx_{name} (rid, param);")
        for i, lookup in enumerate(_LOOKUPS[name]):
            statements.append(
                f"CREATE INDEX IF NOT EXISTS idx_{name}_lookup{i} ON idx_{name} ({lookup});")
    statements.append(
        "CREATE INDEX IF NOT EXISTS idx_reference_url ON idx_reference (type, param, url) "
        "WHERE url IS NOT NULL;")
    # rowid = resources.rid; unicode61 folds case and accents like the string index does.
    statements.append(
        "CREATE VIRTUAL TABLE IF NOT EXISTS idx_text USING fts5(narrative, content, "
        "tokenize = 'unicode61 remove_diacritics 2');")
    return "\n".join(statements)


def _recode_phonetic(conn: sqlite3.Connection) -> None:
    """2 → 3: ``phonetic`` rows hold the Metaphone code of the name part (their text is
    in ``exact``), no longer the name itself."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'idx_string'").fetchone() is None:
        return  # no index tables yet: open() makes them
    rows = conn.execute(
        "SELECT rowid, exact FROM idx_string WHERE param = ?", (PHONETIC,)).fetchall()
    codes = [(phonetic_code(exact or ""), rowid) for rowid, exact in rows]
    conn.executemany("UPDATE idx_string SET value = ? WHERE rowid = ?",
                     [(code, rowid) for code, rowid in codes if code])
    conn.executemany("DELETE FROM idx_string WHERE rowid = ?",
                     [(rowid,) for code, rowid in codes if not code])


_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {2: _recode_phonetic}


def _upgrade_index_schema(conn: sqlite3.Connection) -> bool:
    """Bring the index tables to INDEX_SCHEMA_VERSION: migrate them in place, or drop
    those of an older shape; True when the store now needs a reindex."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version >= INDEX_SCHEMA_VERSION:
        return False
    if version >= _REBUILT_BELOW:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for step in range(version, INDEX_SCHEMA_VERSION):
                _MIGRATIONS[step](conn)
            conn.execute(f"PRAGMA user_version = {INDEX_SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return False
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'idx_%'")]
    for table in tables:
        if table.startswith("idx_text_"):
            continue  # FTS5 shadow tables go with their virtual table
        conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"PRAGMA user_version = {INDEX_SCHEMA_VERSION}")
    conn.execute("UPDATE resources SET index_digest = NULL")  # their rows are gone
    has_data = conn.execute("SELECT 1 FROM resources LIMIT 1").fetchone() is not None
    return has_data


_MAX_INTEGER = 2**63 - 1  # SQLite's largest: no version, rid or seq goes beyond


def now_instant() -> str:
    """The current time as a FHIR instant in UTC with microseconds (sortable as text)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _field_value(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


class SQLiteUnitOfWork(StagedUnit):
    """A unit of work whose commit joins the store's group commit (``SQLiteStore.submit``):
    one ``BEGIN IMMEDIATE`` transaction shared with the units committing at the same
    moment, each applied all or nothing."""

    def __init__(self, store: SQLiteStore):
        super().__init__()
        self._store = store

    async def submit(self) -> None:
        await self._store.submit(self.writes, self.documents, self.events, self.callbacks)


class SQLiteStore:
    """The embedded store. ``path`` may be ``":memory:"`` for throwaway use."""

    def __init__(self, path: str | Path, *, unique_document_fields: Mapping[str, Iterable[str]]
                 | None = None, cache_mb: int = DEFAULT_CACHE_MB):
        self.path = str(path)
        if cache_mb < 1:
            raise ValueError(f"cache_mb must be at least 1, got {cache_mb}")
        self.cache_mb = cache_mb
        self._conn: sqlite3.Connection | None = None
        self._unique = {c: tuple(f) for c, f in (unique_document_fields or {}).items()}
        self._outbox_listeners: list[Any] = []
        self._search: SQLiteSearch | None = None
        self.needs_reindex = False  # the index schema was rebuilt under existing data
        self._pending: list[_Submitted] = []  # units of work waiting for the group commit
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None  # a reference keeps the task alive
        # Writes: their own connection (the read connection for :memory:), used by one
        # batch or maintenance write at a time (_write_gate), whose COMMIT runs in _writer.
        self._writer_conn: sqlite3.Connection | None = None
        self._writer_search: SQLiteSearch | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._checkpointer: _Checkpointer | None = None
        self._write_gate = asyncio.Lock()
        self._gate_waiters = 0  # maintenance writes waiting for the gate (see _BatchChain)
        self._purge_indexes: set[str] = set()  # see purge_documents
        # Outbox events relayed but not yet marked dispatched (see mark_dispatched), and
        # those the batch in flight is marking.
        self._marks: list[str] = []
        self._marking: list[str] = []
        self._marker: asyncio.Task[Any] | None = None  # a reference keeps the task alive
        # AuditEvent's home: a file of its own, written by its own writer
        self.audit_log = SQLiteAuditLog(log_path(self.path))

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> SQLiteStore:
        """``sqlite:///path``, optionally ``?cache_mb=N`` (each connection's page cache)."""
        if not url.startswith("sqlite:///"):
            raise ValueError(f"not a sqlite URL: {url!r} (expected sqlite:///path)")
        path, _, query = url.removeprefix("sqlite:///").partition("?")
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name != "cache_mb" or not value.isdigit():
                raise ValueError(f"unsupported option {name}={value!r} in store URL {url!r}: "
                                 "the only one is cache_mb=<megabytes>")
            kwargs["cache_mb"] = int(value)
        return cls(path, **kwargs)

    # -- lifecycle ---------------------------------------------------------------------
    async def open(self) -> None:
        if self.path != ":memory:":
            _private_files(Path(self.path))
        conn = _connect(self.path, self.cache_mb)
        await _switch_to_wal(conn)
        conn.executescript(_SCHEMA)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(resources)")}
        for column in ("index_digest", "content_digest"):  # a store made before digests
            if column not in columns:
                conn.execute(f"ALTER TABLE resources ADD COLUMN {column} BLOB")
        self.needs_reindex = _upgrade_index_schema(conn)
        if self.needs_reindex:
            log.warning("search index tables were rebuilt for a new schema: run "
                        "`healthplatform reindex` so existing resources are searchable")
        conn.executescript(_index_schema())
        self._conn = conn
        self._search = SQLiteSearch(conn, self._fetch_rids, compile_access)
        if self.path == ":memory:":
            self._writer_conn, self._writer_search = conn, self._search
        else:
            self._writer_conn = _connect(self.path, self.cache_mb)
            self._writer_conn.execute("PRAGMA wal_autocheckpoint=0")  # see _Checkpointer
            # Checkpoints copy WAL frames straight to the file: no use for a page cache.
            self._checkpointer = _Checkpointer(_connect(self.path, 2))
            self._writer_search = SQLiteSearch(
                self._writer_conn, lambda rids: self._fetch_rids(rids, self._writer_conn),
                compile_access)
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="sqlite-writer")
        self._writer_conn.execute(_BULK_VIEW)
        self._writer_conn.execute(_BULK_TRIGGER)
        await self.audit_log.open()

    async def close(self) -> None:
        await self.audit_log.close()
        if self._marks and self._writer_conn is not None:
            await self._write(self._mark_now)
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        if self._writer_conn is not None and self._writer_conn is not self._conn:
            self._writer_conn.close()
        self._writer_conn = self._writer_search = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def writer_conn(self) -> sqlite3.Connection:
        if self._writer_conn is None:
            raise RuntimeError("store is not open")
        return self._writer_conn

    def _in_writer(self, work: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        """``work(*args)`` in the writer thread, handed over now (inline for an in-memory
        store). Not a coroutine on purpose: one would reach the executor only when the
        loop next ran it, after every callback ready meanwhile (measured: 12 ms under
        HL7 load, with the write connection idle and every later batch waiting)."""
        loop = asyncio.get_running_loop()
        if self._writer is None:
            future: asyncio.Future[Any] = loop.create_future()
            try:
                future.set_result(work(*args))
            except Exception as exc:  # delivered to whoever awaits, as the executor would
                future.set_exception(exc)
            return future
        return loop.run_in_executor(self._writer, work, *args)

    async def _write(self, work: Callable[[sqlite3.Connection], Any], *,
                     in_writer: bool = False) -> Any:
        """A maintenance write, ``work(connection)``, in turn with the group commits; in
        the writer thread when ``in_writer`` (long work: the loop goes on meanwhile)."""
        self._gate_waiters += 1
        try:
            await self._write_gate.acquire()
        finally:
            self._gate_waiters -= 1
        try:
            conn = self.writer_conn
            result = await self._in_writer(work, conn) if in_writer else work(conn)
            if self._checkpointer is not None:
                self._checkpointer.committed()
                await self._top_up()
            return result
        finally:
            self._write_gate.release()

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("store is not open")
        return self._conn

    def unit_of_work(self) -> SQLiteUnitOfWork:
        return SQLiteUnitOfWork(self)

    def set_unique_document_fields(self, collection: str, fields: Iterable[str]) -> None:
        self._unique[collection] = tuple(fields)

    def add_outbox_listener(self, callback: Any) -> None:
        """``callback()`` is called after a commit that wrote events (the dispatcher)."""
        self._outbox_listeners.append(callback)

    def notify_outbox(self) -> None:
        for callback in self._outbox_listeners:
            callback()

    # -- resources ---------------------------------------------------------------------
    async def read(self, resource_type: str, id: str, version: int | None = None
                   ) -> StoredResource:
        if version is None:
            current = await self.read_current(resource_type, id)
            if current is None:
                raise ResourceNotFound(resource_type, id)
            if current.deleted:
                raise ResourceGone(resource_type, id, current.version)
            return current
        row = self.conn.execute(
            "SELECT type, id, version, last_updated, deleted, body, method FROM versions "
            "WHERE type = ? AND id = ? AND version = ?",
            (resource_type, id, version),
        ).fetchone() if 0 < version <= _MAX_INTEGER else None
        if row is None:
            raise ResourceNotFound(resource_type, id, str(version))
        stored = _stored(row)
        if stored.deleted:
            raise ResourceGone(resource_type, id, stored.version)
        return stored

    async def created_instants(self, resource_type: str, ids: Sequence[str]
                               ) -> dict[str, str]:
        found: dict[str, str] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), 500):  # well under SQLite's variable limit
            chunk = unique[start:start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(self.conn.execute(
                "SELECT id, last_updated FROM versions "
                f"WHERE type = ? AND version = 1 AND id IN ({marks})",
                (resource_type, *chunk)).fetchall())
        return found

    async def read_current(self, resource_type: str, id: str) -> StoredResource | None:
        row = self.conn.execute(
            "SELECT v.type, v.id, v.version, v.last_updated, v.deleted, v.body, v.method "
            "FROM resources r JOIN versions v "
            "ON v.type = r.type AND v.id = r.id AND v.version = r.version "
            "WHERE r.type = ? AND r.id = ?",
            (resource_type, id),
        ).fetchone()
        return _stored(row) if row else None

    async def history(
        self, resource_type: str | None, id: str | None, *, since: str | None = None,
        at_or_before: str | None = None, count: int = 50, before_seq: int | None = None,
        access: Sequence[AccessGrant] | None = None,
    ) -> HistoryPage:
        where: list[str] = []
        args: list[Any] = []
        if access is not None:
            # The versions of the resources the caller may read now (index rows are those
            # of current versions: a deleted resource's history is an administrator's).
            allowed = compile_access(Compiler(self.conn), access,
                                     None if resource_type is None else [resource_type])
            if allowed is not None:
                check, check_args = allowed.check("r.rid")
                where.append("EXISTS (SELECT 1 FROM resources r WHERE r.type = versions.type "
                             f"AND r.id = versions.id AND r.deleted = 0 AND {check})")
                args.extend(check_args)
        if resource_type is not None:
            where.append("type = ?")
            args.append(resource_type)
        if id is not None:
            where.append("id = ?")
            args.append(id)
        if since is not None:
            where.append("last_updated >= ?")
            args.append(since)
        if at_or_before is not None:
            where.append("last_updated <= ?")
            args.append(at_or_before)
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        total = self.conn.execute(f"SELECT count(*) FROM versions {clause}", args).fetchone()[0]
        if before_seq is not None:
            where.append("seq < ?")
            args.append(before_seq)
            clause = "WHERE " + " AND ".join(where)
        rows = self.conn.execute(
            "SELECT type, id, version, last_updated, deleted, body, method, seq FROM versions "
            f"{clause} ORDER BY seq DESC LIMIT ?",
            [*args, count],
        ).fetchall()
        return HistoryPage([_stored(r) for r in rows], total)

    async def submit(self, writes: Sequence[StagedWrite], documents: Sequence[StagedDocument],
                     events: Sequence[OutboxEvent],
                     callbacks: Sequence[Callable[[Staging], None]] = ()) -> None:
        """Commit one unit of work, grouped with the others committing in this loop turn.

        Group commit: a SQLite commit costs far more than the rows it writes (every dirty page of
        every index goes to the WAL), so units of work that reach ``commit`` in the same event-loop
        turn share one transaction (``MAX_BATCH`` at most), each inside its own savepoint. A unit
        that fails rolls back to its savepoint alone and gets its error; the others commit. Nothing
        waits for a timer: the flush runs as soon as the current turn's ready tasks have staged
        their work, so a lone request pays no extra latency.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append(_Submitted(writes, documents, events, callbacks, future))
        if not self._flushing:
            self._flushing = True
            self._flusher = loop.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        """Commit what is pending, batch after batch: while the writer commits one batch,
        the units of work that reach commit meanwhile gather into the next.

        The batches follow one another through callbacks (:class:`_BatchChain`), not by
        awaiting each COMMIT here: a task awaiting the writer resumes only after a second
        trip through the loop's queue, behind every request that became ready meanwhile
        (traced under update load: 2-4 ms per batch with the write connection idle, a
        quarter of the batch cycle). The chain stops when nothing is pending or a
        maintenance write waits for the gate."""
        try:
            while self._pending:
                async with self._write_gate:
                    chain = _BatchChain(self)
                    try:
                        # Shielded: a cancelled flusher leaves the batch in flight to its
                        # COMMIT (the writer thread goes on regardless) and starts no more.
                        await asyncio.shield(chain.done)
                    except asyncio.CancelledError:
                        chain.stopping = True
                        raise
                    except Exception:  # a fault of the chain itself, not of a unit
                        log.exception("group commit failed; going on with what is pending")
        finally:
            self._flushing = False
            if self._marks and self._writer_conn is not None:  # no batch left to carry them
                self._marker = asyncio.get_running_loop().create_task(
                    self._write(self._mark_now))

    async def _top_up(self) -> None:
        """The writer's share of a WAL rewind, when due (see ``_Checkpointer``)."""
        checkpointer = self._checkpointer
        if checkpointer is not None and checkpointer.rewind:
            await self._in_writer(checkpointer.top_up, self.writer_conn)

    def _begin_batch(self, conn: sqlite3.Connection, batch: Sequence[_Submitted]
                     ) -> tuple[list[BaseException | None], Sequence[str | None] | None]:
        """Open the batch's transaction and apply its units on the loop: their outcomes,
        and the parameters of the bulk index statement the writer thread runs before the
        COMMIT (two statements, see _BULK_APPLY, which SQLite runs with the GIL released
        while the loop goes on)."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            outcomes, bulk = self._apply_batch(conn, batch)
            if self._marks:  # after the units: an optimistic batch's restart redoes them
                self._marking, self._marks = self._marks, []
                _mark(conn, self._marking)
            return outcomes, bulk
        except BaseException:
            self._rollback(conn)
            self._unmark()
            raise

    def _unmark(self) -> None:
        """The batch carrying marks failed: the next one carries them."""
        self._marks, self._marking = [*self._marking, *self._marks], []

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def _fail(self, batch: Sequence[_Submitted], exc: BaseException) -> None:
        """The batch's transaction failed: every unit gets the error."""
        self._unmark()
        for unit in batch:
            reset(unit.writes)
            if not unit.future.done():
                unit.future.set_exception(exc)

    def _settle(self, batch: Sequence[_Submitted], outcomes: Sequence[BaseException | None]
                ) -> None:
        self._marking = []  # committed with the batch
        wrote_events = False
        for unit, error in zip(batch, outcomes, strict=True):
            if unit.future.done():  # the committing task was cancelled meanwhile
                continue
            if error is None:
                wrote_events = wrote_events or bool(unit.events or unit.callbacks)
                unit.future.set_result(None)
            else:
                unit.future.set_exception(error)
        if wrote_events:
            self.notify_outbox()

    def _apply_batch(self, conn: sqlite3.Connection, batch: Sequence[_Submitted]
                     ) -> tuple[list[BaseException | None], Sequence[str | None] | None]:
        """Apply every unit: each unit's error (or None), and the parameters of the bulk
        index statement still to run. Optimistic: units almost never fail, so they run
        without savepoints (a savepoint journals every page it changes and costs ~0.4 ms
        to release) and their index rows wait for the end of the batch; when anything
        fails, whatever the step (a version check, a body the JSON encoder refuses, an
        index row SQLite cannot bind, a callback), the batch starts over with a savepoint
        around each unit, so that the unit at fault alone rolls back and gets the error:
        one client's bad write never fails the others committed with it."""
        pending = _PendingIndex()
        try:
            for unit in batch:
                self._apply_unit(conn, unit, pending)
            return [None] * len(batch), pending.bulk_parameters(conn)
        except Exception:
            conn.execute("ROLLBACK")
            conn.execute("BEGIN IMMEDIATE")
            for unit in batch:
                reset(unit.writes)
        return [self._apply_savepoint(conn, unit) for unit in batch], None

    def _apply_savepoint(self, conn: sqlite3.Connection, unit: _Submitted
                         ) -> BaseException | None:
        conn.execute("SAVEPOINT unit")
        try:
            self._apply_unit(conn, unit)
        except Exception as exc:
            conn.execute("ROLLBACK TO unit")
            conn.execute("RELEASE unit")
            reset(unit.writes)
            return exc
        conn.execute("RELEASE unit")
        return None

    def _apply_unit(self, conn: sqlite3.Connection, unit: _Submitted,
                    pending: _PendingIndex | None = None) -> None:
        """Apply one unit of work; its index rows go to ``pending`` when given (inserted
        at the end of the batch), else they are inserted now."""
        instant = now_instant()
        index_rows = pending if pending is not None else _PendingIndex()
        for write in unit.writes:
            try:
                write.result = self._apply_write(conn, write, instant, index_rows)
            except StoreError as exc:
                exc.staged = write
                raise
        if pending is None:
            index_rows.flush(conn)
        documents, events = run_callbacks(unit.callbacks, unit.documents, unit.events)
        for op, collection, doc_id, body in documents:
            self._apply_document(conn, op, collection, doc_id, body)
        if events:
            conn.executemany(
                "INSERT INTO outbox (id, topic, timestamp, source_service, payload) "
                "VALUES (?, ?, ?, ?, ?)",
                events,
            )

    def _resolve_condition(self, conn: sqlite3.Connection, w: StagedWrite,
                           pending: _PendingIndex) -> StoredResource | None:
        """Settle a conditional write inside the transaction, where no other writer can
        interleave. Returns the existing match when a conditional create must not write.

        The condition must see the writes staged earlier in this commit, whose index rows
        are still pending: matched in memory when the plan allows (see
        ``_PendingIndex.match``; committed rows of resources rewritten since are left
        out), else inserted first."""
        assert w.condition is not None and self._writer_search is not None
        plan = w.condition.plan
        staged = pending.match(plan)
        if staged is None:
            pending.flush(conn)
            ids = self._writer_search.match_ids(plan, limit=2)
        else:
            hidden = set(pending.stale.get("token", ()))
            ids = sorted({*self._writer_search.match_ids(plan, limit=2, hidden=hidden),
                          *staged.values()})
        expected = w.condition.expected_ids
        if expected is not None and tuple(ids) != tuple(sorted(expected)):
            raise ConditionChanged(f"{w.resource_type}: the condition now matches {ids}")
        if len(ids) > 1:
            raise MultipleMatches(w.resource_type, len(ids))
        if not ids:
            return None
        if w.op == "create":
            w.existing = True
            return self._current(conn, w.resource_type, ids[0])
        w.id = ids[0]  # conditional update: the match is the resource to update
        return None

    def _apply_write(self, conn: sqlite3.Connection, w: StagedWrite, instant: str,
                     index_rows: _PendingIndex) -> StoredResource:
        if w.op.startswith("expunge"):
            return self._expunge(conn, w, index_rows)
        if w.condition is not None:
            existing = self._resolve_condition(conn, w, index_rows)
            if existing is not None:
                return existing
        if w.op == "create" and w.must_not_exist:
            return self._insert_new(conn, w, instant, index_rows)
        row = conn.execute(
            "SELECT rid, version, deleted, index_digest, content_digest FROM resources "
            "WHERE type = ? AND id = ?",
            (w.resource_type, w.id),
        ).fetchone()
        rid, old_digest = (row[0], row[3]) if row else (None, None)
        current = CurrentState(row[1], bool(row[2]), row[4]) if row else NEVER_WRITTEN
        new = decide(w, current, instant)
        if new is None:  # nothing to write (see fhir_server.store.writes)
            if w.op == "delete":
                return StoredResource(w.resource_type, w.id, current.version or 0, instant,
                                      True, b"", "DELETE")
            kept = self._current(conn, w.resource_type, w.id)
            assert kept is not None
            return kept
        conn.execute(
            "INSERT INTO versions (type, id, version, last_updated, deleted, method, body) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (w.resource_type, w.id, new.version, instant, new.deleted, w.method, new.body),
        )
        if rid is None:
            rid = conn.execute(
                "INSERT INTO resources (type, id, version, last_updated, deleted, "
                "content_digest) VALUES (?, ?, ?, ?, ?, ?)",
                (w.resource_type, w.id, new.version, instant, new.deleted,
                 new.content_digest),
            ).lastrowid
            assert rid is not None
            if w.index is not None and not new.deleted:
                index_rows.add(rid, w.resource_type, w.id, w.index)
        else:
            # An update rewrites only the index tables whose rows changed (most updates
            # change a few values): per-table digests of the rows say which.
            digest = _digest(w.index) if w.index is not None and not new.deleted else None
            conn.execute(
                "UPDATE resources SET version = ?, last_updated = ?, deleted = ?, "
                "index_digest = ?, content_digest = ? WHERE rid = ?",
                (new.version, instant, new.deleted, digest, new.content_digest, rid),
            )
            tables = _changed_tables(old_digest, digest)
            index_rows.remove(rid, tables)
            if w.index is not None and not new.deleted:
                index_rows.add(rid, w.resource_type, w.id, w.index, tables)
        return StoredResource(w.resource_type, w.id, new.version, instant, new.deleted,
                              new.body, w.method)

    def _expunge(self, conn: sqlite3.Connection, w: StagedWrite, index_rows: _PendingIndex
                 ) -> StoredResource:
        """``UnitOfWork.expunge``: the versions go from ``versions``; erasing the current
        one too drops the ``resources`` row and (pending, like a delete's) its index rows."""
        row = conn.execute("SELECT rid, version FROM resources WHERE type = ? AND id = ?",
                           (w.resource_type, w.id)).fetchone()
        if row is None:
            w.unchanged = True
            return StoredResource(w.resource_type, w.id, 0, now_instant(), True, b"", "DELETE")
        rid, version = row
        if w.op == "expunge-history":
            erased = conn.execute("DELETE FROM versions WHERE type = ? AND id = ? AND "
                                  "version < ?", (w.resource_type, w.id, version)).rowcount
            w.unchanged = erased == 0
            kept = self._current(conn, w.resource_type, w.id)
            assert kept is not None
            return kept
        index_rows.remove(rid)
        conn.execute("DELETE FROM resources WHERE rid = ?", (rid,))
        conn.execute("DELETE FROM versions WHERE type = ? AND id = ?", (w.resource_type, w.id))
        return StoredResource(w.resource_type, w.id, version, now_instant(), True, b"",
                              "DELETE")

    @staticmethod
    def _insert_new(conn: sqlite3.Connection, w: StagedWrite, instant: str,
                    index_rows: _PendingIndex) -> StoredResource:
        """A create (POST): the UNIQUE (type, id) constraint is the existence check, which
        saves a lookup per resource when transaction bundles load thousands."""
        content = content_digest(w)
        body = versioned_body(w, 1, instant)
        try:
            rid = conn.execute(
                "INSERT INTO resources (type, id, version, last_updated, deleted, "
                "content_digest) VALUES (?, ?, 1, ?, 0, ?)",
                (w.resource_type, w.id, instant, content)).lastrowid
        except sqlite3.IntegrityError:
            raise ResourceExists(w.resource_type, w.id) from None
        assert rid is not None
        conn.execute(
            "INSERT INTO versions (type, id, version, last_updated, deleted, method, body) "
            "VALUES (?, ?, 1, ?, 0, ?, ?)", (w.resource_type, w.id, instant, w.method, body))
        if w.index is not None:
            index_rows.add(rid, w.resource_type, w.id, w.index)
        return StoredResource(w.resource_type, w.id, 1, instant, False, body, w.method)

    @staticmethod
    def _current(conn: sqlite3.Connection, resource_type: str, id: str) -> StoredResource | None:
        row = conn.execute(
            "SELECT v.type, v.id, v.version, v.last_updated, v.deleted, v.body, v.method "
            "FROM resources r JOIN versions v "
            "ON v.type = r.type AND v.id = r.id AND v.version = r.version "
            "WHERE r.type = ? AND r.id = ?",
            (resource_type, id),
        ).fetchone()
        return _stored(row) if row else None

    # -- search ----------------------------------------------------------------------------
    @property
    def searcher(self) -> SQLiteSearch:
        """Searches on the read connection."""
        if self._search is None:
            raise RuntimeError("store is not open")
        return self._search

    async def search(self, plan: SearchPlan) -> SearchPage:
        page, rids = self.searcher.search(plan)
        if rids and (plan.includes or plan.revincludes):
            page.included = await collect_includes(plan, rids, SQLiteIncludes(self.searcher))
        return page

    async def match_ids(self, plan: SearchPlan, limit: int) -> list[str]:
        return self.searcher.match_ids(plan, limit)

    async def match_ids_many(self, plans: Sequence[SearchPlan], limit: int
                             ) -> list[list[str]]:
        return self.searcher.match_ids_many(plans, limit)

    def _fetch_rids(self, rids: Sequence[int], conn: sqlite3.Connection | None = None
                    ) -> list[tuple[int, StoredResource]]:
        """(rid, current version) of ``rids``, in that order (deleted ones left out)."""
        if not rids:
            return []
        found: dict[int, StoredResource] = {}
        for start in range(0, len(rids), 500):
            chunk = list(rids[start:start + 500])
            rows = (conn or self.conn).execute(
                "SELECT v.type, v.id, v.version, v.last_updated, v.deleted, v.body, v.method, "
                "r.rid FROM resources r JOIN versions v "
                "ON v.type = r.type AND v.id = r.id AND v.version = r.version "
                f"WHERE r.rid IN ({','.join('?' * len(chunk))}) AND r.deleted = 0", chunk)
            for row in rows:
                found[row[7]] = _stored(row[:7])
        return [(r, found[r]) for r in rids if r in found]

    async def count_current(self) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM resources WHERE deleted = 0").fetchone()[0])

    async def iter_current(self, batch: int = 500) -> AsyncIterator[list[StoredResource]]:
        after = 0
        while True:
            rids = [r[0] for r in self.conn.execute(
                "SELECT rid FROM resources WHERE rid > ? AND deleted = 0 ORDER BY rid LIMIT ?",
                (after, batch))]
            if not rids:
                return
            after = rids[-1]
            yield [resource for _rid, resource in self._fetch_rids(rids)]

    async def replace_index(self, items: Sequence[tuple[StoredResource, IndexRows]]) -> None:
        await self._write(lambda conn: self._replace_index(conn, items))

    @staticmethod
    def _replace_index(conn: sqlite3.Connection,
                       items: Sequence[tuple[StoredResource, IndexRows]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            rows = _PendingIndex()
            for stored, index in items:
                found = conn.execute(
                    "SELECT rid FROM resources WHERE type = ? AND id = ? AND version = ? "
                    "AND deleted = 0", (stored.resource_type, stored.id, stored.version),
                ).fetchone()
                if found is None:
                    continue  # changed since it was read: that write indexed it already
                rows.remove(found[0])
                rows.add(found[0], stored.resource_type, stored.id, index)
                conn.execute("UPDATE resources SET index_digest = NULL WHERE rid = ?",
                             (found[0],))
            rows.flush(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _apply_document(self, conn: sqlite3.Connection, op: str, collection: str, doc_id: str,
                        body: JSON | None) -> None:
        conn.execute(
            "DELETE FROM document_keys WHERE collection = ? AND doc_id = ?", (collection, doc_id)
        )
        if op == "delete":
            conn.execute("DELETE FROM documents WHERE collection = ? AND id = ?",
                         (collection, doc_id))
            return
        assert body is not None
        verb = "INSERT" if op == "insert" else "INSERT OR REPLACE"
        try:
            conn.execute(
                f"{verb} INTO documents (collection, id, body) VALUES (?, ?, ?)",
                (collection, doc_id, orjson.dumps(body).decode()),
            )
            for field in self._unique.get(collection, ()):
                value = body.get(field)
                if value is not None:
                    conn.execute(
                        "INSERT INTO document_keys (collection, field, value, doc_id) "
                        "VALUES (?, ?, ?, ?)",
                        (collection, field, _field_value(value), doc_id),
                    )
        except sqlite3.IntegrityError as exc:
            raise DuplicateDocument(f"{collection}: duplicate {doc_id} or unique field") from exc

    # -- documents ---------------------------------------------------------------------
    async def get_document(self, collection: str, id: str) -> JSON | None:
        row = self.conn.execute(
            "SELECT body FROM documents WHERE collection = ? AND id = ?", (collection, id)
        ).fetchone()
        return orjson.loads(row[0]) if row else None

    def _where(self, collection: str, where: Mapping[str, Any] | None
               ) -> tuple[str, list[Any]]:
        clauses: list[str] = ["d.collection = ?"]
        args: list[Any] = [collection]
        for field, value in (where or {}).items():
            if field in self._unique.get(collection, ()) and value is not None:
                # Unique fields are looked up through their key table (an index, not a scan).
                clauses.append(
                    "d.id = (SELECT doc_id FROM document_keys WHERE collection = ? "
                    "AND field = ? AND value = ?)"
                )
                args.extend([collection, field, _field_value(value)])
            elif value is None:
                clauses.append(f"json_extract(d.body, '$.{_safe(field)}') IS NULL")
            else:
                clauses.append(f"json_extract(d.body, '$.{_safe(field)}') = ?")
                args.append(value if not isinstance(value, bool) else int(value))
        return " AND ".join(clauses), args

    async def find_documents(
        self, collection: str, where: Mapping[str, Any] | None = None, *, limit: int = 100,
        offset: int = 0, order_by: str | None = None, descending: bool = False,
    ) -> list[JSON]:
        clause, args = self._where(collection, where)
        order = f"json_extract(d.body, '$.{_safe(order_by)}')" if order_by else "d.id"
        direction = "DESC" if descending else "ASC"
        rows = self.conn.execute(
            f"SELECT d.body FROM documents d WHERE {clause} ORDER BY {order} {direction}, d.id "
            "LIMIT ? OFFSET ?",
            [*args, limit, offset],
        ).fetchall()
        return [orjson.loads(r[0]) for r in rows]

    async def count_documents(self, collection: str, where: Mapping[str, Any] | None = None
                              ) -> int:
        clause, args = self._where(collection, where)
        return int(
            self.conn.execute(f"SELECT count(*) FROM documents d WHERE {clause}", args)
            .fetchone()[0]
        )

    # -- housekeeping ----------------------------------------------------------------------
    # Deletes go in chunks, each its own short write transaction in turn with the group
    # commits: a purge of millions of rows never holds the write lock for long (measured:
    # 150,000 of 300,000 HL7 records in 3.2 s, ~11 ms a chunk, in the writer thread).
    PURGE_CHUNK = 500

    async def purge_documents(self, collection: str, field: str, before: str, *,
                              companions: Sequence[str] = ()) -> int:
        # The documents to go are found through a partial index on the field (one per
        # collection and field purged, made by the first purge, in the writer thread):
        # a scan would parse every document of the collection, millions for HL7 records.
        index = f"purge_{_safe(collection)}_{_safe(field)}".replace(".", "_")
        expression = f"json_extract(body, '$.{field}')"
        if index not in self._purge_indexes:
            await self._write(lambda conn: conn.execute(
                f"CREATE INDEX IF NOT EXISTS {index} ON documents ({expression}) "
                f"WHERE collection = '{collection}'"), in_writer=True)
            self._purge_indexes.add(index)
        select = (f"SELECT id FROM documents INDEXED BY {index} WHERE collection = "
                  f"'{collection}' AND {expression} < ? LIMIT {self.PURGE_CHUNK}")
        return await self._purge_in_chunks(
            lambda conn: self._purge_documents(conn, select, before, collection, companions))

    async def _purge_in_chunks(self, chunk: Callable[[sqlite3.Connection], int]) -> int:
        """Run ``chunk`` (deleting at most PURGE_CHUNK rows, returning how many) as
        maintenance writes in the writer thread until one deletes fewer; the total."""
        purged = 0
        while True:
            count = await self._write(chunk, in_writer=True)
            purged += count
            if count < self.PURGE_CHUNK:
                return purged

    @staticmethod
    def _purge_documents(conn: sqlite3.Connection, select: str, before: str,
                         collection: str, companions: Sequence[str]) -> int:
        conn.execute("BEGIN IMMEDIATE")
        try:
            ids = [r[0] for r in conn.execute(select, (before,))]
            if ids:
                listed = orjson.dumps(ids).decode()
                for name in (collection, *companions):
                    for table, key in (("document_keys", "doc_id"), ("documents", "id")):
                        conn.execute(
                            f"DELETE FROM {table} WHERE collection = ? AND {key} IN "
                            "(SELECT value FROM json_each(?))", (name, listed))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return len(ids)

    async def purge_dispatched_events(self, before: str) -> int:
        if self._marks:
            await self._write(self._mark_now)
        return await self._purge_in_chunks(lambda conn: conn.execute(
            "DELETE FROM outbox WHERE rowid IN (SELECT rowid FROM outbox "
            "WHERE dispatched = 1 AND timestamp < ? LIMIT ?)",
            (before, self.PURGE_CHUNK)).rowcount)

    # -- outbox ------------------------------------------------------------------------
    async def pending_events(self, limit: int = 100) -> list[JSON]:
        relayed = {*self._marks, *self._marking}  # dispatched, not marked yet
        rows = self.conn.execute(
            "SELECT id, topic, timestamp, source_service, payload FROM outbox "
            "WHERE dispatched = 0 ORDER BY timestamp LIMIT ?",
            (limit + len(relayed),),
        ).fetchall()
        return [
            {"id": r[0], "topic": r[1], "timestamp": r[2], "source_service": r[3],
             "payload": orjson.loads(r[4])}
            for r in rows if r[0] not in relayed
        ][:limit]

    async def mark_dispatched(self, event_ids: Sequence[str]) -> None:
        """While group commits are running, the next batch marks them in its own
        transaction: a write of its own would take the write connection between two
        batches and stall the commit chain (measured: writes lost 10-20% of their
        throughput to the relay's marks, one event a write). Until then they are left
        out of ``pending_events``; a crash before then relays them again (handlers are
        idempotent on the event id)."""
        self._marks.extend(event_ids)
        if not self._flushing:
            await self._write(self._mark_now)

    def _mark_now(self, conn: sqlite3.Connection) -> None:
        marks, self._marks = self._marks, []
        try:
            _mark(conn, marks)
        except BaseException:
            self._marks = [*marks, *self._marks]
            raise


def _mark(conn: sqlite3.Connection, event_ids: Sequence[str]) -> None:
    if event_ids:
        conn.execute("UPDATE outbox SET dispatched = 1 WHERE id IN "
                     "(SELECT value FROM json_each(?))", (orjson.dumps(list(event_ids)).decode(),))


def _private_files(path: Path) -> None:
    """Health data is for the service's user alone: the store's directory is made 0700
    when it is made here (one that exists is left as it is, with a warning when others
    may read it: it may be shared on purpose, and is not ours to change), and the
    database file 0600 before SQLite first opens it, so that its WAL and shared-memory
    files, which SQLite gives the database file's mode, are 0600 too (SQLite's default
    is 0644). The files of a store made before this are narrowed to 0600."""
    directory = path.parent
    if not directory.exists():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    elif directory.stat().st_mode & 0o077:
        log.warning("the store's directory %s may be read by other users; chmod 700 it",
                    directory)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            if name.stat().st_mode & 0o077:
                name.chmod(0o600)
                log.warning("%s could be read by other users: narrowed to 0600", name)
        except FileNotFoundError:
            continue


def _connect(path: str, cache_mb: int) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA cache_size=-{int(cache_mb) * 1024}")  # KiB when negative
    conn.execute("PRAGMA temp_store=MEMORY")
    conn.execute("PRAGMA mmap_size=1073741824")
    return conn


async def _switch_to_wal(conn: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode=WAL``, retried: the switch does not wait on the busy timeout,
    so when two processes open a new file at once the loser gets "database is locked"."""
    for attempt in range(100):
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == 99:
                raise
            await asyncio.sleep(0.05)


class _PendingIndex:
    """Index changes of one commit, applied with a few statements per table at the end:
    the rows of resources written in it, and per table the resources (updated or
    deleted) whose earlier rows must go first."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Any, ...]]] = {}
        self.rids: dict[int, str] = {}  # rid → id of the resources with rows here
        self.stale: dict[str, list[int]] = {}  # table → rids whose stored rows go
        # token rows by (type, param, code): (rid, system), for conditions (see match)
        self.codes: dict[tuple[str, str, str], list[tuple[int, str | None]]] = {}

    def add(self, rid: int, resource_type: str, resource_id: str, index: IndexRows,
            tables: Iterable[str] | None = None) -> None:
        """Stage a resource's rows, of ``tables`` only when given."""
        self.rids[rid] = resource_id
        rows = index.rows
        for table in rows if tables is None else tables:
            values = rows.get(table)
            if not values:
                continue
            out = self.rows.setdefault(table, [])
            if table == "text":
                out.extend((rid, *v) for v in values)
                continue
            out.extend((rid, resource_type, *v) for v in values)
            if table == "token":
                codes = self.codes
                for param, system, code, _text in values:
                    if code is not None:
                        codes.setdefault((resource_type, param, code), []).append((rid, system))

    def remove(self, rid: int, tables: Sequence[str] | None = None) -> None:
        """Drop a resource's rows from ``tables`` (None: all): it is written again, or
        deleted."""
        if tables is None:
            tables = _ALL_TABLES
        for table in tables:
            self.stale.setdefault(table, []).append(rid)
        if rid in self.rids:  # written earlier in this commit: rows may still be here
            for table in tables:
                if table in self.rows:
                    self.rows[table] = [row for row in self.rows[table] if row[0] != rid]
            if "token" in tables:
                for key, found in self.codes.items():
                    self.codes[key] = [hit for hit in found if hit[0] != rid]

    def match(self, plan: SearchPlan) -> dict[int, str] | None:
        """The pending resources (rid → id) that match ``plan``, when it is one a
        conditional write usually carries (token equalities such as
        ``identifier=system|value``, AND-ed); None for any other plan."""
        if len(plan.resource_types) != 1 or not plan.clauses or plan.access is not None:
            return None  # an access filter needs the searcher, not this in-memory match
        resource_type = plan.resource_types[0]
        matched: set[int] | None = None
        for clause in plan.clauses:
            if not plain_token(clause):
                return None
            hits: set[int] = set()
            for c in clause.criteria:
                for param in clause.index_params:
                    hits.update(rid for rid, system
                                in self.codes.get((resource_type, param, c.code), ())
                                if system_matches(c, system))
            matched = hits if matched is None else matched & hits
        return {rid: self.rids[rid] for rid in matched or ()}

    def bulk_parameters(self, conn: sqlite3.Connection) -> tuple[str | None, ...] | None:
        """Empty the pending changes: those of the tables listed in ``_BULK`` as the
        parameters of one ``_BULK_APPLY`` statement (per table a JSON array of the rids
        whose rows go, and one of the rows to insert; None: nothing), or None when there
        is nothing; the others (numbers: a float's JSON text need not come back as the
        same double) applied now."""
        parameters: dict[str, str] = {}
        for table, rids in self.stale.items():
            if table in _BULK:
                parameters[f"d_{table}"] = orjson.dumps(rids).decode()
            else:
                conn.execute(_BULK_DELETE[table], (orjson.dumps(rids).decode(),))
        self.stale = {}
        for table, values in self.rows.items():
            if values and table in _BULK:
                parameters[f"i_{table}"] = orjson.dumps(values).decode()
        self.rows = {t: v for t, v in self.rows.items() if t not in _BULK}
        self.flush(conn)
        if not parameters:
            return None
        return tuple(parameters.get(column) for column in _BULK_COLUMNS)

    def flush(self, conn: sqlite3.Connection) -> None:
        """Apply the pending changes now."""
        for table, rids in self.stale.items():
            conn.execute(_BULK_DELETE[table], (orjson.dumps(rids).decode(),))
        self.stale = {}
        for table, values in self.rows.items():
            if not values:
                continue
            if table == "text":
                conn.executemany(
                    "INSERT INTO idx_text (rowid, narrative, content) VALUES (?, ?, ?)", values)
                continue
            columns = INDEX_TABLES[table]
            marks = ", ".join("?" * (len(columns) + 3))
            conn.executemany(
                f"INSERT INTO idx_{table} (rid, type, param, {', '.join(columns)}) "
                f"VALUES ({marks})", values)
        self.rows.clear()
        self.rids.clear()
        self.codes.clear()


def _bulk_insert(table: str) -> str:
    columns = ["rowid", "narrative", "content"] if table == "text" else \
        ["rid", "type", "param", *INDEX_TABLES[table]]
    values = ", ".join(f"value ->> {i}" for i in range(len(columns)))
    return f"INSERT INTO idx_{table} ({', '.join(columns)}) SELECT {values} FROM json_each(?)"


# Index tables whose rows hold only text and integers: inserted in bulk from JSON.
_BULK = {table: _bulk_insert(table)
         for table in ("string", "token", "reference", "uri", "date", "text")}
_ALL_TABLES = (*INDEX_TABLES, "text")


def _digest(index: IndexRows) -> bytes:
    """Eight bytes per index table (``_ALL_TABLES`` order) identifying a resource's rows
    in it: an update compares them to the stored ones to skip the tables it leaves as
    they were. Computed on updates only; NULL (every table rewritten) after a create."""
    rows = index.rows
    return b"".join(
        hashlib.blake2b(orjson.dumps(rows[t]), digest_size=8).digest() if rows.get(t)
        else bytes(8) for t in _ALL_TABLES)


def _changed_tables(old: bytes | None, new: bytes | None) -> Sequence[str]:
    if old is None or new is None or len(old) != len(new):
        return _ALL_TABLES
    return [t for i, t in enumerate(_ALL_TABLES) if old[i * 8:i * 8 + 8] != new[i * 8:i * 8 + 8]]


# The rows of the resources whose rids a JSON array lists, per table.
_BULK_DELETE = {
    **{table: f"DELETE FROM idx_{table} WHERE rid IN (SELECT value FROM json_each(?))"
       for table in INDEX_TABLES},
    "text": "DELETE FROM idx_text WHERE rowid IN (SELECT value FROM json_each(?))",
}

# A batch's bulk index changes in one statement: an INSERT into a view whose INSTEAD OF
# trigger runs every table's delete, then every table's insert (json_each(NULL) is
# empty). The writer thread runs it and the COMMIT with the GIL released; as separate
# statements (a dozen for a lab result's resources) it took the GIL back after each one,
# waiting up to a switch interval every time while the event loop was busy, which
# doubled the time a batch held the write connection. TEMP objects: per connection,
# created when it opens, never stored in the file.
_BULK_COLUMNS = (*(f"d_{t}" for t in _BULK), *(f"i_{t}" for t in _BULK))
_BULK_VIEW = (f"CREATE TEMP VIEW IF NOT EXISTS bulk_index ({', '.join(_BULK_COLUMNS)}) AS "
              f"SELECT {', '.join('NULL' for _ in _BULK_COLUMNS)}")
_BULK_TRIGGER = (
    "CREATE TEMP TRIGGER IF NOT EXISTS bulk_index_apply INSTEAD OF INSERT ON bulk_index "
    "BEGIN "
    + " ".join(_BULK_DELETE[t].replace("json_each(?)", f"json_each(NEW.d_{t})") + ";"
               for t in _BULK)
    + " ".join(_BULK[t].replace("json_each(?)", f"json_each(NEW.i_{t})") + ";" for t in _BULK)
    + " END")
_BULK_APPLY = (f"INSERT INTO bulk_index ({', '.join(_BULK_COLUMNS)}) "
               f"VALUES ({', '.join('?' for _ in _BULK_COLUMNS)})")


def _finish(conn: sqlite3.Connection, bulk: Sequence[str | None] | None,
            checkpointer: _Checkpointer | None = None) -> None:
    """The end of a batch, in the writer thread: the bulk index changes, then COMMIT."""
    if bulk is not None:
        conn.execute(_BULK_APPLY, bulk)
    conn.execute("COMMIT")
    if checkpointer is not None:
        checkpointer.committed()


# The most units of work one group commit takes; more wait for the next batch. Many
# clients writing at once otherwise move as one convoy: every unit lands in one batch,
# the loop has nothing to do while the writer thread commits it, and the writer idles
# while the loop answers them all and stages their next writes. Split, one group's
# commit overlaps the next group's staging. 16 units already spread a commit's fixed
# cost thin. Measured with bench/fhir_crud.py (32 connections, 10 s, interleaved runs):
# create median 1,315 -> 1,618/s (every capped run above every uncapped one), update
# 1,332 -> 1,407/s, the event loop busy 80% -> 86-91% of the time; caps of 8 (more
# commits) and 24 did worse; halving whatever is pending did not help (batches shrink).
MAX_BATCH = 16


class _BatchChain:
    """Group-commit batches, one after the other, while units are pending.

    On the loop, a batch (at most ``MAX_BATCH`` units) is taken, applied, and handed to the writer
    thread (bulk index statement and COMMIT); the writer's last act is to queue ``_done`` on the
    loop, which answers the batch, runs the writer's WAL top-up when due, and starts the next batch
    right there: one trip through the loop's queue between two batches. ``done`` resolves when the
    chain stops (nothing pending, a maintenance write waiting for the gate, or the flusher
    cancelled); the flusher holds the write gate until then.
    """

    def __init__(self, store: SQLiteStore):
        self.store = store
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.stopping = False
        self._step(self._next)

    def _step(self, step: Callable[..., None], *args: Any) -> None:
        """Run one step of the chain on the loop. An unexpected failure ends the chain
        (the flusher logs it and goes on with what is pending) instead of leaving the
        write gate held by a chain that no callback will continue."""
        try:
            step(*args)
        except BaseException as exc:
            if not self.done.done():
                self.done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    def _next(self) -> None:
        store = self.store
        if self.stopping or not store._pending or store._gate_waiters:
            if not self.done.done():
                self.done.set_result(None)
            return
        batch, store._pending = store._pending[:MAX_BATCH], store._pending[MAX_BATCH:]
        try:
            conn = store.writer_conn  # raises once the store is closed
            outcomes, bulk = store._begin_batch(conn, batch)
        except BaseException as exc:  # the transaction failed: everyone gets it
            store._fail(batch, exc)
            if not isinstance(exc, Exception):
                self.done.set_exception(exc)
                return
            self.loop.call_soon(self._step, self._next)  # a turn, not a deep recursion
            return
        if store._writer is None:  # in-memory store: no writer thread
            self.loop.call_soon(self._step, self._done, batch, outcomes,
                                self._finish(conn, bulk))
            return
        try:
            store._writer.submit(self._commit_in_writer, conn, bulk, batch, outcomes)
        except RuntimeError as exc:  # the store closed meanwhile
            store._rollback(conn)
            store._fail(batch, exc)
            self.done.set_exception(exc)

    def _finish(self, conn: sqlite3.Connection, bulk: Sequence[str | None] | None
                ) -> BaseException | None:
        try:
            _finish(conn, bulk, self.store._checkpointer)
        except BaseException as exc:
            return exc
        return None

    def _commit_in_writer(self, conn: sqlite3.Connection, bulk: Sequence[str | None] | None,
                          batch: Sequence[_Submitted], outcomes: list[BaseException | None]
                          ) -> None:
        error = self._finish(conn, bulk)
        self.loop.call_soon_threadsafe(self._step, self._done, batch, outcomes, error)

    def _done(self, batch: Sequence[_Submitted], outcomes: list[BaseException | None],
              error: BaseException | None) -> None:
        store = self.store
        if error is not None:
            store._rollback(store.writer_conn)
            store._fail(batch, error)
            if not isinstance(error, Exception):
                self.done.set_exception(error)
                return
        else:
            try:
                store._settle(batch, outcomes)
            except BaseException as exc:  # committed: only those not yet answered get it
                for unit in batch:
                    if not unit.future.done():
                        unit.future.set_exception(exc)
                raise
        # The batch is answered; a WAL top-up now delays only the next one, whose units
        # are still being staged meanwhile.
        checkpointer = store._checkpointer
        if checkpointer is not None and checkpointer.rewind and store._writer is not None:
            try:
                store._writer.submit(self._top_up_in_writer, checkpointer, store.writer_conn)
                return
            except RuntimeError:  # the store closed meanwhile: nothing more to commit
                pass
        self._next()

    def _top_up_in_writer(self, checkpointer: _Checkpointer, conn: sqlite3.Connection
                          ) -> None:
        try:
            checkpointer.top_up(conn)
        finally:
            self.loop.call_soon_threadsafe(self._step, self._next)


class _Checkpointer:
    """WAL checkpoints in a thread of their own.

    SQLite's automatic checkpoint runs inside the COMMIT that crosses its threshold: that
    commit copies a thousand pages into the database file and fsyncs it, and every
    request waiting on it waits too (measured: COMMITs of 25-340 ms, p99 of updates
    60-600 ms). Here the writer commits without checkpointing, and this thread, on its
    own connection, checkpoints (PASSIVE: never blocking the writer or readers) at most
    every ``PAUSE`` seconds while commits come in.

    A background checkpoint cannot empty the WAL by itself: SQLite starts writing it from
    the beginning again only when a write transaction begins with every frame copied,
    and the writer keeps appending. So once the WAL holds ``RESTART_FRAMES`` or more and
    a background pass has left at most ``TOP_UP_FRAMES`` uncopied, the writer, after
    its next COMMIT (once that batch is answered: the copy, 2-5 ms with its fsync,
    delays only the next batch), checkpoints the few frames left itself (this thread
    stands aside meanwhile, or the two would keep taking the checkpoint lock from each
    other); its next transaction then rewinds the WAL, which stays a few tens of MB.
    """

    # A pass copies every page changed since the last; pages written again and again
    # (index roots, the current batch's neighbours) are copied once per pass, so fewer
    # passes copy less: 0.25 s took the thread from ~20 to ~10 µs per write under update
    # load (0.05 s before), the WAL growing by a few MB more between passes.
    PAUSE = 0.25
    RESTART_FRAMES = 8192  # 32 MiB of 4 KiB pages
    TOP_UP_FRAMES = 512

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.rewind = False  # set here, acted on by the writer (see committed)
        self.thread = threading.Thread(target=self._run, name="sqlite-checkpoint",
                                       daemon=True)
        self.thread.start()

    def committed(self) -> None:
        """After a COMMIT: a background pass is due."""
        self.wake.set()

    def top_up(self, conn: sqlite3.Connection) -> None:
        """The writer, once its batch is answered, copies what a background pass left
        (while ``rewind`` is set), so that its next transaction rewinds the WAL."""
        if self.rewind:
            try:
                busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error as exc:  # never fails the commit that went through
                log.warning("WAL checkpoint failed: %s", exc)
                self.rewind = False  # the background passes take over again
            else:
                # Done once every frame is copied; while another checkpoint holds the lock
                # (busy) or a reader pins older frames, try again after the next commit.
                self.rewind = bool(busy) or copied < frames
        self.wake.set()

    def _run(self) -> None:
        while True:
            self.wake.wait()
            if self.stopping.is_set():
                return
            self.wake.clear()
            if self.rewind:
                continue  # the writer is finishing one: holding the lock would stop it
            try:
                _busy, frames, copied = self.conn.execute(
                    "PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error as exc:
                log.warning("WAL checkpoint failed: %s", exc)
            else:
                # The writer tops up only a pass that left little to copy (a stall of a
                # few ms), unless the WAL grew far past the mark: then it copies whatever
                # is left, to keep the file bounded.
                self.rewind = frames >= self.RESTART_FRAMES and copied > 0 and (
                    frames - copied <= self.TOP_UP_FRAMES or frames >= 4 * self.RESTART_FRAMES)
            self.stopping.wait(self.PAUSE)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
        self.thread.join()
        self.conn.close()


@dataclass(slots=True)
class _Submitted:
    """A unit of work waiting for the group commit."""

    writes: Sequence[StagedWrite]
    documents: Sequence[StagedDocument]
    events: Sequence[OutboxEvent]
    callbacks: Sequence[Callable[[Staging], None]]
    future: asyncio.Future[None]


def _safe(field: str) -> str:
    if not field.replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"invalid document field name {field!r}")
    return field


def _stored(row: tuple[Any, ...]) -> StoredResource:
    seq = row[7] if len(row) > 7 else 0
    return StoredResource(row[0], row[1], row[2], row[3], bool(row[4]), bytes(row[5]), row[6],
                          seq)
