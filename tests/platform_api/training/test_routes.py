"""The Training operations: served, documented with their models, refused without
credentials."""

from __future__ import annotations

import re

from platform_api.access_rules import OPERATIONS


def template(path: str) -> str:
    return re.sub(r"\{[^}]+\}|:\w+", "{}", path)


def training_operations() -> list[tuple[str, str, str]]:
    return [op for op in OPERATIONS["Workforce and training"]
            if op[1].startswith("/api/training/")]


async def test_every_training_operation_is_served_and_documented(client):
    spec = (await client.get("/openapi.json")).json()
    served = {(method.upper(), template(path)): operation
              for path, methods in spec["paths"].items() for method, operation in methods.items()}
    operations = training_operations()
    assert len(operations) == 10
    for method, path, _access in operations:
        operation = served.get((method, template(path)))
        assert operation is not None, f"{method} {path} is not served"
        ok = next(v for k, v in operation["responses"].items() if k.startswith("2"))
        assert "$ref" in str(ok["content"]["application/json"]["schema"]), (method, path)
        if "requestBody" in operation:
            body = str(operation["requestBody"]["content"])
            assert "$ref" in body or "'title'" in body, (method, path)


async def test_every_training_route_needs_credentials(client):
    for method, path, _access in training_operations():
        url = re.sub(r":\w+", "01a2e0c0-0000-7000-8000-000000000000", path)
        response = await client.request(method, url, json={})
        assert response.status_code == 401, f"{method} {path}"
        assert response.json()["success"] is False
