"""Workforce members (PractitionerRole): the ORG:ADMIN adds members of the organization,
its members list them, other organizations see nothing."""

from __future__ import annotations

from tests.platform_api.workforce.conftest import add_workforce, data, refusal


async def test_admin_adds_a_member_stored_as_a_tagged_practitioner_role(clinic):
    member = await add_workforce(clinic, "nurse", skills=["icu", "triage"],
                                 contracted_hours=37.5, max_hours_per_week=44,
                                 unavailability=[{"start": "2027-03-03", "end": "2027-03-04",
                                                  "reason": "Study leave"}])
    assert member["role"] == "ORG:NURSE" and member["name"] == "Nafula Wekesa"
    assert member["skills"] == ["icu", "triage"] and member["contracted_hours"] == 37.5
    role = (await clinic.get("admin", f"/fhir/PractitionerRole/{member['id']}")).json()
    assert role["organization"] == {"reference": f"Organization/{clinic.org_id}"}
    assert role["practitioner"]["identifier"]["value"] == clinic.user_id("nurse")
    assert role["notAvailable"][0]["description"] == "Study leave"
    assert {"system": "urn:healthplatform:workforce", "code": "member"} in role["meta"]["tag"]


async def test_a_second_record_of_the_same_member_is_409(clinic):
    await add_workforce(clinic, "nurse")
    response = await clinic.post("admin", "/api/workforce/members",
                                 {"user_id": clinic.user_id("nurse")})
    assert refusal(response) == (409, "MEMBER_EXISTS")


async def test_only_members_of_the_organization_join_its_workforce(clinic):
    response = await clinic.post("admin", "/api/workforce/members",
                                 {"user_id": clinic.user_id("stranger")})
    assert refusal(response) == (422, "NOT_A_MEMBER")
    assert response.json()["error"]["field"] == "user_id"


async def test_staff_other_than_the_admin_cannot_add_members(clinic):
    for who in ("doctor", "nurse", "receptionist"):
        response = await clinic.post(who, "/api/workforce/members",
                                     {"user_id": clinic.user_id("lab")})
        assert refusal(response) == (403, "FORBIDDEN"), who
    assert refusal(await clinic.post("stranger", "/api/workforce/members", {
        "user_id": clinic.user_id("lab"), "organization_id": clinic.org_id})) == (403, "FORBIDDEN")


async def test_members_list_their_workforce_and_filter_by_skill(clinic):
    await add_workforce(clinic, "nurse")
    await add_workforce(clinic, "doctor")
    listed = await clinic.get("receptionist", "/api/workforce/members")
    assert listed.json()["meta"]["total"] == 2
    icu = data(await clinic.get("nurse", "/api/workforce/members", skill="icu"))
    assert [m["user_id"] for m in icu] == [clinic.user_id("nurse")]
    mine = data(await clinic.get("nurse", "/api/workforce/members",
                                 user_id=clinic.user_id("doctor")))
    assert [m["role"] for m in mine] == ["ORG:DOCTOR"]


async def test_another_organization_sees_none_of_them(clinic):
    await add_workforce(clinic, "nurse")
    assert data(await clinic.get("other_admin", "/api/workforce/members")) == []
    response = await clinic.get("other_admin", "/api/workforce/members",
                                organization_id=clinic.org_id)
    assert refusal(response) == (403, "FORBIDDEN")
    assert refusal(await clinic.get("stranger", "/api/workforce/members")) == (
        422, "ORGANIZATION_REQUIRED")


async def test_bad_input_names_the_field(clinic):
    response = await clinic.post("admin", "/api/workforce/members", {
        "user_id": clinic.user_id("nurse"), "contracted_hours": 120})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "contracted_hours"
    response = await clinic.post("admin", "/api/workforce/members", {
        "user_id": clinic.user_id("nurse"),
        "unavailability": [{"start": "2027-03-05", "end": "2027-03-01"}]})
    assert refusal(response) == (422, "VALIDATION_ERROR")
