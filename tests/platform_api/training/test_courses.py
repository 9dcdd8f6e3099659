"""Courses (PlanDefinition) with their assessment (Questionnaire, no answers in it)."""

from __future__ import annotations

from tests.platform_api.training.conftest import HAND_HYGIENE, SEPSIS, data, new_course, refusal


async def test_a_course_is_a_plan_definition_with_its_questionnaire(clinic):
    course = await new_course(clinic)
    assert [m["id"] for m in course["modules"]] == ["m1", "m2"]
    assert course["cme_credits"] == 4 and course["assessment"]["pass_mark"] == 50
    assert [q["id"] for q in course["assessment"]["questions"]] == ["q1", "q2"]
    plan = (await clinic.get("admin", f"/fhir/PlanDefinition/{course['id']}")).json()
    assert plan["action"][0]["timingDuration"]["value"] == 45
    canonical = plan["action"][-1]["definitionCanonical"]
    questionnaire = (await clinic.get(
        "admin", f"/fhir/Questionnaire/{course['assessment']['id']}")).json()
    assert questionnaire["url"] == canonical
    assert "answer" not in str(questionnaire["item"]).replace("answerOption", "")
    assert "initialSelected" not in str(questionnaire)


async def test_members_list_their_organizations_courses(clinic):
    await new_course(clinic)
    await new_course(clinic, HAND_HYGIENE)
    listed = await clinic.get("receptionist", "/api/training/courses")
    assert listed.json()["meta"]["total"] == 2
    assert {c["title"] for c in data(listed)} == {"Sepsis: the first hour", "Hand hygiene"}
    assert data(await clinic.get("other_admin", "/api/training/courses")) == []
    assert refusal(await clinic.get("stranger", "/api/training/courses",
                                    organization_id=clinic.org_id)) == (403, "FORBIDDEN")


async def test_only_the_admin_creates_courses(clinic):
    for who in ("doctor", "nurse", "receptionist"):
        assert refusal(await clinic.post(who, "/api/training/courses", HAND_HYGIENE)) == (
            403, "FORBIDDEN"), who


async def test_a_course_is_checked(clinic):
    wrong = {**SEPSIS, "assessment": {"pass_mark": 50, "questions": [
        {"text": "?", "options": ["a", "b"], "answer": 5}]}}
    response = await clinic.post("admin", "/api/training/courses", wrong)
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"].startswith("assessment.questions")
    response = await clinic.post("admin", "/api/training/courses", {**SEPSIS, "modules": []})
    assert response.json()["error"]["field"] == "modules"
