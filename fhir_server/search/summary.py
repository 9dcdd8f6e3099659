"""``_summary`` and ``_elements``: returning part of each resource (R4 3.1.1.5.8-9).

Which elements are "summary" and which are mandatory comes from the StructureDefinitions
(generated into the registry data). A subsetted resource is marked with the
``SUBSETTED`` tag so no client mistakes it for the whole resource.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fhir_server.search.registry import SearchRegistry

SUBSETTED = {"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue",
             "code": "SUBSETTED", "display": "Resource encoded in summary mode"}
_ALWAYS = ("resourceType", "id", "meta")


def _matches(key: str, names: Iterable[str]) -> bool:
    for name in names:
        if name == key or (name.endswith("[x]") and key.startswith(name[:-3])
                           and key[len(name) - 3:len(name) - 2].isupper()):
            return True
    return False


def _keep(resource: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    wanted = [*names, *_ALWAYS]
    kept = {k: v for k, v in resource.items() if _matches(k, wanted)}
    meta = dict(kept.get("meta") or {})
    meta["tag"] = [*(meta.get("tag") or []), SUBSETTED]
    kept["meta"] = meta
    return kept


def summarize(resource: dict[str, Any], mode: str, registry: SearchRegistry) -> dict[str, Any]:
    """``_summary=true|text|data`` applied to one resource."""
    info = registry.elements.get(resource.get("resourceType", ""), {})
    if mode == "true":
        return _keep(resource, info.get("summary", ()))
    if mode == "text":
        return _keep(resource, ["text", *info.get("mandatory", ())])
    if mode == "data":
        return _keep(resource, [k for k in resource if k != "text"])
    return resource


def select_elements(resource: dict[str, Any], names: Iterable[str], registry: SearchRegistry
                    ) -> dict[str, Any]:
    """``_elements=a,b``: those top-level elements plus the mandatory ones."""
    info = registry.elements.get(resource.get("resourceType", ""), {})
    return _keep(resource, [*names, *info.get("mandatory", ())])
