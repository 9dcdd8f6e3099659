"""The /api/mpi routes (platform administrators only: the access table lets SUPER:ADMIN
and APP:ADMIN through and refuses everyone else with 403).

| route | what |
|---|---|
| ``POST /api/mpi/match`` | demographics in; ranked candidates out (score, grade, fields) |
| ``GET /api/mpi/candidates`` | pairs waiting for review, best first |
| ``PATCH /api/mpi/links/:id/review`` | accept (link) or reject (remembered) a candidate |
| ``POST /api/mpi/link`` | merge by hand: ``other_patient_id`` replaced by ``patient_id`` |
| ``POST /api/mpi/links`` | link by hand with a chosen type (default ``seealso``) |
| ``GET /api/mpi/links/:patient_id`` | a patient's links (``Patient.link``) with their decisions |
| ``GET /api/mpi/matches``, ``/:id`` | match decisions, their scores and who decided |
| ``POST /api/mpi/matches/:id/unlink`` | undo a link: both records whole again |
| ``GET /api/mpi/patients/:id/fhir`` | the FHIR Patient: the golden record, with its links |

Mapping: a match decision is the document described in :mod:`platform_api.mpi.service`
(``id`` → the pair's id, ``patient_ids``, ``golden_id``, ``other_id``, ``status``,
``link_type``, ``score``, ``grade``, ``agreed``, ``disagreed``, ``source``
automatic | manual, ``decided_by``, ``decided_at``, ``history``); a link is the pair of
``Patient.link`` elements it wrote.
"""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field, model_validator

from platform_api.envelope import (
    Envelope,
    PageEnvelope,
    Pagination,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import ApiContext, api_context, conflict_responses
from platform_api.mpi.decisions import MATCHES, Decider, pair_id
from platform_api.mpi.demographics import Demographics
from platform_api.mpi.reconcile import linked_ids
from platform_api.mpi.service import mpi_of

JSON = dict[str, Any]
router = APIRouter(prefix="/api/mpi", tags=["master patient index"])
LinkType = Literal["replaced-by", "seealso"]
Grade = Literal["certain", "probable", "possible"]
Status = Literal["candidate", "linked", "rejected", "unlinked"]


class MatchAddress(BaseModel):
    line: str | None = Field(default=None, max_length=200)
    city: str | None = Field(default=None, max_length=100)
    postal_code: str | None = Field(default=None, max_length=20)


class MatchRequest(BaseModel):
    first_name: str | None = Field(default=None, max_length=100, examples=["Amina"])
    last_name: str | None = Field(default=None, max_length=100, examples=["Odhiambo"])
    date_of_birth: date | None = Field(default=None, examples=["1988-04-12"])
    gender: Literal["male", "female", "other", "unknown"] | None = None
    phone: str | None = Field(default=None, max_length=32, examples=["0712 345 678"])
    email: str | None = Field(default=None, max_length=200)
    address: MatchAddress | None = None
    national_id: str | None = Field(default=None, max_length=64)
    limit: int = Field(default=10, ge=1, le=50)
    only_certain: bool = False

    @model_validator(mode="after")
    def something_to_match(self) -> MatchRequest:
        if not any((self.last_name, self.first_name, self.date_of_birth, self.phone,
                    self.email, self.national_id)):
            raise ValueError("give at least a name, date of birth, phone, e-mail or "
                             "national id")
        return self


class MatchCandidate(BaseModel):
    patient_id: str = Field(description="The record in use (a record merged away answers "
                            "as its golden record)")
    score: float = Field(description="Match probability, 0-1")
    weight: float = Field(description="Fellegi-Sunter weight (log2 likelihood ratio)")
    grade: Grade = Field(description="certain: the index would link it by itself")
    agreed: list[str]
    partial: list[str] = Field(description="Fields that agree only in part (a nickname, a "
                               "typo, a day and month transposed): see levels")
    disagreed: list[str]
    levels: dict[str, str] = Field(description="The comparison level of each field")
    hold: str | None = Field(description="Why a certain pair would wait for review")
    names_swapped: bool
    name: str | None = None
    date_of_birth: str | None = None
    gender: str | None = None
    linked_to: list[str] = []


class MatchResult(BaseModel):
    candidates: list[MatchCandidate]


class HistoryEntry(BaseModel):
    status: Status
    by: str
    at: str
    reason: str | None = None


class MatchDecision(BaseModel):
    id: str
    patient_ids: list[str]
    golden_id: str
    other_id: str
    status: Status
    link_type: LinkType | None
    score: float | None
    weight: float | None
    grade: Grade | None
    agreed: list[str]
    partial: list[str] = []
    disagreed: list[str]
    levels: dict[str, str] = {}
    hold: str | None = Field(default=None, description="Why the pair waited (or waits) for "
                             "review instead of an automatic link")
    via: list[str] | None = Field(default=None, description="The pair through which a "
                                  "record joined its golden record's cluster, when the two "
                                  "do not match directly")
    names_swapped: bool
    source: str
    reason: str | None
    decided_by: str | None
    decided_at: str | None
    created_at: str
    updated_at: str
    history: list[HistoryEntry]


class LinkRequest(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64, description="The golden record "
                            "(it survives)")
    other_patient_id: str = Field(min_length=1, max_length=64)
    type: LinkType | None = Field(default=None, description="replaced-by: other_patient_id "
                                  "is merged into patient_id; seealso: both stay in use")
    reason: str | None = Field(default=None, max_length=500)


class ReviewRequest(BaseModel):
    decision: Literal["accept", "reject"]
    link_type: LinkType = "replaced-by"
    reason: str | None = Field(default=None, max_length=500)


class UnlinkRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=500)


class PatientLink(BaseModel):
    patient_id: str
    type: str
    match_id: str
    status: Status | None
    score: float | None


class PatientLinks(BaseModel):
    patient_id: str
    golden_id: str = Field(description="The record in use: this one, or the one that "
                           "replaced it")
    links: list[PatientLink]


CONFLICTS = {
    "ALREADY_LINKED": "the two patients are linked already",
    "GOLDEN_RECORD_REPLACED": "the golden record was itself replaced",
    "PATIENT_CHANGED": "a patient changed while being linked",
    "INVALID_TRANSITION": "the decision's status does not allow the move",
    "NOT_A_CANDIDATE": "the match was decided already",
}


def decider(ctx: ApiContext) -> Decider:
    return Decider(ctx.principal.user_id, ctx.principal.email)


def _view(decision: JSON) -> JSON:
    return {k: v for k, v in decision.items() if k != "restore"}


@router.post("/match", response_model=Envelope[MatchResult],
             summary="Find the patients matching demographics")
async def match(body: MatchRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    mpi = mpi_of(ctx.services)
    address = body.address or MatchAddress()
    query = Demographics.of(
        given=body.first_name, family=body.last_name, birth_date=body.date_of_birth and
        body.date_of_birth.isoformat(), sex=body.gender, phone=body.phone, email=body.email,
        address=address.line, city=address.city, postcode=address.postal_code,
        national_ids=[body.national_id] if body.national_id else [],
        region=ctx.services.settings.mpi_default_region)
    found = await mpi.match(query, limit=body.limit)
    candidates = []
    for pair in found:
        if body.only_certain and pair.grade != "certain":
            continue
        scored = pair.scored
        patient = await ctx.fhir.find_json("Patient", scored.id)
        if patient is None:
            continue
        name = (patient.get("name") or [{}])[0]
        candidates.append({
            "patient_id": scored.id, "score": round(scored.probability, 6),
            "weight": round(scored.weight, 3), "grade": pair.grade,
            "agreed": list(scored.agreed), "partial": list(scored.partial),
            "disagreed": list(scored.disagreed), "levels": dict(scored.levels),
            "hold": pair.hold, "names_swapped": scored.names_swapped,
            "name": " ".join([*name.get("given", []), name.get("family", "")]).strip() or None,
            "date_of_birth": patient.get("birthDate"), "gender": patient.get("gender"),
            "linked_to": sorted(linked_ids(patient))})
    return ok({"candidates": candidates})


@router.get("/candidates", response_model=PageEnvelope[MatchDecision],
            summary="Candidate pairs waiting for review, best first")
async def candidates(ctx: ApiContext = Depends(api_context),
                     page: Pagination = Depends(pagination)) -> Any:
    store = ctx.services.store
    where = {"status": "candidate"}
    found = await store.find_documents(MATCHES, where, limit=page.limit, offset=page.offset,
                                       order_by="score", descending=True)
    return page.respond([_view(d) for d in found], await store.count_documents(MATCHES, where))


@router.get("/matches", response_model=PageEnvelope[MatchDecision],
            summary="Match decisions, newest first")
async def matches(ctx: ApiContext = Depends(api_context),
                  page: Pagination = Depends(pagination),
                  status: Status | None = Query(default=None),
                  patient_id: str | None = Query(default=None, max_length=64)) -> Any:
    store = ctx.services.store
    where: JSON = {"status": status} if status else {}
    if patient_id is None:
        found = await store.find_documents(MATCHES, where, limit=page.limit,
                                           offset=page.offset, order_by="updated_at",
                                           descending=True)
        return page.respond([_view(d) for d in found],
                            await store.count_documents(MATCHES, where))
    # A patient's decisions: few, gathered from both sides of the pairs.
    both = [d for side in ("golden_id", "other_id") for d in await store.find_documents(
        MATCHES, {**where, side: patient_id}, limit=1000)]
    both.sort(key=lambda d: d["updated_at"], reverse=True)
    return page.respond([_view(d) for d in both[page.offset:page.offset + page.limit]],
                        len(both))


@router.get("/matches/{match_id}", response_model=Envelope[MatchDecision],
            summary="A match decision")
async def get_match(match_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    return ok(_view(await mpi_of(ctx.services).decision(match_id)))


@router.post("/matches/{match_id}/unlink", response_model=Envelope[MatchDecision],
             summary="Undo a link: both records whole again",
             responses=conflict_responses(CONFLICTS))
async def unlink(match_id: str, body: UnlinkRequest | None = None,
                 ctx: ApiContext = Depends(api_context)) -> Any:
    mpi = mpi_of(ctx.services)
    decision = await mpi.decision(match_id)
    reason = body.reason if body else None
    return ok(_view(await mpi.unlink(ctx.fhir, decision, decider(ctx), reason)))


@router.patch("/links/{match_id}/review", response_model=Envelope[MatchDecision],
              summary="Accept (link) or reject a candidate pair",
              responses=conflict_responses(CONFLICTS))
async def review(match_id: str, body: ReviewRequest,
                 ctx: ApiContext = Depends(api_context)) -> Any:
    mpi = mpi_of(ctx.services)
    decision = await mpi.decision(match_id)
    record = await mpi.review(ctx.fhir, decision, body.decision == "accept", decider(ctx),
                              body.reason, body.link_type)
    return ok(_view(record))


async def _link(ctx: ApiContext, body: LinkRequest, default: str) -> Any:
    record = await mpi_of(ctx.services).link(
        ctx.fhir, body.patient_id, body.other_patient_id, body.type or default, decider(ctx),
        reason=body.reason)
    return ok(_view(record), 201)


@router.post("/link", status_code=201, response_model=Envelope[MatchDecision],
             summary="Merge two patients by hand (other_patient_id replaced by patient_id)",
             responses=conflict_responses(CONFLICTS))
async def link(body: LinkRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    return await _link(ctx, body, "replaced-by")


@router.post("/links", status_code=201, response_model=Envelope[MatchDecision],
             summary="Link two patients by hand (default: seealso, both stay in use)",
             responses=conflict_responses(CONFLICTS))
async def add_link(body: LinkRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    return await _link(ctx, body, "seealso")


@router.get("/links/{patient_id}", response_model=Envelope[PatientLinks],
            summary="A patient's links and their decisions")
async def patient_links(patient_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    patient = await ctx.fhir.find_json("Patient", patient_id)
    if patient is None:
        raise not_found("Patient")
    links = []
    for other, link_type in linked_ids(patient).items():
        decision = await ctx.services.store.get_document(MATCHES, pair_id(patient_id, other))
        links.append({"patient_id": other, "type": link_type,
                      "match_id": pair_id(patient_id, other),
                      "status": decision and decision["status"],
                      "score": decision and decision["score"]})
    golden = next((o for o, t in linked_ids(patient).items() if t == "replaced-by"),
                  patient_id)
    return ok({"patient_id": patient_id, "golden_id": golden, "links": links})


@router.get("/patients/{patient_id}/fhir", response_model=Envelope[dict[str, Any]],
            summary="The FHIR Patient: the golden record, with its links")
async def golden_record(patient_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    patient = await ctx.fhir.find_json("Patient", patient_id)
    seen = {patient_id}
    while patient is not None:
        nxt = next((o for o, t in linked_ids(patient).items() if t == "replaced-by"), None)
        if nxt is None or nxt in seen:
            return ok(patient)
        seen.add(nxt)
        patient = await ctx.fhir.find_json("Patient", nxt)
    raise not_found("Patient")
