"""What the modules of the Patients area share: references to users and patients, codings
and quantities, "my records" lists, the Provenance of an /api write.

- **Users** are referred to by their platform identifier (a logical reference:
  ``{"identifier": {"system": "urn:healthplatform:user", "value": <user id>}, "display":
  <e-mail>}``), as the labs area does, so a record says who wrote it without a
  Practitioner resource having to exist; "my records" is then the search
  ``<author param>:identifier=urn:healthplatform:user|<user id>``.
- **My records** (``GET /api/vitals`` and the like without ``patient_id``): with
  ``role=patient`` the records about the caller's own Patient record, with
  ``role=clinician`` the records the caller wrote; by default ``patient`` for a user with
  a patient profile and no organization, ``clinician`` otherwise (and every record for
  whom the policy's ``records.list-all`` admits: platform administrators). With
  ``patient_id``, that patient's records, once the caller may see the patient (404
  unknown, 403 not theirs to see).
- **Provenance**: who made each version of a record is a FHIR Provenance written in the
  same unit of work (``target`` the version-specific reference of each resource written,
  ``recorded``, ``activity`` from v3-DataOperation, ``agent.who`` the user, type
  ``author``). Provenance is FHIR's answer to "who made this version"; AuditEvent is the
  security log. A Provenance is owned like the record it is about (its owner labels), so
  the record's organization reads it on /fhir.

A workflow step that writes what its caller could not (a prescription dispatched to a
pharmacy, a patient asking for a refill) is decided by the access policy's rule for it
(:mod:`platform_api.policy.actions.care`) and then written through the policy's named
elevation (``ctx.elevate("<action>: <what it writes>")``), next to the route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, date, datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from fhir_server.access import CREATE
from fhir_server.ownership import owner_labels, with_owners
from platform_api.auth.principal import Principal
from platform_api.facade import ApiContext, require_patient

JSON = dict[str, Any]
USER_SYSTEM = "urn:healthplatform:user"
LOINC = "http://loinc.org"
SNOMED = "http://snomed.info/sct"
UCUM = "http://unitsofmeasure.org"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
DATA_OPERATION = "http://terminology.hl7.org/CodeSystem/v3-DataOperation"
PARTICIPANT_TYPE = "http://terminology.hl7.org/CodeSystem/provenance-participant-type"
TASK_CODES = "urn:healthplatform:task-code"
NO_PATIENT = "none"  # a patient id no record has: "my records" of a user without a profile

Role = Literal["patient", "clinician"]
ROLE_HELP = ("patient: the records about you; clinician: the records you wrote (default: "
             "patient when you have a patient profile and no organization)")


# -- small FHIR builders and readers -------------------------------------------------------
def deep_copy(resource: JSON) -> JSON:
    return orjson.loads(orjson.dumps(resource))  # type: ignore[no-any-return]


def coding(system: str, code: str, display: str | None = None) -> JSON:
    found = {"system": system, "code": code}
    if display:
        found["display"] = display
    return found


def concept(system: str, code: str, display: str | None = None, text: str | None = None
            ) -> JSON:
    found: JSON = {"coding": [coding(system, code, display)]}
    if text:
        found["text"] = text
    return found


def first_coding(concept_: JSON | None) -> JSON:
    return ((concept_ or {}).get("coding") or [{}])[0]  # type: ignore[no-any-return]


def concept_text(concept_: JSON | None) -> str | None:
    first = first_coding(concept_)
    return (concept_ or {}).get("text") or first.get("display") or first.get("code")


def code_in(concept_: JSON | None, system: str) -> str | None:
    """The code of ``concept_`` in ``system``, if it has one."""
    for c in (concept_ or {}).get("coding") or []:
        if c.get("system") == system:
            return c.get("code")  # type: ignore[no-any-return]
    return None


def fhir_datetime(value: datetime | date | str) -> str:
    """A FHIR dateTime (a time without a zone is taken as UTC)."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    return value.isoformat() if isinstance(value, date) else value


def quantity(value: float, unit: str, code: str | None = None) -> JSON:
    """A UCUM quantity (``unit`` as shown, ``code`` the UCUM code, the unit by default)."""
    return {"value": value, "unit": unit, "system": UCUM, "code": code or unit}


def local_id(reference: JSON | None, resource_type: str) -> str | None:
    ref = (reference or {}).get("reference", "")
    prefix = f"{resource_type}/"
    return ref[len(prefix):].split("/_history/")[0] if ref.startswith(prefix) else None


def version_of(resource: JSON) -> int:
    return int((resource.get("meta") or {}).get("versionId") or 0)


def versioned(resource: JSON, version: int) -> str:
    return f"{resource['resourceType']}/{resource['id']}/_history/{version}"


def without_meta(resource: JSON) -> JSON:
    return {k: v for k, v in resource.items() if k != "meta"}


def first_note(resource: JSON) -> str | None:
    """The text of a resource's first ``note``."""
    notes = resource.get("note") or [{}]
    return notes[0].get("text")  # type: ignore[no-any-return]


# -- users and patients --------------------------------------------------------------------
def user_reference(principal: Principal) -> JSON:
    return {"identifier": {"system": USER_SYSTEM, "value": principal.user_id},
            "display": principal.email or principal.user_id}


def user_of(reference: JSON | None) -> str | None:
    """The user id a logical reference made by :func:`user_reference` names."""
    identifier = (reference or {}).get("identifier") or {}
    return identifier.get("value") if identifier.get("system") == USER_SYSTEM else None


def patient_name(patient: JSON) -> str | None:
    for name in patient.get("name") or []:
        text = name.get("text") or " ".join([*name.get("given", []), name.get("family", "")])
        if text.strip():
            return text.strip()  # type: ignore[no-any-return]
    return None


def patient_reference(patient: JSON) -> JSON:
    found = {"reference": f"Patient/{patient['id']}"}
    if (name := patient_name(patient)) is not None:
        found["display"] = name
    return found


async def known_patient(ctx: ApiContext, payload: JSON) -> JSON:
    """A create's ``prepare``: the payload's patient must be visible to the caller (404
    unknown, 403 not theirs to see); its name travels as the subject's display."""
    patient = await require_patient(ctx, payload["patient_id"])
    return {**payload, "_patient": patient}


def subject_of(payload: JSON) -> JSON:
    """The subject reference of a prepared payload (see :func:`known_patient`)."""
    patient = payload.get("_patient")
    return patient_reference(patient) if patient else {
        "reference": f"Patient/{payload['patient_id']}"}


# -- "my records" ----------------------------------------------------------------------------
class MineQuery(BaseModel):
    """The ``role`` filter of the lists that default to the caller's own records."""

    role: Role | None = Field(None, description=ROLE_HELP)


def role_of(ctx: ApiContext, asked: Role | None) -> Role | None:
    """The perspective of a "my records" list (None: everything the caller may see)."""
    if asked is not None:
        return asked
    if ctx.may("records.list-all"):
        return None
    member = bool(ctx.organizations_for("organization.work-in"))
    return "patient" if ctx.access.subject.patient_id is not None and not member \
        else "clinician"


Criteria = list[tuple[str, str]]


def mine(patient_param: str, author_param: str | None = None, *,
         clinician: Callable[[ApiContext], Criteria] | None = None,
         narrowed_by: str = "patient_id"
         ) -> Callable[[ApiContext, Any], Awaitable[Criteria]]:
    """A facade's ``list_criteria``: when the query's ``narrowed_by`` field is given, its
    own criteria (``patient_id``: that patient's records, once the patient is visible);
    else the caller's own (see the module docstring): as a patient ``patient_param``
    names their record, as a clinician ``clinician(ctx)`` decides (default: what
    ``author_param`` names them as the author of)."""

    async def criteria(ctx: ApiContext, query: Any) -> Criteria:
        narrowed = getattr(query, narrowed_by, None)
        if narrowed is not None:
            if narrowed_by == "patient_id":
                await require_patient(ctx, narrowed)
            return []
        role = role_of(ctx, getattr(query, "role", None))
        if role is None:
            return []
        if role == "patient":
            own = ctx.access.subject.patient_id or NO_PATIENT
            return [(patient_param, f"Patient/{own}")]
        if clinician is not None:
            return clinician(ctx)
        return [(f"{author_param}:identifier", f"{USER_SYSTEM}|{ctx.principal.user_id}")]
    return criteria


# -- provenance ------------------------------------------------------------------------------
def provenance(targets: Iterable[str], activity: str, principal: Principal, when: str, *,
               owners: Iterable[str] = (), reason: str | None = None,
               signature: JSON | None = None) -> JSON:
    """Who made the versions ``targets`` (``Type/id/_history/n``) and how (``activity``:
    CREATE, UPDATE, DELETE, or another v3-DataOperation code)."""
    record: JSON = {
        "resourceType": "Provenance", "target": [{"reference": t} for t in targets],
        "recorded": when,
        "activity": concept(DATA_OPERATION, activity, activity.lower()),
        "agent": [{"type": concept(PARTICIPANT_TYPE, "author", "Author"),
                   "who": user_reference(principal)}],
    }
    if reason:
        record["reason"] = [{"text": reason}]
    if signature is not None:
        record["signature"] = [signature]
    return with_owners(record, owners) if owners else record


def provenance_owners(ctx: ApiContext, resource: JSON) -> frozenset[str]:
    """The owners a Provenance of ``resource`` gets: the resource's own, those the policy
    lets the caller write a Provenance for (all of them for a platform administrator)."""
    return frozenset(o for o in owner_labels(resource) if ctx.fhir.admitted(
        CREATE, with_owners({"resourceType": "Provenance"}, {o})))


def source_service(area: str) -> str:
    return f"patients.{area}"
