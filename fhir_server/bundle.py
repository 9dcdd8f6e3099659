"""Building Bundles (searchset, history) around stored JSON without re-serializing it."""

from __future__ import annotations

from typing import Any

import orjson

from fhir_server.http import http_date
from fhir_server.store import StoredResource


def raw(stored: StoredResource) -> orjson.Fragment:
    """Embed the stored JSON text as-is (no parse, no dump)."""
    return orjson.Fragment(stored.body)


def history_entry(stored: StoredResource, fhir_base: str) -> dict[str, Any]:
    url = f"{stored.resource_type}/{stored.id}"
    entry: dict[str, Any] = {"fullUrl": f"{fhir_base}/{url}"}
    if not stored.deleted:
        entry["resource"] = raw(stored)
    method = stored.method if stored.method in ("POST", "PUT", "PATCH", "DELETE") else "PUT"
    entry["request"] = {"method": method, "url": url if method != "POST" else stored.resource_type}
    entry["response"] = {
        "status": "201 Created" if stored.version == 1 and not stored.deleted else
                  ("204 No Content" if stored.deleted else "200 OK"),
        "etag": stored.etag,
        "lastModified": stored.last_updated,
    }
    return entry


def search_entry(stored: StoredResource, fhir_base: str, mode: str = "match") -> dict[str, Any]:
    return {
        "fullUrl": f"{fhir_base}/{stored.resource_type}/{stored.id}",
        "resource": raw(stored),
        "search": {"mode": mode},
    }


def bundle(kind: str, entries: list[dict[str, Any]], *, total: int | None = None,
           links: dict[str, str] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"resourceType": "Bundle", "type": kind}
    if total is not None:
        result["total"] = total
    if links:
        result["link"] = [{"relation": rel, "url": url} for rel, url in links.items()]
    result["entry"] = entries
    return result


__all__ = ["bundle", "history_entry", "http_date", "raw", "search_entry"]
