"""What the Sessions and clinical notes modules share: references to users and records,
the code systems and extensions of the platform, and the patient/encounter checks every
create makes."""

from __future__ import annotations

import base64
from typing import Any

from platform_api.auth.principal import Principal
from platform_api.envelope import ApiError, not_found
from platform_api.facade import ApiContext, require_patient

JSON = dict[str, Any]
USER_SYSTEM = "urn:healthplatform:user"
TASK_CODES = "urn:healthplatform:task-code"
DOCUMENT_TYPES = "urn:healthplatform:document-type"
EXTENSION = "urn:healthplatform:extension:"
LOINC = "http://loinc.org"
SNOMED = "http://snomed.info/sct"


def user_reference(principal: Principal) -> JSON:
    """A reference to the acting user by their platform identifier (the platform's
    convention: ``urn:healthplatform:user|<user id>``), shown by e-mail."""
    return {"identifier": {"system": USER_SYSTEM, "value": principal.user_id},
            "display": principal.email or principal.user_id}


def user_of(reference: JSON | None) -> str | None:
    """The user id of a reference made by :func:`user_reference`."""
    identifier = (reference or {}).get("identifier") or {}
    return identifier.get("value") if identifier.get("system") == USER_SYSTEM else None


def user_token(user_id: str) -> str:
    return f"{USER_SYSTEM}|{user_id}"


def local_id(reference: JSON | None, resource_type: str) -> str | None:
    ref = (reference or {}).get("reference", "")
    prefix = f"{resource_type}/"
    return ref[len(prefix):].split("/_history/")[0] if ref.startswith(prefix) else None


def ref(resource_type: str, resource_id: str) -> JSON:
    return {"reference": f"{resource_type}/{resource_id}"}


def coding(system: str, code: str, display: str | None = None) -> JSON:
    found = {"system": system, "code": code}
    if display:
        found["display"] = display
    return found


def concept(system: str, code: str, display: str | None = None,
            text: str | None = None) -> JSON:
    found: JSON = {"coding": [coding(system, code, display)]}
    if text:
        found["text"] = text
    return found


def first_code(value: JSON | None, system: str | None = None) -> str | None:
    for c in (value or {}).get("coding") or []:
        if system is None or c.get("system") == system:
            return c.get("code")  # type: ignore[no-any-return]
    return None


def extension(resource: JSON, name: str) -> Any:
    """The value of the platform extension ``name`` on ``resource`` (None when absent)."""
    for ext in resource.get("extension") or []:
        if ext.get("url") == EXTENSION + name:
            return next((v for k, v in ext.items() if k.startswith("value")), None)
    return None


def set_extension(resource: JSON, name: str, value_type: str, value: Any) -> None:
    """Set (or with ``value`` None, remove) the platform extension ``name``."""
    kept = [e for e in resource.get("extension") or [] if e.get("url") != EXTENSION + name]
    if value is not None:
        kept.append({"url": EXTENSION + name, value_type: value})
    if kept:
        resource["extension"] = kept
    else:
        resource.pop("extension", None)


def text_attachment(text: str, content_type: str = "text/plain; charset=utf-8", **more: Any
                    ) -> JSON:
    return {"contentType": content_type,
            "data": base64.b64encode(text.encode("utf-8")).decode("ascii"), **more}


def attachment_text(attachment: JSON | None) -> str | None:
    data = (attachment or {}).get("data")
    return base64.b64decode(data).decode("utf-8") if data else None


async def check_patient_and_encounter(ctx: ApiContext, payload: JSON) -> JSON:
    """``patient_id`` must be a patient the caller may see (404/403) and
    ``encounter_id``, when given, one of that patient's encounters (404, 422)."""
    await require_patient(ctx, payload["patient_id"])
    encounter_id = payload.get("encounter_id")
    if encounter_id:
        encounter = await ctx.fhir.find_json("Encounter", encounter_id)
        if encounter is None:
            raise not_found("Encounter")
        if local_id(encounter.get("subject"), "Patient") != payload["patient_id"]:
            raise ApiError(422, "ENCOUNTER_PATIENT_MISMATCH",
                           "The encounter is not one of this patient's", field="encounter_id")
    return payload


def source_service(request: Any) -> str:
    route = request.scope.get("route")
    tags = getattr(route, "tags", None) or ["sessions"]
    return str(tags[0])
