"""Assessment attempts: scored against the answer key and pass mark, stored as
QuestionnaireResponse; a pass completes a course whose modules are done."""

from __future__ import annotations

from tests.platform_api.training.conftest import (
    HAND_HYGIENE,
    data,
    enrolled,
    new_course,
    refusal,
)

RIGHT = [{"question_id": "q1", "option": 2}, {"question_id": "q2", "option": 0}]
WRONG = [{"question_id": "q1", "option": 0}, {"question_id": "q2", "option": 1}]


async def test_a_failed_then_passed_attempt_completes_the_course(clinic):
    course = await new_course(clinic)
    enrollment = await enrolled(clinic, "nurse", course)
    for module in ("m1", "m2"):
        progress = data(await clinic.post(
            "nurse", f"/api/training/enrollments/{enrollment['id']}/progress",
            {"module_id": module}))
    assert progress["status"] == "in-progress" and progress["progress"] == 100  # not passed yet
    failed = data(await clinic.post("nurse", "/api/training/assessments", {
        "enrollment_id": enrollment["id"], "answers": WRONG}), 201)
    assert failed["score"] == 0 and not failed["passed"] and failed["attempt"] == 1
    passed = data(await clinic.post("nurse", "/api/training/assessments", {
        "enrollment_id": enrollment["id"], "answers": RIGHT}), 201)
    assert passed["score"] == 100 and passed["passed"] and passed["attempt"] == 2
    after = data(await clinic.get("nurse", "/api/training/enrollments"))[0]
    assert after["status"] == "completed" and after["assessment_passed"]
    credits = data(await clinic.get("nurse", "/api/training/cme-credits"))
    assert [c["credits"] for c in credits] == [4]
    stored = (await clinic.get("platform_admin",
                               f"/fhir/QuestionnaireResponse/{passed['id']}")).json()
    assert stored["questionnaire"].endswith(course["assessment"]["id"])
    assert stored["item"][0]["answer"] == [{"valueString": "4"}]
    response = await clinic.post("nurse", "/api/training/assessments", {
        "enrollment_id": enrollment["id"], "answers": RIGHT})
    assert refusal(response) == (409, "INVALID_TRANSITION")


async def test_attempts_are_listed_with_scores_for_their_member(clinic):
    course = await new_course(clinic)
    nurse = await enrolled(clinic, "nurse", course)
    doctor = await enrolled(clinic, "doctor", course)
    data(await clinic.post("nurse", "/api/training/assessments",
                           {"enrollment_id": nurse["id"], "answers": WRONG}), 201)
    data(await clinic.post("doctor", "/api/training/assessments",
                           {"enrollment_id": doctor["id"], "answers": RIGHT}), 201)
    mine = data(await clinic.get("nurse", "/api/training/assessments"))
    assert [(a["user_id"], a["score"]) for a in mine] == [(clinic.user_id("nurse"), 0)]
    everyone = await clinic.get("admin", "/api/training/assessments")
    assert everyone.json()["meta"]["total"] == 2
    assert data(await clinic.get("other_admin", "/api/training/assessments")) == []


async def test_an_attempt_answers_every_question_of_the_members_own_course(clinic):
    course = await new_course(clinic)
    enrollment = await enrolled(clinic, "nurse", course)
    response = await clinic.post("nurse", "/api/training/assessments", {
        "enrollment_id": enrollment["id"], "answers": RIGHT[:1]})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "answers"
    response = await clinic.post("nurse", "/api/training/assessments", {
        "enrollment_id": enrollment["id"],
        "answers": [{"question_id": "q1", "option": 7}, RIGHT[1]]})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    response = await clinic.post("doctor", "/api/training/assessments", {
        "enrollment_id": enrollment["id"], "answers": RIGHT})
    assert refusal(response) == (404, "NOT_FOUND")
    plain = await enrolled(clinic, "nurse", await new_course(clinic, HAND_HYGIENE))
    response = await clinic.post("nurse", "/api/training/assessments", {
        "enrollment_id": plain["id"], "answers": RIGHT})
    assert refusal(response) == (422, "NO_ASSESSMENT")


async def test_only_the_enrolled_member_answers_whatever_their_role_writes(clinic):
    # The ORG:ADMIN follows a member's training (training.enrol) but does not answer for
    # them (training.answer); a billing clerk, whose role writes no clinical record,
    # answers their own and reads their attempts (stored and read by the platform).
    course = await new_course(clinic)
    clerk = await enrolled(clinic, "billing", course)
    response = await clinic.post("admin", "/api/training/assessments", {
        "enrollment_id": clerk["id"], "answers": RIGHT})
    assert refusal(response) == (403, "FORBIDDEN")
    assert "enrolled member" in response.json()["error"]["message"]
    passed = data(await clinic.post("billing", "/api/training/assessments", {
        "enrollment_id": clerk["id"], "answers": RIGHT}), 201)
    assert passed["passed"] and passed["user_id"] == clinic.user_id("billing")
    mine = data(await clinic.get("billing", "/api/training/assessments"))
    assert [a["id"] for a in mine] == [passed["id"]]
    assert refusal(await clinic.get("billing", "/api/training/assessments",
                                    user_id=clinic.user_id("nurse"))) == (403, "FORBIDDEN")
    # What the clerk's own role reaches on /fhir stays as it was: no clinical record.
    assert (await clinic.get("billing", f"/fhir/QuestionnaireResponse/{passed['id']}")
            ).status_code == 403
