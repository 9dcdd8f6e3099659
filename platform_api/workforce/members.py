"""Workforce members: an organization's staff as rostering sees them, as FHIR
**PractitionerRole** (the role a person has at an organization, what they may do there,
when they are not available: what a FHIR integrator reads a staff directory from).

Mapping (/api field → PractitionerRole element):

    user_id              → practitioner.identifier (urn:healthplatform:user|<id>), with
                           the member's name as practitioner.display; identifier
                           urn:healthplatform:workforce-member|<org_id>:<user_id> (one
                           workforce record per member and organization: 409
                           ``MEMBER_EXISTS``)
    organization_id      → organization (Organization/<id>) and the owner label
    role                 → code urn:healthplatform:org-role#ORG:<ROLE> (read from the
                           membership, :mod:`platform_api.organizations.members`: the
                           person must be a member, 422 ``NOT_A_MEMBER``)
    grade                → code urn:healthplatform:workforce-grade#<grade>
    skills               → code urn:healthplatform:workforce-skill#<skill> (each)
    contracted_hours     → extension …workforce-contracted-hours (hours a week)
    max_hours_per_week   → extension …workforce-max-hours-per-week (default: the setting)
    preferred_shift_types / avoided_shift_types
                         → extension …workforce-preferred-shift-type / …-avoided-… (ids)
    unavailability[]     → notAvailable[] (description = reason, during = start..end);
                           approved leave is added here too (:mod:`.leave`)
    (always)             → meta.tag urn:healthplatform:workforce#member, active true

The workforce record sits beside the practitioner role the Doctors area keeps for a
doctor's directory entry (told apart by the tag). Only the organization's ``ORG:ADMIN``
creates them (the access policy's directory rights agree); its members list them.
Event ``platform.workforce.member_created`` (payload: the member's view).
"""

from __future__ import annotations

from datetime import date, datetime, time
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, Field, model_validator

from fhir_server.ownership import OWNER_SYSTEM, owner_labels, with_owners
from platform_api.envelope import ApiError
from platform_api.facade import ApiContext, Events, Facade, SearchParam, Unique
from platform_api.organizations.members import MEMBERS
from platform_api.workforce.common import organization

JSON = dict[str, Any]
USER_SYSTEM = "urn:healthplatform:user"
MEMBER_SYSTEM = "urn:healthplatform:workforce-member"
ROLE_SYSTEM = "urn:healthplatform:org-role"
GRADE_SYSTEM = "urn:healthplatform:workforce-grade"
SKILL_SYSTEM = "urn:healthplatform:workforce-skill"
EXTENSION = "urn:healthplatform:extension:workforce-"
TAG = {"system": "urn:healthplatform:workforce", "code": "member"}
MAX_MEMBERS = 1000
Code = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


class Unavailability(BaseModel):
    start: date | datetime = Field(examples=["2027-02-08"])
    end: date | datetime = Field(examples=["2027-02-12"],
                                 description="A date: the whole day is included")
    reason: str | None = Field(default=None, max_length=200, examples=["Study leave"])

    @model_validator(mode="after")
    def _ordered(self) -> Unavailability:
        if any(isinstance(v, datetime) and v.tzinfo is None for v in (self.start, self.end)):
            raise ValueError("a date-time needs its time zone (or give a date)")
        if window(self.start, self.end)[1] <= window(self.start, self.end)[0]:
            raise ValueError("end is before start")
        return self


class MemberCreate(BaseModel):
    user_id: str = Field(min_length=1, max_length=64)
    organization_id: str | None = Field(default=None, max_length=64)
    grade: str | None = Field(default=None, max_length=64, examples=["Nursing Officer II"])
    skills: list[Code] = Field(default_factory=list, max_length=30, examples=[["icu"]])
    contracted_hours: float = Field(default=40, ge=0, le=80,
                                    description="Contracted hours a week")
    max_hours_per_week: float | None = Field(default=None, gt=0, le=96)
    preferred_shift_types: list[str] = Field(default_factory=list, max_length=20)
    avoided_shift_types: list[str] = Field(default_factory=list, max_length=20)
    unavailability: list[Unavailability] = Field(default_factory=list, max_length=100)


class MemberView(BaseModel):
    id: str
    organization_id: str | None = None
    user_id: str | None = None
    name: str | None = None
    role: str | None = None
    grade: str | None = None
    skills: list[str] = []
    contracted_hours: float | None = None
    max_hours_per_week: float | None = None
    preferred_shift_types: list[str] = []
    avoided_shift_types: list[str] = []
    unavailability: list[Unavailability] = []
    active: bool = True
    updated_at: str | None = None


class MemberQuery(BaseModel):
    organization_id: str | None = Field(default=None, max_length=64,
                                        description="Default: your only organization")
    skill: Annotated[str | None, SearchParam("role", SKILL_SYSTEM + "|{}")] = Field(
        None, max_length=64)
    user_id: str | None = Field(None, max_length=64)


def window(start: date | datetime, end: date | datetime) -> tuple[datetime, datetime]:
    """The instants an unavailability covers (a date end includes its whole day)."""
    first = start if isinstance(start, datetime) else datetime.combine(start, time())
    last = end if isinstance(end, datetime) else datetime.combine(end, time.max)
    return first.replace(tzinfo=None), last.replace(tzinfo=None)


def _codes(role: JSON, system: str) -> list[str]:
    return [c["code"] for concept in role.get("code") or [] for c in concept.get("coding") or []
            if c.get("system") == system and c.get("code")]


def _extensions(role: JSON, name: str) -> list[Any]:
    url = EXTENSION + name
    return [next(v for k, v in e.items() if k.startswith("value"))
            for e in role.get("extension") or [] if e.get("url") == url]


def _concept(system: str, code: str) -> JSON:
    return {"coding": [{"system": system, "code": code}]}


def member_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    org_id, user_id = payload["organization_id"], payload["user_id"]
    codes = [_concept(ROLE_SYSTEM, payload["role"]),
             *([_concept(GRADE_SYSTEM, payload["grade"])] if payload.get("grade") else []),
             *(_concept(SKILL_SYSTEM, s) for s in dict.fromkeys(payload.get("skills") or []))]
    extensions: list[JSON] = [{"url": EXTENSION + "contracted-hours",
                               "valueDecimal": payload.get("contracted_hours", 40)}]
    if payload.get("max_hours_per_week"):
        extensions.append({"url": EXTENSION + "max-hours-per-week",
                           "valueDecimal": payload["max_hours_per_week"]})
    for kind in ("preferred", "avoided"):
        extensions += [{"url": f"{EXTENSION}{kind}-shift-type", "valueString": s}
                       for s in payload.get(f"{kind}_shift_types") or []]
    role: JSON = {
        "resourceType": "PractitionerRole", "meta": {"tag": [TAG]}, "active": True,
        "identifier": [{"system": MEMBER_SYSTEM, "value": f"{org_id}:{user_id}"}],
        "practitioner": {"identifier": {"system": USER_SYSTEM, "value": user_id},
                         **({"display": payload["name"]} if payload.get("name") else {})},
        "organization": {"reference": f"Organization/{org_id}"},
        "code": codes, "extension": extensions,
    }
    absences = [{"description": u.get("reason") or "Unavailable",
                 "during": {"start": _instant(u["start"]), "end": _instant(u["end"])}}
                for u in payload.get("unavailability") or []]
    if absences:
        role["notAvailable"] = absences
    return with_owners(role, {org_id})


def _instant(value: Any) -> str:
    """A FHIR dateTime: a date stays a date (its whole day), a date-time as given."""
    return value.isoformat() if isinstance(value, date | datetime) else str(value)


def member_view(role: JSON) -> JSON:
    owners = sorted(owner_labels(role))
    practitioner = role.get("practitioner") or {}
    first = (_extensions(role, "contracted-hours") or [None])[0]
    most = (_extensions(role, "max-hours-per-week") or [None])[0]
    return MemberView(
        id=role["id"], organization_id=owners[0] if owners else None,
        user_id=(practitioner.get("identifier") or {}).get("value"),
        name=practitioner.get("display"), role=next(iter(_codes(role, ROLE_SYSTEM)), None),
        grade=next(iter(_codes(role, GRADE_SYSTEM)), None), skills=_codes(role, SKILL_SYSTEM),
        contracted_hours=first, max_hours_per_week=most,
        preferred_shift_types=_extensions(role, "preferred-shift-type"),
        avoided_shift_types=_extensions(role, "avoided-shift-type"),
        unavailability=[Unavailability(start=n["during"]["start"], end=n["during"]["end"],
                                       reason=n.get("description"))
                        for n in role.get("notAvailable") or [] if n.get("during")],
        active=role.get("active", True), updated_at=(role.get("meta") or {}).get("lastUpdated"),
    ).model_dump(mode="json")


async def _prepare(ctx: ApiContext, payload: JSON) -> JSON:
    org_id = await organization(ctx, payload.get("organization_id"))
    ctx.authorize("workforce.manage", org_id)
    member = await ctx.services.store.get_document(MEMBERS, f"{org_id}:{payload['user_id']}")
    if member is None:
        raise ApiError(422, "NOT_A_MEMBER", "user_id: not a member of the organization "
                       "(invite them first)", field="user_id")
    name = " ".join(p for p in (member.get("first_name"), member.get("last_name")) if p)
    return {**payload, "organization_id": org_id, "role": member["role"], "name": name or None}


async def _list_criteria(ctx: ApiContext, query: MemberQuery | None) -> list[tuple[str, str]]:
    org_id = await organization(ctx, query.organization_id if query else None)
    criteria = [("_security", f"{OWNER_SYSTEM}|{org_id}")]
    if query is not None and query.user_id:
        criteria.append(("identifier", f"{MEMBER_SYSTEM}|{org_id}:{query.user_id}"))
    return criteria


members = Facade(
    resource="PractitionerRole", name="Workforce member", create=MemberCreate,
    view=MemberView, query=MemberQuery, to_fhir=member_to_fhir, from_fhir=member_view,
    fixed=(("_tag", f"{TAG['system']}|{TAG['code']}"),), sort="_id", prepare=_prepare,
    list_criteria=_list_criteria,
    unique=Unique(lambda r: [("identifier", f"{MEMBER_SYSTEM}|{r['identifier'][0]['value']}")],
                  "MEMBER_EXISTS", "This person already has a workforce record here"),
    events=Events(created="platform.workforce.member_created"), tags=["workforce"],
    summaries={"list": "List the workforce members of an organization (filter by skill, "
                       "user)",
               "create": "Add a member to the workforce: grade, contracted hours, skills, "
                         "unavailability (ORG:ADMIN)"},
)
router = APIRouter(tags=["workforce"])
members.mount(router, "/api/workforce/members", ops=("list", "create"))


async def workforce_members(ctx: ApiContext, org_id: str) -> list[JSON]:
    """Every workforce member of ``org_id`` the caller may see (views)."""
    found = await ctx.fhir.search("PractitionerRole", [
        ("_security", f"{OWNER_SYSTEM}|{org_id}"), ("_tag", f"{TAG['system']}|{TAG['code']}"),
        ("_count", str(MAX_MEMBERS))])
    return [member_view(r) for r in found]
