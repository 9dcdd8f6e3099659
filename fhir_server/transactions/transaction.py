"""transaction: a ``transaction`` Bundle (R4 3.1.0.11), all or nothing.

Entries are processed in the order the spec prescribes (DELETE, POST, PUT/PATCH, then
GET/HEAD) whatever their order in the Bundle:

1. *resolve*: every write gets its target id. POST gets a new id (or, with
   ``ifNoneExist``, the id of the one existing match, and then writes nothing); a
   conditional PUT/DELETE (``Patient?identifier=...``) finds its match; every ``fullUrl``
   (``urn:uuid:...`` included) is mapped to ``Type/id``. The GET entries' reads and
   searches are checked now, so one that must fail fails the transaction before it
   commits;
2. *rewrite*: references to those fullUrls, and conditional references such as
   ``Patient?identifier=sys|val`` (exactly one match required), become ``Type/id``
   (:mod:`fhir_server.transactions.references`);
3. *stage and commit* every write in one unit of work of the caller
   (:class:`~fhir_server.caller.FhirUnit`: each entry is checked by the access policy):
   any failure rolls back everything and the OperationOutcome names the entry
   (``Bundle.entry[3]``). Conditions resolved in step 1 are re-checked inside the commit;
   if a concurrent write changed what they match, the whole transaction is resolved again
   (a few times) rather than committing references to the wrong resource;
4. GET entries run after the commit and see its result.

The answer is a ``transaction-response`` Bundle with one entry per request entry, in the
request's order: status, location, etag, lastModified and (unless ``Prefer:
return=minimal``) the resource. Conditions, conditional references and GET entries see
what the caller may see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from fhir_server.caller import CallerFhir, FhirUnit
from fhir_server.ids import new_id
from fhir_server.outcome import FhirError
from fhir_server.patches import patch_from_entry
from fhir_server.search.plan import SearchPlan
from fhir_server.store import Condition, ConditionChanged, MultipleMatches, StoreError
from fhir_server.store.port import Staging
from fhir_server.transactions.entries import (
    ORDER,
    STATUS_TEXT,
    Entry,
    read_entry,
    response_entry,
)
from fhir_server.transactions.references import ReferenceRewriter

RETRIES = 3
# Staging a bundle's entry (validation, ownership, index values) takes ~0.1-0.5 ms on the
# event loop: a bundle of 500 held it for 150 ms, every other request (/healthz too)
# waiting. It gives the loop a turn after this many entries.
YIELD_EVERY = 32
# on_commit(staging, written): see fhir_server.transactions.process_bundle.
OnCommit = Callable[[Staging, Sequence[str]], None]


class Transaction:
    """One transaction Bundle; ``await run()`` answers the transaction-response."""

    def __init__(self, fhir: CallerFhir, entries: list[Entry], *, base_url: str,
                 prefer: str | None, on_commit: OnCommit | None = None):
        self.fhir = fhir
        self.service = fhir.service
        self.entries = entries
        self.base_url = base_url
        self.prefer = prefer
        self.on_commit = on_commit

    async def run(self) -> dict[str, Any]:
        await self.service.refresh_registry()
        for _attempt in range(RETRIES):
            try:
                await self._attempt()
            except ConditionChanged:
                continue  # a concurrent write changed a match: resolve everything again
            return {"resourceType": "Bundle", "type": "transaction-response",
                    "entry": [e.response for e in self.entries]}
        raise FhirError.of(409, "conflict",
                           "Resources matched by the transaction's conditions kept changing; "
                           "retry the transaction")

    async def _attempt(self) -> None:
        for entry in self.entries:
            # A retry resolves references again, so it must start from what was sent, not
            # from the previous attempt's rewrite (whose targets may not exist).
            if entry.submitted is None:
                entry.submitted = entry.resource
            entry.resource = entry.submitted
            entry.target_id, entry.expected, entry.existing = None, None, None
            entry.matched, entry.staged, entry.response = None, [], None
        ordered = sorted(self.entries, key=lambda e: ORDER[e.method])
        writes = [e for e in ordered if e.method not in ("GET", "HEAD")]
        await self._match_conditions(writes)
        ids: dict[str, str] = {}
        for entry in writes:
            await self._resolve(entry, ids)
        _check_overlaps(writes)
        await self._check_reads(ordered, writes)
        rewriter = ReferenceRewriter(self.fhir, ids)
        for entry in writes:
            if entry.method in ("POST", "PUT") and entry.existing is None:
                entry.resource = await rewriter.rewrite(entry, entry.resource)
        async with self.fhir.unit() as unit:
            for staged, entry in enumerate(writes, 1):
                await self._stage(unit, entry)
                if staged % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # the other requests' turn (see YIELD_EVERY)
            if self.on_commit is not None:
                on_commit = self.on_commit
                unit.after_writes(lambda staging: on_commit(
                    staging, [_written(entry) for entry in self.entries]))
            try:
                await unit.commit()
            except ConditionChanged:
                raise
            except StoreError as exc:
                raise self._failed_entry(exc).fail(exc) from None
        for entry in writes:
            entry.response = self._write_response(entry)
        for entry in ordered:
            if entry.method in ("GET", "HEAD"):
                entry.response = await read_entry(self.fhir, entry, self.base_url)

    async def _check_reads(self, ordered: Sequence[Entry], writes: Sequence[Entry]) -> None:
        """GET entries run after the commit (they see its result), so whatever would make
        one fail must fail the transaction before it commits: a read of a resource the
        transaction does not write is read now (404, 410, or 403 when the caller may not
        see it), a search is parsed now (400 for a bad one)."""
        written = {(e.resource_type, e.target_id) for e in writes}
        for entry in ordered:
            if entry.method not in ("GET", "HEAD"):
                continue
            assert entry.resource_type is not None
            try:
                if entry.resource_id is None:
                    await self.fhir.parse([entry.resource_type], entry.criteria or [],
                                          base_url=self.base_url)
                elif (entry.resource_type, entry.resource_id) not in written:
                    version = int(entry.version) if entry.version and \
                        entry.version.isdecimal() else None
                    await self.fhir.read(entry.resource_type, entry.resource_id, version)
            except (FhirError, StoreError) as exc:
                raise entry.fail(exc) from None

    def _failed_entry(self, exc: StoreError) -> Entry:
        for entry in self.entries:
            if exc.staged is not None and any(s is exc.staged for s in entry.staged):
                return entry
        return self.entries[0]

    # -- step 1: resolve targets ------------------------------------------------------------
    async def _match_conditions(self, writes: Sequence[Entry]) -> None:
        """Ask the store for the matches of every conditional create and update at once
        (an HL7 result carries a dozen or more: one statement instead of one each). An
        entry whose condition does not parse is left to ``_resolve``, which says why."""
        asked: list[tuple[Entry, SearchPlan]] = []
        for entry in writes:
            criteria = entry.if_none_exist if entry.method == "POST" else (
                entry.criteria if entry.method == "PUT" and entry.resource_id is None
                else None)
            if not criteria or entry.resource_type is None:
                continue
            try:
                entry.condition_plan = await self.fhir.condition(entry.resource_type, criteria)
            except FhirError:
                continue
            asked.append((entry, entry.condition_plan))
        if len(asked) > 1:
            answers = await self.service.store.match_ids_many([p for _e, p in asked], limit=2)
            for (entry, _plan), found in zip(asked, answers, strict=True):
                entry.matched = found

    async def _matches(self, entry: Entry, criteria: list[tuple[str, str]], limit: int
                       ) -> list[str]:
        assert entry.resource_type is not None
        if entry.matched is not None:
            return entry.matched
        if entry.condition_plan is None:
            entry.condition_plan = await self.fhir.condition(entry.resource_type, criteria)
        return await self.service.match_plan(entry.condition_plan, limit=limit)

    async def _resolve(self, entry: Entry, ids: dict[str, str]) -> None:
        kind = entry.resource_type
        assert kind is not None
        try:
            if entry.method == "POST":
                entry.target_id = new_id()
                if entry.if_none_exist is not None:
                    found = await self._matches(entry, entry.if_none_exist, limit=2)
                    if len(found) > 1:
                        raise MultipleMatches(kind, len(found))
                    entry.expected = tuple(found)
                    if found:
                        entry.target_id = found[0]
                        entry.existing = await self.fhir.read(kind, found[0])
            elif entry.resource_id is not None:
                body_id = entry.resource.get("id") if isinstance(entry.resource, dict) else None
                if entry.method == "PUT" and body_id not in (None, entry.resource_id):
                    raise FhirError.of(400, "invalid", f"The body's id {body_id!r} does not "
                                       f"match the url's id {entry.resource_id!r}")
                entry.target_id = entry.resource_id
            else:
                assert entry.criteria is not None
                limit = 101 if entry.method == "DELETE" else 2
                if not entry.criteria:
                    raise FhirError.of(400, "invalid",
                                       "A conditional request needs search criteria")
                found = await self._matches(entry, entry.criteria, limit=limit)
                if entry.method != "DELETE" and len(found) > 1:
                    raise MultipleMatches(kind, len(found))
                if len(found) > 100:
                    raise FhirError.of(412, "too-costly", "More than 100 resources match")
                entry.expected = tuple(found)
                body_id = entry.resource.get("id") if isinstance(entry.resource, dict) else None
                if entry.method == "PUT" and found and body_id not in (None, found[0]):
                    raise FhirError.of(400, "invalid", f"The body's id {body_id!r} is not the "
                                       f"id of the matching resource {found[0]!r}")
                entry.target_id = found[0] if found else (body_id or new_id())
        except (FhirError, StoreError) as exc:
            raise entry.fail(exc) from None
        if entry.full_url and entry.target_id and entry.method != "DELETE":
            ids[entry.full_url] = f"{kind}/{entry.target_id}"

    # -- step 3: stage -------------------------------------------------------------------------
    async def _stage(self, unit: FhirUnit, entry: Entry) -> None:
        kind = entry.resource_type
        assert kind is not None and entry.target_id is not None
        try:
            if entry.method == "POST":
                if entry.existing is not None:
                    return
                condition = None
                if entry.if_none_exist is not None:
                    assert entry.condition_plan is not None
                    condition = Condition(entry.condition_plan, entry.expected)
                entry.staged.append(await unit.create(
                    entry.resource, resource_id=entry.target_id, expected_type=kind,
                    condition=condition))
            elif entry.method == "PUT":
                body = {**entry.resource, "id": entry.target_id}
                condition = None
                if entry.criteria is not None:
                    assert entry.condition_plan is not None
                    condition = Condition(entry.condition_plan, entry.expected)
                entry.staged.append(await unit.update(
                    body, if_match=entry.if_match, expected_type=kind, condition=condition))
            elif entry.method == "PATCH":
                entry.staged.append(await unit.patch(
                    kind, entry.target_id, patch_from_entry(entry.resource),
                    if_match=entry.if_match))
            elif entry.method == "DELETE":
                targets = entry.expected if entry.resource_id is None else (entry.target_id,)
                for target in targets or ():
                    entry.staged.append(await unit.delete(kind, target,
                                                          if_match=entry.if_match))
        except (FhirError, StoreError) as exc:
            raise entry.fail(exc) from None

    def _write_response(self, entry: Entry) -> dict[str, Any]:
        if entry.method == "DELETE":
            response: dict[str, Any] = {"status": STATUS_TEXT[204]}
            if len(entry.staged) == 1 and entry.staged[0].result is not None:
                response["etag"] = entry.staged[0].result.etag
            return {"response": response}
        if entry.existing is not None:  # ifNoneExist found its match: nothing written
            return response_entry(entry.existing, 200, self.base_url, self.prefer)
        staged = entry.staged[0]
        assert staged.result is not None
        created = staged.created and entry.method != "PATCH"
        return response_entry(staged.result, 201 if created else 200, self.base_url,
                              self.prefer)


def _written(entry: Entry) -> str:
    """"Type/id" of the resource an entry wrote or matched, once applied ("" for none)."""
    if entry.existing is not None:
        return f"{entry.existing.resource_type}/{entry.existing.id}"
    if entry.method in ("GET", "HEAD", "DELETE") or not entry.staged:
        return ""
    result = entry.staged[0].result
    return f"{result.resource_type}/{result.id}" if result is not None else ""


def _check_overlaps(writes: list[Entry]) -> None:
    """R4 3.1.0.11.2: a transaction whose entries (after resolving conditional ones) change
    the same resource twice fails."""
    seen: dict[str, Entry] = {}
    for entry in writes:
        targets = entry.expected if entry.method == "DELETE" and entry.resource_id is None \
            else (entry.target_id,)
        for target in targets or ():
            key = f"{entry.resource_type}/{target}"
            if key in seen:
                first = seen[key]
                raise entry.fail(FhirError.of(
                    400, "business-rule", f"{key} is also changed by {first.where}; a "
                    "transaction may change each resource once"))
            seen[key] = entry


