"""Public health and surveillance as a whole: every operation the spec lists for them is
served, documented with named models, and refused without credentials."""

from __future__ import annotations

from platform_api.access_rules import OPERATIONS
from tests.platform_api.patients.test_routes import template

OURS = ("/api/public-health/", "/api/surveillance/")
OPERATIONS_OF_AREA = [op for op in OPERATIONS["Clinical decision support"]
                      if op[1].startswith(OURS)]


async def test_every_operation_of_the_area_is_served_and_documented(client):
    spec = (await client.get("/openapi.json")).json()
    served = {(method.upper(), template(path)): operation
              for path, methods in spec["paths"].items() for method, operation in methods.items()}
    assert len(OPERATIONS_OF_AREA) == 7
    for method, path, _access in OPERATIONS_OF_AREA:
        operation = served.get((method, template(path)))
        assert operation is not None, f"{method} {path} is not served"
        ok = next(v for k, v in operation["responses"].items() if k.startswith("2"))
        assert "$ref" in str(ok["content"]["application/json"]["schema"]), (method, path)
        if method == "POST":
            assert "$ref" in str(operation["requestBody"]["content"]), (method, path)
    dashboard = served[("GET", "/api/public-health/dashboard")]["responses"]["200"]
    assert {"image/svg+xml", "image/png"} <= set(dashboard["content"])


async def test_every_route_of_the_area_needs_credentials(client):
    for method, path, _access in OPERATIONS_OF_AREA:
        response = await client.request(method, path, json={})
        assert response.status_code == 401, f"{method} {path}"
        assert response.json()["success"] is False
