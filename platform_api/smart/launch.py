"""EHR launch (spec: FHIR and SMART, ``POST /api/smart/launch``; SMART app-launch.md
"Launch App: EHR Launch").

A signed-in clinician (a user's token, not an API key) asks to open a registered app for
a patient, and optionally an encounter of that patient, both of which they may read the
way the app will (their relations, never administrator powers). The answer is the URL to
open, ``{launch_uri}?iss={FHIR base}&launch={opaque}``: the launch handle stands for the
context (user, client, patient, encounter, ``need_patient_banner``, ``intent``) kept as a
``smart_launches`` document under its SHA-256. It expires after
``HEALTHPLATFORM_SMART_LAUNCH_TTL_SECONDS`` and is spent by the first authorization
request that presents it (only that client, only that user may use it).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from fhir_server.store import ResourceGone, ResourceNotFound
from platform_api.auth.dependencies import require_user_session
from platform_api.auth.principal import Principal
from platform_api.auth.tokens import rfc3339
from platform_api.envelope import ApiError, Envelope, ErrorEnvelope, created, not_found
from platform_api.smart.oauth import LAUNCHES, urls
from platform_api.smart.server import as_app_of, smart_server

router = APIRouter(prefix="/api/smart", tags=["SMART"])
JSON = dict[str, Any]


class LaunchRequest(BaseModel):
    client_id: str = Field(min_length=1, max_length=200, description="A registered app")
    patient_id: str = Field(min_length=1, max_length=64, description="Patient in context")
    encounter_id: str | None = Field(default=None, min_length=1, max_length=64,
                                     description="Encounter of that patient in context")
    need_patient_banner: bool = Field(
        default=False, description="Whether the app must show a patient banner (the EHR "
        "usually shows its own)")
    intent: str | None = Field(default=None, max_length=200,
                               description="What the app should open on (app-defined)")


class LaunchView(BaseModel):
    launch_url: str = Field(description="Open this: {launch_uri}?iss=...&launch=...")
    launch: str = Field(description="The opaque launch handle (single use)")
    iss: str = Field(description="The FHIR base the app talks to")
    client_id: str
    patient_id: str
    encounter_id: str | None = None
    expires_in: int


def launch_hash(launch: str) -> str:
    return hashlib.sha256(launch.encode()).hexdigest()


@router.post("/launch", status_code=201, response_model=Envelope[LaunchView],
             responses={s: {"model": ErrorEnvelope} for s in (401, 403, 404, 409, 422)},
             summary="Create an EHR launch context for an app and a patient")
async def create_launch(body: LaunchRequest, request: Request,
                        principal: Principal = Depends(require_user_session)) -> Any:
    server = smart_server(request)
    client = await server.registry.active(body.client_id)
    if client is None:
        raise not_found("SMART client")
    if "authorization_code" not in client["grant_types"] or not client.get("launch_uri"):
        raise ApiError(409, "NOT_LAUNCHABLE", "This app has no launch_uri (or is a backend "
                       "services client): it cannot be launched from the EHR")
    fhir = await as_app_of(server.services, principal, client["id"])
    await _readable(fhir.read("Patient", body.patient_id), "Patient")
    if body.encounter_id is not None:
        encounter = await _readable(fhir.read_json("Encounter", body.encounter_id),
                                    "Encounter")
        if body.patient_id not in fhir.patients_of(encounter):
            raise ApiError(422, "VALIDATION_ERROR", "The encounter is not the patient's",
                           field="encounter_id")
    launch = secrets.token_urlsafe(32)
    ttl = server.settings.smart_launch_ttl_seconds
    now = time.time()
    async with server.services.store.unit_of_work() as uow:
        uow.insert_document(LAUNCHES, launch_hash(launch), {
            "id": launch_hash(launch), "client_id": client["id"],
            "user_id": principal.user_id, "patient": body.patient_id,
            "encounter": body.encounter_id, "need_patient_banner": body.need_patient_banner,
            "intent": body.intent, "created_at": rfc3339(now),
            "expires_at": rfc3339(now + ttl)})
        await uow.commit()
    iss = urls(request).fhir
    separator = "&" if "?" in client["launch_uri"] else "?"
    launch_url = f"{client['launch_uri']}{separator}{urlencode({'iss': iss, 'launch': launch})}"
    return created({"launch_url": launch_url, "launch": launch, "iss": iss,
                    "client_id": client["id"], "patient_id": body.patient_id,
                    "encounter_id": body.encounter_id, "expires_in": ttl},
                   headers={"Cache-Control": "no-store"})


async def _readable(read: Any, what: str) -> Any:
    try:
        return await read
    except (ResourceNotFound, ResourceGone):
        raise not_found(what) from None
