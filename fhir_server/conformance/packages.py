"""FHIR packages (``.tgz``, the npm-style format implementation guides are published in):
read, and installed into the store so their profiles and terminology are usable at once.

A package is a gzipped tar with ``package/package.json`` (name, version, fhirVersions,
dependencies) and its resources as ``package/*.json``. What validation and the
terminology operations read is installed: StructureDefinitions, CodeSystems, ValueSets,
ConceptMaps (and SearchParameters, which ``healthplatform reindex`` activates).
Examples and other resources are left out.

Installation writes every resource in one unit of work as the platform itself (the
system's access): all or nothing. A StructureDefinition without a snapshot gets one
generated first, against the package's own definitions and what the server has (in the
order their bases need). A resource keeps the package's id (an existing one with that id
is replaced: installing a newer version updates it); one without an id gets one made
from its URL. A package for another FHIR version than R4 is refused. Dependencies are
not fetched (the server reaches no registry): a profile whose base is in a package not
installed yet is refused, naming it; install that package first.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fhir_server.access import SYSTEM
from fhir_server.caller import CallerFhir
from fhir_server.conformance.canonicals import ConformanceContext
from fhir_server.conformance.snapshot import SnapshotError, generate_snapshot
from fhir_server.service import FhirService

INSTALLED_TYPES = ("StructureDefinition", "CodeSystem", "ValueSet", "ConceptMap",
                   "SearchParameter")
CORE_PACKAGES = frozenset({"hl7.fhir.r4.core", "hl7.fhir.r4.expansions",
                           "hl7.terminology.r4", "hl7.fhir.uv.extensions.r4"})
MAX_MEMBER_BYTES = 64 * 1024 * 1024  # a resource file larger than this is refused
_ID = re.compile(r"^[A-Za-z0-9\-.]{1,64}$")


class PackageError(ValueError):
    """The file is not a FHIR R4 package this server can install (the message says why)."""


@dataclass(slots=True)
class Package:
    name: str
    version: str
    fhir_versions: list[str]
    dependencies: dict[str, str]
    resources: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # resources of other types (examples...)


def read_package(path: Path) -> Package:
    """The package's manifest and its installable resources."""
    try:
        archive = tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise PackageError(f"{path} is not a package (a .tgz archive): {exc}") from None
    with archive:
        manifest: dict[str, Any] | None = None
        resources: list[dict[str, Any]] = []
        skipped = 0
        for member in archive.getmembers():
            name = member.name.lstrip("./")
            if not member.isfile() or not name.endswith(".json") or \
                    not name.startswith("package/") or name.count("/") != 1:
                continue
            if member.size > MAX_MEMBER_BYTES:
                raise PackageError(f"{name} is larger than {MAX_MEMBER_BYTES} bytes")
            handle = archive.extractfile(member)
            if handle is None:
                continue
            try:
                content = json.loads(handle.read().decode("utf-8-sig"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise PackageError(f"{name} is not JSON: {exc}") from None
            if name == "package/package.json":
                manifest = content
            elif isinstance(content, dict) and content.get("resourceType") in INSTALLED_TYPES:
                resources.append(content)
            elif isinstance(content, dict) and "resourceType" in content:
                skipped += 1
    if manifest is None:
        raise PackageError(f"{path} has no package/package.json: not a FHIR package")
    versions = manifest.get("fhirVersions") or manifest.get("fhir-version-list") or []
    if isinstance(versions, str):
        versions = [versions]
    if versions and not any(str(v).startswith("4.0") for v in versions):
        raise PackageError(f"{manifest.get('name')} is for FHIR {', '.join(versions)}; this "
                           "server is FHIR R4 (4.0.1)")
    return Package(str(manifest.get("name", path.stem)), str(manifest.get("version", "")),
                   [str(v) for v in versions], dict(manifest.get("dependencies") or {}),
                   resources, skipped)


def _resource_id(resource: dict[str, Any]) -> str:
    rid = resource.get("id")
    if isinstance(rid, str) and _ID.match(rid):
        return rid
    digest = hashlib.sha256(str(resource.get("url", "")).encode()).hexdigest()[:16]
    return f"{resource['resourceType'].lower()}-{digest}"


def with_snapshots(package: Package, context: ConformanceContext) -> list[dict[str, Any]]:
    """The package's resources, StructureDefinitions with a snapshot (generated against
    the package and the server's definitions, bases first)."""
    by_url = {r["url"]: r for r in package.resources
              if r["resourceType"] == "StructureDefinition" and isinstance(r.get("url"), str)}
    done: dict[str, dict[str, Any]] = {}

    def lookup(url: str) -> dict[str, Any] | None:
        if url in done:
            return done[url]
        if url in by_url:
            return prepare(by_url[url], set())
        return context.structure_definition(url)

    def prepare(sd: dict[str, Any], visiting: set[str]) -> dict[str, Any]:
        url = sd["url"]
        if url in done:
            return done[url]
        if url in visiting:
            raise PackageError(f"{url}: its baseDefinition chain loops")
        visiting.add(url)
        if (sd.get("snapshot") or {}).get("element"):
            done[url] = sd
        else:
            try:
                done[url] = generate_snapshot(sd, lookup)
            except SnapshotError as exc:
                raise PackageError(f"{url}: the snapshot cannot be generated: {exc}") from None
        return done[url]

    prepared = []
    for resource in package.resources:
        if resource["resourceType"] == "StructureDefinition" and resource.get("url") in by_url:
            resource = prepare(resource, set())
        prepared.append(resource)
    return prepared


@dataclass(frozen=True, slots=True)
class Installed:
    name: str
    version: str
    counts: dict[str, int]
    skipped: int
    dependencies: list[str]  # beyond the R4 core, not checked to be installed


async def install_package(service: FhirService, path: Path) -> Installed:
    """Install the package at ``path`` (module docstring)."""
    package = read_package(path)
    context = await service.conformance.registry.refresh(force=True)
    # Dependencies are not fetched: what the package builds on must be there already
    # (the R4 core always is); a snapshot that needs a missing base fails below.
    missing = [f"{name}#{version}" for name, version in package.dependencies.items()
               if name not in CORE_PACKAGES and not name.startswith("hl7.fhir.r4.")]
    resources = with_snapshots(package, context)
    counts: dict[str, int] = {}
    caller = CallerFhir(service, SYSTEM)
    async with caller.unit() as unit:
        for resource in resources:
            body = dict(resource)
            body["id"] = _resource_id(resource)
            body.pop("meta", None)
            await unit.update(body)
            counts[resource["resourceType"]] = counts.get(resource["resourceType"], 0) + 1
        await unit.commit()
    await service.conformance.registry.refresh(force=True)
    return Installed(package.name, package.version, counts, package.skipped, missing)
