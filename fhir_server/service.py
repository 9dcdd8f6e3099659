"""The FHIR service: every write to the system of record goes through here.

It validates, assigns ids, extracts search-index values, and stages the write in a unit of
work, so versioning, indexing and events happen once, in one place, whether the caller is
the FHIR REST API, an /api facade or the HL7v2 gateway.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import jsonpatch
import orjson

from fhir_server.outcome import FhirError
from fhir_server.store import (
    IndexRows,
    ResourceGone,
    ResourceNotFound,
    ResourceStore,
    StoredResource,
    UnitOfWork,
    VersionConflict,
)
from fhir_server.store.port import StagedWrite
from fhir_server.validation import check_id, is_resource_type, validate_resource

Indexer = Callable[[dict[str, Any]], IndexRows]


def new_id() -> str:
    return str(uuid.uuid4())


class FhirService:
    def __init__(self, store: ResourceStore, *, indexer: Indexer | None = None):
        self.store = store
        self.indexer = indexer

    # -- reads -----------------------------------------------------------------------
    async def read(self, resource_type: str, resource_id: str, version: int | None = None
                   ) -> StoredResource:
        self.check_type(resource_type)
        return await self.store.read(resource_type, resource_id, version)

    async def read_json(self, resource_type: str, resource_id: str) -> dict[str, Any]:
        return orjson.loads((await self.read(resource_type, resource_id)).body)  # type: ignore[no-any-return]

    async def find_json(self, resource_type: str, resource_id: str) -> dict[str, Any] | None:
        """The current resource as JSON, or None when unknown or deleted."""
        try:
            return await self.read_json(resource_type, resource_id)
        except (ResourceNotFound, ResourceGone):
            return None

    def check_type(self, resource_type: str) -> None:
        if not is_resource_type(resource_type):
            raise FhirError.of(404, "not-supported", f"Unknown resource type {resource_type!r}")

    # -- staged writes (callers own the unit of work) ----------------------------------
    def stage_create(self, uow: UnitOfWork, resource: dict[str, Any], *,
                     resource_id: str | None = None) -> StagedWrite:
        """Validate and stage a create with a server-assigned id (FHIR ignores a client id
        on POST)."""
        validate_resource(resource)
        resource = dict(resource)
        resource["id"] = resource_id or new_id()
        return uow.create(resource["resourceType"], resource["id"], resource,
                          index=self._index(resource), method="POST")

    def stage_update(self, uow: UnitOfWork, resource: dict[str, Any], *,
                     if_match: int | None = None, method: str = "PUT") -> StagedWrite:
        validate_resource(resource)
        resource_id = resource.get("id")
        if not isinstance(resource_id, str):
            raise FhirError.of(400, "required", "An update needs the resource id in the body",
                               f"{resource['resourceType']}.id")
        return uow.update(resource["resourceType"], resource_id, resource, if_match=if_match,
                          index=self._index(resource), method=method)

    def _index(self, resource: dict[str, Any]) -> IndexRows | None:
        return self.indexer(resource) if self.indexer is not None else None

    # -- one-shot writes -----------------------------------------------------------------
    async def create(self, resource: dict[str, Any], *, expected_type: str | None = None
                     ) -> StoredResource:
        validate_resource(resource, expected_type)
        async with self.store.unit_of_work() as uow:
            staged = self.stage_create(uow, resource)
            await uow.commit()
        assert staged.result is not None
        return staged.result

    async def update(self, resource_type: str, resource_id: str, resource: dict[str, Any], *,
                     if_match: int | None = None) -> tuple[StoredResource, bool]:
        """Update (or create with the client's id); returns (stored, created)."""
        self.check_type(resource_type)
        check_id(resource_id)
        validate_resource(resource, resource_type)
        body_id = resource.get("id")
        if body_id is None:
            raise FhirError.of(400, "required", "The resource in an update must carry its id",
                               f"{resource_type}.id")
        if body_id != resource_id:
            raise FhirError.of(400, "invalid",
                               f"The body's id {body_id!r} does not match the URL's id "
                               f"{resource_id!r}", f"{resource_type}.id")
        async with self.store.unit_of_work() as uow:
            staged = self.stage_update(uow, resource, if_match=if_match)
            await uow.commit()
        assert staged.result is not None
        return staged.result, staged.result.version == 1

    async def patch(self, resource_type: str, resource_id: str, operations: Any, *,
                    if_match: int | None = None) -> StoredResource:
        """Apply a JSON Patch (RFC 6902) to the current version and store the result."""
        current = await self.read(resource_type, resource_id)
        if if_match is not None and if_match != current.version:
            raise VersionConflict(resource_type, resource_id, if_match, current.version)
        if not isinstance(operations, list):
            raise FhirError.of(400, "structure", "A JSON Patch body must be an array of operations")
        try:
            patched = jsonpatch.apply_patch(orjson.loads(current.body), operations)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError,
                KeyError, ValueError) as exc:
            raise FhirError.of(422, "processing", f"The JSON Patch could not be applied: {exc}"
                               ) from None
        if patched.get("resourceType") != resource_type or patched.get("id") != resource_id:
            raise FhirError.of(422, "processing", "A patch may not change resourceType or id")
        async with self.store.unit_of_work() as uow:
            # Guard against a concurrent write between our read and this commit.
            staged = self.stage_update(uow, patched, if_match=current.version, method="PATCH")
            await uow.commit()
        assert staged.result is not None
        return staged.result

    async def delete(self, resource_type: str, resource_id: str, *,
                     if_match: int | None = None) -> StoredResource:
        self.check_type(resource_type)
        current = await self.store.read_current(resource_type, resource_id)
        if current is None:
            raise ResourceNotFound(resource_type, resource_id)
        async with self.store.unit_of_work() as uow:
            staged = uow.delete(resource_type, resource_id, if_match=if_match)
            await uow.commit()
        assert staged.result is not None
        return staged.result
