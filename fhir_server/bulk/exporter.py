"""Streams what a bulk export covers from the store into NDJSON files, as its caller.

Every resource is found with the caller's searches (:class:`~fhir_server.caller.CallerFhir`),
so an export holds exactly what that caller may search: the access policy (and a SMART
``system/`` token's scopes) decide, as for any search. Pages of up to 1,000 resources are
read in the store's keyset order and appended to one file per type (``Observation.ndjson``):
memory stays one page, however large the store.

After each page the :class:`Progress` (where the export stands: which step, the page
cursor, each file's length) is handed to ``checkpoint``, which the job keeps. A job
restarted after a crash gives that progress back: each file is cut back to its
checkpointed length and the export goes on from the cursor, so no resource is lost or
written twice by the restart.

What each level covers:

- **system**: every resource of the requested types (all types when ``_type`` is absent);
- **patient**: Patients, and the resources of the Patient compartment's types that
  belong to some patient's compartment;
- **group**: the Group's active Patient members and their compartments; a resource in
  several members' compartments is written once (with the first of them, in the Group's
  order: decided from the resource alone, so no memory of what was written is needed).

``_since`` adds ``_lastUpdated=gt<since>`` to each search; a type's ``_typeFilter``
queries are each searched in turn, a resource matching an earlier one skipped (one
indexed lookup per page), so the OR of several filters writes each resource once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fhir_server.access import SEARCH, may_touch_type
from fhir_server.bulk.request import GROUP, PATIENT, ExportRequest, query_pairs
from fhir_server.caller import CallerFhir
from fhir_server.outcome import FhirError, Issue, operation_outcome
from fhir_server.private_files import private_directory, private_open
from fhir_server.search.plan import MAX_COUNT, Cursor, SearchPlan, compartment
from fhir_server.search.values import parse_reference
from fhir_server.service import FhirService
from fhir_server.store import StoredResource
from fhir_server.validation import resource_types

JSON = dict[str, Any]
Params = list[tuple[str, str]]


@dataclass(slots=True)
class Progress:
    """Where an export stands (JSON-able: the job keeps it)."""

    step: int = 0  # index into the export's steps (types and filters; group: members)
    cursor: str | None = None  # the page cursor within the step
    files: dict[str, JSON] = field(default_factory=dict)  # type → {count, bytes}
    exported: int = 0
    steps: int = 0  # how many steps there are (for X-Progress)
    # What the steps are, fixed by the first run so a resumed one counts them the same:
    # the types covered, and the version of the Group whose members are exported.
    types: list[str] | None = None
    group_version: int | None = None

    def to_json(self) -> JSON:
        return {"step": self.step, "cursor": self.cursor, "files": self.files,
                "exported": self.exported, "steps": self.steps, "types": self.types,
                "group_version": self.group_version}

    @classmethod
    def from_json(cls, data: JSON | None) -> Progress:
        data = data or {}
        return cls(data.get("step", 0), data.get("cursor"), dict(data.get("files") or {}),
                   data.get("exported", 0), data.get("steps", 0), data.get("types"),
                   data.get("group_version"))


Checkpoint = Callable[[Progress], Awaitable[None]]


class Exporter:
    """One export's work: ``await Exporter(...).run()`` writes the files and returns the
    final progress. ``checkpoint`` is awaited after every page."""

    def __init__(self, caller: CallerFhir, request: ExportRequest, directory: Path,
                 progress: Progress, checkpoint: Checkpoint, *, page_size: int = MAX_COUNT):
        self.caller, self.request, self.directory = caller, request, directory
        self.progress, self.checkpoint = progress, checkpoint
        self.page_size = page_size
        self._files: dict[str, Any] = {}

    async def run(self) -> Progress:
        private_directory(self.directory)
        self._reopen()
        try:
            if self.request.ignored and ERRORS not in self.progress.files:
                self._write_errors()
            if self.request.level == GROUP:
                await self._group()
            else:
                await self._types()
        finally:
            for handle in self._files.values():
                handle.close()
        return self.progress

    # -- system and patient level: one step per (type, filter) -----------------------------
    async def _types(self) -> None:
        if self.progress.types is None:
            self.progress.types = await self.covered_types()
        steps = [(t, i) for t in self.progress.types
                 for i in range(max(1, len(self.request.type_filters.get(t, ()))))]
        self.progress.steps = len(steps)
        while self.progress.step < len(steps):
            resource_type, filter_index = steps[self.progress.step]
            if not may_touch_type(self.caller.access, SEARCH, resource_type):
                self.progress.step += 1  # resumed under narrower rights: skipped
                self.progress.cursor = None
                continue
            plan = await self._plan([resource_type], self._filter(resource_type, filter_index))
            async for page in self._pages(plan):
                kept = [s for s in page if self._belongs(s)]
                if filter_index:
                    kept = await self._not_matched_before(resource_type, filter_index, kept)
                self._write(kept)
                await self.checkpoint(self.progress)

    async def covered_types(self) -> list[str]:
        """The types to export, in order: those asked for, or every type of the level,
        less those the caller may never search (a type it could never see is not an
        error for an export of everything; asked for by name it is refused at kick-off)."""
        if self.request.types is not None:
            wanted: Sequence[str] = self.request.types
        elif self.request.level in (PATIENT, GROUP):
            wanted = await self.compartment_types()
        else:
            wanted = sorted(resource_types())
        return [t for t in wanted if may_touch_type(self.caller.access, SEARCH, t)]

    async def compartment_types(self) -> list[str]:
        registry = await self.caller.service.refresh_registry()
        return sorted({"Patient", *registry.compartment_types("Patient")})

    def _belongs(self, stored: StoredResource) -> bool:
        """At patient level, a resource other than a Patient must be in some patient's
        compartment."""
        if self.request.level != PATIENT or stored.resource_type == "Patient":
            return True
        return bool(self.caller.patients_of(orjson.loads(stored.body)))

    async def _not_matched_before(self, resource_type: str, filter_index: int,
                                  found: list[StoredResource]) -> list[StoredResource]:
        """``found`` less what an earlier ``_typeFilter`` of the type already exported."""
        if not found:
            return found
        ids = ",".join(s.id for s in found)
        seen: set[str] = set()
        for earlier in range(filter_index):
            params = [*self._filter(resource_type, earlier), ("_id", ids)]
            seen.update(await self.caller.match_ids(resource_type, params, len(found)))
        return [s for s in found if s.id not in seen]

    # -- group level: one step per member -------------------------------------------------
    async def _group(self) -> None:
        members = await self.group_members()
        order = {patient_id: i for i, patient_id in enumerate(members)}
        if self.progress.types is None:
            self.progress.types = await self.covered_types()
        types = [t for t in self.progress.types
                 if may_touch_type(self.caller.access, SEARCH, t)]
        self.progress.steps = len(members)
        while self.progress.step < len(members) and types:
            member = self.progress.step
            plan = await self._plan(types, self._since())
            plan.compartment = compartment(await self.caller.service.refresh_registry(),
                                           "Patient", members[member], types,
                                           include_owner=True)
            async for page in self._pages(plan):
                kept = [s for s in page if self._first_member(s, order) == member]
                self._write(await self._filtered(kept))
                await self.checkpoint(self.progress)

    async def group_members(self) -> list[str]:
        """The ids of the Group's active Patient members, in its order (403 when the
        caller may not read the Group, 404 when there is none); of the version the export
        started with, when it resumes."""
        assert self.request.group_id is not None
        stored = await self.caller.read("Group", self.request.group_id,
                                        self.progress.group_version)
        self.progress.group_version = stored.version
        return group_member_ids(orjson.loads(stored.body))

    def _first_member(self, stored: StoredResource, order: dict[str, int]) -> int:
        return first_member(self.caller, stored, order)

    async def _filtered(self, found: list[StoredResource]) -> list[StoredResource]:
        """``found`` less what fails its type's ``_typeFilter`` queries (any one admits)."""
        by_type: dict[str, list[StoredResource]] = {}
        for stored in found:
            if stored.resource_type in self.request.type_filters:
                by_type.setdefault(stored.resource_type, []).append(stored)
        rejected: set[tuple[str, str]] = set()
        for resource_type, candidates in by_type.items():
            ids = ",".join(s.id for s in candidates)
            matched: set[str] = set()
            for query in self.request.type_filters[resource_type]:
                params = [*query_pairs(query), ("_id", ids)]
                matched.update(await self.caller.match_ids(resource_type, params,
                                                           len(candidates)))
            rejected.update((resource_type, s.id) for s in candidates if s.id not in matched)
        return [s for s in found if (s.resource_type, s.id) not in rejected]

    # -- searching and writing ------------------------------------------------------------
    def _since(self) -> Params:
        since = self.request.since
        return [("_lastUpdated", f"gt{since}")] if since else []

    def _filter(self, resource_type: str, index: int) -> Params:
        queries = self.request.type_filters.get(resource_type, ())
        return [*(query_pairs(queries[index]) if queries else []), *self._since()]

    async def _plan(self, types: list[str], params: Params) -> SearchPlan:
        plan = await self.caller.parse(types, params, strict=True)
        plan.count, plan.total = self.page_size, "none"
        return plan

    async def _pages(self, plan: SearchPlan) -> Any:
        """The pages of ``plan`` from the checkpointed cursor on. Before each is yielded
        the progress moves past it (the next page's cursor; after the last page, the
        next step), so the checkpoint taken once it is written resumes after it."""
        plan.cursor = Cursor.decode(self.progress.cursor) if self.progress.cursor else None
        while True:
            page = await self.caller.search_page(plan)
            if page.next is None:
                self.progress.step += 1
                self.progress.cursor = None
            else:
                self.progress.cursor = page.next.encode()
            yield [s for s in page.resources if not s.deleted]
            if page.next is None:
                return
            plan.cursor = page.next
            # The SQLite store answers reads in the loop's thread, without suspending: a
            # page at a time, the loop serves others (and a cancellation gets in).
            await asyncio.sleep(0)

    def _write(self, found: list[StoredResource]) -> None:
        by_type: dict[str, list[bytes]] = {}
        for stored in found:
            by_type.setdefault(stored.resource_type, []).append(stored.body)
        for resource_type, bodies in by_type.items():
            handle = self._file(resource_type)
            handle.write(b"\n".join(bodies) + b"\n")
            handle.flush()
            entry = self.progress.files.setdefault(resource_type, {"count": 0, "bytes": 0})
            entry["count"] += len(bodies)
            entry["bytes"] = handle.tell()
            self.progress.exported += len(bodies)

    def _write_errors(self) -> None:
        """The error file: one OperationOutcome per kick-off parameter ignored."""
        outcomes = [orjson.dumps(operation_outcome([Issue(
            "warning", "not-supported", f"{name} is not offered by this server's $export "
            "and was ignored", (name,))])) for name in self.request.ignored]
        handle = self._file(ERRORS)
        handle.write(b"\n".join(outcomes) + b"\n")
        handle.flush()
        self.progress.files[ERRORS] = {"count": len(outcomes), "bytes": handle.tell()}

    def _file(self, resource_type: str) -> Any:
        handle = self._files.get(resource_type)
        if handle is None:
            handle = self._files[resource_type] = private_open(  # closed by run()
                self.directory / file_name(resource_type), "ab")
        return handle

    def _reopen(self) -> None:
        """Cut each file back to its checkpointed length (a restart after a crash: what
        was written after the last checkpoint is written again from its cursor), and
        remove files no checkpoint knows."""
        known = {file_name(t): entry["bytes"] for t, entry in self.progress.files.items()}
        for path in self.directory.glob("*.ndjson"):
            if path.name not in known:
                path.unlink()
            elif path.stat().st_size != known[path.name]:
                os.truncate(path, known[path.name])


ERRORS = "_errors"  # the key (and file) of the error file's OperationOutcomes


def group_member_ids(group: JSON) -> list[str]:
    """The ids of a Group's active Patient members, in its order, each once."""
    members: list[str] = []
    for member in group.get("member") or []:
        reference = (member.get("entity") or {}).get("reference")
        if member.get("inactive") is True or not isinstance(reference, str):
            continue
        parsed = parse_reference(reference)
        if parsed.resource_type == "Patient" and parsed.id:
            members.append(parsed.id)
    return list(dict.fromkeys(members))


def first_member(caller: CallerFhir, stored: StoredResource, order: dict[str, int]) -> int:
    """The position (in ``order``) of the first patient ``stored`` is about, -1 for none:
    a resource in several members' compartments is written with the first of them."""
    resource = orjson.loads(stored.body)
    patients = set(caller.patients_of(resource))
    if stored.resource_type == "Patient":
        patients.add(stored.id)
    return min((order[p] for p in patients if p in order), default=-1)


def file_name(resource_type: str) -> str:
    return f"{resource_type}.ndjson"


def check_requested_types(caller: CallerFhir, request: ExportRequest) -> None:
    """A type asked for by name that the caller may never search is refused at kick-off
    (403 naming it), rather than exported empty."""
    for resource_type in request.types or ():
        if not may_touch_type(caller.access, SEARCH, resource_type):
            raise FhirError.of(403, "forbidden", f"{caller.access.describe().capitalize()} "
                               f"may not search {resource_type} resources"
                               f"{caller.access.explain(SEARCH, resource_type)}", "_type")


async def check_filters(service: FhirService, request: ExportRequest) -> None:
    """Each ``_typeFilter`` must be a search this server can run (400 naming it)."""
    for resource_type, queries in request.type_filters.items():
        for query in queries:
            try:
                await service.parse([resource_type], query_pairs(query), strict=True)
            except FhirError as exc:
                raise FhirError.of(400, "invalid", f"_typeFilter {resource_type}?{query}: "
                                   f"{exc}", "_typeFilter") from None
