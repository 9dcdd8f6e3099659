"""On-device AI: POST /api/ai/devices/register, POST /api/ai/devices/:id/heartbeat,
GET /api/ai/devices (stale flag, model updates due)."""

from __future__ import annotations

from tests.platform_api.ai.conftest import data, refusal
from tests.platform_api.ai.onnx_models import diagnosis_model
from tests.platform_api.ai.test_registry_and_inference import upload


def tablet(clinic, **fields):
    return {"organization_id": clinic.org_id, "name": "Maternity ward tablet",
            "serial_number": "TAB-0042", "platform": "android", "app_version": "3.1.0",
            "model_versions": [{"task": "diagnosis", "version": "1.0.0"}], **fields}


async def test_register_heartbeat_and_list(clinic):
    seen = clinic.recorded("platform.ai.*")
    device = data(await clinic.post("admin", "/api/ai/devices/register", tablet(clinic)), 201)
    assert device["organization_id"] == clinic.org_id and device["stale"] is False
    assert device["model_versions"] == [{"task": "diagnosis", "version": "1.0.0"}]
    stored = (await clinic.client.get(f"/fhir/Device/{device['id']}",
                                      headers=clinic.h("admin"))).json()
    assert stored["owner"] == {"reference": f"Organization/{clinic.org_id}"}
    assert stored["serialNumber"] == "TAB-0042"
    # a nurse of the clinic uses it; the registry now has version 1.1.0 active
    data(await upload(clinic, diagnosis_model(), version="1.1.0"), 201)
    beat = data(await clinic.post("nurse", f"/api/ai/devices/{device['id']}/heartbeat",
                                  {"battery_level": 64}))
    assert beat["battery_level"] == 64 and beat["last_seen_at"] >= device["last_seen_at"]
    assert beat["updates"] == [{"task": "diagnosis", "installed": "1.0.0",
                                "current": "1.1.0"}]
    beat = data(await clinic.post("nurse", f"/api/ai/devices/{device['id']}/heartbeat", {
        "model_versions": [{"task": "diagnosis", "version": "1.1.0"}]}))
    assert beat["updates"] == [] and beat["battery_level"] == 64
    listed = (await clinic.get("doctor", "/api/ai/devices")).json()
    assert listed["meta"]["total"] == 1 and listed["data"][0]["stale"] is False
    await clinic.drain()
    assert [e["topic"] for e in seen if "device" in e["topic"]] == ["platform.ai.device_registered",
                                          "platform.ai.device_models_changed"]


async def test_a_silent_device_is_stale(clinic, app):
    device = data(await clinic.post("admin", "/api/ai/devices/register", tablet(clinic)), 201)
    app.state.services.settings.ai_device_stale_seconds = 0.000001
    listed = data(await clinic.get("admin", "/api/ai/devices",
                                   organization_id=clinic.org_id))
    assert [(d["id"], d["stale"]) for d in listed] == [(device["id"], True)]


async def test_refusals(clinic):
    assert refusal(await clinic.post("doctor", "/api/ai/devices/register",
                                     tablet(clinic))) == (403, "FORBIDDEN")
    assert refusal(await clinic.post("other_admin", "/api/ai/devices/register",
                                     tablet(clinic))) == (403, "FORBIDDEN")
    assert refusal(await clinic.post("admin", "/api/ai/devices/register",
                                     tablet(clinic, organization_id="nope"))) == (
        404, "NOT_FOUND")
    bad = await clinic.post("admin", "/api/ai/devices/register",
                            tablet(clinic, model_versions=[{"task": "X", "version": "1"}]))
    assert refusal(bad) == (422, "VALIDATION_ERROR")
    device = data(await clinic.post("admin", "/api/ai/devices/register", tablet(clinic)), 201)
    assert refusal(await clinic.post("admin", "/api/ai/devices/register",
                                     tablet(clinic))) == (409, "DEVICE_EXISTS")
    # the other clinic neither sees it nor reports for it
    assert data(await clinic.get("other_admin", "/api/ai/devices")) == []
    assert (await clinic.get("other_admin", "/api/ai/devices",
                             organization_id=clinic.org_id)).status_code == 403
    assert refusal(await clinic.post("other_admin", f"/api/ai/devices/{device['id']}/heartbeat",
                                     {})) == (403, "NOT_DEVICE_MEMBER")
    assert refusal(await clinic.post("stranger", "/api/ai/devices/nope/heartbeat", {})) == (
        404, "NOT_FOUND")
    assert refusal(await clinic.get("stranger", "/api/ai/devices")) == (403, "FORBIDDEN")
    assert refusal(await clinic.post("nurse", f"/api/ai/devices/{device['id']}/heartbeat",
                                     {"battery_level": 140})) == (422, "VALIDATION_ERROR")
