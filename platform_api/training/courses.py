"""Training courses: FHIR **PlanDefinition** (a definition of a sequence of activities —
the modules — owned by the organization that teaches it), its assessment a FHIR
**Questionnaire**.

Mapping (/api field → PlanDefinition element):

    title, description   → title, description
    modules[]            → action[] (id m1, m2…; title, description,
                           timingDuration in minutes)
    cme_credits          → extension …training-cme-credits (valueDecimal)
    credit_type          → extension …training-credit-type (valueCode: CME, CPD, CNE)
    assessment           → a Questionnaire (url urn:healthplatform:training-assessment:<id>,
                           status active, item[] one ``choice`` question each with its
                           answerOption[] valueString, extension …training-pass-mark)
                           referenced by a last action (definitionCanonical); the answer
                           key is NOT in the Questionnaire, which every signed-in user may
                           read, but in the document ``training_answer_keys/<id>``
    organization_id      → the owner label
    (always)             → status active, type urn:healthplatform:training#course,
                           meta.tag urn:healthplatform:training#course

The organization's ``ORG:ADMIN`` creates courses (with their assessment, in one unit of
work); its members list them. Event ``platform.training.course_created`` (the view).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field, model_validator

from fhir_server.ids import new_id
from fhir_server.ownership import OWNER_SYSTEM, owner_labels, with_owners
from platform_api.facade import ApiContext, Events, Facade, Write
from platform_api.workforce.common import organization

JSON = dict[str, Any]
EXTENSION = "urn:healthplatform:extension:training-"
COURSE_TAG = {"system": "urn:healthplatform:training", "code": "course"}
ASSESSMENT_URL = "urn:healthplatform:training-assessment:"
ANSWER_KEYS = "training_answer_keys"
CreditType = Literal["CME", "CPD", "CNE"]


class Module(BaseModel):
    title: str = Field(min_length=1, max_length=200, examples=["Recognising sepsis"])
    description: str | None = Field(default=None, max_length=2000)
    minutes: int | None = Field(default=None, ge=1, le=10_000)


class Question(BaseModel):
    text: str = Field(min_length=1, max_length=1000,
                      examples=["First-line antibiotic for adult sepsis of unknown source?"])
    options: list[str] = Field(min_length=2, max_length=10)
    answer: int = Field(ge=0, description="The index of the right option")

    @model_validator(mode="after")
    def _answer_is_an_option(self) -> Question:
        if self.answer >= len(self.options):
            raise ValueError("answer: not the index of an option")
        return self


class AssessmentCreate(BaseModel):
    pass_mark: float = Field(ge=0, le=100, examples=[80], description="Percent correct")
    questions: list[Question] = Field(min_length=1, max_length=100)


class CourseCreate(BaseModel):
    organization_id: str | None = Field(default=None, max_length=64)
    title: str = Field(min_length=1, max_length=200, examples=["Sepsis: the first hour"])
    description: str | None = Field(default=None, max_length=4000)
    modules: list[Module] = Field(min_length=1, max_length=50)
    cme_credits: float = Field(default=0, ge=0, le=100)
    credit_type: CreditType = "CME"
    assessment: AssessmentCreate | None = None


class QuestionView(BaseModel):
    id: str
    text: str
    options: list[str]


class AssessmentView(BaseModel):
    id: str
    pass_mark: float
    questions: list[QuestionView]


class ModuleView(BaseModel):
    id: str
    title: str
    description: str | None = None
    minutes: int | None = None


class CourseView(BaseModel):
    id: str
    organization_id: str | None = None
    title: str
    description: str | None = None
    status: str
    modules: list[ModuleView]
    cme_credits: float = 0
    credit_type: str = "CME"
    assessment: AssessmentView | None = None
    updated_at: str | None = None


class CourseQuery(BaseModel):
    organization_id: str | None = Field(default=None, max_length=64,
                                        description="Default: your only organization")


def extension_value(resource: JSON, name: str) -> Any:
    return next((next(v for k, v in e.items() if k.startswith("value"))
                 for e in resource.get("extension") or [] if e.get("url") == EXTENSION + name),
                None)


def assessment_id(course: JSON) -> str | None:
    for action in course.get("action") or []:
        canonical = action.get("definitionCanonical") or ""
        if canonical.startswith(ASSESSMENT_URL):
            return str(canonical[len(ASSESSMENT_URL):])
    return None


def modules_of(course: JSON) -> list[JSON]:
    return [{"id": a.get("id"), "title": a.get("title"), "description": a.get("description"),
             "minutes": (a.get("timingDuration") or {}).get("value")}
            for a in course.get("action") or [] if not a.get("definitionCanonical")]


def course_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    actions: list[JSON] = []
    for i, module in enumerate(payload["modules"], start=1):
        action: JSON = {"id": f"m{i}", "title": module["title"]}
        if module.get("description"):
            action["description"] = module["description"]
        if module.get("minutes"):
            action["timingDuration"] = {"value": module["minutes"], "unit": "min",
                                        "system": "http://unitsofmeasure.org", "code": "min"}
        actions.append(action)
    course: JSON = {
        "resourceType": "PlanDefinition", "meta": {"tag": [COURSE_TAG]}, "status": "active",
        "title": payload["title"], "type": {"coding": [COURSE_TAG]}, "action": actions,
        "extension": [{"url": EXTENSION + "cme-credits",
                       "valueDecimal": payload.get("cme_credits", 0)},
                      {"url": EXTENSION + "credit-type",
                       "valueCode": payload.get("credit_type", "CME")}]}
    if payload.get("description"):
        course["description"] = payload["description"]
    return with_owners(course, {payload["organization_id"]})


def questionnaire_of(assessment: JSON, questionnaire_id: str, title: str, org_id: str) -> JSON:
    return with_owners({
        "resourceType": "Questionnaire", "id": questionnaire_id, "status": "active",
        "url": ASSESSMENT_URL + questionnaire_id, "title": f"Assessment: {title}",
        "meta": {"tag": [{"system": COURSE_TAG["system"], "code": "assessment"}]},
        "extension": [{"url": EXTENSION + "pass-mark", "valueDecimal": assessment["pass_mark"]}],
        "item": [{"linkId": f"q{i}", "text": q["text"], "type": "choice", "required": True,
                  "answerOption": [{"valueString": o} for o in q["options"]]}
                 for i, q in enumerate(assessment["questions"], start=1)]}, {org_id})


def assessment_view(questionnaire: JSON) -> JSON:
    return {"id": questionnaire["id"],
            "pass_mark": extension_value(questionnaire, "pass-mark") or 0,
            "questions": [{"id": item["linkId"], "text": item.get("text", ""),
                           "options": [o.get("valueString", "") for o in
                                       item.get("answerOption") or []]}
                          for item in questionnaire.get("item") or []]}


def course_view(course: JSON, questionnaire: JSON | None = None) -> JSON:
    owners = sorted(owner_labels(course))
    return CourseView(
        id=course["id"], organization_id=owners[0] if owners else None,
        title=course.get("title", ""), description=course.get("description"),
        status=course.get("status", "active"),
        modules=[ModuleView(**m) for m in modules_of(course)],
        cme_credits=extension_value(course, "cme-credits") or 0,
        credit_type=extension_value(course, "credit-type") or "CME",
        assessment=AssessmentView(**assessment_view(questionnaire)) if questionnaire else None,
        updated_at=(course.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def course_views(ctx: ApiContext, courses: list[JSON]) -> list[JSON]:
    """The views of a page of courses, their Questionnaires read in one search."""
    wanted = [i for c in courses if (i := assessment_id(c))]
    found = {q["id"]: q for q in await ctx.fhir.search(
        "Questionnaire", [("_id", ",".join(wanted))])} if wanted else {}
    return [course_view(c, found.get(assessment_id(c) or "")) for c in courses]


async def _prepare(ctx: ApiContext, payload: JSON) -> JSON:
    org_id = await organization(ctx, payload.get("organization_id"))
    ctx.authorize("workforce.manage", org_id)
    return {**payload, "organization_id": org_id}


async def _with_assessment(write: Write) -> JSON:
    """A course created with an assessment: its Questionnaire and answer key, and the
    action that points at it."""
    assessment = (write.payload or {}).get("assessment")
    if write.change != "created" or not assessment:
        return write.resource
    questionnaire_id = new_id()
    org_id = write.payload["organization_id"]  # type: ignore[index]
    await write.unit.create(questionnaire_of(assessment, questionnaire_id,
                                             write.resource["title"], org_id),
                            resource_id=questionnaire_id, expected_type="Questionnaire")
    write.unit.put_document(ANSWER_KEYS, questionnaire_id, {
        "id": questionnaire_id, "course_id": write.resource["id"],
        "organization_id": org_id, "pass_mark": assessment["pass_mark"],
        "answers": {f"q{i}": q["answer"] for i, q in enumerate(assessment["questions"],
                                                               start=1)}})
    return {**write.resource, "action": [*write.resource["action"], {
        "id": "assessment", "title": "Assessment",
        "definitionCanonical": ASSESSMENT_URL + questionnaire_id}]}


def _list_criteria(ctx: ApiContext, query: CourseQuery | None) -> Any:
    async def criteria() -> list[tuple[str, str]]:
        org_id = await organization(ctx, query.organization_id if query else None)
        return [("_security", f"{OWNER_SYSTEM}|{org_id}")]
    return criteria()


courses = Facade(
    resource="PlanDefinition", name="Course", create=CourseCreate, view=CourseView,
    query=CourseQuery, to_fhir=course_to_fhir, from_fhir=course_view, views=course_views,
    fixed=(("_tag", f"{COURSE_TAG['system']}|{COURSE_TAG['code']}"),), sort="title",
    prepare=_prepare, list_criteria=_list_criteria, alongside=_with_assessment,
    events=Events(created="platform.training.course_created"), tags=["training"],
    summaries={"list": "List an organization's courses",
               "create": "Create a course: modules, CME credits, an assessment (ORG:ADMIN)"},
)
router = APIRouter(tags=["training"])
courses.mount(router, "/api/training/courses", ops=("list", "create"))
