"""The FHIR operation Patient/$match (IHE PDQm ITI-119) over the MPI: a searchset Bundle
with search.score and the match-grade extension, onlyCertainMatches and count, what the
caller may see, and refusals as OperationOutcomes."""

from __future__ import annotations

from typing import Any

from tests.platform_api.clinic import Clinic
from tests.platform_api.mpi.conftest import fhir_patient, register

MATCH_GRADE = "http://hl7.org/fhir/StructureDefinition/match-grade"
AMINA = {"resourceType": "Patient", "name": [{"family": "Odhiambo", "given": ["Amina"]}],
         "birthDate": "1988-04-12", "gender": "female"}


def parameters(resource: dict[str, Any], **more: Any) -> dict[str, Any]:
    extra = [{"name": "onlyCertainMatches", "valueBoolean": v} if k == "only_certain" else
             {"name": "count", "valueInteger": v} for k, v in more.items()]
    return {"resourceType": "Parameters",
            "parameter": [{"name": "resource", "resource": resource}, *extra]}


async def post_match(clinic: Clinic, who: str, body: Any) -> Any:
    return await clinic.client.post("/fhir/Patient/$match", json=body, headers={
        **clinic.h(who), "Content-Type": "application/fhir+json"})


async def test_match_answers_a_searchset_with_scores_and_grades(clinic: Clinic):
    # day and month transposed: never agreement, so probable at best
    namesake = await register(clinic, first_name="Amina", last_name="Odhiambo",
                              date_of_birth="1988-12-04", gender="female")
    response = await post_match(clinic, "platform_admin", parameters(AMINA))
    assert response.status_code == 200, response.text
    bundle = response.json()
    assert bundle["resourceType"] == "Bundle" and bundle["type"] == "searchset"
    ids = [e["resource"]["id"] for e in bundle["entry"]]
    assert ids[:2] == [clinic.patient_id, namesake]
    first, second = bundle["entry"][:2]
    assert first["search"]["mode"] == "match"
    assert first["search"]["score"] > second["search"]["score"]
    assert first["search"]["extension"] == [{"url": MATCH_GRADE, "valueCode": "certain"}]
    assert second["search"]["extension"][0]["valueCode"] == "probable"
    certain = (await post_match(clinic, "platform_admin",
                                parameters(AMINA, only_certain=True))).json()
    assert [e["resource"]["id"] for e in certain["entry"]] == [clinic.patient_id]
    one = (await post_match(clinic, "platform_admin", parameters(AMINA, count=1))).json()
    assert one["total"] == 1


async def test_match_shows_only_what_the_caller_may_see(clinic: Clinic):
    elsewhere = await register(clinic, "other_admin", first_name="Amina",
                               last_name="Odhiambo", date_of_birth="1988-04-12",
                               gender="female", phone="+254700000001")
    seen = (await post_match(clinic, "doctor", parameters(AMINA))).json()
    ids = [e["resource"]["id"] for e in seen["entry"]]
    assert clinic.patient_id in ids and elsewhere not in ids
    by_admin = (await post_match(clinic, "platform_admin", parameters(AMINA))).json()
    assert elsewhere in [e["resource"]["id"] for e in by_admin["entry"]]


async def test_a_bare_patient_is_the_resource_and_bad_parameters_are_400(clinic: Clinic):
    await fhir_patient(clinic, {"name": [{"family": "Mensah", "given": ["Kwame"]}],
                                "birthDate": "1975-09-30", "gender": "male"})
    bare = await post_match(clinic, "platform_admin", {
        "resourceType": "Patient", "name": [{"family": "Mensah", "given": ["Kwame"]}],
        "birthDate": "1975-09-30"})
    assert bare.status_code == 200 and bare.json()["total"] == 1
    for body in ({"resourceType": "Parameters", "parameter": []},
                 parameters(AMINA, count=0),
                 {"resourceType": "Observation", "status": "final"},
                 parameters({"resourceType": "Patient", "birthDate": "12/04/1988"})):
        response = await post_match(clinic, "platform_admin", body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["resourceType"] == "OperationOutcome"
    unsigned = await clinic.client.post("/fhir/Patient/$match", json=parameters(AMINA))
    assert unsigned.status_code == 401
