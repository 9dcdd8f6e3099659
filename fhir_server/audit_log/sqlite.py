"""The audit log on SQLite: a database file of its own beside the store's.

Its own file, its own write connection and its own writer thread: appending never waits
for the clinical writer's lock, commits or WAL checkpoints, nor makes them wait. Two
tables:

- ``entries``: one row per AuditEvent (``seq`` in append order, ``id``, ``recorded``,
  ``logged``, ``action``, ``outcome``, its keys, the JSON text), indexed on ``id`` and
  ``(recorded, seq)`` only (``_lastUpdated`` is a filter: what is appended pays for
  no index it does not need);
- ``entry_keys``: ``(key, recorded, seq)``, the primary key itself (``WITHOUT ROWID``):
  the events of one key (a patient, a resource, a user, an organization...) come out in
  date order from one index range, which is how every audit query pages.

A query walks one key group (:attr:`LogQuery.driver`, the most selective) in date
order and checks the others by primary-key lookups; without keys it walks
``(recorded, seq)``. An append is one transaction of a few inserts per entry.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from fhir_server.audit_log.entry import Entry
from fhir_server.audit_log.port import Found, LogPage
from fhir_server.audit_log.query import LogQuery, Prefix
from fhir_server.search.plan import Cursor

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    recorded TEXT NOT NULL,
    logged TEXT NOT NULL,
    action TEXT NOT NULL,
    outcome TEXT NOT NULL,
    type TEXT NOT NULL,
    keys TEXT NOT NULL,  -- the entry's keys (a JSON array): entry_keys is made from it
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_recorded ON entries (recorded, seq);
CREATE TABLE IF NOT EXISTS entry_keys (
    key TEXT NOT NULL,
    recorded TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (key, recorded, seq)
) WITHOUT ROWID;
"""
_ORDER = {"recorded": ("recorded", "seq"), "logged": ("logged", "seq"), "id": ("id",)}
PURGE_CHUNK = 5000
CACHE_MB = 64  # page cache of each connection
PAGE_SIZE = 16384


def log_path(store_path: str) -> str:
    """``<store>-audit.db`` beside the store's file (``:memory:`` stays in memory)."""
    if store_path == ":memory:":
        return store_path
    path = Path(store_path)
    return str(path.with_name(f"{path.stem}-audit{path.suffix or '.db'}"))


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    # before the file has a page: 16 KiB pages, a quarter of the WAL frames (one write
    # each) per entry appended that 4 KiB pages took (measured: the commit's CPU 15-20 →
    # 5-8 µs an entry)
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA temp_store=MEMORY")
    # the key index takes inserts all over (one key per patient, user, request...): its
    # upper pages stay cached
    conn.execute(f"PRAGMA cache_size=-{CACHE_MB * 1024}")
    return conn


class SQLiteAuditLog:
    def __init__(self, path: str):
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._writer_conn: sqlite3.Connection | None = None
        self._writer: ThreadPoolExecutor | None = None

    async def open(self) -> None:
        if self._conn is not None:
            return
        if self.path != ":memory:":
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))  # like the store's
        conn = _connect(self.path)
        for attempt in range(100):
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:  # two processes making the file
                if "locked" not in str(exc) or attempt == 99:
                    raise
                await asyncio.sleep(0.05)
        conn.executescript(_SCHEMA)
        self._conn = conn
        if self.path == ":memory:":
            self._writer_conn = conn
        else:
            self._writer_conn = _connect(self.path)
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="audit-log-writer")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self._writer_conn is not None and self._writer_conn is not self._conn:
            self._writer_conn.close()
        if self._conn is not None:
            self._conn.close()
        self._conn = self._writer_conn = None

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the audit log is not open")
        return self._conn

    async def _in_writer(self, work: Any, *args: Any) -> Any:
        if self._writer_conn is None:
            raise RuntimeError("the audit log is not open")
        if self._writer is None:
            return work(self._writer_conn, *args)
        return await asyncio.get_running_loop().run_in_executor(
            self._writer, work, self._writer_conn, *args)

    # -- writing ---------------------------------------------------------------------------
    async def append(self, entries: Sequence[Entry]) -> None:
        if entries:
            await self._in_writer(_append, list(entries))

    async def purge(self, before: str, logged_before: str) -> int:
        purged = 0
        while True:
            gone = await self._in_writer(_purge_chunk, before, logged_before)
            purged += gone
            if gone < PURGE_CHUNK:
                return purged

    # -- reading ---------------------------------------------------------------------------
    async def get(self, entry_id: str) -> Found | None:
        row = self.conn.execute("SELECT id, logged, body FROM entries WHERE id = ?",
                                (entry_id,)).fetchone()
        return Found(row[0], row[1], row[2]) if row else None

    async def oldest(self) -> str | None:
        row = self.conn.execute("SELECT min(recorded) FROM entries").fetchone()
        return row[0] if row else None

    async def search(self, query: LogQuery) -> LogPage:
        if query.nothing or query.access == []:
            return LogPage([], 0 if query.total else None)
        sql, args, order = _compile(query)
        total = None
        if query.total:
            total = self.conn.execute(f"SELECT count(*) FROM ({sql})", args).fetchone()[0]
        direction = "DESC" if query.descending else "ASC"
        where, where_args = "", []
        if query.cursor is not None:
            columns = ", ".join(order)
            marks = ", ".join("?" * len(order))
            where = f"WHERE ({columns}) {'<' if query.descending else '>'} ({marks})"
            where_args = list(query.cursor.key)
        page = self.conn.execute(
            f"SELECT id, logged, body, {', '.join(order)} FROM ({sql}) {where} "
            f"ORDER BY {', '.join(f'{c} {direction}' for c in order)} LIMIT ? OFFSET ?",
            [*args, *where_args, query.count + 1, query.offset]).fetchall()
        more = len(page) > query.count
        page = page[:query.count]
        next_cursor = Cursor(tuple(page[-1][3:])) if more and page else None
        return LogPage([Found(r[0], r[1], r[2]) for r in page], total, next_cursor)


def _append(conn: sqlite3.Connection, entries: list[Entry]) -> None:
    """One transaction: the entries (one statement run for all), then their keys in one
    statement SQLite runs by itself from each entry's key list (``json_each``): the
    writer thread binds a handful of values an entry, not one per key, so it hardly
    holds the interpreter's lock while the requests need it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        last = conn.execute("SELECT coalesce(max(seq), 0) FROM entries").fetchone()[0]
        conn.executemany(
            "INSERT INTO entries (id, recorded, logged, action, outcome, type, keys, body) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(e.id, e.recorded, e.logged, e.action, e.outcome, e.type,
              orjson.dumps(e.keys).decode(), e.body) for e in entries])
        conn.execute("INSERT OR IGNORE INTO entry_keys (key, recorded, seq) "
                     "SELECT k.value, e.recorded, e.seq FROM entries e, json_each(e.keys) k "
                     "WHERE e.seq > ?", (last,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _purge_chunk(conn: sqlite3.Connection, before: str, logged_before: str) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        seqs = [r[0] for r in conn.execute(
            "SELECT seq FROM entries WHERE recorded < ? AND logged < ? ORDER BY seq LIMIT ?",
            (before, logged_before, PURGE_CHUNK))]
        if seqs:
            chunk = "e.seq BETWEEN ? AND ? AND e.recorded < ? AND e.logged < ?"
            args = (seqs[0], seqs[-1], before, logged_before)
            conn.execute("DELETE FROM entry_keys WHERE (key, recorded, seq) IN ("
                         "SELECT k.value, e.recorded, e.seq FROM entries e, "
                         f"json_each(e.keys) k WHERE {chunk})", args)
            conn.execute(f"DELETE FROM entries AS e WHERE {chunk}", args)
        conn.execute("COMMIT")
        return len(seqs)
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _in(values: Sequence[str]) -> str:
    return f"IN ({', '.join('?' * len(values))})"


def _matches(column: str, group: tuple[str, ...], args: list[Any]) -> str:
    """``column`` is one of the group's keys, or starts with one of its prefixes."""
    exact = [k for k in group if not isinstance(k, Prefix)]
    tests = []
    if exact:
        tests.append(f"{column} {_in(exact)}")
        args.extend(exact)
    for prefix in group:
        if isinstance(prefix, Prefix):
            tests.append(f"({column} >= ? AND {column} < ?)")
            args.extend((prefix, prefix.end))
    return tests[0] if len(tests) == 1 else "(" + " OR ".join(tests) + ")"


def _compile(query: LogQuery) -> tuple[str, list[Any], tuple[str, ...]]:
    """The query's matches as one SELECT of ``id, logged, body`` and the order columns."""
    order = _ORDER[query.order]
    driver = query.driver if query.order == "recorded" else None
    where: list[str] = []
    args: list[Any] = []
    if driver is not None:
        source = ("entry_keys d JOIN entries e ON e.seq = d.seq "
                  "AND e.recorded = d.recorded")
        where.append(_matches("d.key", driver, args))
        at = "d"
    else:
        source, at = "entries e", "e"
    for found in query.ranges:
        column = f"{at}.recorded" if found.column == "recorded" else "e.logged"
        if found.low is not None:
            where.append(f"{column} >= ?")
            args.append(found.low)
        if found.high is not None:
            where.append(f"{column} < ?")
            args.append(found.high)

    def has(group: tuple[str, ...]) -> str:
        return (f"EXISTS (SELECT 1 FROM entry_keys k WHERE {_matches('k.key', group, args)} "
                "AND k.recorded = e.recorded AND k.seq = e.seq)")

    for group in query.groups:
        if group is not driver:
            where.append(has(group))
    for group in query.excluded:
        where.append("NOT " + has(group))
    for column, values, negate in query.columns:
        where.append(("NOT " if negate else "") + _matches(f"e.{column}", values, args))
    for ids in query.ids:
        where.append(f"e.id {_in(ids)}")
        args.extend(ids)
    if query.access is not None:
        alternatives = []
        for groups in query.access:
            alternatives.append(" AND ".join(
                "1" if group is driver else has(group) for group in groups))
        where.append("(" + " OR ".join(alternatives) + ")")
    # the order columns from the driving index when there is one: the rows come out in
    # its order, no sort
    columns = ", ".join(f"{at if c in ('recorded', 'seq') else 'e'}.{c} AS {c}"
                        for c in order if c not in ("id", "logged"))
    distinct = "DISTINCT " if driver is not None and (
        len(driver) > 1 or isinstance(driver[0], Prefix)) else ""
    select = f"SELECT {distinct}e.id AS id, e.logged AS logged, e.body AS body" + (
        f", {columns}" if columns else "")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"{select} FROM {source}{clause}", args, order
