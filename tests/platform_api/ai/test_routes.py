"""The /api/ai operations as a whole: every one the spec lists is served, documented
with named models, and refused without credentials (model-info is public)."""

from __future__ import annotations

import re

from platform_api.access_rules import OPERATIONS

AI = [op for op in OPERATIONS["Clinical decision support"] if op[1].startswith("/api/ai/")]


def template(path: str) -> str:
    return re.sub(r"\{[^}]+\}|:\w+", "{}", path)


async def test_every_operation_is_served_and_documented(client):
    assert len(AI) == 11
    spec = (await client.get("/openapi.json")).json()
    served = {(method.upper(), template(path)): operation
              for path, methods in spec["paths"].items() for method, operation in methods.items()}
    for method, path, _access in AI:
        operation = served.get((method, template(path)))
        assert operation is not None, f"{method} {path} is not served"
        answer = next(v for k, v in operation["responses"].items() if k.startswith("2"))
        assert "$ref" in str(answer["content"]["application/json"]["schema"]), (method, path)
        if method == "POST":
            body = str(operation["requestBody"]["content"])
            assert "$ref" in body, (method, path)  # a named model


async def test_every_route_needs_credentials_but_model_info(client):
    for method, path, access in AI:
        url = re.sub(r":\w+", "01a2e0c0-0000-7000-8000-000000000000", path)
        response = await client.request(method, url, json={})
        if access == "public":
            assert response.status_code == 200, path
            continue
        assert response.status_code == 401, f"{method} {path}"
        assert response.json()["success"] is False
