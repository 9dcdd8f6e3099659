"""What every AI-assisted answer shares: what it is based on, its inputs, the statement
that it is decision support, and the AuditEvent each call leaves.

Every answer of ``/api/ai/*`` carries a :class:`Support` block:

    based_on    [{kind: rule | score | model, name, version, source}] — the rule table,
                the validated score (with its publication) or the registered model
                (Device id, name and version) the answer comes from
    inputs      [{name, value, unit, reference}] — what was used (FHIR references of the
                patient's records, or what the caller posted)
    missing     the inputs a rule or score needed and did not find (never guessed)
    disclaimer  the fixed statement that this is decision support, not a diagnosis
    audit_event_id  the AuditEvent recorded for the call

**Who** (the access policy's ``ai.decision-support``): platform administrators and
members of an organization with a clinical role (403 ``CLINICAL_ROLE_REQUIRED``).

**Audit**: one FHIR AuditEvent per call, written before the answer is sent (DICOM
110112 Query, subtype ``urn:healthplatform:audit-subtype|ai-<operation>``, action E,
outcome 0; entities: the patient, the records read, the model Device; agent: the caller
and their address), owned by the patient's organizations (their ORG:ADMINs read it
through ``/api/clinical/audit``), with the event ``platform.ai.decision_support_given``
in the same unit of work; the platform writes it (the caller reads, but writes no audit
trail), through the policy's named elevation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from fhir_server.ownership import owner_labels, with_owners
from platform_api.audit import DCM, ENTITY_TYPE, OBJECT_ROLE
from platform_api.facade import ApiContext, require_patient
from platform_api.observability import request_id_var
from platform_api.sessions.audit import SUBTYPES, audit_event
from platform_api.sessions.common import coding

JSON = dict[str, Any]
DISCLAIMER = ("Decision support, not a diagnosis: a clinician must review this against "
              "the patient's full clinical picture before acting on it.")
GIVEN = "platform.ai.decision_support_given"
PATIENT_ID = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9\-.]{1,64}$")
OPTIONAL_PATIENT_ID = Field(default=None, min_length=1, max_length=64,
                            pattern=r"^[A-Za-z0-9\-.]{1,64}$")


@cache
def data_file(name: str) -> JSON:
    """A knowledge table of ``platform_api/ai/data`` (rules, code lists, coefficients)."""
    return orjson.loads(resources.files("platform_api.ai.data")  # type: ignore[no-any-return]
                        .joinpath(name).read_bytes())


def converted(value: float, unit: str | None, entry: JSON) -> float | None:
    """``value`` in the unit of a table ``entry`` (``unit``, ``conversions``: factors from
    other units); None when the unit is unknown to it (never guessed)."""
    unit = (unit or entry["unit"]).strip()
    if unit == entry["unit"]:
        return value
    factor = (entry.get("conversions") or {}).get(unit)
    return value * factor if factor is not None else None


def instant(text: str | None) -> datetime | None:
    """A FHIR dateTime as an aware datetime (UTC when it names no zone); None when absent
    or not a full date and time."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class Basis(BaseModel):
    kind: Literal["rule", "score", "model"]
    name: str
    version: str | None = None
    source: str | None = Field(default=None, description="Publication, table or model record")


class InputUsed(BaseModel):
    name: str
    value: Any = None
    unit: str | None = None
    reference: str | None = Field(default=None, description="The FHIR record it was read from")


class Support(BaseModel):
    based_on: list[Basis]
    inputs: list[InputUsed] = []
    missing: list[str] = []
    disclaimer: str = DISCLAIMER
    audit_event_id: str | None = None


async def patient_for(ctx: ApiContext, patient_id: str | None) -> JSON | None:
    """The patient named (404 unknown, 403 not the caller's to see), or None."""
    return await require_patient(ctx, patient_id) if patient_id else None


def _entity(reference: str, role: tuple[str, str], kind: tuple[str, str]) -> JSON:
    return {"what": {"reference": reference}, "type": coding(ENTITY_TYPE, *kind),
            "role": coding(OBJECT_ROLE, *role)}


async def record_call(ctx: ApiContext, operation: str, support: Support, *,
                      patient: JSON | None = None, records: Iterable[str] = (),
                      summary: str = "") -> str:
    """Write the call's AuditEvent (and its event) in one unit of work; its id."""
    services = ctx.services
    client = ctx.request.client
    entities = [_entity(r, ("4", "Domain Resource"), ("2", "System Object"))
                for r in dict.fromkeys(records)]
    if patient is not None:
        entities.append(_entity(f"Patient/{patient['id']}", ("1", "Patient"),
                                ("1", "Person")))
    basis = "; ".join(f"{b.kind} {b.name}" + (f" {b.version}" if b.version else "")
                      for b in support.based_on)
    event = audit_event(
        ctx.principal, kind=coding(DCM, "110112", "Query"),
        subtype=coding(SUBTYPES, f"ai-{operation}", f"AI {operation}"), action="E",
        recorded=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        outcome="0", description=f"{basis}: {summary}" if summary else basis,
        address=client.host if client else None,
        user_agent=ctx.request.headers.get("user-agent", "")[:200] or None,
        request_id=request_id_var.get(), entities=entities,
        service=services.settings.service_name)
    owners = owner_labels(patient) if patient is not None else set()
    if owners:
        event = with_owners(event, owners)
    unit = ctx.elevate("decision support: record the call as an AuditEvent").unit()
    async with unit:
        staged = await unit.create(event)
        unit.emit(GIVEN, {"audit_event_id": staged.id, "operation": operation,
                          "patient_id": patient["id"] if patient else None,
                          "user_id": ctx.principal.user_id,
                          "based_on": [b.model_dump() for b in support.based_on]},
                  source_service="ai")
        await unit.commit()
    return str(staged.id)


async def answered(ctx: ApiContext, operation: str, answer: JSON, support: Support, *,
                   patient: JSON | None = None, records: Sequence[str] = (),
                   summary: str = "") -> JSON:
    """``answer`` with its support block, after the call is audited."""
    support.audit_event_id = await record_call(ctx, operation, support, patient=patient,
                                               records=records, summary=summary)
    return {**answer, "support": support.model_dump()}


__all__ = ["DISCLAIMER", "GIVEN", "OPTIONAL_PATIENT_ID", "PATIENT_ID", "Basis", "InputUsed",
           "Support", "answered", "converted", "data_file", "instant", "patient_for",
           "record_call"]
