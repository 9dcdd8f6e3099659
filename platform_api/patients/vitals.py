"""Patients area, vitals: a set of vital signs ⇄ FHIR Observations of the vital signs
profiles (http://hl7.org/fhir/R4/observation-vitalsigns.html), grouped by a panel.

A vitals record is the panel Observation (its id is the record's id): LOINC 85353-1
*Vital signs, weight, height, head circumference, oxygen saturation and BMI panel*
(profile ``vitalspanel``), ``hasMember`` → one Observation per sign measured:

    heart_rate               → LOINC 8867-4 Heart rate, valueQuantity /min (profile heartrate)
    blood_pressure_systolic  → LOINC 85354-9 Blood pressure panel (profile bp),
    blood_pressure_diastolic   component 8480-6 Systolic / 8462-4 Diastolic, mm[Hg]
    temperature              → LOINC 8310-5 Body temperature, Cel (profile bodytemp)
    respiratory_rate         → LOINC 9279-1 Respiratory rate, /min (profile resprate)
    oxygen_saturation        → LOINC 2708-6 and 59408-5 (pulse oximetry), % (profile
                               oxygensat)

Every Observation has category ``vital-signs``, status final (amended once changed),
``subject`` the patient, ``effectiveDateTime`` (``effective_at``, default now),
``performer`` the user who measured (``recorded_by``), ``encounter`` (``encounter_id``),
and an ``interpretation`` (v3-ObservationInterpretation H / L / N) against the adult
reference range of ``VITAL_SIGNS``; ``notes`` → the panel's ``note``. Values are UCUM
quantities, each range-checked against what a living patient can show (``VITAL_SIGNS``:
a heart rate of 900 is a 422 naming ``heart_rate``); blood pressure needs both values,
the systolic above the diastolic.

``PATCH /api/vitals/:id`` changes the signs sent (a new version of each member changed, a
new member for a sign added, a sign set to null marked ``entered-in-error`` and dropped
from ``hasMember``) and the panel;
``DELETE`` deletes the panel and its members. Lists are one search of panels with
``_include=Observation:has-member``; without ``patient_id`` the caller's own (see
``shared``), newest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from platform_api.envelope import ApiError
from platform_api.facade import ApiContext, Facade, SearchParam, Write
from platform_api.patients.shared import (
    JSON,
    LOINC,
    MineQuery,
    coding,
    concept,
    deep_copy,
    fhir_datetime,
    first_note,
    known_patient,
    local_id,
    mine,
    quantity,
    subject_of,
    user_of,
    user_reference,
)

CATEGORY = concept("http://terminology.hl7.org/CodeSystem/observation-category",
                   "vital-signs", "Vital Signs")
INTERPRETATION = "http://terminology.hl7.org/CodeSystem/v3-ObservationInterpretation"
PROFILE = "http://hl7.org/fhir/StructureDefinition/"
PANEL = ("85353-1", "Vital signs, weight, height, head circumference, oxygen saturation and "
                    "BMI panel")
BLOOD_PRESSURE = ("85354-9", "Blood pressure panel with all children optional")


@dataclass(frozen=True)
class VitalSign:
    """One sign: its LOINC codes (the profile's first), UCUM unit, profile, the range a
    living patient can show (outside it: 422) and the adult reference range."""

    field: str
    codes: tuple[tuple[str, str], ...]
    unit: str  # UCUM code
    unit_display: str
    profile: str
    low: float
    high: float
    normal: tuple[float, float]


VITAL_SIGNS: dict[str, VitalSign] = {v.field: v for v in (
    VitalSign("heart_rate", (("8867-4", "Heart rate"),), "/min", "beats/minute", "heartrate",
              20, 300, (60, 100)),
    VitalSign("blood_pressure_systolic", (("8480-6", "Systolic blood pressure"),), "mm[Hg]",
              "mmHg", "bp", 40, 300, (90, 139)),
    VitalSign("blood_pressure_diastolic", (("8462-4", "Diastolic blood pressure"),),
              "mm[Hg]", "mmHg", "bp", 20, 200, (60, 89)),
    VitalSign("temperature", (("8310-5", "Body temperature"),), "Cel", "°C", "bodytemp",
              25, 45, (36.1, 37.8)),
    VitalSign("respiratory_rate", (("9279-1", "Respiratory rate"),), "/min", "breaths/minute",
              "resprate", 4, 80, (12, 20)),
    VitalSign("oxygen_saturation", (
        ("2708-6", "Oxygen saturation in Arterial blood"),
        ("59408-5", "Oxygen saturation in Arterial blood by Pulse oximetry")),
        "%", "%", "oxygensat", 50, 100, (95, 100)),
)}
PRESSURES = ("blood_pressure_systolic", "blood_pressure_diastolic")
# The member Observation each field lives in (both pressures share the bp panel).
MEMBER_OF = {f: ("blood_pressure" if f in PRESSURES else f) for f in VITAL_SIGNS}


def _measure(field: str) -> Any:
    sign = VITAL_SIGNS[field]
    return Field(default=None, ge=sign.low, le=sign.high,
                 description=f"{sign.unit_display} ({sign.low:g}-{sign.high:g})")


class VitalSigns(BaseModel):
    heart_rate: float | None = _measure("heart_rate")
    blood_pressure_systolic: float | None = _measure("blood_pressure_systolic")
    blood_pressure_diastolic: float | None = _measure("blood_pressure_diastolic")
    temperature: float | None = _measure("temperature")
    respiratory_rate: float | None = _measure("respiratory_rate")
    oxygen_saturation: float | None = _measure("oxygen_saturation")
    effective_at: datetime | None = Field(default=None, description="When measured "
                                                                    "(default: now)")
    notes: str | None = Field(default=None, max_length=2000)


class VitalsCreate(VitalSigns):
    patient_id: str = Field(min_length=1, max_length=64)
    encounter_id: str | None = Field(default=None, max_length=64)


class VitalsUpdate(VitalSigns):
    """The signs sent change; null removes one."""


class VitalsView(BaseModel):
    id: str
    patient_id: str | None = None
    heart_rate: float | None = None
    blood_pressure_systolic: float | None = None
    blood_pressure_diastolic: float | None = None
    temperature: float | None = None
    respiratory_rate: float | None = None
    oxygen_saturation: float | None = None
    interpretation: dict[str, str] = Field(default_factory=dict,
                                           description="H, L or N per sign measured")
    effective_at: str | None = None
    recorded_by: str | None = None
    encounter_id: str | None = None
    notes: str | None = None
    status: str
    observation_ids: dict[str, str] = Field(default_factory=dict,
                                            description="The Observation of each sign")
    updated_at: str | None = None


class VitalsQuery(MineQuery):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64, description="A patient's vitals (default: your own)")
    since: Annotated[datetime | None, SearchParam("date", "ge{}")] = None
    until: Annotated[datetime | None, SearchParam("date", "le{}")] = None


# -- mapping ------------------------------------------------------------------------------------
def _interpretation(field: str, value: float) -> str:
    low, high = VITAL_SIGNS[field].normal
    return "L" if value < low else ("H" if value > high else "N")


def _interpreted(field: str, value: float) -> list[JSON]:
    code = _interpretation(field, value)
    display = {"L": "Low", "H": "High", "N": "Normal"}[code]
    return [concept(INTERPRETATION, code, display)]


def _value(field: str, value: float) -> JSON:
    sign = VITAL_SIGNS[field]
    return quantity(value, sign.unit_display, sign.unit)


def _code(field: str) -> JSON:
    codes = BLOOD_PRESSURE if MEMBER_OF[field] == "blood_pressure" else None
    if codes is not None:
        return concept(LOINC, *codes)
    return {"coding": [coding(LOINC, c, d) for c, d in VITAL_SIGNS[field].codes],
            "text": VITAL_SIGNS[field].codes[0][1]}


def _observation_base(panel: JSON, member: str) -> JSON:
    field = PRESSURES[0] if member == "blood_pressure" else member
    base: JSON = {
        "resourceType": "Observation", "status": panel["status"],
        "meta": {"profile": [PROFILE + VITAL_SIGNS[field].profile]},
        "category": [CATEGORY], "code": _code(field), "subject": panel["subject"],
        "effectiveDateTime": panel["effectiveDateTime"], "performer": panel["performer"],
    }
    if panel.get("encounter"):
        base["encounter"] = panel["encounter"]
    return base


def member_to_fhir(panel: JSON, member: str, values: JSON) -> JSON:
    """The Observation of one member with ``values`` (by field)."""
    observation = _observation_base(panel, member)
    if member == "blood_pressure":
        observation["component"] = [
            {"code": concept(LOINC, *VITAL_SIGNS[f].codes[0]), "valueQuantity": _value(
                f, values[f]), "interpretation": _interpreted(f, values[f])}
            for f in PRESSURES]
    else:
        observation["valueQuantity"] = _value(member, values[member])
        observation["interpretation"] = _interpreted(member, values[member])
    return observation


def panel_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    """The panel (its members are staged alongside); on update the fields sent change."""
    if existing is None:
        panel: JSON = {
            "resourceType": "Observation", "status": "final",
            "meta": {"profile": [PROFILE + "vitalspanel"]}, "category": [CATEGORY],
            "code": concept(LOINC, *PANEL, "Vital signs"), "subject": subject_of(payload),
            "effectiveDateTime": fhir_datetime(payload.get("effective_at") or now_instant()),
            "performer": [user_reference(ctx.principal)],
        }
        if payload.get("encounter_id"):
            panel["encounter"] = {"reference": f"Encounter/{payload['encounter_id']}"}
    else:
        panel = {**deep_copy(existing), "status": "amended"}
        if payload.get("effective_at"):
            panel["effectiveDateTime"] = fhir_datetime(payload["effective_at"])
    if "notes" in payload:
        if payload["notes"]:
            panel["note"] = [{"text": payload["notes"]}]
        else:
            panel.pop("note", None)
    return panel


def _codes(concept_: JSON | None) -> set[str]:
    return {c.get("code") for c in (concept_ or {}).get("coding") or []}


def values_of(members: list[JSON]) -> JSON:
    """The /api values held by member Observations (or their components), by field."""
    values: JSON = {}
    for observation in members:
        for part in observation.get("component") or [observation]:
            codes = _codes(part.get("code"))
            for field, sign in VITAL_SIGNS.items():
                if any(c in codes for c, _ in sign.codes) and "valueQuantity" in part:
                    values[field] = part["valueQuantity"].get("value")
    return values


def member_kind(observation: JSON) -> str | None:
    codes = _codes(observation.get("code"))
    if BLOOD_PRESSURE[0] in codes:
        return "blood_pressure"
    return next((f for f, s in VITAL_SIGNS.items() if any(c in codes for c, _ in s.codes)),
                None)


def vitals_view(panel: JSON, members: list[JSON]) -> JSON:
    values = values_of(members)
    meta = panel.get("meta") or {}
    performer = (panel.get("performer") or [None])[0]
    return VitalsView(
        id=panel["id"], patient_id=local_id(panel.get("subject"), "Patient"), **values,
        interpretation={f: _interpretation(f, v) for f, v in values.items()
                        if isinstance(v, int | float)},
        effective_at=panel.get("effectiveDateTime"),
        recorded_by=user_of(performer) or (performer or {}).get("display"),
        encounter_id=local_id(panel.get("encounter"), "Encounter"),
        notes=first_note(panel), status=panel["status"],
        observation_ids={kind: m["id"] for m in members if (kind := member_kind(m))},
        updated_at=meta.get("lastUpdated"),
    ).model_dump()


def _member_ids(panel: JSON) -> list[str]:
    return [i for ref in panel.get("hasMember") or []
            if (i := local_id(ref, "Observation"))]


async def vitals_views(ctx: ApiContext, panels: list[JSON]) -> list[JSON]:
    """Views of panels with their members (one search, as the caller)."""
    if not panels:
        return []
    found = await ctx.fhir.search("Observation", [
        ("_id", ",".join(p["id"] for p in panels)),
        ("_include", "Observation:has-member")], included=True)
    by_id = {o["id"]: o for o in found}
    return [vitals_view(p, [by_id[i] for i in _member_ids(p) if i in by_id]) for p in panels]


# -- what a write brings along: the members -------------------------------------------------------
def check_values(values: JSON) -> None:
    """422 naming the field: nothing measured, half a blood pressure, or a systolic not
    above the diastolic."""
    if not any(values.get(f) is not None for f in VITAL_SIGNS):
        raise ApiError(422, "VALIDATION_ERROR", "heart_rate: at least one vital sign is "
                       "needed", field="heart_rate")
    systolic, diastolic = (values.get(f) for f in PRESSURES)
    if (systolic is None) != (diastolic is None):
        missing = PRESSURES[0] if systolic is None else PRESSURES[1]
        raise ApiError(422, "VALIDATION_ERROR", f"{missing}: a blood pressure needs both "
                       "the systolic and the diastolic value", field=missing)
    if systolic is not None and diastolic is not None and systolic <= diastolic:
        raise ApiError(422, "VALIDATION_ERROR", "blood_pressure_diastolic: must be below the "
                       "systolic pressure", field="blood_pressure_diastolic")


async def _with_members(write: Write) -> JSON:
    """Stage the members a create adds, an update changes, a delete removes; the panel
    then points at those that remain."""
    ctx, unit, panel = write.ctx, write.unit, write.resource
    members: dict[str, JSON] = {}
    if write.current is not None:
        for member_id in _member_ids(write.current):
            found = await ctx.fhir.find_json("Observation", member_id)
            if found is not None and (kind := member_kind(found)) is not None:
                members[kind] = found
    if write.payload is None:
        for member in members.values():
            await unit.delete("Observation", member["id"])
        return panel
    current = values_of(list(members.values()))
    values = {**current, **{f: write.payload[f] for f in VITAL_SIGNS if f in write.payload}}
    check_values(values)
    kept: list[str] = []
    for kind in dict.fromkeys(MEMBER_OF.values()):
        fields = PRESSURES if kind == "blood_pressure" else (kind,)
        wanted = values.get(fields[0]) is not None
        existing = members.get(kind)
        if existing is not None and not wanted:
            # A sign withdrawn from the set was wrong: marked so (an update, which a nurse
            # may make), not erased.
            await unit.update({**existing, "status": "entered-in-error"})
        elif existing is None and wanted:
            created = {**member_to_fhir(panel, kind, values), "id": new_id(),
                       "status": "final"}
            await unit.create(created, resource_id=created["id"])
            kept.append(created["id"])
        elif existing is not None:
            changed = {**member_to_fhir(panel, kind, values), "id": existing["id"]}
            if any(values.get(f) != current.get(f) for f in fields) or \
                    changed["effectiveDateTime"] != existing.get("effectiveDateTime"):
                await unit.update({**changed, "status": "amended"})
            kept.append(existing["id"])
    return {**panel, "hasMember": [{"reference": f"Observation/{i}"} for i in kept]}


vitals = Facade(
    resource="Observation", name="Vitals", create=VitalsCreate, update=VitalsUpdate,
    view=VitalsView, query=VitalsQuery, to_fhir=panel_to_fhir,
    from_fhir=lambda panel: vitals_view(panel, []), views=vitals_views,
    fixed=[("code", f"{LOINC}|{PANEL[0]}")], sort="-date", prepare=known_patient,
    alongside=_with_members, list_criteria=mine("subject", "performer"), tags=["vitals"],
    summaries={"create": "Record vital signs (FHIR vital-signs Observations in a panel)",
               "list": "Your vitals (role=patient: yours; clinician: measured by you), or "
                       "a patient's (patient_id), newest first",
               "get": "A set of vital signs",
               "update": "Correct vital signs (the signs sent change; null removes one)",
               "delete": "Delete a set of vital signs and its Observations"},
)

router = APIRouter(tags=["vitals"])
vitals.mount(router, "/api/vitals", update_method="PATCH")
