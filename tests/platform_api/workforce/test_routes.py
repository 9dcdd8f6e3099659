"""The Workforce and training area as a whole (``platform_api.workforce`` and
``platform_api.training``): every operation the spec lists is served, documented with its
models, and refused without credentials."""

from __future__ import annotations

import re

from platform_api.access_rules import OPERATIONS


def template(path: str) -> str:
    return re.sub(r"\{[^}]+\}|:\w+", "{}", path)


def workforce_operations() -> list[tuple[str, str, str]]:
    """The area's operations (the Workforce and the Training packages serve them)."""
    return list(OPERATIONS["Workforce and training"])


async def test_every_workforce_and_training_operation_is_served_and_documented(client):
    spec = (await client.get("/openapi.json")).json()
    served = {(method.upper(), template(path)): operation
              for path, methods in spec["paths"].items() for method, operation in methods.items()}
    operations = workforce_operations()
    assert len(operations) == 26
    for method, path, _access in operations:
        operation = served.get((method, template(path)))
        assert operation is not None, f"{method} {path} is not served"
        ok = next(v for k, v in operation["responses"].items() if k.startswith("2"))
        assert "$ref" in str(ok["content"]["application/json"]["schema"]), (method, path)
        if "requestBody" in operation:
            body = str(operation["requestBody"]["content"])
            assert "$ref" in body or "'title'" in body, (method, path)


async def test_every_workforce_and_training_route_needs_credentials(client):
    for method, path, _access in workforce_operations():
        url = re.sub(r":\w+", "01a2e0c0-0000-7000-8000-000000000000", path)
        response = await client.request(method, url, json={})
        assert response.status_code == 401, f"{method} {path}"
        assert response.json()["success"] is False
