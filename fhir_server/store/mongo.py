"""MongoDB adapter of the store port: the production system of record.

``HEALTHPLATFORM_STORE=mongodb://host1,host2,host3/healthplatform?replicaSet=rs0`` (any
option of a MongoDB connection string; the database is the URL's path, ``healthplatform``
when it has none). It uses PyMongo's native async API (``pymongo.AsyncMongoClient``).
What it stores, and its indexes and shard keys: :mod:`fhir_server.store.mongo_layout`;
how searches compile: :mod:`fhir_server.store.mongo_query` and
:mod:`fhir_server.store.mongo_search`.

Units of work: each commit is one multi-document transaction (its resource versions with
their index values, history, documents and outbox events; conditional creates and updates
resolved and If-Match checked inside it, where they see the transaction's own earlier
writes), run by the driver's ``with_transaction``, which retries the whole unit on a
write conflict with a concurrent transaction (``TransientTransactionError``) and the
commit when its outcome is unknown, as MongoDB recommends. Transactions need a replica set
(one node is enough) or a sharded cluster: ``open()`` asks the server which it is.

On a **standalone** server there are no transactions. A unit of work that writes several
resources (a transaction bundle, a facade writing more than one resource) is then refused
before anything is written (:class:`~fhir_server.store.port.TransactionsUnavailable`,
HTTP 501), never half-applied. Any other unit is applied in order within this process
(one at a time): everything that can refuse it (versions, conditions, unique fields, the
after-write callbacks) is decided before its first write; the resource's document is
replaced only if its version is still the one read (a concurrent process that won makes
it :class:`~fhir_server.store.port.ConditionChanged`); and if a later write of the unit
fails, what it had written is put back as it was. That is for development and trying it
out: production runs a replica set.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import orjson
from bson import ObjectId
from pymongo.errors import DuplicateKeyError, OperationFailure
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from fhir_server.audit_log.mongo import MongoAuditLog
from fhir_server.clock import now_instant
from fhir_server.search.plan import AccessGrant, SearchPlan
from fhir_server.store.includes import collect_includes
from fhir_server.store.mongo_access import access_filter
from fhir_server.store.mongo_layout import (
    COLLECTIONS,
    DOCUMENT_KEYS,
    DOCUMENTS,
    HISTORY,
    INDEXES,
    OUTBOX,
    RESOURCES,
    SHARD_KEYS,
    document_key,
    field_value,
    index_document,
    resource_key,
    sort_document,
    unique_keys,
    version_key,
)
from fhir_server.store.mongo_search import MongoIncludes, MongoSearch, stored
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
    StoredResource,
    StoreError,
    TransactionsUnavailable,
)
from fhir_server.store.unit_of_work import StagedDocument, StagedUnit, reset, run_callbacks
from fhir_server.store.writes import NEVER_WRITTEN, CurrentState, decide

log = logging.getLogger(__name__)

DEFAULT_DATABASE = "healthplatform"
_HISTORY_FIELDS = {"type": 1, "id": 1, "version": 1, "lastUpdated": 1, "deleted": 1,
                   "body": 1, "method": 1, "seq": 1}


def _connect(url: str) -> Any:
    from pymongo import AsyncMongoClient

    return AsyncMongoClient(url, tz_aware=False, appname="healthplatform")


def seq_number(seq: ObjectId) -> int:
    """A history ``seq`` (an ObjectId, increasing in write order) as the port's integer."""
    return int(str(seq), 16)


def seq_id(number: int) -> ObjectId:
    return ObjectId(f"{number:024x}"[-24:])


def _prefixed(found: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """A filter on resources rewritten for their documents joined under ``prefix``."""
    out: dict[str, Any] = {}
    for key, value in found.items():
        if key in ("$and", "$or", "$nor"):
            out[key] = [_prefixed(v, prefix) for v in value]
        elif key.startswith("$"):
            out[key] = value
        else:
            out[prefix + key] = value
    return out


class _Writes:
    """The writes of one unit: inside a transaction (``session``), or on a standalone
    server with what each write replaced remembered, so that a unit failing half-way is
    put back as it was (``undo``)."""

    def __init__(self, db: Any, session: Any, standalone: bool):
        self.db, self.session, self.standalone = db, session, standalone
        self._before: dict[tuple[str, Any], dict[str, Any] | None] = {}

    async def _remember(self, collection: str, key: Any, known: dict[str, Any] | None = None,
                        new: bool = False) -> None:
        if not self.standalone or (collection, key) in self._before:
            return
        if not new and known is None:
            known = await self.db[collection].find_one({"_id": key})
        self._before[(collection, key)] = known

    async def insert(self, collection: str, document: dict[str, Any]) -> None:
        await self._remember(collection, document["_id"], new=True)
        await self.db[collection].insert_one(document, session=self.session)

    async def insert_many(self, collection: str, documents: list[dict[str, Any]]) -> None:
        for document in documents:
            await self._remember(collection, document["_id"], new=True)
        await self.db[collection].insert_many(documents, session=self.session)

    async def replace(self, collection: str, found: dict[str, Any], document: dict[str, Any],
                      before: dict[str, Any] | None = None) -> bool:
        """Replace (or create: ``upsert``) the document ``found`` selects; False when none
        matched (a version it names changed)."""
        await self._remember(collection, document["_id"], before)
        result = await self.db[collection].replace_one(found, document, session=self.session,
                                                       upsert=before is None
                                                       and "version" not in found)
        return bool(result.matched_count or result.upserted_id is not None)

    async def delete(self, collection: str, key: Any) -> None:
        await self._remember(collection, key)
        await self.db[collection].delete_one({"_id": key}, session=self.session)

    async def delete_many(self, collection: str, found: dict[str, Any]) -> int:
        """Delete what ``found`` selects; how many went."""
        if self.standalone:
            async for doc in self.db[collection].find(found):
                await self._remember(collection, doc["_id"], doc)
        result = await self.db[collection].delete_many(found, session=self.session)
        return int(result.deleted_count)

    async def undo(self) -> None:
        """Put back what this unit wrote (standalone), newest first; best effort."""
        for (collection, key), before in reversed(list(self._before.items())):
            try:
                if before is None:
                    await self.db[collection].delete_one({"_id": key})
                else:
                    await self.db[collection].replace_one({"_id": key}, before, upsert=True)
            except Exception:  # the server went away: nothing more can be done here
                log.exception("could not undo a write to %s %s", collection, key)


class MongoUnitOfWork(StagedUnit):
    """A unit of work committed as one MongoDB transaction (see the module docstring)."""

    def __init__(self, store: MongoStore):
        super().__init__()
        self._store = store

    async def submit(self) -> None:
        await self._store.submit(self)


class MongoStore:
    """The store on MongoDB. ``client_factory(url)`` makes the client (an
    ``AsyncMongoClient``; the tests give an in-process stand-in with the same surface)."""

    client_factory: ClassVar[Callable[[str], Any]] = staticmethod(_connect)
    PURGE_CHUNK = 500

    def __init__(self, url: str, *, unique_document_fields: Mapping[str, Iterable[str]]
                 | None = None):
        self.url = url
        self._unique = {c: tuple(f) for c, f in (unique_document_fields or {}).items()}
        self._outbox_listeners: list[Any] = []
        self._client: Any = None
        self._db: Any = None
        self.transactions = False  # a replica set or a sharded cluster: set by open()
        self.sharded = False
        self._standalone_gate = asyncio.Lock()
        self.audit_log = MongoAuditLog(self)  # AuditEvent's home (fhir_server.audit_log)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> MongoStore:
        if not url.startswith(("mongodb://", "mongodb+srv://")):
            raise ValueError(f"not a MongoDB URL: {url!r}")
        return cls(url, **kwargs)

    # -- lifecycle ---------------------------------------------------------------------
    async def open(self) -> None:
        self._client = type(self).client_factory(self.url)
        self._db = self._client.get_default_database(DEFAULT_DATABASE)
        hello = await self._client.admin.command("hello")
        self.sharded = hello.get("msg") == "isdbgrid"
        self.transactions = self.sharded or "setName" in hello
        if not self.transactions:
            log.warning("MongoDB at %s is a standalone server: units of work writing "
                        "several resources (transaction bundles) are refused; run a "
                        "replica set (see README)", self.database_name)
        await self.ensure_collections()
        await self.audit_log.open()

    async def close(self) -> None:
        await self.audit_log.close()
        if self._client is not None:
            await self._client.close()
            self._client = self._db = None

    @property
    def db(self) -> Any:
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    @property
    def client(self) -> Any:
        if self._client is None:
            raise RuntimeError("store is not open")
        return self._client

    @property
    def database_name(self) -> str:
        return str(self.db.name)

    @property
    def topology(self) -> str:
        """What the server is, as the tests and ``mongo-init`` report it."""
        if getattr(self._client, "is_fake", False):
            return "in-process fake (mongomock, standalone)"
        if self.sharded:
            return "sharded cluster"
        return "replica set" if self.transactions else "standalone server"

    async def ensure_collections(self) -> None:
        """Create the collections and every index, idempotently (at each start; a
        transaction cannot create a collection on every server version)."""
        existing = set(await self.db.list_collection_names())
        for name in COLLECTIONS:
            if name not in existing:
                try:
                    await self.db.create_collection(name)
                except OperationFailure as exc:
                    if exc.code != 48:  # NamespaceExists: another process made it first
                        raise
            await self.db[name].create_indexes(list(INDEXES[name]))

    async def shard_collections(self) -> list[str]:
        """On a sharded cluster, shard every collection on its key (mongo-init)."""
        if not self.sharded:
            return []
        admin = self.client.admin
        done = []
        for name, key in SHARD_KEYS.items():
            try:
                await admin.command("shardCollection", f"{self.database_name}.{name}",
                                    key=dict(key))
            except OperationFailure as exc:
                if "already" not in str(exc):
                    raise
            done.append(name)
        return done

    def unit_of_work(self) -> MongoUnitOfWork:
        return MongoUnitOfWork(self)

    def set_unique_document_fields(self, collection: str, fields: Iterable[str]) -> None:
        self._unique[collection] = tuple(fields)

    def add_outbox_listener(self, callback: Any) -> None:
        self._outbox_listeners.append(callback)

    @property
    def searcher(self) -> MongoSearch:
        return MongoSearch(self.db[RESOURCES])

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
        doc = await self.db[HISTORY].find_one(
            {"_id": version_key(resource_type, id, version), "type": resource_type, "id": id},
            _HISTORY_FIELDS)
        if doc is None:
            raise ResourceNotFound(resource_type, id, str(version))
        if doc["deleted"]:
            raise ResourceGone(resource_type, id, doc["version"])
        return _version(doc)

    async def created_instants(self, resource_type: str, ids: Sequence[str]
                               ) -> dict[str, str]:
        found = self.db[HISTORY].find(
            {"type": resource_type, "version": 1, "id": {"$in": list(dict.fromkeys(ids))}},
            {"id": 1, "lastUpdated": 1})
        return {doc["id"]: doc["lastUpdated"] async for doc in found}

    async def read_current(self, resource_type: str, id: str) -> StoredResource | None:
        doc = await self.db[RESOURCES].find_one(
            {"_id": resource_key(resource_type, id), "type": resource_type, "id": id},
            {"ix": 0, "sort": 0})
        return stored(doc) if doc else None

    async def history(
        self, resource_type: str | None, id: str | None, *, since: str | None = None,
        at_or_before: str | None = None, count: int = 50, before_seq: int | None = None,
        access: Sequence[AccessGrant] | None = None,
    ) -> HistoryPage:
        found: dict[str, Any] = {}
        if resource_type is not None:
            found["type"] = resource_type
        if id is not None:
            found["id"] = id
        if since is not None or at_or_before is not None:
            found["lastUpdated"] = {**({"$gte": since} if since is not None else {}),
                                    **({"$lte": at_or_before} if at_or_before else {})}
        allowed = None if access is None else access_filter(
            access, None if resource_type is None else [resource_type])
        if allowed is not None:
            return await self._history_allowed(found, allowed, count, before_seq)
        history = self.db[HISTORY]
        total = await history.count_documents(found)
        if before_seq is not None:
            found["seq"] = {"$lt": seq_id(before_seq)}
        docs = await history.find(found, _HISTORY_FIELDS, sort=[("seq", -1)],
                                  limit=count).to_list(None)
        return HistoryPage([_version(d) for d in docs], total)

    async def _history_allowed(self, found: dict[str, Any], allowed: dict[str, Any],
                               count: int, before_seq: int | None) -> HistoryPage:
        """The versions of the resources the caller may read now (their index values are
        those of their current version: a deleted resource's history is an
        administrator's), joined to the current documents in one aggregation."""
        join: list[dict[str, Any]] = [
            {"$match": found},
            {"$lookup": {"from": RESOURCES, "localField": "rkey", "foreignField": "_id",
                         "as": "r"}},
            {"$unwind": "$r"},
            {"$match": {"r.deleted": False, **_prefixed(allowed, "r.")}},
        ]
        history = self.db[HISTORY]
        counted = await (await history.aggregate([*join, {"$count": "n"}])).to_list(None)
        page = [*join]
        if before_seq is not None:
            page.append({"$match": {"seq": {"$lt": seq_id(before_seq)}}})
        page += [{"$sort": {"seq": -1}}, {"$limit": count}, {"$project": _HISTORY_FIELDS}]
        docs = await (await history.aggregate(page)).to_list(None)
        return HistoryPage([_version(d) for d in docs], counted[0]["n"] if counted else 0)

    # -- units of work -------------------------------------------------------------------
    async def submit(self, unit: StagedUnit) -> None:
        """Apply a unit all or nothing (see the module docstring)."""
        if self.transactions:
            await self._in_transaction(lambda session: self._apply(unit, session, None))
        else:
            if len(unit.writes) > 1:
                raise TransactionsUnavailable(
                    f"This unit of work writes {len(unit.writes)} resources, which needs a "
                    "multi-document transaction; the MongoDB server is standalone "
                    "(transactions need a replica set: see the README, 'Running on MongoDB')")
            async with self._standalone_gate:
                writes = _Writes(self.db, None, standalone=True)
                try:
                    await self._apply(unit, None, writes)
                except BaseException:
                    await writes.undo()
                    reset(unit.writes)
                    raise
        if unit.events or unit.callbacks:
            for callback in self._outbox_listeners:
                callback()

    async def _in_transaction(self, work: Callable[[Any], Awaitable[None]]) -> None:
        async with self.client.start_session() as session:
            async def attempt(session: Any) -> None:
                await work(session)
            await session.with_transaction(
                attempt, read_concern=ReadConcern("snapshot"),
                write_concern=WriteConcern("majority"))

    async def _apply(self, unit: StagedUnit, session: Any, writes: _Writes | None) -> None:
        """Everything a unit staged: its resource writes, then its callbacks' staging,
        documents and events. Run again from the start when a transaction is retried."""
        reset(unit.writes)
        writes = writes or _Writes(self.db, session, standalone=False)
        instant = now_instant()
        for write in unit.writes:
            try:
                write.result = await self._apply_write(write, instant, writes)
            except StoreError as exc:
                exc.staged = write
                raise
        documents, events = run_callbacks(unit.callbacks, unit.documents, unit.events)
        if writes.standalone:
            await self._check_documents(documents)
        for document in documents:
            await self._apply_document(document, writes)
        if events:
            await writes.insert_many(OUTBOX, [
                {"_id": e.id, "topic": e.topic, "timestamp": e.timestamp,
                 "source_service": e.source_service, "payload": e.payload,
                 "dispatched": False} for e in events])

    async def _resolve_condition(self, w: StagedWrite, writes: _Writes
                                 ) -> StoredResource | None:
        """Settle a conditional write inside the commit, where it sees what the unit
        wrote before it. Returns the existing match when a conditional create must not
        write."""
        assert w.condition is not None
        ids = await self.searcher.match_ids(w.condition.plan, 2, writes.session)
        expected = w.condition.expected_ids
        if expected is not None and tuple(ids) != tuple(sorted(expected)):
            raise ConditionChanged(f"{w.resource_type}: the condition now matches {ids}")
        if len(ids) > 1:
            raise MultipleMatches(w.resource_type, len(ids))
        if not ids:
            return None
        if w.op == "create":
            w.existing = True
            doc = await self.db[RESOURCES].find_one(
                {"_id": resource_key(w.resource_type, ids[0])}, {"ix": 0, "sort": 0},
                session=writes.session)
            return stored(doc) if doc else None
        w.id = ids[0]  # conditional update: the match is the resource to update
        return None

    async def _apply_write(self, w: StagedWrite, instant: str, writes: _Writes
                           ) -> StoredResource:
        if w.condition is not None:
            existing = await self._resolve_condition(w, writes)
            if existing is not None:
                return existing
        key = resource_key(w.resource_type, w.id)
        # Standalone: the whole document, to put back if the unit fails later.
        projection = None if writes.standalone else {"ix": 0, "sort": 0}
        doc = await self.db[RESOURCES].find_one({"_id": key, "type": w.resource_type,
                                                 "id": w.id}, projection,
                                                session=writes.session)
        if w.op.startswith("expunge"):
            return await self._expunge(w, key, doc, writes)
        current = CurrentState(doc["version"], bool(doc["deleted"]), doc.get("digest")) \
            if doc else NEVER_WRITTEN
        new = decide(w, current, instant)
        if new is None:  # nothing to write (see fhir_server.store.writes)
            if w.op == "delete":
                return StoredResource(w.resource_type, w.id, current.version or 0, instant,
                                      True, b"", "DELETE")
            assert doc is not None
            return stored(doc)
        body = new.body.decode()
        ix = index_document(w.index) if not new.deleted else {}
        document = {
            "_id": key, "type": w.resource_type, "id": w.id,
            "rid": doc["rid"] if doc else ObjectId(), "version": new.version,
            "lastUpdated": instant, "deleted": new.deleted, "method": w.method,
            "body": body, "digest": new.content_digest, "ix": ix, "sort": sort_document(ix),
        }
        if doc is None:
            try:
                await writes.insert(RESOURCES, document)
            except DuplicateKeyError:
                if w.must_not_exist:
                    raise ResourceExists(w.resource_type, w.id) from None
                raise ConditionChanged(f"{key} was created meanwhile") from None
        elif not await writes.replace(RESOURCES, {"_id": key, "type": w.resource_type,
                                                  "id": w.id, "version": doc["version"]},
                                      document, before=doc):
            raise ConditionChanged(f"{key} changed meanwhile (version {doc['version']})")
        await writes.insert(HISTORY, {
            "_id": version_key(w.resource_type, w.id, new.version), "rkey": key,
            "type": w.resource_type, "id": w.id, "version": new.version,
            "lastUpdated": instant, "deleted": new.deleted, "method": w.method,
            "body": body, "seq": ObjectId()})
        return StoredResource(w.resource_type, w.id, new.version, instant, new.deleted,
                              new.body, w.method)

    async def _expunge(self, w: StagedWrite, key: str, doc: dict[str, Any] | None,
                       writes: _Writes) -> StoredResource:
        """``UnitOfWork.expunge``: the versions go from the history; erasing the current
        one too removes the resource document (with its index values)."""
        if doc is None:
            w.unchanged = True
            return StoredResource(w.resource_type, w.id, 0, now_instant(), True, b"", "DELETE")
        versions = {"type": w.resource_type, "id": w.id}
        if w.op == "expunge-history":
            erased = await writes.delete_many(HISTORY, {**versions,
                                                        "version": {"$lt": doc["version"]}})
            w.unchanged = erased == 0
            return stored(doc)
        await writes.delete(RESOURCES, key)
        await writes.delete_many(HISTORY, versions)
        return StoredResource(w.resource_type, w.id, doc["version"], now_instant(), True, b"",
                              "DELETE")

    # -- documents -----------------------------------------------------------------------
    async def _check_documents(self, documents: Sequence[StagedDocument]) -> None:
        """Standalone: refuse a unit whose documents would clash on an id or a unique
        value before writing anything (inside a transaction the server refuses it)."""
        for op, collection, doc_id, body in documents:
            if op == "insert" and await self.db[DOCUMENTS].find_one(
                    {"_id": document_key(collection, doc_id)}, {"_id": 1}) is not None:
                raise DuplicateDocument(f"{collection}: duplicate {doc_id}")
            if body is None:
                continue
            for key in unique_keys(collection, doc_id, body, self._unique.get(collection, ())):
                held = await self.db[DOCUMENT_KEYS].find_one({"_id": key["_id"]})
                if held is not None and held["doc"] != doc_id:
                    raise DuplicateDocument(f"{collection}: duplicate unique field")

    async def _apply_document(self, document: StagedDocument, writes: _Writes) -> None:
        op, collection, doc_id, body = document
        key = document_key(collection, doc_id)
        keys = self.db[DOCUMENT_KEYS]
        held = await keys.find({"c": collection, "doc": doc_id}, {"_id": 1},
                               session=writes.session).to_list(None)
        for old in held:
            await writes.delete(DOCUMENT_KEYS, old["_id"])
        if op == "delete":
            await writes.delete(DOCUMENTS, key)
            return
        assert body is not None
        try:
            if op == "insert":
                await writes.insert(DOCUMENTS, {"_id": key, "c": collection, "id": doc_id,
                                                "body": body})
            else:
                await writes.replace(DOCUMENTS, {"_id": key},
                                     {"_id": key, "c": collection, "id": doc_id, "body": body},
                                     before=await self._document(key, writes))
            for unique in unique_keys(collection, doc_id, body, self._unique.get(collection, ())):
                await writes.insert(DOCUMENT_KEYS, unique)
        except DuplicateKeyError as exc:
            raise DuplicateDocument(
                f"{collection}: duplicate {doc_id} or unique field") from exc

    async def _document(self, key: str, writes: _Writes) -> dict[str, Any] | None:
        if not writes.standalone:
            return None
        found: dict[str, Any] | None = await self.db[DOCUMENTS].find_one({"_id": key})
        return found

    async def get_document(self, collection: str, id: str) -> JSON | None:
        doc = await self.db[DOCUMENTS].find_one({"_id": document_key(collection, id)})
        return dict(doc["body"]) if doc else None

    async def _where(self, collection: str, where: Mapping[str, Any] | None
                     ) -> dict[str, Any]:
        found: dict[str, Any] = {"c": collection}
        for field, value in (where or {}).items():
            if field in self._unique.get(collection, ()) and value is not None:
                # Unique fields are looked up through their key (one _id lookup).
                held = await self.db[DOCUMENT_KEYS].find_one(
                    {"_id": f"{collection}\x1f{field}\x1f{field_value(value)}"})
                found.setdefault("$and", []).append({"id": held["doc"] if held else
                                                     {"$in": []}})
            else:
                found.setdefault("$and", []).append({f"body.{_safe(field)}": value})
        return found

    async def find_documents(
        self, collection: str, where: Mapping[str, Any] | None = None, *, limit: int = 100,
        offset: int = 0, order_by: str | None = None, descending: bool = False,
    ) -> list[JSON]:
        direction = -1 if descending else 1
        sort = ([(f"body.{_safe(order_by)}", direction), ("id", 1)] if order_by
                else [("id", direction)])
        docs = await self.db[DOCUMENTS].find(await self._where(collection, where),
                                             {"body": 1}, sort=sort, skip=offset,
                                             limit=limit).to_list(None)
        return [dict(d["body"]) for d in docs]

    async def count_documents(self, collection: str, where: Mapping[str, Any] | None = None
                              ) -> int:
        return int(await self.db[DOCUMENTS].count_documents(
            await self._where(collection, where)))

    async def purge_documents(self, collection: str, field: str, before: str, *,
                              companions: Sequence[str] = ()) -> int:
        path = f"body.{_safe(field)}"
        await self.db[DOCUMENTS].create_index([("c", 1), (path, 1)],
                                              name=f"purge_{collection}_{field}"[:120],
                                              partialFilterExpression={"c": collection})
        purged = 0
        while True:
            docs = await self.db[DOCUMENTS].find(
                {"c": collection, path: {"$lt": before}}, {"id": 1},
                limit=self.PURGE_CHUNK).to_list(None)
            ids = [d["id"] for d in docs]
            if ids:
                await self._maintenance(functools.partial(
                    self._purge_chunk, collection=collection, companions=companions, ids=ids))
            purged += len(ids)
            if len(ids) < self.PURGE_CHUNK:
                return purged

    async def _purge_chunk(self, session: Any, collection: str, companions: Sequence[str],
                           ids: list[str]) -> None:
        for name in (collection, *companions):
            await self.db[DOCUMENT_KEYS].delete_many({"c": name, "doc": {"$in": ids}},
                                                     session=session)
            await self.db[DOCUMENTS].delete_many(
                {"_id": {"$in": [document_key(name, i) for i in ids]}}, session=session)

    async def _maintenance(self, work: Callable[[Any], Awaitable[None]]) -> None:
        """A housekeeping write, in a transaction when the server has them."""
        if self.transactions:
            await self._in_transaction(work)
        else:
            await work(None)

    # -- search --------------------------------------------------------------------------
    async def search(self, plan: SearchPlan) -> SearchPage:
        page, keys = await self.searcher.search(plan)
        if keys and (plan.includes or plan.revincludes):
            page.included = await collect_includes(plan, keys,
                                                   MongoIncludes(self.db[RESOURCES]))
        return page

    async def match_ids(self, plan: SearchPlan, limit: int) -> list[str]:
        return await self.searcher.match_ids(plan, limit)

    async def match_ids_many(self, plans: Sequence[SearchPlan], limit: int
                             ) -> list[list[str]]:
        return [await self.searcher.match_ids(plan, limit) for plan in plans]

    async def count_current(self) -> int:
        return int(await self.db[RESOURCES].count_documents({"deleted": False}))

    async def iter_current(self, batch: int = 500) -> AsyncIterator[list[StoredResource]]:
        after: ObjectId | None = None
        while True:
            found: dict[str, Any] = {"deleted": False}
            if after is not None:
                found["rid"] = {"$gt": after}
            docs = await self.db[RESOURCES].find(found, {"ix": 0, "sort": 0},
                                                 sort=[("rid", 1)], limit=batch).to_list(None)
            if not docs:
                return
            after = docs[-1]["rid"]
            yield [stored(d) for d in docs]

    async def replace_index(self, items: Sequence[tuple[StoredResource, IndexRows]]) -> None:
        async def work(session: Any) -> None:
            for resource, index in items:
                ix = index_document(index)
                # Changed since it was read: that write indexed it already.
                await self.db[RESOURCES].update_one(
                    {"_id": resource_key(resource.resource_type, resource.id),
                     "type": resource.resource_type, "id": resource.id,
                     "version": resource.version, "deleted": False},
                    {"$set": {"ix": ix, "sort": sort_document(ix)}}, session=session)
        await self._maintenance(work)

    # -- outbox --------------------------------------------------------------------------
    async def pending_events(self, limit: int = 100) -> list[JSON]:
        docs = await self.db[OUTBOX].find({"dispatched": False}, sort=[("timestamp", 1)],
                                          limit=limit).to_list(None)
        return [{"id": d["_id"], "topic": d["topic"], "timestamp": d["timestamp"],
                 "source_service": d["source_service"], "payload": orjson.loads(d["payload"])}
                for d in docs]

    async def mark_dispatched(self, event_ids: Sequence[str]) -> None:
        if event_ids:
            await self.db[OUTBOX].update_many({"_id": {"$in": list(event_ids)}},
                                              {"$set": {"dispatched": True}})

    async def purge_dispatched_events(self, before: str) -> int:
        purged = 0
        while True:
            docs = await self.db[OUTBOX].find(
                {"dispatched": True, "timestamp": {"$lt": before}}, {"_id": 1},
                limit=self.PURGE_CHUNK).to_list(None)
            if docs:
                await self.db[OUTBOX].delete_many({"_id": {"$in": [d["_id"] for d in docs]}})
            purged += len(docs)
            if len(docs) < self.PURGE_CHUNK:
                return purged


def _version(doc: dict[str, Any]) -> StoredResource:
    return StoredResource(doc["type"], doc["id"], doc["version"], doc["lastUpdated"],
                          bool(doc["deleted"]), doc.get("body", "").encode(),
                          doc.get("method", "PUT"), seq_number(doc["seq"]))


def _safe(field: str) -> str:
    if not field.replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"invalid document field name {field!r}")
    return field


__all__ = ["DEFAULT_DATABASE", "MongoStore", "MongoUnitOfWork"]
