"""An in-process stand-in for a MongoDB server: ``mongomock`` behind the surface of
PyMongo's native async client (``pymongo.AsyncMongoClient``) that the MongoDB adapter uses.

No MongoDB server can run where CI runs, so the contract suite runs the adapter against
this fake unless ``HEALTHPLATFORM_TEST_MONGODB_URI`` names a real one. It answers like a
**standalone** server: mongomock has no sessions, so multi-document transactions are not
faked here (the adapter sees a standalone server and the tests that need a replica set
are skipped with that reason).

One thing is taught to mongomock, because the adapter's number search depends on it and
MongoDB does it: comparing and sorting ``Decimal128`` values as numbers (mongomock 4.3
raises ``NotImplementedError`` on them). The values compare as the exact decimals they
hold, which is what the server does.
"""

from __future__ import annotations

import decimal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import mongomock
import mongomock.filtering as filtering
from bson.decimal128 import Decimal128
from pymongo.errors import DuplicateKeyError

_bson_compare = filtering.bson_compare
_compare_type = filtering._get_compare_type


def _decimal(value: Any) -> Any:
    return value.to_decimal() if isinstance(value, Decimal128) else value


def _compare(op: Any, a: Any, b: Any, can_compare_types: bool = True) -> Any:
    return _bson_compare(op, _decimal(a), _decimal(b), can_compare_types)


def _type_of(value: Any) -> int:
    return 10 if isinstance(value, (Decimal128, decimal.Decimal)) else _compare_type(value)


filtering.bson_compare = _compare
filtering._get_compare_type = _type_of

_SERVERS: dict[str, mongomock.MongoClient] = {}  # host part of a URL → one in-memory server


class FakeCursor:
    """``AsyncCursor`` / ``AsyncCommandCursor``: ``to_list`` and ``async for``."""

    def __init__(self, documents: Iterator[dict[str, Any]]):
        self._documents = documents

    async def to_list(self, length: int | None = None) -> list[dict[str, Any]]:
        found = []
        for document in self._documents:
            found.append(document)
            if length is not None and len(found) >= length:
                break
        return found

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        for document in self._documents:
            yield document


class FakeCollection:
    def __init__(self, collection: Any):
        self._c = collection
        self.name = collection.name

    def find(self, filter: dict[str, Any] | None = None, projection: Any = None, *,
             sort: Any = None, limit: int = 0, skip: int = 0, session: Any = None
             ) -> FakeCursor:
        cursor = self._c.find(filter or {}, projection)
        if sort:
            cursor = cursor.sort(list(sort))
        if skip:
            cursor = cursor.skip(skip)
        if limit:
            cursor = cursor.limit(limit)
        return FakeCursor(iter(cursor))

    async def find_one(self, filter: dict[str, Any] | None = None, projection: Any = None, *,
                       session: Any = None, sort: Any = None) -> dict[str, Any] | None:
        found = await self.find(filter, projection, sort=sort, limit=1).to_list(1)
        return found[0] if found else None

    async def aggregate(self, pipeline: list[dict[str, Any]], *, session: Any = None,
                        allowDiskUse: bool | None = None) -> FakeCursor:
        return FakeCursor(iter(self._c.aggregate(pipeline)))

    async def insert_one(self, document: dict[str, Any], *, session: Any = None) -> Any:
        return self._c.insert_one(document)

    async def insert_many(self, documents: list[dict[str, Any]], *, ordered: bool = True,
                          session: Any = None) -> Any:
        return self._c.insert_many(documents, ordered=ordered)

    async def replace_one(self, filter: dict[str, Any], document: dict[str, Any], *,
                          upsert: bool = False, session: Any = None) -> Any:
        return self._c.replace_one(filter, document, upsert=upsert)

    async def update_one(self, filter: dict[str, Any], update: Any, *, upsert: bool = False,
                         session: Any = None) -> Any:
        return self._c.update_one(filter, update, upsert=upsert)

    async def update_many(self, filter: dict[str, Any], update: Any, *,
                          session: Any = None) -> Any:
        return self._c.update_many(filter, update)

    async def delete_one(self, filter: dict[str, Any], *, session: Any = None) -> Any:
        return self._c.delete_one(filter)

    async def delete_many(self, filter: dict[str, Any], *, session: Any = None) -> Any:
        return self._c.delete_many(filter)

    async def count_documents(self, filter: dict[str, Any], *, limit: int | None = None,
                              session: Any = None) -> int:
        count = self._c.count_documents(filter)
        return min(count, limit) if limit else int(count)

    async def create_index(self, keys: Any, **kwargs: Any) -> str:
        return str(self._c.create_index(keys, **kwargs))

    async def create_indexes(self, models: list[Any], *, session: Any = None) -> list[str]:
        return [str(self._c.create_index(m.document["key"].items(),
                                         **{k: v for k, v in m.document.items()
                                            if k != "key"}))
                for m in models]

    async def drop(self, *, session: Any = None) -> None:
        self._c.drop()

    async def index_information(self) -> dict[str, Any]:
        return dict(self._c.index_information())


class FakeDatabase:
    def __init__(self, database: Any):
        self._db = database
        self.name = database.name

    def __getitem__(self, name: str) -> FakeCollection:
        return FakeCollection(self._db[name])

    async def list_collection_names(self, *, session: Any = None) -> list[str]:
        return list(self._db.list_collection_names())

    async def create_collection(self, name: str, **kwargs: Any) -> FakeCollection:
        self._db.create_collection(name)
        return self[name]

    async def command(self, command: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        name = command if isinstance(command, str) else next(iter(command))
        if name in ("hello", "isMaster", "ismaster"):  # a standalone server
            return {"isWritablePrimary": True, "ismaster": True, "ok": 1.0,
                    "maxWireVersion": 21}
        if name == "ping":
            return {"ok": 1.0}
        raise NotImplementedError(f"the in-process fake has no {name!r} command")


class FakeClient:
    """What the adapter asks of an ``AsyncMongoClient``."""

    is_fake = True

    def __init__(self, url: str):
        from pymongo.uri_parser import parse_uri

        parsed = parse_uri(url)
        host = ",".join(f"{h}:{p}" for h, p in parsed["nodelist"])
        self._client = _SERVERS.setdefault(host, mongomock.MongoClient())
        self._default = parsed.get("database") or "healthplatform"
        self.admin = FakeDatabase(self._client["admin"])

    def __getitem__(self, name: str) -> FakeDatabase:
        return FakeDatabase(self._client[name])

    def get_default_database(self, default: str | None = None) -> FakeDatabase:
        return self[self._default or default or "healthplatform"]

    async def drop_database(self, name: str) -> None:
        self._client.drop_database(name)

    def start_session(self) -> Any:
        raise NotImplementedError("the in-process fake has no sessions (transactions need "
                                  "a real replica set)")

    async def close(self) -> None:
        return None


@contextmanager
def installed() -> Iterator[None]:
    """Every MongoStore made meanwhile talks to the fake."""
    from fhir_server.store.mongo import MongoStore

    original = MongoStore.client_factory
    MongoStore.client_factory = staticmethod(FakeClient)  # type: ignore[assignment]
    try:
        yield
    finally:
        MongoStore.client_factory = original  # type: ignore[assignment]


__all__ = ["DuplicateKeyError", "FakeClient", "installed"]
