"""On-device AI: the phones, tablets and point-of-care devices that run models offline.
They register, report in with heartbeats, and are listed with a stale flag when silent
past ``HEALTHPLATFORM_AI_DEVICE_STALE_SECONDS``; ``GET /api/ai/model-info``
(:mod:`.registry`) tells them the current model version of each task.

An edge device is a FHIR **Device** (mapping /api field → element):

    organization_id → owner (Organization/<id>) and the owner label in meta.security
    name            → deviceName[type user-friendly-name]
    serial_number   → serialNumber, and identifier urn:healthplatform:device-serial|
                      <organization id>:<serial> (unique in the organization: 409
                      DEVICE_EXISTS)
    platform        → type.text ("android", "ios", "linux", ...); type coding
                      urn:healthplatform:device-kind#edge-device
    app_version     → version[type app].value
    model_versions  → version[type model]: type.text the task, value the version
    last_seen_at    → extension urn:healthplatform:extension:last-seen (valueInstant)
    battery_level   → extension …:battery-level (valueDecimal, percent)
    status          → status active (entered-in-error is not offered here)
    stale           → computed: no heartbeat (or registration) within the threshold
    updates         → computed: tasks whose active registry version differs from the
                      installed one

Who (the access policy's rules): an organization's ORG:ADMIN (and platform
administrators) registers its devices (``organization.manage``); any member of the owning
organization may send its heartbeat (``ai.device.heartbeat``: a device is used by its
staff; the heartbeat is written through the policy's named elevation after that check);
members list their organizations' devices (``ai.device.list``). Events
``platform.ai.device_registered`` and ``platform.ai.device_models_changed`` (a heartbeat
reporting other model versions).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.ownership import OWNER_SYSTEM, owner_labels, with_owners
from platform_api.ai.registry import AI_MODEL, KINDS, TASK_PATTERN, model_view
from platform_api.envelope import Envelope, not_found, ok
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    SearchParam,
    Unique,
    api_context,
    require_organization,
    until_stable,
)
from platform_api.services import Services
from platform_api.sessions.common import concept, extension, local_id, set_extension

JSON = dict[str, Any]
EDGE_DEVICE = f"{KINDS}|edge-device"
SERIAL_SYSTEM = "urn:healthplatform:device-serial"
TOPIC = "platform.ai.device_"


class ModelVersion(BaseModel):
    task: str = Field(pattern=TASK_PATTERN, examples=["cancer-detection"])
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,39}$", examples=["1.2.0"])


class DeviceRegister(BaseModel):
    organization_id: str = Field(min_length=1, max_length=64)
    name: str = Field(min_length=1, max_length=200, examples=["Ward 3 dermatoscope tablet"])
    serial_number: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._:-]+$")
    platform: str = Field(min_length=1, max_length=40, examples=["android"])
    app_version: str | None = Field(default=None, max_length=40)
    model_versions: list[ModelVersion] = Field(default=[], max_length=100)


class Heartbeat(BaseModel):
    battery_level: float | None = Field(default=None, ge=0, le=100, description="Percent")
    app_version: str | None = Field(default=None, max_length=40)
    model_versions: list[ModelVersion] | None = Field(default=None, max_length=100)


class UpdateView(BaseModel):
    task: str
    installed: str | None
    current: str


class DeviceView(BaseModel):
    id: str
    organization_id: str | None = None
    name: str | None = None
    serial_number: str | None = None
    platform: str | None = None
    app_version: str | None = None
    model_versions: list[ModelVersion] = []
    status: str | None = None
    last_seen_at: str | None = None
    battery_level: float | None = None
    stale: bool
    updates: list[UpdateView] = []


class DeviceQuery(BaseModel):
    organization_id: Annotated[str | None, SearchParam("organization", "Organization/{}")] = \
        Field(default=None, max_length=64)


def _versions(models: list[JSON]) -> list[JSON]:
    return [{"type": {"text": m["task"]}, "value": m["version"]} for m in models]


def device_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    org_id = payload["organization_id"]
    device: JSON = {
        "resourceType": "Device", "status": "active",
        "identifier": [{"system": SERIAL_SYSTEM,
                        "value": f"{org_id}:{payload['serial_number']}"}],
        "type": {**concept(KINDS, "edge-device", "Edge device"), "text": payload["platform"]},
        "deviceName": [{"name": payload["name"], "type": "user-friendly-name"}],
        "serialNumber": payload["serial_number"],
        "owner": {"reference": f"Organization/{org_id}"},
        "version": [*([{"type": {"text": "app"}, "value": payload["app_version"]}]
                      if payload.get("app_version") else []),
                    *_versions(payload.get("model_versions") or [])],
    }
    if not device["version"]:
        device.pop("version")
    set_extension(device, "last-seen", "valueInstant", now_instant())
    return with_owners(device, {org_id})


def _is_model_version(version: JSON) -> bool:
    return (version.get("type") or {}).get("text") not in (None, "app")


def device_view(device: JSON, stale_after: timedelta | None = None,
                current: dict[str, str] | None = None) -> JSON:
    last_seen = extension(device, "last-seen")
    installed = [ModelVersion(task=v["type"]["text"], version=v.get("value", ""))
                 for v in device.get("version") or [] if _is_model_version(v)]
    stale = True
    if last_seen and stale_after is not None:
        seen = datetime.fromisoformat(str(last_seen).replace("Z", "+00:00"))
        stale = datetime.now(UTC) - seen > stale_after
    have = {m.task: m.version for m in installed}
    updates = [UpdateView(task=task, installed=have.get(task), current=version)
               for task, version in sorted((current or {}).items())
               if task in have and have[task] != version]
    return DeviceView(
        id=device["id"], organization_id=local_id(device.get("owner"), "Organization"),
        name=next((n.get("name") for n in device.get("deviceName") or []), None),
        serial_number=device.get("serialNumber"),
        platform=(device.get("type") or {}).get("text"),
        app_version=next((v.get("value") for v in device.get("version") or []
                          if (v.get("type") or {}).get("text") == "app"), None),
        model_versions=installed, status=device.get("status"), last_seen_at=last_seen,
        battery_level=extension(device, "battery-level"), stale=stale, updates=updates,
    ).model_dump()


async def current_versions(fhir: CallerFhir) -> dict[str, str]:
    """Task → the active registry version (the registry: every signed-in user reads it)."""
    current: dict[str, str] = {}
    for device in await fhir.search("Device", [("type", AI_MODEL), ("status", "active")]):
        view = model_view(device)
        current.setdefault(view["task"], view["version"])
    return current


def _stale_after(services: Services) -> timedelta:
    return timedelta(seconds=services.settings.ai_device_stale_seconds)


async def device_views(ctx: ApiContext, devices: list[JSON]) -> list[JSON]:
    current = await current_versions(ctx.fhir)
    return [device_view(d, _stale_after(ctx.services), current) for d in devices]


async def _prepare(ctx: ApiContext, payload: JSON) -> JSON:
    await require_organization(ctx, payload["organization_id"], "organization.manage")
    return payload


async def _my_organizations(ctx: ApiContext, query: DeviceQuery | None
                            ) -> list[tuple[str, str]]:
    """Members see their organizations' devices; platform administrators all."""
    if query is not None and query.organization_id:
        await require_organization(ctx, query.organization_id)
        return []
    ctx.authorize("ai.device.list")
    mine = ctx.organizations_for("organization.work-in")
    if mine is None:  # a platform administrator: every organization's
        return []
    return [("_security", ",".join(f"{OWNER_SYSTEM}|{o}" for o in sorted(mine)))]


devices = Facade(
    resource="Device", name="Device", create=DeviceRegister, view=DeviceView,
    query=DeviceQuery, to_fhir=device_to_fhir, from_fhir=device_view, views=device_views,
    fixed=(("type", EDGE_DEVICE),), prepare=_prepare, list_criteria=_my_organizations,
    unique=Unique(lambda device: [("identifier",
                                   f"{SERIAL_SYSTEM}|{device['identifier'][0]['value']}")],
                  "DEVICE_EXISTS", "This organization already registered a device with "
                  "that serial number"),
    events=Events(created=TOPIC + "registered"), tags=["ai"],
    summaries={"list": "Your organizations' AI devices, with a stale flag when silent "
                       "and the model updates they are due",
               "create": "Register a device (its organization's administrator)"})
router = APIRouter(tags=["ai"])
devices.mount(router, "/api/ai/devices", ops=("list",))
devices.mount(router, "/api/ai/devices/register", ops=("create",))


@router.post("/api/ai/devices/{device_id}/heartbeat", response_model=Envelope[DeviceView],
             summary="A device reports in: last seen, battery, installed model versions")
async def heartbeat(device_id: str, body: Heartbeat,
                    ctx: ApiContext = Depends(api_context)) -> Any:
    services = ctx.services

    async def once() -> JSON:
        device = await ctx.fhir.find_json("Device", device_id)
        if device is None or not any(c.get("code") == "edge-device" for c in (
                device.get("type") or {}).get("coding") or []):
            raise not_found("Device")
        owners = owner_labels(device)
        ctx.authorize("ai.device.heartbeat", owners)
        changed = orjson.loads(orjson.dumps(device))
        set_extension(changed, "last-seen", "valueInstant", now_instant())
        if body.battery_level is not None:
            set_extension(changed, "battery-level", "valueDecimal", body.battery_level)
        versions = [v for v in changed.get("version") or [] if _is_model_version(v)]
        app = [v for v in changed.get("version") or [] if not _is_model_version(v)]
        if body.app_version:
            app = [{"type": {"text": "app"}, "value": body.app_version}]
        models_changed = body.model_versions is not None and \
            _versions([m.model_dump() for m in body.model_versions]) != versions
        if body.model_versions is not None:
            versions = _versions([m.model_dump() for m in body.model_versions])
        changed["version"] = [*app, *versions]
        if not changed["version"]:
            changed.pop("version")
        # A member uses the device; only its organization's administrator may edit it.
        unit = ctx.elevate("device heartbeat: update the device's last-seen time, battery "
                           "and model versions").unit()
        async with unit:
            staged = await unit.update(changed, if_match=int(device["meta"]["versionId"]))
            if models_changed:
                unit.emit(TOPIC + "models_changed", {
                    "device_id": device_id, "organization_id": sorted(owners)[0] if owners
                    else None, "model_versions": [m.model_dump() for m in
                                                  body.model_versions or []]},
                    source_service="ai")
            await unit.commit()
        assert staged.result is not None
        return orjson.loads(staged.result.body)  # type: ignore[no-any-return]

    stored = await until_stable(once)
    return ok(device_view(stored, _stale_after(services), await current_versions(ctx.fhir)))


__all__ = ["DeviceView", "device_view", "devices", "router"]
