"""Merged conditional updates: lay a message's resource over the stored one.

A plain conditional update (``PUT Patient?identifier=...``) replaces the stored resource
with what the message says. For the resources v2 feeds share with other sources that
would lose data: an ADT would drop the ``link`` an earlier merge (A40) set, or the
identifiers an /api registration or another feed added; an ORM about an order placed
through /api/labs would drop the order's notes. So for entries marked ``merge`` the
gateway first finds the stored resource, lays the mapped elements over it and turns the
entry into a version-checked update of that resource (``PUT Type/id`` + ``ifMatch``):

- elements the message maps replace the stored ones (the feed is the source of truth
  for what it sends);
- ``identifier`` and ``link`` are unions (mapped first, then the stored ones the message
  does not repeat), so nothing that identifies or links the resource is lost;
- who a request is for and who made it (``subject``, ``requester``) stay as first
  recorded: a lab's status update must not move an order to another patient record, or
  take it away from the clinician who placed it;
- everything else the stored resource holds stays.

When nothing matches, the entry stays a conditional update and creates the resource.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from hl7_gateway.v2_to_fhir.bundle import Entry, identifier_token

__all__ = ["AmbiguousMatch", "Search", "merge_into", "overlay", "resolve_merges"]

JSON = dict[str, Any]
Search = Callable[[str, list[tuple[str, str]]], Awaitable[list[JSON]]]


class AmbiguousMatch(Exception):
    """A merged update's identifier matches several stored resources (FHIR: 412)."""

    def __init__(self, entry: Entry, count: int) -> None:
        super().__init__(f"{entry.resource['resourceType']} with identifier "
                         f"{identifier_token(entry.identifier or {})!r} matches {count} "
                         "stored resources; it must match at most one")
        self.entry = entry


def _identity(key: str, item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    if key == "identifier":
        return (item.get("system"), item.get("value"))
    if key == "link":
        return ((item.get("other") or {}).get("reference"), item.get("type"))
    return repr(item)


_UNIONS = frozenset({"identifier", "link"})
_KEPT = frozenset({"subject", "requester"})


def _union(key: str, mapped: Iterable[Any], stored: Iterable[Any]) -> list[Any]:
    result = list(mapped)
    seen = {_identity(key, item) for item in result}
    for item in stored:
        if _identity(key, item) not in seen:
            result.append(item)
            seen.add(_identity(key, item))
    return result


def overlay(stored: JSON, mapped: JSON) -> JSON:
    """``stored`` with the elements of ``mapped`` laid over it (see the module docstring)."""
    result = copy.deepcopy(stored)
    result.pop("meta", None)
    result.pop("text", None)  # a narrative of the old content would now be wrong
    for key, value in mapped.items():
        if key in {"id", "meta"} or (key in _KEPT and key in result):
            continue
        if key in _UNIONS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _union(key, value, result[key])
        else:
            result[key] = value
    return result


async def resolve_merges(entries: Iterable[Entry], search: Search) -> None:
    """Turn each ``merge`` entry whose identifier matches a stored resource into a
    version-checked update of that resource, its content merged (mutates the entries)."""
    for entry in entries:
        if not entry.merge or entry.identifier is None:
            continue
        resource_type = entry.resource["resourceType"]
        found = await search(resource_type, [("identifier", identifier_token(entry.identifier))])
        if not found:
            continue
        if len(found) > 1:
            raise AmbiguousMatch(entry, len(found))
        merge_into(entry, found[0])


def merge_into(entry: Entry, stored: JSON) -> None:
    """Make ``entry`` a version-checked update of ``stored`` with its content laid over."""
    resource_type = entry.resource["resourceType"]
    entry.resource = overlay(stored, entry.resource)
    entry.resource["id"] = stored["id"]
    entry.method, entry.url = "PUT", f"{resource_type}/{stored['id']}"
    version = (stored.get("meta") or {}).get("versionId")
    entry.if_match = f'W/"{version}"' if version else None
