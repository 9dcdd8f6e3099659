"""Profiles in use: validation against them, their snapshots, and the check of writes.

:class:`Conformance` is what the FHIR service holds: the
:class:`~fhir_server.conformance.canonicals.CanonicalRegistry` of its store (shipped and
stored StructureDefinitions and terminology), the validation options, and the profile
enforcement settings (:mod:`.enforcement`).

- ``validate`` runs the full StructureDefinition validation (``$validate``);
- ``check_write`` is what each create and update gets beyond the compiled R4 JSON
  Schema: the profiles the resource claims (``meta.profile``) and those required of it,
  as the enforcement settings say, nothing when there are none;
- ``prepare_structure_definition`` is the write hook of StructureDefinition: a
  differential gets its snapshot generated (and a snapshot that cannot be generated is
  refused, 422), so a profile written through /fhir is usable at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import orjson

from fhir_server.conformance.canonicals import CANONICAL_TYPES, CanonicalRegistry
from fhir_server.conformance.enforcement import ProfilePolicy
from fhir_server.conformance.snapshot import SnapshotError, generate_snapshot
from fhir_server.conformance.validator import Options, Validation
from fhir_server.outcome import FhirError, Issue
from fhir_server.ownership import owner_labels
from fhir_server.store.port import ResourceStore

log = logging.getLogger(__name__)

# A resource whose JSON is larger than this is validated in a worker thread (as the
# service offloads schema validation and indexing; see FhirService.offloads).
LARGE_RESOURCE_BYTES = 32 * 1024
_WARNINGS: ContextVar[list[Issue] | None] = ContextVar("profile_warnings", default=None)


@contextmanager
def collected_warnings() -> Iterator[list[Issue]]:
    """The issues ``warn`` mode finds in the writes made inside the block (for the
    response of the request that made them)."""
    found: list[Issue] = []
    token = _WARNINGS.set(found)
    try:
        yield found
    finally:
        _WARNINGS.reset(token)


class Conformance:
    """See the module docstring."""

    def __init__(self, store: ResourceStore | None = None, *,
                 policy: ProfilePolicy | None = None, options: Options | None = None):
        self.registry = CanonicalRegistry(store)
        self.policy = policy or ProfilePolicy()
        self.options = options or Options()

    def written(self, resource_types: Sequence[str]) -> None:
        """After a commit that wrote (or deleted) resources of ``resource_types``."""
        if any(t in CANONICAL_TYPES for t in resource_types):
            self.registry.invalidate()

    async def validate(self, resource: Any, profiles: Sequence[str] = (), *,
                       options: Options | None = None, fresh: bool = False) -> list[Issue]:
        """Every issue of ``resource`` against its type's definition (or ``profiles``),
        the profiles it claims included (see Options.meta_profiles). ``fresh``: look
        for canonical resources another process stored now, not within REFRESH_SECONDS
        (``$validate``: a package just installed is used by the next call)."""
        context = await self.registry.refresh(force=fresh)

        def run() -> list[Issue]:
            validation = Validation(context, options or self.options)
            validation.resource(resource, profiles)
            return validation.issues

        if _large(resource):
            return await asyncio.to_thread(run)
        return run()

    async def check_write(self, resource: dict[str, Any]) -> list[Issue]:
        """The profile check of a create or update (module docstring): raises a 422
        FhirError in ``enforce`` mode, answers the issues in ``warn`` mode."""
        resource_type = str(resource.get("resourceType"))
        mode, required = self.policy.rule_for(resource_type, owner_labels(resource))
        if mode == "off":
            return []
        meta = resource.get("meta")
        claimed = [p for p in (meta.get("profile") or ()) if isinstance(p, str)] \
            if isinstance(meta, dict) else []
        wanted = list(dict.fromkeys([*claimed, *required]))
        if mode == "warn" and wanted:
            # nothing to warn about in a profile the server does not know (the backport's,
            # another IG's): only enforce refuses those
            context = await self.registry.refresh()
            wanted = [p for p in wanted if context.profile(p) is not None]
        if not wanted:
            return []
        options = Options(self.options.unknown_extensions, self.options.check_codes,
                          meta_profiles=False)
        issues = await self.validate(resource, wanted, options=options)
        errors = [i for i in issues if i.severity in ("error", "fatal")]
        if mode == "enforce" and errors:
            raise FhirError(422, [Issue(
                "error", "processing", f"The {resource_type} does not conform to "
                f"{', '.join(wanted)}", (resource_type,), "profile"), *errors[:50]])
        if errors:
            log.warning("%s/%s does not conform to %s: %s", resource_type, resource.get("id"),
                        ", ".join(wanted), "; ".join(i.diagnostics for i in errors[:5]))
            collected = _WARNINGS.get()
            if collected is not None:
                collected += [Issue("warning", i.code, i.diagnostics, i.expression, i.rule,
                                    i.source) for i in errors]
        return errors

    async def prepare_structure_definition(self, _access: Any, _action: str,
                                           resource: dict[str, Any], _unit: Any
                                           ) -> dict[str, Any]:
        """The write hook of StructureDefinition (module docstring)."""
        if (resource.get("snapshot") or {}).get("element") or \
                not (resource.get("differential") or {}).get("element"):
            return resource
        context = await self.registry.refresh()
        try:
            return generate_snapshot(resource, context.structure_definition)
        except SnapshotError as exc:
            raise FhirError.of(422, "processing", f"The snapshot of {resource.get('url')} "
                               f"cannot be generated: {exc}",
                               "StructureDefinition.differential") from None


def _large(resource: Any) -> bool:
    try:
        return len(orjson.dumps(resource)) > LARGE_RESOURCE_BYTES
    except (orjson.JSONEncodeError, TypeError):
        return False
