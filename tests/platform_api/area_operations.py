"""Checks every /api area's tests make of the area as a whole: each operation the spec
lists for it (``access_rules.OPERATIONS``) is served and documented with named models,
and each one that is not Public refuses a request without credentials.

``area`` is the spec's area name, or the operations themselves (a part of an area: the
/api/ai routes of Clinical decision support)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import httpx

from platform_api.access_rules import OPERATIONS

ANY_ID = "01a2e0c0-0000-7000-8000-000000000000"
Operation = tuple[str, str, str]


def template(path: str) -> str:
    return re.sub(r"\{[^}]+\}|:\w+", "{}", path)


def operations_of(area: str | Sequence[Operation]) -> Sequence[Operation]:
    return OPERATIONS[area] if isinstance(area, str) else area


async def assert_served_and_documented(client: httpx.AsyncClient,
                                       area: str | Sequence[Operation], count: int
                                       ) -> dict[tuple[str, str], Any]:
    """The area's ``count`` operations are served, each answering a named model (a
    DELETE may answer nothing) and taking one when it has a body; the OpenAPI operations
    by (METHOD, template) for further checks."""
    spec = (await client.get("/openapi.json")).json()
    served: dict[tuple[str, str], Any] = {
        (method.upper(), template(path)): operation
        for path, methods in spec["paths"].items() for method, operation in methods.items()}
    operations = operations_of(area)
    assert len(operations) == count
    for method, path, _access in operations:
        operation = served.get((method, template(path)))
        assert operation is not None, f"{method} {path} is not served"
        ok = next(v for k, v in operation["responses"].items() if k.startswith("2"))
        if method != "DELETE":
            assert "$ref" in str(ok["content"]["application/json"]["schema"]), (method, path)
        if method in ("POST", "PUT", "PATCH") and "requestBody" in operation:
            body = str(operation["requestBody"]["content"])
            assert "$ref" in body or "'title'" in body, (method, path)  # a named model
    return served


async def assert_credentials_needed(client: httpx.AsyncClient,
                                    area: str | Sequence[Operation],
                                    skip: Sequence[str] = ()) -> list[str]:
    """Every operation but the Public ones (and the paths in ``skip``) answers 401 without
    credentials; the Public ones' paths are returned for the caller to check."""
    public = []
    for method, path, access in operations_of(area):
        if path in skip:
            continue
        url = re.sub(r":\w+", ANY_ID, path)
        response = await client.request(method, url, json={})
        if access == "public":
            assert response.status_code != 401, f"{method} {path}"
            public.append(path)
            continue
        assert response.status_code == 401, f"{method} {path}"
        assert response.json()["success"] is False
    return public
