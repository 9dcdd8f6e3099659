"""What a staged write stores, whatever the storage: the versioning rules of the port.

An adapter looks up what it knows of the resource's current version — its number,
whether it is a tombstone, the digest of its content (:class:`CurrentState`; no body
needed) — and :func:`decide` answers with the rules FHIR and the port set:

- a create that must not exist refuses an id in use (:class:`ResourceExists`);
- ``If-Match`` must name the current version of a live resource (a delete may name a
  tombstone's) (:class:`VersionConflict`);
- a delete of what is absent or already deleted writes nothing (FHIR answers it 200/204
  all the same);
- an update that carries the current content writes nothing (as HAPI FHIR and
  Microsoft's FHIR server do), so a feed that resends the same record (an ADT feed sends
  the whole patient with every event) does not fill the history; content is compared by
  :func:`content_digest`, key order and the store's own ``meta`` left out;
- otherwise the next version: its number, its body with ``id``, ``meta.versionId`` and
  ``meta.lastUpdated`` set (:func:`versioned_body`), a tombstone for a delete.

A write that writes nothing is marked ``unchanged`` (no resource event, no new version).
The adapter then stores what :func:`decide` returns, in the same atomic step as the
checks it read. A body the JSON encoder refuses (nested deeper than it allows, an integer
beyond 64 bits) is :class:`UnstorableResource`: a failure of that write's unit of work
alone, like a version conflict, never of the others committed with it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson

from fhir_server.store.port import (
    ResourceExists,
    StagedWrite,
    UnstorableResource,
    VersionConflict,
)


@dataclass(frozen=True, slots=True)
class CurrentState:
    """What an adapter knows of a resource's current version without reading its body."""

    version: int | None = None  # None: the id was never used
    deleted: bool = True
    content_digest: bytes | None = None

    @property
    def exists(self) -> bool:
        return self.version is not None


NEVER_WRITTEN = CurrentState()


@dataclass(frozen=True, slots=True)
class NewVersion:
    """The version a write stores."""

    version: int
    deleted: bool
    body: bytes  # JSON text with id and meta set; empty for a tombstone
    content_digest: bytes | None  # None for a tombstone


def decide(w: StagedWrite, current: CurrentState, instant: str) -> NewVersion | None:
    """The version ``w`` stores, or ``None`` when it stores nothing (``w.unchanged`` is
    then set). Raises :class:`ResourceExists` or :class:`VersionConflict` as the rules of
    the module docstring say."""
    if w.must_not_exist and current.exists:
        raise ResourceExists(w.resource_type, w.id)
    if w.if_match is not None and (
            current.version != w.if_match or (current.deleted and w.op != "delete")):
        raise VersionConflict(w.resource_type, w.id, w.if_match,
                              None if current.deleted else current.version)
    version = (current.version or 0) + 1
    if w.op == "delete":
        if current.deleted:
            w.unchanged = True
            return None
        return NewVersion(version, True, b"", None)
    digest = content_digest(w)
    if not current.deleted and current.content_digest == digest:
        w.unchanged = True
        return None
    return NewVersion(version, False, versioned_body(w, version, instant), digest)


def content_digest(w: StagedWrite) -> bytes:
    """16 bytes identifying what a write stores, apart from what the store sets itself
    (``meta.versionId``, ``meta.lastUpdated``): equal digests, equal content. Keys are
    sorted, so the order a client writes them in does not count."""
    assert w.body is not None
    resource = dict(w.body)
    resource["id"] = w.id
    meta = resource.get("meta")
    if isinstance(meta, dict) and ("versionId" in meta or "lastUpdated" in meta):
        meta = {k: v for k, v in meta.items() if k not in ("versionId", "lastUpdated")}
        if meta:
            resource["meta"] = meta
        else:
            del resource["meta"]
    return hashlib.blake2b(_json_text(w, resource, orjson.OPT_SORT_KEYS),
                           digest_size=16).digest()


def versioned_body(w: StagedWrite, version: int, instant: str) -> bytes:
    """The JSON text of a new version: the staged body with its id and meta set."""
    assert w.body is not None
    resource = w.body
    resource["id"] = w.id
    meta = dict(resource.get("meta") or {})
    meta["versionId"] = str(version)
    meta["lastUpdated"] = instant
    resource["meta"] = meta
    return _json_text(w, resource)


def _json_text(w: StagedWrite, resource: dict[str, object], option: int = 0) -> bytes:
    try:
        return orjson.dumps(resource, option=option)
    except orjson.JSONEncodeError as exc:
        raise UnstorableResource(w.resource_type, w.id, str(exc)) from None
