"""The audit log on MongoDB: one collection per month of ``recorded``.

``audit_log_YYYY_MM`` holds the entries recorded in that month (``_id`` the AuditEvent's
id, ``recorded``, ``logged``, ``action``, ``outcome``, ``keys``, ``body``), indexed on
``(keys, recorded, _id)`` (one key's entries in date order, as on SQLite),
``(recorded, _id)`` and ``logged``. Time partitions because retention then drops whole
collections (cheap, no write load on the clinical collections), and a search in date
order reads the months in turn, stopping once the page is full. Appends never touch the
clinical collections or their transactions.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from typing import Any

from pymongo import ASCENDING, DESCENDING

from fhir_server.audit_log.entry import Entry
from fhir_server.audit_log.port import Found, LogPage
from fhir_server.audit_log.query import LogQuery, Prefix
from fhir_server.search.plan import Cursor

PREFIX = "audit_log_"
_ORDER = {"recorded": ("recorded", "_id"), "logged": ("logged", "_id"), "id": ("_id",)}
_INDEXES = ([("keys", ASCENDING), ("recorded", ASCENDING), ("_id", ASCENDING)],
            [("recorded", ASCENDING), ("_id", ASCENDING)], [("logged", ASCENDING)])


def partition_of(recorded: str) -> str:
    return f"{PREFIX}{recorded[:4]}_{recorded[5:7]}"


def _bounds(name: str) -> tuple[str, str]:
    """The ``recorded`` range ``[start, end)`` of a partition."""
    year, month = int(name[len(PREFIX):len(PREFIX) + 4]), int(name[-2:])
    after = (year + 1, 1) if month == 12 else (year, month + 1)
    return (f"{year:04d}-{month:02d}-01T00:00:00.000000Z",
            f"{after[0]:04d}-{after[1]:02d}-01T00:00:00.000000Z")


class MongoAuditLog:
    """The log in ``store``'s database (``store.db``, available once the store is open)."""

    def __init__(self, store: Any):
        self.store = store
        self._indexed: set[str] = set()

    async def open(self) -> None:
        self._indexed.clear()

    async def close(self) -> None:
        return None

    async def partitions(self) -> list[str]:
        names = await self.store.db.list_collection_names()
        return sorted(n for n in names if n.startswith(PREFIX) and len(n) == len(PREFIX) + 7)

    async def _collection(self, name: str) -> Any:
        collection = self.store.db[name]
        if name not in self._indexed:
            for keys in _INDEXES:
                await collection.create_index(keys)
            self._indexed.add(name)
        return collection

    # -- writing ---------------------------------------------------------------------------
    async def append(self, entries: Sequence[Entry]) -> None:
        by_month: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            by_month.setdefault(partition_of(entry.recorded), []).append({
                "_id": entry.id, "recorded": entry.recorded, "logged": entry.logged,
                "action": entry.action, "outcome": entry.outcome, "type": entry.type,
                "keys": list(entry.keys),
                "body": entry.body})
        for name, documents in by_month.items():
            await (await self._collection(name)).insert_many(documents, ordered=False)

    async def purge(self, before: str, logged_before: str) -> int:
        purged = 0
        for name in await self.partitions():
            start, end = _bounds(name)
            if start >= before:
                break
            collection = self.store.db[name]
            late = await collection.count_documents({"logged": {"$gte": logged_before}})
            if end <= before and not late:  # the whole month is past: the collection goes
                purged += await collection.count_documents({})
                await collection.drop()
                self._indexed.discard(name)
            else:
                purged += (await collection.delete_many(
                    {"recorded": {"$lt": before}, "logged": {"$lt": logged_before}})
                ).deleted_count
        return purged

    # -- reading ---------------------------------------------------------------------------
    async def get(self, entry_id: str) -> Found | None:
        for name in reversed(await self.partitions()):  # the recent first
            found = await self.store.db[name].find_one({"_id": entry_id})
            if found is not None:
                return Found(found["_id"], found["logged"], bytes(found["body"]))
        return None

    async def oldest(self) -> str | None:
        for name in await self.partitions():
            found = await self.store.db[name].find_one({}, sort=[("recorded", ASCENDING)])
            if found is not None:
                return str(found["recorded"])
        return None

    async def search(self, query: LogQuery) -> LogPage:
        if query.nothing or query.access == []:
            return LogPage([], 0 if query.total else None)
        order = _ORDER[query.order]
        found = _filter(query)
        partitions = [n for n in await self.partitions() if _overlaps(n, query)]
        total = None
        if query.total:
            total = 0
            for name in partitions:
                total += await self.store.db[name].count_documents(found)
        paged = found
        if query.cursor is not None:
            paged = {"$and": [found, _after(order, query.cursor.key, query.descending)]}
        direction = DESCENDING if query.descending else ASCENDING
        sort = [(field, direction) for field in order]
        wanted = query.offset + query.count + 1
        if query.descending:
            partitions.reverse()
        runs: list[list[dict[str, Any]]] = []
        for name in partitions:
            run = await self.store.db[name].find(paged, sort=sort, limit=wanted).to_list(
                wanted)
            runs.append(run)
            # months are disjoint ranges of recorded: in that order, a full page ends it
            if query.order == "recorded" and sum(len(r) for r in runs) >= wanted:
                break

        def sort_key(document: dict[str, Any]) -> tuple[Any, ...]:
            return tuple(document[f] for f in order)

        merged = list(heapq.merge(*runs, key=sort_key, reverse=query.descending))
        page = merged[query.offset:query.offset + query.count + 1]
        more = len(page) > query.count
        page = page[:query.count]
        next_cursor = Cursor(sort_key(page[-1])) if more and page else None
        return LogPage([Found(d["_id"], d["logged"], bytes(d["body"])) for d in page],
                       total, next_cursor)


def _overlaps(name: str, query: LogQuery) -> bool:
    start, end = _bounds(name)
    for found in query.ranges:
        if found.column != "recorded":
            continue
        if found.low is not None and found.low >= end:
            return False
        if found.high is not None and found.high <= start:
            return False
    return True


def _after(order: tuple[str, ...], key: Sequence[Any], descending: bool) -> dict[str, Any]:
    """Past a cursor's position in keyset order."""
    op = "$lt" if descending else "$gt"
    alternatives = []
    for i, field in enumerate(order):
        same = {order[j]: key[j] for j in range(i)}
        alternatives.append({**same, field: {op: key[i]}})
    return {"$or": alternatives}


def _any(group: tuple[str, ...]) -> list[Any]:
    """A group's members for ``$in``: keys, and anchored expressions for prefixes."""
    return [re.compile("^" + re.escape(k)) if isinstance(k, Prefix) else k for k in group]


def _filter(query: LogQuery) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"keys": {"$in": _any(g)}} for g in query.groups]
    parts += [{"keys": {"$nin": _any(g)}} for g in query.excluded]
    for found in query.ranges:
        bounds = {}
        if found.low is not None:
            bounds["$gte"] = found.low
        if found.high is not None:
            bounds["$lt"] = found.high
        if bounds:
            parts.append({found.column: bounds})
    for column, values, negate in query.columns:
        parts.append({column: {"$nin" if negate else "$in": _any(values)}})
    parts += [{"_id": {"$in": list(ids)}} for ids in query.ids]
    if query.access is not None:
        parts.append({"$or": [{"$and": [{"keys": {"$in": _any(g)}} for g in groups]}
                              for groups in query.access]})
    return {"$and": parts} if parts else {}
