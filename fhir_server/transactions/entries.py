"""The entries of a batch or transaction Bundle: parsed, checked, answered.

An entry's ``request`` (R4 3.1.0.11) is parsed into an :class:`Entry`: its method, the
resource type, id and version its URL names, the criteria of a conditional or search
URL, ``ifMatch`` and ``ifNoneExist``. What processing decides for it (its target id, the
match of its condition, what it staged, its response) is kept on the entry too, so a
refusal can name it (``Bundle.entry[3]``). GET and HEAD entries are answered here, as
the caller: a read, a vread or a searchset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fhir_server.bundle import raw
from fhir_server.caller import CallerFhir
from fhir_server.http import parse_etag, parse_query, store_error_to_fhir
from fhir_server.outcome import FhirError, Issue
from fhir_server.search.plan import SearchPlan
from fhir_server.searchset import run_search
from fhir_server.store import StoredResource, StoreError
from fhir_server.store.port import StagedWrite
from fhir_server.validation import check_id, is_resource_type

# R4 3.1.0.11.2: the order in which a transaction processes its entries.
ORDER = {"DELETE": 0, "POST": 1, "PUT": 2, "PATCH": 2, "GET": 3, "HEAD": 3}
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
    if method not in ORDER or not isinstance(url, str) or not url:
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
    """``Type``, ``Type/id``, ``Type/id/_history/vid``, ``Type?criteria`` and (GET)
    ``Type/_search?criteria``, relative or absolute: an absolute URL on another base is
    read from its first resource type on, its query kept (dropping it made a GET entry's
    search match every resource of the type)."""
    if base_url and url.startswith(base_url + "/"):
        url = url[len(base_url) + 1:]
    elif "://" in url:
        split = urlsplit(url)
        segments = [s for s in split.path.split("/") if s]
        first = next((i for i, s in enumerate(segments) if is_resource_type(s)), len(segments))
        url = "/".join(segments[first:]) + (f"?{split.query}" if split.query else "")
    path, _, query = url.lstrip("/").partition("?")
    parts = [p for p in path.split("/") if p]
    if not parts or not is_resource_type(parts[0]):
        raise entry.fail(FhirError.of(400, "not-supported", f"Unsupported request url {url!r}"))
    entry.resource_type = parts[0]
    if parts[1:] == ["_search"] and entry.method in ("GET", "HEAD"):
        parts = parts[:1]
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
        if not entry.version.isdecimal():
            raise FhirError.of(404, "not-found", f"Unknown version {entry.version!r}")
        version = int(entry.version)
    stored = await fhir.read(kind, entry.resource_id, version)
    result = response_entry(stored, 200, base_url, None if entry.method == "GET" else "minimal")
    result["response"].pop("location", None)
    return result


