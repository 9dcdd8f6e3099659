"""The canonical resources validation reads: StructureDefinitions, CodeSystems, ValueSets
and ConceptMaps, shipped (R4) and stored on the server (written through /fhir or
installed from a package), as one consistent view.

A :class:`ConformanceContext` is such a view, immutable: it compiles each profile once
(:func:`~fhir_server.conformance.model.compile_profile`) and keeps its terminology
(:class:`~fhir_server.terminology.content.TerminologyContent`) with the value set members
it computed. :class:`CanonicalRegistry` holds the current one for a store: it loads the
stored canonical resources into memory and builds a new context when they change. A
change made in this process is seen at once (``invalidate``, called after the commit);
one made by another process (a package installed with the CLI) within
:data:`REFRESH_SECONDS`, from a fingerprint of the newest version of each type.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson

from fhir_server.conformance.definitions import core_url, shipped_structure_definitions
from fhir_server.conformance.model import Profile, compile_profile
from fhir_server.search.plan import SearchPlan
from fhir_server.store.port import ResourceStore
from fhir_server.terminology.content import TerminologyContent, pick_version

log = logging.getLogger(__name__)

CANONICAL_TYPES = ("StructureDefinition", "CodeSystem", "ValueSet", "ConceptMap")
REFRESH_SECONDS = 2.0
PAGE = 500

Stored = dict[tuple[str, str], list[dict[str, Any]]]


class ConformanceContext:
    """Shipped and stored canonical resources at one moment (module docstring)."""

    def __init__(self, stored: Stored | None = None, version: Any = None):
        self.stored: Stored = stored or {}
        self.version = version
        self.terminology = TerminologyContent(self._stored_lookup)
        self._profiles: dict[tuple[str, str | None], Profile | None] = {}
        self.compile_errors: dict[str, str] = {}
        self.cache: dict[str, Any] = {}  # what validators work out once per view

    def _stored_lookup(self, resource_type: str, url: str, version: str | None
                       ) -> dict[str, Any] | None:
        return pick_version(self.stored.get((resource_type, url), ()), version)

    def stored_of(self, resource_type: str) -> list[dict[str, Any]]:
        return [r for (kind, _), found in self.stored.items() if kind == resource_type
                for r in found]

    def structure_definition(self, url: str, version: str | None = None
                             ) -> dict[str, Any] | None:
        url, _, pinned = url.partition("|")
        version = version or pinned or None
        stored = self._stored_lookup("StructureDefinition", url, version)
        if stored is not None:
            return stored
        shipped = shipped_structure_definitions().get(url)
        if shipped is not None and (version is None or
                                    str(shipped.get("version", "")).startswith(version)):
            return shipped
        return None

    def profile(self, canonical: str) -> Profile | None:
        """The compiled profile of a canonical URL (``url`` or ``url|version``), None when
        unknown or without a usable snapshot."""
        url, _, version = canonical.partition("|")
        key = (url, version or None)
        if key not in self._profiles:
            definition = self.structure_definition(url, version or None)
            compiled = None
            if definition is not None:
                try:
                    compiled = compile_profile(definition)
                except (ValueError, KeyError, TypeError) as exc:
                    self.compile_errors[url] = str(exc)
                    log.warning("profile %s cannot be compiled: %s", url, exc)
            self._profiles[key] = compiled
        return self._profiles[key]

    def type_profile(self, type_code: str) -> Profile | None:
        return self.profile(core_url(type_code))

    def supported_profiles(self) -> dict[str, list[str]]:
        """Resource type → the profiles (constraints) on it the server knows."""
        found: dict[str, set[str]] = {}
        for sd in [*shipped_structure_definitions().values(),
                   *self.stored_of("StructureDefinition")]:
            if sd.get("derivation") == "constraint" and sd.get("kind") == "resource":
                found.setdefault(str(sd.get("type")), set()).add(str(sd["url"]))
        return {kind: sorted(urls) for kind, urls in found.items()}

    def profiles_of_type(self, resource_type: str) -> list[str]:
        """The URLs of the profiles (constraints) on ``resource_type`` the server knows."""
        found = [sd["url"] for sd in shipped_structure_definitions().values()
                 if sd.get("type") == resource_type and sd.get("derivation") == "constraint"]
        found += [sd["url"] for sd in self.stored_of("StructureDefinition")
                  if sd.get("type") == resource_type]
        return sorted(set(found))


class CanonicalRegistry:
    """The current :class:`ConformanceContext` of a store (module docstring)."""

    def __init__(self, store: ResourceStore | None = None):
        self.store = store
        self._context = ConformanceContext()
        self._checked = 0.0
        self._fingerprint: Any = None
        self._stale = store is not None
        self._lock = asyncio.Lock()

    @property
    def context(self) -> ConformanceContext:
        """The view as last loaded (``refresh`` first to follow the store)."""
        return self._context

    def invalidate(self) -> None:
        """A canonical resource was written in this process: reload on next refresh."""
        self._stale = True

    async def refresh(self, *, force: bool = False) -> ConformanceContext:
        if self.store is None:
            return self._context
        now = time.monotonic()
        if not (force or self._stale) and now - self._checked < REFRESH_SECONDS:
            return self._context
        async with self._lock:
            if not (force or self._stale) and time.monotonic() - self._checked < \
                    REFRESH_SECONDS:
                return self._context
            self._checked = time.monotonic()
            fingerprint = await self._fingerprint_of(self.store)
            if fingerprint != self._fingerprint or self._stale:
                self._stale = False
                stored = await load_stored(self.store)
                self._context = ConformanceContext(stored, fingerprint)
                self._fingerprint = fingerprint
        return self._context

    @staticmethod
    async def _fingerprint_of(store: ResourceStore) -> tuple[Any, ...]:
        marks = []
        for resource_type in CANONICAL_TYPES:
            page = await store.history(resource_type, None, count=1)
            newest = page.entries[0].seq if page.entries else 0
            marks.append((newest, page.total))
        return tuple(marks)


async def load_stored(store: ResourceStore, types: Sequence[str] = CANONICAL_TYPES
                      ) -> Stored:
    """Every current stored resource of ``types``, by (type, canonical url), the newest
    version first among those with the same url."""
    found: Stored = {}
    for resource_type in types:
        plan = SearchPlan((resource_type,), count=PAGE)
        while True:
            page = await store.search(plan)
            for stored in page.resources:
                resource = orjson.loads(stored.body)
                url = resource.get("url")
                if isinstance(url, str) and url:
                    found.setdefault((resource_type, url), []).append(resource)
            if page.next is None:
                break
            plan.cursor = page.next
    for versions in found.values():
        versions.sort(key=lambda r: str(r.get("version", "")), reverse=True)
    return found
