"""transaction: ``POST [base]`` with a ``transaction`` Bundle (R4 3.1.0.11), all or nothing.

Entries are processed in the order the spec prescribes (DELETE, POST, PUT/PATCH, then
GET/HEAD) whatever their order in the Bundle:

1. *resolve*: every write gets its target id. POST gets a new id (or, with
   ``ifNoneExist``, the id of the one existing match, and then writes nothing); a
   conditional PUT/DELETE (``Patient?identifier=...``) finds its match; every ``fullUrl``
   (``urn:uuid:...`` included) is mapped to ``Type/id``;
2. *rewrite*: references to those fullUrls, and conditional references such as
   ``Patient?identifier=sys|val`` (exactly one match required), become ``Type/id``;
3. *stage and commit* every write in one unit of work: any failure rolls back everything
   and the OperationOutcome names the entry (``Bundle.entry[3]``). Conditions resolved in
   step 1 are re-checked inside the commit; if a concurrent write changed what they
   match, the whole transaction is resolved again (a few times) rather than committing
   references to the wrong resource;
4. GET entries run after the commit and see its result.

The answer is a ``transaction-response`` Bundle with one entry per request entry, in the
request's order: status, location, etag, lastModified and (unless ``Prefer:
return=minimal``) the resource. Batch bundles are in :mod:`fhir_server.interactions.batch`.
"""

from __future__ import annotations

import base64
import binascii
import gc
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from starlette.requests import Request
from starlette.responses import Response

from fhir_server.access import Access
from fhir_server.bundle import raw
from fhir_server.caller import CallerFhir, FhirUnit
from fhir_server.http import (
    FhirResponse,
    check_format,
    parse_etag,
    parse_query,
    prefer_return,
    read_json_body,
    store_error_to_fhir,
)
from fhir_server.interactions.search_type import run_search
from fhir_server.outcome import FhirError, Issue
from fhir_server.search.plan import SearchPlan
from fhir_server.service import FhirService, new_id
from fhir_server.store import (
    Condition,
    ConditionChanged,
    MultipleMatches,
    StoredResource,
    StoreError,
)
from fhir_server.store.port import StagedWrite, Staging
from fhir_server.validation import check_id, is_resource_type

if TYPE_CHECKING:
    from fhir_server.interactions.context import FhirContext

_ORDER = {"DELETE": 0, "POST": 1, "PUT": 2, "PATCH": 2, "GET": 3, "HEAD": 3}
RETRIES = 3
# on_commit(staging, written): see process_bundle.
OnCommit = Callable[[Staging, Sequence[str]], None]
MAX_ENTRIES = 10_000
STATUS_TEXT = {200: "200 OK", 201: "201 Created", 204: "204 No Content"}


@dataclass
class Entry:
    """One request entry, parsed, and what processing decided for it."""

    index: int
    method: str
    url: str
    resource_type: str | None
    resource_id: str | None = None
    version: str | None = None  # GET Type/id/_history/vid
    criteria: list[tuple[str, str]] | None = None  # Type?criteria (conditional or search)
    resource: Any = None
    full_url: str | None = None
    if_match: int | None = None
    if_none_exist: list[tuple[str, str]] | None = None
    # decided while processing
    submitted: Any = None  # the resource as sent: each attempt rewrites from this
    condition_plan: SearchPlan | None = None  # ifNoneExist / criteria, parsed once
    matched: list[str] | None = None  # the condition's matches, asked with the others'
    target_id: str | None = None
    expected: tuple[str, ...] | None = None
    existing: StoredResource | None = None
    staged: list[StagedWrite] = field(default_factory=list)
    response: dict[str, Any] | None = None

    @property
    def where(self) -> str:
        return f"Bundle.entry[{self.index}]"

    def fail(self, error: FhirError | StoreError) -> FhirError:
        """The error, re-addressed to this entry."""
        fhir = error if isinstance(error, FhirError) else store_error_to_fhir(error)
        issues = [Issue(i.severity, i.code, f"{self.where} ({self.method} {self.url}): "
                                            f"{i.diagnostics}", (self.where, *i.expression))
                  for i in fhir.issues]
        return FhirError(fhir.status, issues, fhir.headers)


# --- parsing -----------------------------------------------------------------------------

def bundle_entries(bundle: Any, kind: str) -> list[dict[str, Any]]:
    if not isinstance(bundle, dict) or bundle.get("resourceType") != "Bundle":
        raise FhirError.of(400, "structure", "POST [base] takes a Bundle", "Bundle")
    if bundle.get("type") != kind:
        raise FhirError.of(400, "value", f"Bundle.type must be {kind}", "Bundle.type")
    entries = bundle.get("entry") or []
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise FhirError.of(400, "structure", f"Bundle.entry must be a list of at most "
                           f"{MAX_ENTRIES} entries", "Bundle.entry")
    return entries


def parse_entry(index: int, raw_entry: Any, base_url: str) -> Entry:
    where = f"Bundle.entry[{index}]"
    if not isinstance(raw_entry, dict) or not isinstance(raw_entry.get("request"), dict):
        raise FhirError.of(400, "required", f"{where}.request is missing", f"{where}.request")
    request = raw_entry["request"]
    method = str(request.get("method", "")).upper()
    url = request.get("url")
    if method not in _ORDER or not isinstance(url, str) or not url:
        raise FhirError.of(400, "value", f"{where}.request needs a method (GET, HEAD, POST, "
                           "PUT, PATCH, DELETE) and a url", f"{where}.request")
    entry = Entry(index, method, url, None, resource=raw_entry.get("resource"),
                  full_url=raw_entry.get("fullUrl"))
    _parse_url(entry, url, base_url)
    try:
        entry.if_match = parse_etag(request.get("ifMatch"))
    except FhirError as exc:
        raise entry.fail(exc) from None
    if request.get("ifNoneExist"):
        entry.if_none_exist = parse_query(str(request["ifNoneExist"]))
    _check_shape(entry)
    return entry


def _parse_url(entry: Entry, url: str, base_url: str) -> None:
    if base_url and url.startswith(base_url + "/"):
        url = url[len(base_url) + 1:]
    elif "://" in url:
        url = urlsplit(url).path.rsplit("/fhir/", 1)[-1]
    path, _, query = url.lstrip("/").partition("?")
    parts = [p for p in path.split("/") if p]
    if not parts or not is_resource_type(parts[0]):
        raise entry.fail(FhirError.of(400, "not-supported", f"Unsupported request url {url!r}"))
    entry.resource_type = parts[0]
    if len(parts) >= 2:
        entry.resource_id = parts[1]
    if len(parts) == 4 and parts[2] == "_history":
        entry.version = parts[3]
    elif len(parts) > 2 or (len(parts) == 2 and parts[1].startswith(("$", "_"))):
        raise entry.fail(FhirError.of(400, "not-supported", f"Unsupported request url {url!r}"))
    if query or (len(parts) == 1 and entry.method in ("GET", "HEAD", "PUT", "DELETE", "PATCH")):
        entry.criteria = parse_query(query) if query else []


def _check_shape(entry: Entry) -> None:
    if entry.method in ("POST", "PUT"):
        if not isinstance(entry.resource, dict):
            raise entry.fail(FhirError.of(400, "required", "This entry needs a resource"))
        if entry.resource.get("resourceType") != entry.resource_type:
            raise entry.fail(FhirError.of(400, "invalid",
                                          f"The resource is not a {entry.resource_type}"))
    if entry.method == "POST" and entry.resource_id is not None:
        raise entry.fail(FhirError.of(400, "invalid", "POST takes a type, not an id"))
    if entry.method in ("PUT", "PATCH", "DELETE") and entry.resource_id is None \
            and not entry.criteria:
        raise entry.fail(FhirError.of(400, "invalid",
                                      f"{entry.method} needs Type/id or Type?criteria"))
    if entry.resource_id is not None:
        try:
            check_id(entry.resource_id)
        except FhirError as exc:
            raise entry.fail(exc) from None


# --- references ----------------------------------------------------------------------------

_CONDITIONAL_REFERENCE = re.compile(rb'"reference":("[A-Z][A-Za-z]+\?(?:[^"\\]|\\.)*")')
# A urn fullUrl as a whole token: "urn:uuid:<uuid>" or "urn:oid:<dotted digits>", not
# followed by more of a URL (so urn:uuid:1 never rewrites inside urn:uuid:12).
_URN = re.compile(rb"urn:(?:uuid|oid):[A-Za-z0-9.:-]+(?![A-Za-z0-9._~-])")


class ReferenceRewriter:
    """Rewrites fullUrl and conditional references in resources about to be written.

    Works on the compact JSON text: a ``urn:uuid``/``urn:oid`` fullUrl is replaced
    wherever it occurs as a whole (references, other uri values, the narrative), another
    fullUrl only where it is a ``reference``; conditional references
    (``Patient?identifier=...``) are searched and must match exactly one resource.
    """

    def __init__(self, fhir: CallerFhir, ids: dict[str, str]):
        self.fhir = fhir
        self.urns = {k.encode(): v.encode() for k, v in ids.items() if k.startswith("urn:")}
        self.urls = {orjson.dumps(k): orjson.dumps(v) for k, v in ids.items()
                     if not k.startswith("urn:")}
        # One precompiled pattern for every urn (compiling one per bundle from its fullUrls
        # cost ~4 ms a bundle); a match that is not one of this bundle's fullUrls is left.
        self.pattern = _URN if self.urns else None

    async def rewrite(self, entry: Entry, resource: dict[str, Any]) -> dict[str, Any]:
        raw = orjson.dumps(resource)
        text = raw
        if self.pattern is not None and b"urn:" in text:
            urns = self.urns
            text = self.pattern.sub(lambda m: urns.get(m.group(0), m.group(0)), text)
        for url, target in self.urls.items():
            text = text.replace(b'"reference":' + url, b'"reference":' + target)
        if b"?" in text:
            for match in set(_CONDITIONAL_REFERENCE.findall(text)):
                reference = orjson.loads(match)
                resolved = await _resolve_conditional(self.fhir, entry, reference)
                text = text.replace(b'"reference":' + match,
                                    b'"reference":' + orjson.dumps(resolved))
        return resource if text is raw else orjson.loads(text)  # type: ignore[no-any-return]


async def _resolve_conditional(fhir: CallerFhir, entry: Entry, reference: str) -> str:
    resource_type, _, query = reference.partition("?")
    if not is_resource_type(resource_type):
        return reference
    found = await fhir.match_ids(resource_type, parse_query(query), limit=2)
    if len(found) != 1:
        raise entry.fail(FhirError.of(
            412, "multiple-matches" if found else "not-found",
            f"The conditional reference {reference!r} matches {len(found)} resources; it "
            "must match exactly one"))
    return f"{resource_type}/{found[0]}"


# --- the transaction ---------------------------------------------------------------------------

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
        ordered = sorted(self.entries, key=lambda e: _ORDER[e.method])
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
            for entry in writes:
                await self._stage(unit, entry)
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
                        entry.version.isdigit() else None
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
                    kind, entry.target_id, _patch_operations(entry.resource),
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


def _patch_operations(resource: Any) -> Any:
    """A PATCH entry carries its JSON Patch as a Binary (R4 3.1.0.11.2)."""
    if isinstance(resource, dict) and resource.get("resourceType") == "Binary":
        try:
            return orjson.loads(base64.b64decode(resource.get("data", ""), validate=True))
        except (binascii.Error, orjson.JSONDecodeError):
            raise FhirError.of(400, "structure", "The Binary does not hold a JSON Patch"
                               ) from None
    raise FhirError.of(400, "not-supported",
                       "PATCH entries take a Binary holding a JSON Patch (FHIRPath Patch "
                       "Parameters are not supported)")


def response_entry(stored: StoredResource, status: int, base_url: str, prefer: str | None
                   ) -> dict[str, Any]:
    path = f"{stored.resource_type}/{stored.id}/_history/{stored.version}"
    entry: dict[str, Any] = {
        "fullUrl": f"{base_url}/{stored.resource_type}/{stored.id}" if base_url
        else f"{stored.resource_type}/{stored.id}",
        "response": {"status": STATUS_TEXT.get(status, str(status)),
                     "location": f"{base_url}/{path}" if base_url else path,
                     "etag": stored.etag, "lastModified": stored.last_updated},
    }
    if prefer != "minimal" and not stored.deleted:
        entry["resource"] = raw(stored)
    return entry


async def read_entry(fhir: CallerFhir, entry: Entry, base_url: str) -> dict[str, Any]:
    """A GET/HEAD entry: read, vread or search, as the caller."""
    kind = entry.resource_type
    assert kind is not None
    if entry.resource_id is None:
        result = await run_search(fhir, base_url, kind, [kind], entry.criteria or [],
                                  strict=False)
        return {"resource": result, "response": {"status": "200 OK"}}
    version = None
    if entry.version is not None:
        if not entry.version.isdigit():
            raise FhirError.of(404, "not-found", f"Unknown version {entry.version!r}")
        version = int(entry.version)
    stored = await fhir.read(kind, entry.resource_id, version)
    result = response_entry(stored, 200, base_url, None if entry.method == "GET" else "minimal")
    result["response"].pop("location", None)
    return result


# --- entry points ------------------------------------------------------------------------------

_gc_holds = 0  # bundles being processed with the cyclic garbage collector held off


@contextmanager
def _cyclic_gc_deferred(large: bool) -> Iterator[None]:
    """Hold off Python's cyclic garbage collector while a large bundle is processed.

    Validating and indexing hundreds of resources allocates millions of short-lived,
    acyclic objects; each allocation burst triggers collections that traverse every live
    object, the whole bundle included (measured: 15% of a 500-entry transaction). Nothing
    here creates cycles, so collecting once afterwards loses nothing. A counter keeps
    concurrent bundles from re-enabling it under each other."""
    global _gc_holds
    if not large or (_gc_holds == 0 and not gc.isenabled()):
        yield
        return
    _gc_holds += 1
    gc.disable()
    try:
        yield
    finally:
        _gc_holds -= 1
        if _gc_holds == 0:
            gc.enable()


async def process_bundle(service: FhirService, bundle: Any, *, access: Access,
                         base_url: str = "", prefer: str | None = None,
                         on_commit: OnCommit | None = None) -> dict[str, Any]:
    """A transaction or batch Bundle → its response Bundle (FhirError when refused), each
    entry as ``access`` allows (``SYSTEM`` for the platform's own doors).

    ``on_commit(staging, written)`` (transactions only) runs inside the commit with the
    "Type/id" each entry wrote or matched, in entry order; what it stages (documents,
    events) commits atomically with the resources."""
    kind = bundle.get("type") if isinstance(bundle, dict) else None
    if kind == "batch":
        from fhir_server.interactions.batch import process_batch

        return await process_batch(CallerFhir(service, access), bundle, base_url=base_url,
                                   prefer=prefer)
    raw_entries = bundle_entries(bundle, "transaction")
    with _cyclic_gc_deferred(len(raw_entries) >= 50):
        entries = [parse_entry(i, e, base_url) for i, e in enumerate(raw_entries)]
        return await Transaction(CallerFhir(service, access), entries, base_url=base_url,
                                 prefer=prefer, on_commit=on_commit).run()


async def transaction_or_batch(ctx: FhirContext, request: Request) -> Response:
    """``POST [base]``: a transaction or batch Bundle."""
    check_format(request)
    size = request.headers.get("content-length", "")
    with _cyclic_gc_deferred(size.isdigit() and int(size) > 64 * 1024):  # parsing included
        body = await read_json_body(request)
        result = await process_bundle(ctx.service, body, access=ctx.caller(request).access,
                                      base_url=ctx.fhir_base(request),
                                      prefer=prefer_return(request))
    return FhirResponse(result)
