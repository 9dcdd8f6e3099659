"""Enrolments in courses and their progress: staff training bookkeeping, kept as documents
(FHIR has no resource for a member of staff taking a course; the course itself is the
PlanDefinition of :mod:`.courses`).

``training_enrollments``: ``id``, ``organization_id``, ``course_id``, ``course_title``,
``user_id``, ``status`` enrolled | in-progress | completed, ``progress`` (percent of the
modules done), ``modules_completed`` (module ids), ``assessment_passed``,
``enrolled_at``, ``enrolled_by``, ``completed_at``, ``revision``. One enrolment per
member and course (``training_enrollment_keys/<course>:<user>``: 409
``ALREADY_ENROLLED``).

Progress is monotonic: a module once done stays done, and a ``progress`` below the
current one is 409 ``PROGRESS_BACKWARDS``; progress is the larger of what is reported and
the share of modules done. Status table: enrolled → in-progress → completed (final:
recording progress then is 409 ``INVALID_TRANSITION``). A course is completed when all
its modules are done and, when it has an assessment, an attempt passed
(:mod:`.assessments`); completion records its CME credits once (:mod:`.cme`).

Who: a member enrols themselves; an ``ORG:ADMIN`` enrols any member and sees every
enrolment; others see and progress their own. Events ``platform.training.enrolled``,
``…progress_recorded``, ``…course_completed`` (the enrolment's view).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field, model_validator

from fhir_server.caller import FhirUnit
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.ownership import owner_labels
from fhir_server.store import ResourceGone, ResourceNotFound
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    conflict,
    created,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import ApiContext, StatusTable, api_context, conflict_responses
from platform_api.organizations.members import MEMBERS, documents_page
from platform_api.training.cme import stage_course_credit
from platform_api.training.courses import COURSE_TAG, assessment_id, modules_of
from platform_api.workforce.common import change_in_turn, organization

JSON = dict[str, Any]
ENROLLMENTS = "training_enrollments"
ENROLLMENT_KEYS = "training_enrollment_keys"
SOURCE = "training"
TOPIC = "platform.training."
ENROLLMENT_STATUS = StatusTable.of(enrolled=("in-progress", "completed"),
                                   in_progress=("completed",), completed=())
EnrollmentStatus = Literal["enrolled", "in-progress", "completed"]


class EnrollRequest(BaseModel):
    user_id: str | None = Field(default=None, max_length=64,
                                description="Whom to enrol (ORG:ADMIN; default: you)")


class ProgressReport(BaseModel):
    module_id: str | None = Field(default=None, max_length=64, examples=["m1"],
                                  description="A module done")
    progress: float | None = Field(default=None, ge=0, le=100, description="Percent done")

    @model_validator(mode="after")
    def _something(self) -> ProgressReport:
        if self.module_id is None and self.progress is None:
            raise ValueError("give module_id or progress")
        return self


class EnrollmentView(BaseModel):
    id: str
    organization_id: str
    course_id: str
    course_title: str | None = None
    user_id: str
    status: str
    progress: float
    modules_completed: list[str]
    assessment_passed: bool | None = None
    enrolled_at: str
    enrolled_by: str | None = None
    completed_at: str | None = None


def enrollment_view(enrollment: JSON) -> JSON:
    return EnrollmentView.model_validate(enrollment).model_dump()


async def load_course(ctx: ApiContext, course_id: str) -> JSON:
    """The course (404 unknown or not a course), its organization's members only (403)."""
    try:
        course = await ctx.fhir.read_json("PlanDefinition", course_id)
    except (ResourceNotFound, ResourceGone):
        raise not_found("Course") from None
    if COURSE_TAG not in (course.get("meta") or {}).get("tag", []) or not owner_labels(course):
        raise not_found("Course")
    await organization(ctx, sorted(owner_labels(course))[0])
    return course


def completes(enrollment: JSON, course: JSON) -> bool:
    modules = {m["id"] for m in modules_of(course)}
    passed = assessment_id(course) is None or bool(enrollment.get("assessment_passed"))
    return modules <= set(enrollment["modules_completed"]) and passed


def finished(enrollment: JSON, course: JSON) -> tuple[JSON, list[tuple[str, JSON]]]:
    """``enrollment`` completed when its course is (its events), else as it is."""
    if enrollment["status"] == "completed" or not completes(enrollment, course):
        return enrollment, []
    done = {**ENROLLMENT_STATUS.move(enrollment, "completed"), "completed_at": now_instant(),
            "progress": 100.0}
    return done, [(TOPIC + "course_completed", enrollment_view(done))]


router = APIRouter(tags=["training"])


@router.post("/api/training/courses/{course_id}/enroll", status_code=201,
             response_model=Envelope[EnrollmentView],
             responses=conflict_responses({"ALREADY_ENROLLED": "the member is enrolled"}),
             summary="Enrol in a course (yourself, or a member: ORG:ADMIN)")
async def enroll(course_id: str, body: EnrollRequest | None = None,
                 ctx: ApiContext = Depends(api_context)) -> Any:
    course = await load_course(ctx, course_id)
    org_id = sorted(owner_labels(course))[0]
    user_id = (body.user_id if body else None) or ctx.principal.user_id
    ctx.authorize("training.enrol", org_id, user_id=user_id)
    if user_id != ctx.principal.user_id:
        if await ctx.services.store.get_document(MEMBERS, f"{org_id}:{user_id}") is None:
            raise ApiError(422, "NOT_A_MEMBER", "user_id: not a member of the organization",
                           field="user_id")
    enrollment: JSON = {
        "id": new_id(), "organization_id": org_id, "course_id": course_id,
        "course_title": course.get("title"), "user_id": user_id, "status": "enrolled",
        "progress": 0.0, "modules_completed": [], "assessment_passed": None,
        "enrolled_at": now_instant(), "enrolled_by": ctx.principal.user_id,
        "completed_at": None, "revision": 0}
    await ctx.insert_once(
        ENROLLMENTS, enrollment, unique=(ENROLLMENT_KEYS, f"{course_id}:{user_id}"),
        event=(TOPIC + "enrolled", enrollment_view(enrollment), SOURCE),
        refusal=("ALREADY_ENROLLED", "Already enrolled in this course"))
    return created(enrollment_view(enrollment))


@router.get("/api/training/enrollments", response_model=PageEnvelope[EnrollmentView],
            summary="List enrolments (ORG:ADMIN: everyone's; others: their own)")
async def list_enrollments(organization_id: str | None = Query(None, max_length=64),
                           course_id: str | None = Query(None, max_length=64),
                           user_id: str | None = Query(None, max_length=64),
                           status: EnrollmentStatus | None = Query(None),
                           page: Pagination = Depends(pagination),
                           ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = await organization(ctx, organization_id)
    if user_id is not None:
        ctx.authorize("training.read-enrolments", org_id, user_id=user_id)
    elif not ctx.may("training.read-enrolments", org_id):
        user_id = ctx.principal.user_id
    where = {"organization_id": org_id, **{k: v for k, v in (
        ("course_id", course_id), ("user_id", user_id), ("status", status)) if v}}
    found, total = await documents_page(ctx, ENROLLMENTS, where, page, "enrolled_at",
                                        descending=True)
    return page.respond([enrollment_view(e) for e in found], total)


async def own_enrollment(ctx: ApiContext, enrollment_id: str) -> JSON:
    enrollment = await ctx.services.store.get_document(ENROLLMENTS, enrollment_id)
    if enrollment is None:
        raise not_found("Enrollment")
    await organization(ctx, enrollment["organization_id"])
    if not ctx.may("training.enrol", enrollment["organization_id"],
                   user_id=enrollment["user_id"]):
        raise not_found("Enrollment")
    return enrollment


@router.post("/api/training/enrollments/{enrollment_id}/progress",
             response_model=Envelope[EnrollmentView],
             responses=conflict_responses({
                 "PROGRESS_BACKWARDS": "progress only goes forward",
                 "INVALID_TRANSITION": "the course is completed"}),
             summary="Record progress: a module done, or the percent done (monotonic)")
async def record_progress(enrollment_id: str, body: ProgressReport,
                          ctx: ApiContext = Depends(api_context)) -> Any:
    enrollment = await own_enrollment(ctx, enrollment_id)
    course = await load_course(ctx, enrollment["course_id"])
    modules = [m["id"] for m in modules_of(course)]
    if body.module_id is not None and body.module_id not in modules:
        raise ApiError(422, "UNKNOWN_MODULE", f"module_id: the course's modules are "
                       f"{', '.join(modules)}", field="module_id")

    async def change(current: JSON) -> tuple[JSON, list[tuple[str, JSON]]]:
        if current["status"] == "completed":
            raise conflict("INVALID_TRANSITION", "The course is completed")
        if body.progress is not None and body.progress < current["progress"]:
            raise conflict("PROGRESS_BACKWARDS", f"Progress is {current['progress']}%: it "
                           "only goes forward")
        done = list(dict.fromkeys([*current["modules_completed"],
                                   *([body.module_id] if body.module_id else [])]))
        share = 100.0 * len(set(done) & set(modules)) / len(modules)
        progress = round(max(current["progress"], body.progress or 0, share), 2)
        moved = current if current["status"] == "in-progress" else \
            ENROLLMENT_STATUS.move(current, "in-progress")
        changed = {**moved, "modules_completed": done, "progress": min(progress, 100.0)}
        changed, completion = finished(changed, course)
        completed[:] = [changed] if completion else []
        return changed, [(TOPIC + "progress_recorded", enrollment_view(changed)), *completion]

    completed: list[JSON] = []

    def credit(unit: FhirUnit) -> None:
        for enrollment in completed:  # the credits come with the completion
            stage_course_credit(unit, enrollment, course)

    saved = await change_in_turn(ctx.services, ctx.fhir, enrollment_id, change, also=credit,
                                 collection=ENROLLMENTS, name="Enrollment", source=SOURCE)
    return ok(enrollment_view(saved))
