"""Assessment attempts: a member's answers to their course's assessment, scored against
its answer key and pass mark, stored as FHIR **QuestionnaireResponse** of the course's
Questionnaire (:mod:`.courses`).

Mapping (/api field → QuestionnaireResponse element):

    questionnaire_id     → questionnaire (urn:healthplatform:training-assessment:<id>)
    user_id              → author.identifier (urn:healthplatform:user|<id>)
    answers[]            → item[] (linkId = question_id, answer.valueString = the option)
    score, passed        → extension …training-score (valueDecimal, percent correct),
                           …training-passed (valueBoolean)
    attempt              → extension …training-attempt (valueInteger: 1, 2…)
    course_id, enrollment_id → extension …training-course, …training-enrollment
    pass_mark            → (the Questionnaire's, at the time: extension …training-pass-mark)
    (always)             → status completed, authored, meta.tag
                           urn:healthplatform:training#assessment-attempt, the owner label

Every question is answered once (422 naming ``answers``). A passed attempt marks the
enrolment's assessment passed and, when its modules are done, completes the course (with
its credits) — all in one unit of work with the response; a completed enrolment takes no
more attempts (409 ``INVALID_TRANSITION``). The enrolment's revision orders attempts.

Who: members submit attempts at their own enrolments; an ``ORG:ADMIN`` lists everyone's,
others their own. The responses are written and read by the platform after these
checks (staff training is not a patient form the access policy's roles describe).
Event ``platform.training.assessment_submitted`` (the attempt's view).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from fhir_server.caller import FhirUnit
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.ownership import OWNER_SYSTEM, owner_labels, with_owners
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    conflict,
    created,
    pagination,
)
from platform_api.facade import ApiContext, api_context, conflict_responses, search_page
from platform_api.training.cme import stage_course_credit, whose
from platform_api.training.courses import (
    ANSWER_KEYS,
    ASSESSMENT_URL,
    COURSE_TAG,
    EXTENSION,
    assessment_id,
    extension_value,
)
from platform_api.training.enrollments import (
    ENROLLMENTS,
    SOURCE,
    TOPIC,
    enrollment_view,
    finished,
    load_course,
    own_enrollment,
)
from platform_api.workforce.common import change_in_turn, organization

JSON = dict[str, Any]
USER_SYSTEM = "urn:healthplatform:user"
ATTEMPT_TAG = {"system": COURSE_TAG["system"], "code": "assessment-attempt"}


class Answer(BaseModel):
    question_id: str = Field(min_length=1, max_length=20, examples=["q1"])
    option: int = Field(ge=0, description="The index of the option chosen")


class AttemptCreate(BaseModel):
    enrollment_id: str = Field(min_length=1, max_length=64)
    answers: list[Answer] = Field(min_length=1, max_length=100)


class AttemptView(BaseModel):
    id: str
    organization_id: str | None = None
    course_id: str | None = None
    enrollment_id: str | None = None
    questionnaire_id: str | None = None
    user_id: str | None = None
    attempt: int | None = None
    score: float
    passed: bool
    answers: list[Answer]
    submitted_at: str | None = None


def attempt_view(response: JSON) -> JSON:
    owners = sorted(owner_labels(response))
    canonical = response.get("questionnaire") or ""
    chosen = [Answer(question_id=item["linkId"], option=int(extension_value(item, "option") or 0))
              for item in response.get("item") or []]
    return AttemptView(
        id=response["id"], organization_id=owners[0] if owners else None,
        course_id=extension_value(response, "course"),
        enrollment_id=extension_value(response, "enrollment"),
        questionnaire_id=canonical.removeprefix(ASSESSMENT_URL) or None,
        user_id=((response.get("author") or {}).get("identifier") or {}).get("value"),
        attempt=extension_value(response, "attempt"),
        score=extension_value(response, "score") or 0,
        passed=bool(extension_value(response, "passed")), answers=chosen,
        submitted_at=response.get("authored")).model_dump()


def score(answers: list[Answer], key: JSON) -> float:
    given = {a.question_id: a.option for a in answers}
    right = sum(1 for q, correct in key["answers"].items() if given.get(q) == correct)
    return round(100.0 * right / len(key["answers"]), 1)


def _checked(answers: list[Answer], questionnaire: JSON) -> dict[str, list[str]]:
    """The options of each question; 422 unless every question is answered once with
    one of its options."""
    options = {item["linkId"]: [o.get("valueString", "") for o in item.get("answerOption") or []]
               for item in questionnaire.get("item") or []}
    given = [a.question_id for a in answers]
    if sorted(given) != sorted(options) or len(set(given)) != len(given):
        raise ApiError(422, "VALIDATION_ERROR", "answers: answer each question once "
                       f"({', '.join(options)})", field="answers")
    for answer in answers:
        if answer.option >= len(options[answer.question_id]):
            raise ApiError(422, "VALIDATION_ERROR", f"answers: {answer.question_id} has "
                           f"{len(options[answer.question_id])} options", field="answers")
    return options


def response_of(body: AttemptCreate, enrollment: JSON, questionnaire_id: str,
                options: dict[str, list[str]], percent: float, passed: bool,
                attempt: int) -> JSON:
    return with_owners({
        "resourceType": "QuestionnaireResponse", "id": new_id(),
        "meta": {"tag": [ATTEMPT_TAG]}, "status": "completed", "authored": now_instant(),
        "questionnaire": ASSESSMENT_URL + questionnaire_id,
        "author": {"identifier": {"system": USER_SYSTEM, "value": enrollment["user_id"]}},
        "extension": [
            {"url": EXTENSION + "score", "valueDecimal": percent},
            {"url": EXTENSION + "passed", "valueBoolean": passed},
            {"url": EXTENSION + "attempt", "valueInteger": attempt},
            {"url": EXTENSION + "course", "valueString": enrollment["course_id"]},
            {"url": EXTENSION + "enrollment", "valueString": enrollment["id"]}],
        "item": [{"linkId": a.question_id,
                  "extension": [{"url": EXTENSION + "option", "valueInteger": a.option}],
                  "answer": [{"valueString": options[a.question_id][a.option]}]}
                 for a in body.answers],
    }, {enrollment["organization_id"]})


router = APIRouter(tags=["training"])


@router.post("/api/training/assessments", status_code=201, response_model=Envelope[AttemptView],
             responses=conflict_responses({"INVALID_TRANSITION": "the course is completed"}),
             summary="Submit an attempt at your course's assessment: scored against its "
                     "pass mark")
async def submit_attempt(body: AttemptCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    enrollment = await own_enrollment(ctx, body.enrollment_id)
    ctx.authorize("training.answer", enrollment["organization_id"],
                  user_id=enrollment["user_id"])
    course = await load_course(ctx, enrollment["course_id"])
    questionnaire_id = assessment_id(course)
    key = await ctx.services.store.get_document(ANSWER_KEYS, questionnaire_id or "")
    if questionnaire_id is None or key is None:
        raise ApiError(422, "NO_ASSESSMENT", "enrollment_id: this course has no assessment",
                       field="enrollment_id")
    questionnaire = await ctx.fhir.read_json("Questionnaire", questionnaire_id)
    options = _checked(body.answers, questionnaire)
    percent = score(body.answers, key)
    passed = percent >= float(extension_value(questionnaire, "pass-mark") or 0)
    written: list[JSON] = []

    async def change(current: JSON) -> tuple[JSON, list[tuple[str, JSON]]]:
        if current["status"] == "completed":
            raise conflict("INVALID_TRANSITION", "The course is completed")
        attempt = int(current.get("attempts", 0)) + 1
        written[:] = [response_of(body, current, questionnaire_id, options, percent, passed,
                                  attempt)]
        changed = {**current, "attempts": attempt,
                   "assessment_passed": bool(current.get("assessment_passed")) or passed}
        changed, completion = finished(changed, course)
        events = [(TOPIC + "assessment_submitted", attempt_view(written[0])),
                  *completion]
        if completion:
            written.append(changed)
        else:
            events.append((TOPIC + "progress_recorded", enrollment_view(changed)))
        return changed, events

    async def stage(unit: FhirUnit) -> None:
        response = written[0]
        # Any member takes a course, whatever their role may write of the clinical
        # record: the attempt is stored by the platform once the policy let them answer.
        await ctx.elevate_unit(unit, "training.answer: the member's attempt "
                               "(QuestionnaireResponse)").create(
            response, resource_id=response["id"], expected_type="QuestionnaireResponse")
        for completed in written[1:]:
            stage_course_credit(unit, completed, course)

    await change_in_turn(ctx.services, ctx.fhir, enrollment["id"], change, also=stage,
                         collection=ENROLLMENTS, name="Enrollment", source=SOURCE)
    return created(attempt_view(written[0]))


@router.get("/api/training/assessments", response_model=PageEnvelope[AttemptView],
            summary="List assessment attempts with their scores (ORG:ADMIN: everyone's; "
                    "others: their own)")
async def list_attempts(organization_id: str | None = Query(None, max_length=64),
                        user_id: str | None = Query(None, max_length=64),
                        page: Pagination = Depends(pagination),
                        ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = await organization(ctx, organization_id)
    wanted = whose(ctx, org_id, user_id)
    params = [("_security", f"{OWNER_SYSTEM}|{org_id}"),
              ("_tag", f"{ATTEMPT_TAG['system']}|{ATTEMPT_TAG['code']}"),
              ("_sort", "-authored")]
    if wanted:
        params.append(("author:identifier", f"{USER_SYSTEM}|{wanted}"))
    # The attempts are the training area's records, which a member whose role reads no
    # clinical record reads too: read by the platform once the policy chose whose.
    found = await search_page(ctx.elevate("training.credits: read the members' assessment "
                                          "attempts (QuestionnaireResponse)"),
                              "QuestionnaireResponse", params, page)
    return page.respond([attempt_view(r) for r in found.resources], found.total)
