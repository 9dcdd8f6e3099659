"""Enrolments and their progress: one per member and course, forward only, completed
with the course's credits."""

from __future__ import annotations

from tests.platform_api.training.conftest import (
    HAND_HYGIENE,
    data,
    enrolled,
    new_course,
    refusal,
)


async def test_a_member_enrols_once(clinic):
    course = await new_course(clinic)
    enrollment = await enrolled(clinic, "nurse", course)
    assert enrollment["status"] == "enrolled" and enrollment["progress"] == 0
    assert enrollment["user_id"] == clinic.user_id("nurse")
    again = await clinic.post("nurse", f"/api/training/courses/{course['id']}/enroll")
    assert refusal(again) == (409, "ALREADY_ENROLLED")
    assert refusal(await clinic.post("other_admin",
                                     f"/api/training/courses/{course['id']}/enroll")) == (
        403, "FORBIDDEN")
    assert refusal(await clinic.post("nurse", "/api/training/courses/unknown/enroll")) == (
        404, "NOT_FOUND")


async def test_the_admin_enrols_members_and_others_enrol_only_themselves(clinic):
    course = await new_course(clinic)
    done = data(await clinic.post("admin", f"/api/training/courses/{course['id']}/enroll",
                                  {"user_id": clinic.user_id("doctor")}), 201)
    assert done["user_id"] == clinic.user_id("doctor")
    response = await clinic.post("nurse", f"/api/training/courses/{course['id']}/enroll",
                                 {"user_id": clinic.user_id("lab")})
    assert refusal(response) == (403, "FORBIDDEN")
    response = await clinic.post("admin", f"/api/training/courses/{course['id']}/enroll",
                                 {"user_id": clinic.user_id("stranger")})
    assert refusal(response) == (422, "NOT_A_MEMBER")


async def test_progress_only_goes_forward_and_completes_the_course(clinic):
    credits = clinic.recorded("platform.training.cme_credit_recorded")
    course = await new_course(clinic, {**HAND_HYGIENE, "modules": [
        {"title": "The five moments"}, {"title": "Technique"}]})
    enrollment = await enrolled(clinic, "nurse", course)
    path = f"/api/training/enrollments/{enrollment['id']}/progress"
    halfway = data(await clinic.post("nurse", path, {"module_id": "m1"}))
    assert halfway["status"] == "in-progress" and halfway["progress"] == 50
    assert refusal(await clinic.post("nurse", path, {"progress": 20})) == (
        409, "PROGRESS_BACKWARDS")
    assert refusal(await clinic.post("nurse", path, {"module_id": "m9"})) == (
        422, "UNKNOWN_MODULE")
    assert data(await clinic.post("nurse", path, {"progress": 75}))["progress"] == 75
    done = data(await clinic.post("nurse", path, {"module_id": "m2"}))
    assert done["status"] == "completed" and done["progress"] == 100 and done["completed_at"]
    assert refusal(await clinic.post("nurse", path, {"module_id": "m2"})) == (
        409, "INVALID_TRANSITION")
    mine = data(await clinic.get("nurse", "/api/training/cme-credits"))
    assert [(c["source"], c["credits"], c["credit_type"]) for c in mine] == [
        ("course", 1, "CPD")]
    await clinic.drain()
    assert len(credits) == 1


async def test_members_see_and_progress_their_own_enrolments(clinic):
    course = await new_course(clinic)
    nurse = await enrolled(clinic, "nurse", course)
    await enrolled(clinic, "doctor", course)
    assert [e["id"] for e in data(await clinic.get("nurse", "/api/training/enrollments"))] == [
        nurse["id"]]
    assert len(data(await clinic.get("admin", "/api/training/enrollments",
                                     course_id=course["id"]))) == 2
    assert refusal(await clinic.get("nurse", "/api/training/enrollments",
                                    user_id=clinic.user_id("doctor"))) == (403, "FORBIDDEN")
    response = await clinic.post("doctor", f"/api/training/enrollments/{nurse['id']}/progress",
                                 {"module_id": "m1"})
    assert refusal(response) == (404, "NOT_FOUND")
    response = await clinic.post("nurse", f"/api/training/enrollments/{nurse['id']}/progress",
                                 {})
    assert refusal(response) == (422, "VALIDATION_ERROR")
