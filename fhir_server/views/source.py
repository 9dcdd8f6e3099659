"""The resources a view runs over on this server: searched as the caller, page by page.

Every page is a search of the view's resource type through the caller's
:class:`~fhir_server.caller.CallerFhir`, so the access policy applies as to any search
(a clinic's member sees their organization's records, a SMART token its scopes) and the
reads are audited. The run's filters become search criteria:

- ``_since``: ``_lastUpdated=gt<instant>``;
- ``patient`` (one or more ``Patient/<id>``) and ``group`` (the active Patient members
  of each Group, in order): one step per patient, each the patient's compartment of the
  view's type (the Patient itself for a Patient view); a resource in several of those
  compartments is read once, with the first of them. A patient the caller cannot see or
  that does not exist is a 400 naming ``patient``; a Group, a 404 or 403 as for a read.

Memory stays one page, whatever the store holds. :class:`Position` says where a run
stands (step and page cursor), so an export can checkpoint it and go on from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import orjson

from fhir_server.bulk.exporter import first_member, group_member_ids
from fhir_server.caller import CallerFhir
from fhir_server.outcome import FhirError
from fhir_server.search.plan import MAX_COUNT, Cursor, compartment
from fhir_server.search.values import parse_reference
from fhir_server.store import ResourceGone, ResourceNotFound

JSON = dict[str, object]


@dataclass(frozen=True, slots=True)
class Scope:
    """What a run covers besides the view's type: changed after ``since``; about
    ``patients`` (ids in order; None: about anyone)."""

    since: str | None = None
    patients: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Position:
    step: int = 0  # the patient (0 without patients)
    cursor: str | None = None  # the next page's cursor within the step
    done: bool = False


def reference_id(value: str, expected: str, parameter: str) -> str:
    """``Patient/123`` (or an absolute URL ending so) → ``123``; 400 naming
    ``parameter`` otherwise."""
    parsed = parse_reference(value)
    if parsed.resource_type != expected or not parsed.id:
        raise FhirError.of(400, "invalid", f"{parameter} must reference a {expected} "
                           f"(e.g. {expected}/123), not {value!r}", parameter)
    return parsed.id


async def resolve_scope(caller: CallerFhir, resource_type: str, since: str | None,
                        patients: Sequence[str], groups: Sequence[str]) -> Scope:
    """The run's :class:`Scope` from its ``patient`` and ``group`` references."""
    if not patients and not groups:
        return Scope(since, None)
    registry = await caller.service.refresh_registry()
    if resource_type != "Patient" and not registry.compartment_params("Patient",
                                                                      resource_type):
        raise FhirError.of(400, "invalid", f"{resource_type} resources are not in a "
                           "patient's compartment: patient and group do not apply",
                           "patient" if patients else "group")
    ids: list[str] = []
    for value in patients:
        patient_id = reference_id(value, "Patient", "patient")
        try:
            await caller.read("Patient", patient_id)
        except (ResourceNotFound, ResourceGone):
            raise FhirError.of(400, "not-found", f"Patient {patient_id!r} not found",
                               "patient") from None
        ids.append(patient_id)
    for value in groups:
        group = await caller.read("Group", reference_id(value, "Group", "group"))
        ids += group_member_ids(orjson.loads(group.body))
    return Scope(since, tuple(dict.fromkeys(ids)))


async def pages(caller: CallerFhir, resource_type: str, scope: Scope, *,
                start: Position | None = None, page_size: int = MAX_COUNT
                ) -> AsyncIterator[tuple[list[bytes], Position]]:
    """The stored JSON of each page of resources (current versions), with the position
    after it, from ``start`` on."""
    position = start or Position()
    steps = 1 if scope.patients is None else len(scope.patients)
    order = {p: i for i, p in enumerate(scope.patients or ())}
    registry = await caller.service.refresh_registry()
    criteria = [("_lastUpdated", f"gt{scope.since}")] if scope.since else []
    while position.step < steps and not position.done:
        plan = await caller.parse([resource_type], criteria, strict=True)
        plan.count, plan.total = page_size, "none"
        if scope.patients is not None:
            plan.compartment = compartment(registry, "Patient",
                                           scope.patients[position.step], [resource_type],
                                           include_owner=True)
        plan.cursor = Cursor.decode(position.cursor) if position.cursor else None
        while True:
            page = await caller.search_page(plan)
            found = [s for s in page.resources if not s.deleted]
            if scope.patients is not None and len(scope.patients) > 1:
                found = [s for s in found
                         if first_member(caller, s, order) == position.step]
            if page.next is None:
                last = position.step + 1 >= steps
                position = Position(position.step + 1, None, last)
            else:
                position = Position(position.step, page.next.encode())
            yield [s.body for s in found], position
            if page.next is None:
                break
            plan.cursor = page.next
            # SQLite answers reads in the loop's thread: let others in between pages.
            await asyncio.sleep(0)
