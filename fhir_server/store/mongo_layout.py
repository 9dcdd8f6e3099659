"""What the MongoDB adapter stores, and where: collections, documents, indexes, shard keys.

Collections (one database, the store URL's, ``healthplatform`` by default):

- ``resources``: the current version of each resource, ``_id`` ``"<type>/<id>"``, with
  ``type``, ``id``, ``rid`` (an ObjectId taken at its first write: the default search
  order and the keyset of its pages), ``version``, ``lastUpdated``, ``deleted``,
  ``method``, ``body`` (the version's JSON text, exactly as every adapter returns it),
  ``digest`` (see :mod:`fhir_server.store.writes`), its search-index values ``ix`` (per
  kind an array of the rows :data:`fhir_server.store.index.FIELDS` names, numbers as
  ``Decimal128``; ``ix.text`` the words of ``_text``/``_content``) and ``sort`` (per
  parameter the lowest value ``a`` an ascending ``_sort`` orders by and the highest ``d``
  a descending one does);
- ``history``: every version, tombstones included, ``_id`` ``"<type>/<id>/<version>"``,
  with ``seq`` (an ObjectId: the global write order history pages by);
- ``documents``: platform bookkeeping, ``_id`` ``"<collection>/<id>"`` with ``c`` (the
  collection), ``id`` and ``body``; ``document_keys``: one document per value of a
  unique field (its ``_id`` is the value, so a second one is refused by the server);
- ``outbox``: events written in the same transaction as their change.

Shard keys (``healthplatform mongo-init`` on a sharded cluster): ``resources`` and
``history`` on ``{type: 1, id: "hashed"}`` (a resource and its versions live on one
shard; reads by id, conditional writes and instance history are targeted), the others on
a hashed ``_id``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from bson.decimal128 import Decimal128
from pymongo import ASCENDING, DESCENDING, IndexModel

from fhir_server.store.index import FIELDS
from fhir_server.store.mongo_query import decimal, words
from fhir_server.store.port import IndexRows

RESOURCES, HISTORY, DOCUMENTS, DOCUMENT_KEYS, OUTBOX = (
    "resources", "history", "documents", "document_keys", "outbox")
COLLECTIONS = (RESOURCES, HISTORY, DOCUMENTS, DOCUMENT_KEYS, OUTBOX)

# Fields of each kind holding numbers (stored as Decimal128: exact comparisons).
_NUMBERS = {"number": ("lo", "hi"), "quantity": ("lo", "hi", "nlo", "nhi"),
            "composite": ("lo", "hi")}


def _lookup(kind: str, *fields: str) -> IndexModel:
    keys = [("type", ASCENDING), *((f"ix.{kind}.{f}", ASCENDING) for f in fields)]
    return IndexModel(keys, name=f"ix_{kind}_{'_'.join(fields)}")


# Every path a compiled search filters or sorts on (see mongo_query): the equality fields
# first (type, param, then the value compared), multikey over the rows of one kind.
INDEXES: Mapping[str, Sequence[IndexModel]] = {
    RESOURCES: [
        IndexModel([("type", ASCENDING), ("rid", ASCENDING)], name="type_rid"),
        IndexModel([("rid", ASCENDING)], name="rid"),
        IndexModel([("type", ASCENDING), ("id", ASCENDING)], name="type_id"),
        IndexModel([("type", ASCENDING), ("lastUpdated", ASCENDING)], name="type_updated"),
        _lookup("string", "param", "value"),
        _lookup("string", "param", "exact"),
        _lookup("token", "param", "code"),
        _lookup("date", "param", "lo"),
        _lookup("date", "param", "hi"),
        _lookup("number", "param", "lo"),
        _lookup("quantity", "param", "ncode", "nlo"),
        _lookup("uri", "param", "value"),
        _lookup("composite", "param", "code", "lo"),
        # chains, _has, includes, compartments and patients' grants look references up by
        # their target, whatever the type holding them
        IndexModel([("ix.reference.target_id", ASCENDING),
                    ("ix.reference.target_type", ASCENDING),
                    ("ix.reference.param", ASCENDING)], name="ix_reference_target"),
        IndexModel([("type", ASCENDING), ("ix.reference.param", ASCENDING),
                    ("ix.reference.url", ASCENDING)], name="ix_reference_url",
                   partialFilterExpression={"ix.reference.url": {"$exists": True}}),
        IndexModel([("type", ASCENDING), ("ix.text.narrative", ASCENDING)],
                   name="ix_text_narrative"),
        IndexModel([("type", ASCENDING), ("ix.text.content", ASCENDING)],
                   name="ix_text_content"),
    ],
    HISTORY: [
        IndexModel([("seq", DESCENDING)], name="seq"),
        IndexModel([("type", ASCENDING), ("seq", DESCENDING)], name="type_seq"),
        IndexModel([("type", ASCENDING), ("id", ASCENDING), ("seq", DESCENDING)],
                   name="instance_seq"),
        IndexModel([("lastUpdated", ASCENDING)], name="updated"),
    ],
    DOCUMENTS: [IndexModel([("c", ASCENDING), ("id", ASCENDING)], name="collection_id")],
    DOCUMENT_KEYS: [IndexModel([("c", ASCENDING), ("doc", ASCENDING)], name="document")],
    OUTBOX: [IndexModel([("dispatched", ASCENDING), ("timestamp", ASCENDING)],
                        name="pending")],
}

SHARD_KEYS: Mapping[str, Mapping[str, Any]] = {
    RESOURCES: {"type": 1, "id": "hashed"},
    HISTORY: {"type": 1, "id": "hashed"},
    DOCUMENTS: {"_id": "hashed"},
    DOCUMENT_KEYS: {"_id": "hashed"},
    OUTBOX: {"_id": "hashed"},
}


def resource_key(resource_type: str, id: str) -> str:
    return f"{resource_type}/{id}"


def version_key(resource_type: str, id: str, version: int) -> str:
    return f"{resource_type}/{id}/{version}"


def document_key(collection: str, id: str) -> str:
    return f"{collection}/{id}"


# --- index values ------------------------------------------------------------------------

def _row_document(kind: str, row: Sequence[Any]) -> dict[str, Any]:
    """A row as a document of its named fields; absent values left out (a query for
    ``system: null`` matches a missing one), numbers as Decimal128."""
    numbers = _NUMBERS.get(kind, ())
    found: dict[str, Any] = {}
    for name, value in zip(FIELDS[kind], row, strict=True):
        if value is None:
            continue
        if name in numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = decimal(value)
        found[name] = value
    return found


def index_document(index: IndexRows | None) -> dict[str, Any]:
    """The ``ix`` field of a resource document: its rows per kind."""
    if index is None:
        return {}
    found: dict[str, Any] = {}
    for kind, rows in index.rows.items():
        if not rows:
            continue
        if kind == "text":
            narrative, content = rows[0]
            found["text"] = {"narrative": words(narrative or ""),
                             "content": words(content or "")}
            continue
        found[kind] = [_row_document(kind, row) for row in rows]
    return found


def _comparable(value: Any) -> Any:
    return value.to_decimal() if isinstance(value, Decimal128) else value


def _sort_values(kind: str, row: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """(ascending value, descending value) of one row, as a ``_sort`` compares them."""
    if kind in ("string", "uri"):
        value = row.get("value")
        return (value, value) if value is not None else None
    if kind == "token":
        code = row.get("code")
        return (code, code) if code is not None else None
    if kind in ("date", "number", "quantity"):
        return row.get("lo"), row.get("hi")
    if kind == "reference":
        target = row.get("target_id") or row.get("url")
        if row.get("target_type") is None or target is None:
            return None
        value = f"{row['target_type']}/{target}"
        return value, value
    return None


def sort_document(ix: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sort`` field: per parameter its lowest value ``a`` and highest ``d``."""
    found: dict[str, dict[str, Any]] = {}
    for kind, rows in ix.items():
        if kind in ("text", "composite"):
            continue
        for row in rows:
            param = row.get("param", "")
            if ":" in param:  # :of-type and :identifier rows are never sorted by
                continue
            values = _sort_values(kind, row)
            if values is None:
                continue
            low, high = values
            keys = found.setdefault(param, {})
            if low is not None and ("a" not in keys
                                    or _comparable(low) < _comparable(keys["a"])):
                keys["a"] = low
            if high is not None and ("d" not in keys
                                     or _comparable(high) > _comparable(keys["d"])):
                keys["d"] = high
    return found


def cursor_value(value: Any) -> Any:
    """A sort value as JSON (for a paging cursor)."""
    from bson import ObjectId

    if isinstance(value, Decimal128):
        return {"$numberDecimal": str(value)}
    if isinstance(value, ObjectId):
        return {"$oid": str(value)}
    if isinstance(value, Decimal):
        return {"$numberDecimal": str(value)}
    return value


def from_cursor_value(value: Any) -> Any:
    from bson import ObjectId
    from bson.errors import InvalidId

    if isinstance(value, dict):
        try:
            if "$numberDecimal" in value:
                return Decimal128(str(value["$numberDecimal"]))
            if "$oid" in value:
                return ObjectId(str(value["$oid"]))
        except (InvalidId, ArithmeticError, ValueError, TypeError):
            pass
        raise ValueError("not a value this server put in a cursor")
    return value


def field_value(value: Any) -> str:
    """A unique document field's value as the text of its key."""
    import orjson

    return value if isinstance(value, str) else orjson.dumps(value).decode()


def unique_keys(collection: str, id: str, body: Mapping[str, Any],
                fields: Iterable[str]) -> list[dict[str, Any]]:
    """The ``document_keys`` documents of a document's unique fields."""
    return [{"_id": f"{collection}\x1f{field}\x1f{field_value(value)}", "c": collection,
             "doc": id}
            for field in fields if (value := body.get(field)) is not None]


__all__ = ["COLLECTIONS", "DOCUMENTS", "DOCUMENT_KEYS", "HISTORY", "INDEXES", "OUTBOX",
           "RESOURCES", "SHARD_KEYS", "cursor_value", "document_key", "from_cursor_value",
           "index_document", "resource_key", "sort_document", "unique_keys", "version_key"]
