"""Bundle rules the specification states in prose (R4 Bundle 2.36.x), as the reference
validator checks them:

- ``fullUrl`` is absolute; a RESTful one (``.../Patient/1``) names the entry's resource
  type and id; no two entries share one (unless they are versions: history);
- a ``document``: every reference inside resolves inside the Bundle, and every entry can
  be reached from the Composition (forward or backward);
- a ``message``: the MessageHeader's ``focus`` resolves inside the Bundle (the rest of
  its structure is the invariants': a MessageHeader first, ``bdl-12``);
- a ``searchset``: each link relation at most once, matches carry ids;
- anywhere: a reference that resolves to an entry of another type than it names, or to
  several entries, is wrong.

The structural rules of the R4 invariants (``bdl-1`` .. ``bdl-12``: a document starts
with a Composition, a message with a MessageHeader...) are the invariants'.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fhir_server.conformance.references import BundleIndex, base_of, parse_reference

# (severity, IssueType code, rule, message, expression)
Finding = tuple[str, str, str, str, str]
SINGLE_RELATIONS = frozenset({"self", "first", "previous", "prev", "next", "last"})


def bundle_problems(bundle: dict[str, Any], path: str) -> list[Finding]:
    found: list[Finding] = []
    entries = [e if isinstance(e, dict) else {} for e in bundle.get("entry") or ()]
    kind = bundle.get("type")
    index = BundleIndex.of(bundle)
    seen: dict[tuple[str, str | None], int] = {}
    for number, entry in enumerate(entries):
        where = f"{path}.entry[{number}]"
        found += _full_url(entry, where)
        full_url, resource = entry.get("fullUrl"), entry.get("resource")
        if isinstance(full_url, str) and isinstance(resource, dict):
            version = (resource.get("meta") or {}).get("versionId")
            key = (full_url, version)
            if key in seen:
                found.append(("error", "invalid", "bundle-duplicate", "Duplicate entries for "
                              f"fullUrl '{full_url}' (entries {seen[key]} and {number})",
                              where))
            else:
                seen[key] = number
        mode = entry["search"].get("mode") if isinstance(entry.get("search"), dict) else None
        if kind == "searchset" and isinstance(resource, dict):
            if mode == "outcome" and resource.get("resourceType") != "OperationOutcome":
                found.append(("error", "invalid", "bundle-search-mode", "an entry of search "
                              "mode 'outcome' must be an OperationOutcome, not a "
                              f"{resource.get('resourceType')}", f"{where}.resource"))
            elif mode == "match" and "id" not in resource:
                found.append(("error", "required", "bundle-search-id", "search results must "
                              "have ids", f"{where}.resource"))
    if kind == "searchset":
        relations: dict[str, int] = {}
        for number, link in enumerate(bundle.get("link") or ()):
            relation = link.get("relation") if isinstance(link, dict) else None
            if relation in SINGLE_RELATIONS:
                if relation in relations:
                    found.append(("error", "invalid", "bundle-link", f"the link relation "
                                  f"'{relation}' can only occur once",
                                  f"{path}.link[{number}]"))
                relations[str(relation)] = number
    found += _references(entries, index, path, kind)
    if kind == "document":
        found += _reachable(entries, index, path)
    return found


def _full_url(entry: dict[str, Any], where: str) -> list[Finding]:
    full_url, resource = entry.get("fullUrl"), entry.get("resource")
    if not isinstance(full_url, str):
        return []
    if ":" not in full_url:
        return [("error", "invalid", "bundle-fullurl", "the fullUrl must be an absolute URL "
                 f"(not '{full_url}')", where)]
    if not isinstance(resource, dict):
        return []
    base = base_of(full_url)
    if base is None:
        return []
    tail = full_url[len(base) + 1:].split("/_history/")[0]
    resource_type, _, resource_id = tail.partition("/")
    if "id" not in resource:
        return [("error", "invalid", "bundle-fullurl", f"the fullUrl '{full_url}' looks like "
                 "a RESTful server URL, but the resource has no id", where)]
    if resource_type != resource.get("resourceType") or resource_id != resource.get("id"):
        return [("error", "invalid", "bundle-fullurl", f"the fullUrl '{full_url}' looks like "
                 "a RESTful server URL, so it must end with the resource's type and id "
                 f"(/{resource.get('resourceType')}/{resource.get('id')})", where)]
    return []


def references_in(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(reference, expression) of every literal reference below ``value``."""
    if isinstance(value, dict):
        reference = value.get("reference")
        if isinstance(reference, str) and path and not path.endswith(".meta"):
            yield reference, path
        for key, child in value.items():
            if key in ("contained", "resourceType"):
                continue
            if isinstance(child, list):
                for number, item in enumerate(child):
                    yield from references_in(item, f"{path}.{key}[{number}]")
            elif isinstance(child, dict):
                yield from references_in(child, f"{path}.{key}")


def _references(entries: list[dict[str, Any]], index: BundleIndex, path: str,
                kind: Any) -> list[Finding]:
    found: list[Finding] = []
    for number, entry in enumerate(entries):
        resource = entry.get("resource")
        if not isinstance(resource, dict):
            continue
        from_url = entry.get("fullUrl") if isinstance(entry.get("fullUrl"), str) else None
        for reference, where in references_in(resource, f"{path}.entry[{number}].resource"):
            if reference.startswith("#"):
                continue
            targets = index.resolve(reference, from_url)
            parsed = parse_reference(reference)
            if len(targets) > 1:
                found.append(("error", "invalid", "bundle-reference", f"Found {len(targets)} "
                              f"matches for '{reference}' in the bundle", where))
            elif targets:
                actual = targets[0].get("resourceType")
                if parsed.resource_type is not None and actual != parsed.resource_type:
                    found.append(("error", "invalid", "bundle-reference", "the entry matching "
                                  f"the reference {reference} is a {actual}", where))
            elif kind == "document" and parsed.kind in ("relative", "uuid", "absolute") and \
                    _local(reference, from_url, index):
                found.append(("error", "not-found", "bundle-reference", f"Can't find "
                              f"'{reference}' in the bundle (a document holds what it "
                              "references)", where))
            elif kind == "message" and number == 0 and ".focus[" in where and \
                    parsed.kind in ("relative", "uuid", "absolute") and \
                    _local(reference, from_url, index):
                found.append(("error", "not-found", "bundle-reference", f"Can't find "
                              f"'{reference}' in the bundle (a message holds its focus)",
                              where))
    return found


def _local(reference: str, from_url: str | None, index: BundleIndex) -> bool:
    """Whether a document must hold what ``reference`` points at: relative and urn
    references always, absolute ones when they share a base with an entry."""
    parsed = parse_reference(reference)
    if parsed.kind in ("relative", "uuid"):
        return True
    base = base_of(reference)
    return base is not None and any(base_of(url) == base for url in index.by_url)


def _reachable(entries: list[dict[str, Any]], index: BundleIndex, path: str) -> list[Finding]:
    """Every entry of a document must be reachable from its Composition."""
    if not entries or not isinstance(entries[0].get("resource"), dict):
        return []
    links: dict[int, set[int]] = {n: set() for n in range(len(entries))}
    positions = {id(e.get("resource")): n for n, e in enumerate(entries)
                 if isinstance(e.get("resource"), dict)}
    for number, entry in enumerate(entries):
        resource = entry.get("resource")
        if not isinstance(resource, dict):
            continue
        from_url = entry.get("fullUrl") if isinstance(entry.get("fullUrl"), str) else None
        for reference, _ in references_in(resource, "x"):
            for target in index.resolve(reference, from_url):
                other = positions.get(id(target))
                if other is not None:
                    links[number].add(other)
                    links[other].add(number)  # "forward or backward"
    reached, pending = {0}, [0]
    while pending:
        for other in links[pending.pop()]:
            if other not in reached:
                reached.add(other)
                pending.append(other)
    return [("error", "invalid", "bundle-reachable", f"Entry '{entries[n].get('fullUrl')}' "
             "isn't reachable by traversing links (forward or backward) from the "
             "Composition", f"{path}.entry[{n}]")
            for n in range(len(entries)) if n not in reached
            and isinstance(entries[n].get("resource"), dict)]
