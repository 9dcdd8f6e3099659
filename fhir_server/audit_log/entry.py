"""One record of the audit log: an AuditEvent as the log keeps it.

An :class:`Entry` is the AuditEvent's JSON text (without ``id`` and ``meta.versionId`` /
``meta.lastUpdated``, which the log holds itself) plus what the audit searches compare,
taken straight from the event's elements (no FHIRPath, no index extraction):

- columns: ``id``, ``recorded`` (``AuditEvent.recorded`` in the store's sortable UTC form,
  the ``date`` parameter), ``logged`` (when the log took it: ``_lastUpdated``),
  ``action`` and ``outcome``;
- keys, ``<parameter>=<value>``, one per value the event has (the log indexes them with
  ``recorded`` so one key's events come out in date order):

  =====================  =======================================================
  ``agent=T/id``          ``agent.who.reference``
  ``agent:identifier=``   ``agent.who.identifier`` as ``value|system``
  ``entity=T/id``         ``entity.what.reference``
  ``entity:identifier=``  ``entity.what.identifier`` as ``value|system``
  ``patient=Patient/id``  ``entity.what`` and ``agent.who`` that are Patients
  ``subtype=``            the codings, as ``code|system``
  ``_security=``          ``meta.security`` as ``code|system`` (the owners)
  =====================  =======================================================

  ``type`` (one coding, a handful of values) is a column, compared as a filter. A
  request's id (``urn:healthplatform:request-id``) is no key: unique to its event, each
  would take an index entry on a page of its own in every batch; it stays in the event.

  Tokens are written code first (:func:`token_key`): one key answers both a search by
  ``system|code`` (that key) and by ``code`` alone (the keys starting ``code|``).

An event is rendered back (:func:`render`) with its id and ``meta`` put in: what a read
or a search answers is the AuditEvent as written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from fhir_server.search.dates import date_range

JSON = dict[str, Any]
REQUEST_SYSTEM = "urn:healthplatform:request-id"
UNKEYED_SYSTEMS = frozenset({REQUEST_SYSTEM})  # identifiers unique to one event


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    recorded: str  # sortable UTC instant (fhir_server.search.dates form)
    logged: str  # when the log took it, same form
    action: str
    outcome: str
    type: str  # code|system of AuditEvent.type ("" when none)
    keys: tuple[str, ...]
    body: bytes  # the AuditEvent's JSON text, without id and meta versioning


def token_key(name: str, code: str, system: Any) -> str:
    """The key of a token value: ``name=code|system`` (``name=code|`` without a system)."""
    return f"{name}={code}|{system if isinstance(system, str) else ''}"


def _tokens(name: str, codings: Iterable[Any]) -> list[str]:
    return [token_key(name, c["code"], c.get("system")) for c in codings
            if isinstance(c, dict) and isinstance(c.get("code"), str)]


def _reference(name: str, reference: Any, keys: list[str]) -> None:
    """Keys of a Reference: its local reference, its identifier (both token forms), and
    ``patient`` when it points at a Patient."""
    if not isinstance(reference, dict):
        return
    target = reference.get("reference")
    if isinstance(target, str) and "/" in target and "://" not in target:
        local = "/".join(target.split("/_history/")[0].split("/")[-2:])
        keys.append(f"{name}={local}")
        if local.startswith("Patient/"):
            keys.append(f"patient={local}")
    identifier = reference.get("identifier")
    if isinstance(identifier, dict) and isinstance(identifier.get("value"), str) \
            and identifier.get("system") not in UNKEYED_SYSTEMS:
        keys.append(token_key(f"{name}:identifier", identifier["value"],
                              identifier.get("system")))


def keys_of(event: JSON) -> tuple[str, ...]:
    keys: list[str] = []
    for agent in event.get("agent") or ():
        if isinstance(agent, dict):
            _reference("agent", agent.get("who"), keys)
    for entity in event.get("entity") or ():
        if isinstance(entity, dict):
            _reference("entity", entity.get("what"), keys)
    keys += _tokens("subtype", event.get("subtype") or ())
    meta = event.get("meta")
    keys += _tokens("_security", (meta.get("security") or ()) if isinstance(meta, dict)
                    else ())
    return tuple(dict.fromkeys(keys))


def sortable(instant: str) -> str:
    """An instant in the log's sortable UTC form (the platform's own instants, in UTC to
    the millisecond, without parsing)."""
    if len(instant) == 24 and instant[10] == "T" and instant[19] == "." and instant[-1] == "Z":
        return instant[:23] + "000Z"
    return date_range(instant)[0]


def entry_of(event: JSON, event_id: str, logged: str) -> Entry:
    """The entry of a valid AuditEvent (``recorded`` is required by R4)."""
    meta = event.get("meta")
    kept = {k: v for k, v in meta.items() if k not in ("versionId", "lastUpdated")} \
        if isinstance(meta, dict) else {}
    # resourceType first, then meta (when any): render() puts the id and the versioning
    # in at known places, without parsing the text again
    body: JSON = {"resourceType": "AuditEvent", **({"meta": kept} if kept else {})}
    body.update((k, v) for k, v in event.items() if k not in ("resourceType", "id", "meta"))
    return Entry(event_id, sortable(str(event["recorded"])), logged,
                 str(event.get("action") or ""), str(event.get("outcome") or ""),
                 type_of(event), keys_of(event), orjson.dumps(body))


def type_of(event: JSON) -> str:
    """The ``type`` column: ``code|system`` of ``AuditEvent.type``."""
    kind = event.get("type")
    if isinstance(kind, dict) and isinstance(kind.get("code"), str):
        return token_key("", kind["code"], kind.get("system"))[1:]
    return ""


_HEAD = b'{"resourceType":"AuditEvent"'
_META = _HEAD + b',"meta":{'


def render(entry_id: str, logged: str, body: bytes) -> bytes:
    """The AuditEvent as read: the stored text (as :func:`entry_of` wrote it) with its id
    and ``meta`` (version 1, the instant the log took it) put in, without parsing it."""
    head = _HEAD + b',"id":' + orjson.dumps(entry_id) + \
        b',"meta":{"versionId":"1","lastUpdated":"' + logged.encode() + b'"'
    if body.startswith(_META):
        rest = body[len(_META):]
        return head + (b"," + rest if not rest.startswith(b"}") else rest)
    return head + b"}" + body[len(_HEAD):]
