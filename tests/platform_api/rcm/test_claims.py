"""Claims from draft to paid: drafted with computed totals, edited only while draft, sent
to payers over FHIR and in their own format (approved, partly approved, rejected, timed
out), eligibility and pre-authorization, cancellation, and who may do what."""

from __future__ import annotations

from tests.conftest import register_and_login
from tests.platform_api.clinic import Clinic, refusal
from tests.platform_api.rcm.conftest import data, draft, put
from tests.platform_api.rcm.payer_standin import PayerStandIn

Payer = tuple[PayerStandIn, str]


async def test_a_claim_is_drafted_with_its_total_and_the_patients_coverage(clinic: Clinic):
    created_events = clinic.recorded("platform.rcm.claim_created")
    claim = data(await draft(clinic), 201)
    assert claim["status"] == "draft" and claim["total"] == "1850.50"
    assert claim["currency"] == "KES" and claim["diagnoses"] == ["B50.9"]
    assert claim["organization_id"] == clinic.org_id and claim["service_date"] == "2026-11-20"
    assert [(i["quantity"], i["amount"]) for i in claim["items"]] == [("1", "1500.00"),
                                                                      ("2", "350.50")]
    fhir = (await clinic.get("billing", f"/fhir/Claim/{claim['id']}")).json()
    assert fhir["status"] == "draft" and fhir["use"] == "claim"
    assert fhir["total"] == {"value": 1850.5, "currency": "KES"}
    assert fhir["diagnosis"][0]["diagnosisCodeableConcept"]["coding"][0]["system"] == \
        "http://hl7.org/fhir/sid/icd-10"
    assert fhir["item"][1]["servicedDate"] == "2026-11-20"
    coverage = (await clinic.get("billing", f"/fhir/Coverage/{claim['coverage_id']}")).json()
    assert coverage["subscriberId"] == "NHIF-2231-8890"
    # the organization's billing view lists the same Claim
    listed = data(await clinic.get("receptionist",
                                   f"/api/organizations/{clinic.org_id}/claims"))
    assert [c["id"] for c in listed] == [claim["id"]] and listed[0]["status"] == "draft"
    await clinic.drain()
    assert [e["payload"]["claim_id"] for e in created_events] == [claim["id"]]


async def test_claims_are_refused_to_the_wrong_people_and_bad_input(clinic: Clinic):
    assert refusal(await draft(clinic, who="doctor")) == (403, "FORBIDDEN")
    assert refusal(await draft(clinic, who="other_admin")) == (403, "FORBIDDEN")
    assert refusal(await draft(clinic, who="stranger")) == (403, "FORBIDDEN")
    unknown = await draft(clinic, patient_id="0190a1b2-0000-7000-8000-000000000000")
    assert refusal(unknown) == (404, "NOT_FOUND")
    bad_code = await draft(clinic, diagnoses=["malaria"])
    assert refusal(bad_code) == (422, "VALIDATION_ERROR")
    assert bad_code.json()["error"]["field"] == "diagnoses.0"
    negative = await draft(clinic, items=[{"description": "Refund", "unit_price": "-1"}])
    assert negative.json()["error"]["field"] == "items.0.unit_price"
    assert refusal(await draft(clinic, service_date="20/11/2026")) == (422,
                                                                       "VALIDATION_ERROR")


async def test_a_draft_is_edited_and_its_total_recomputed(clinic: Clinic):
    claim = data(await draft(clinic), 201)
    path = f"/api/rcm/claims/{claim['id']}"
    edited = data(await put(clinic, "billing", path, {"items": [
        {"description": "Inpatient day", "code": "I-DAY", "quantity": 3,
         "unit_price": "4200.00"}], "diagnoses": ["A01.0"]}))
    assert edited["total"] == "12600.00" and edited["diagnoses"] == ["A01.0"]
    assert edited["insurer"] == "NHIF" and edited["status"] == "draft"
    assert edited["number"] == claim["number"]
    assert refusal(await put(clinic, "doctor", path, {"diagnoses": ["B50.9"]})) == (
        403, "FORBIDDEN")
    got = data(await clinic.get("doctor", path))
    assert got["total"] == "12600.00"
    moved = data(await put(clinic, "billing", path, {"insurer": "Jubilee Insurance",
                                                     "policy_number": "JUB-77"}))
    assert moved["insurer"] == "Jubilee Insurance" and moved["total"] == "12600.00"
    assert moved["coverage_id"] != claim["coverage_id"]
    coverage = (await clinic.get("billing", f"/fhir/Coverage/{moved['coverage_id']}")).json()
    assert coverage["subscriberId"] == "JUB-77"
    bad = await put(clinic, "billing", path, {"items": []})
    assert refusal(bad) == (422, "VALIDATION_ERROR") and bad.json()["error"]["field"] == \
        "items"


async def test_an_approved_claim_is_adjudicated_and_paid_over_fhir(clinic: Clinic,
                                                                    payer: Payer):
    stand_in, _ = payer
    events = clinic.recorded("platform.rcm.*")
    claim = data(await draft(clinic), 201)
    sent = data(await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/submit"))
    assert sent["status"] == "paid" and sent["decision"] == "approved"
    assert sent["approved"] == "1850.50" and sent["paid"] == "1850.50"
    path, body = stand_in.received[-1]
    assert path == "/fhir/Claim/$submit" and body["resourceType"] == "Claim"
    assert body["total"]["value"] == 1850.5 and "meta" not in body
    response = (await clinic.get("billing",
                                 f"/fhir/ClaimResponse/{sent['claim_response_id']}")).json()
    assert response["request"] == {"reference": f"Claim/{claim['id']}"}
    fhir = (await clinic.get("billing", f"/fhir/Claim/{claim['id']}")).json()
    assert fhir["status"] == "active"
    # sent once: a second submission is refused by the status table
    again = await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/submit")
    assert refusal(again) == (409, "INVALID_TRANSITION")
    assert refusal(await put(clinic, "billing", f"/api/rcm/claims/{claim['id']}",
                             {"diagnoses": ["B54"]})) == (409, "CLAIM_NOT_EDITABLE")
    await clinic.drain()
    topics = [e["topic"] for e in events]
    assert "platform.rcm.claim_submitted" in topics
    adjudicated = next(e for e in events if e["topic"] == "platform.rcm.claim_adjudicated")
    assert adjudicated["payload"]["decision"] == "approved"
    assert adjudicated["payload"]["paid"] == "1850.50"


async def test_a_partly_approved_claim_in_the_payers_own_format_is_partially_paid(
        clinic: Clinic, payer: Payer):
    stand_in, _ = payer
    stand_in.decision = "partial"
    claim = data(await draft(clinic, insurer="Jubilee Insurance", policy_number="JUB-77"), 201)
    sent = data(await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/submit"))
    assert sent["status"] == "partially-paid" and sent["decision"] == "partial"
    assert sent["approved"] == "1110.30" and sent["paid"] == "1110.30"
    path, body = stand_in.received[-1]
    assert path == "/own/claims" and body["member_number"] == "JUB-77"
    assert body["total"] == "1850.50" and body["lines"][1]["amount"] == "350.50"
    assert body["lines"][1]["quantity"] == "2"
    listed = data(await clinic.get("billing", "/api/rcm/claims", status="partially-paid"))
    assert [c["id"] for c in listed] == [claim["id"]]


async def test_a_rejected_claim_says_why(clinic: Clinic, payer: Payer):
    payer[0].decision = "reject"
    for insurer in ("NHIF", "Jubilee Insurance"):
        claim = data(await draft(clinic, insurer=insurer), 201)
        sent = data(await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/submit"))
        assert sent["status"] == "rejected" and sent["approved"] == "0.00"
        assert sent["disposition"] in ("Service not covered by the member's scheme",
                                       "Pre-existing condition excluded")


async def test_a_payer_that_does_not_answer_leaves_the_claim_a_draft(clinic: Clinic,
                                                                      payer: Payer):
    stand_in, _ = payer
    stand_in.decision, stand_in.delay = "timeout", 2.0
    claim = data(await draft(clinic), 201)
    path = f"/api/rcm/claims/{claim['id']}/submit"
    assert refusal(await clinic.post("billing", path)) == (504, "PAYER_TIMEOUT")
    assert data(await clinic.get("billing", f"/api/rcm/claims/{claim['id']}"))["status"] == \
        "draft"
    stand_in.decision = "fail"
    assert refusal(await clinic.post("billing", path)) == (502, "PAYER_UNAVAILABLE")
    stand_in.decision = "malformed"
    malformed = await clinic.post("billing", path)
    assert refusal(malformed) == (502, "PAYER_REFUSED")
    assert "payment" in malformed.json()["error"]["message"]
    stand_in.decision = "approve"
    assert data(await clinic.post("billing", path))["status"] == "paid"


async def test_a_queued_decision_leaves_the_claim_submitted(clinic: Clinic, payer: Payer):
    payer[0].decision = "queue"
    claim = data(await draft(clinic), 201)
    sent = data(await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/submit"))
    assert sent["status"] == "submitted" and sent["decision"] == "pending"


async def test_an_insurer_without_a_payer_api_is_refused_before_anything_is_sent(
        clinic: Clinic, payer: Payer):
    claim = data(await draft(clinic, insurer="Madison Insurance"), 201)
    sent = await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/submit")
    assert refusal(sent) == (422, "PAYER_NOT_CONFIGURED")
    assert payer[0].received == []
    # only the financial roles send claims
    nhif = data(await draft(clinic), 201)
    assert refusal(await clinic.post("doctor", f"/api/rcm/claims/{nhif['id']}/submit")) == (
        403, "FORBIDDEN")
    assert refusal(await clinic.post("other_admin",
                                     f"/api/rcm/claims/{nhif['id']}/submit"))[0] == 403
    assert payer[0].received == []


async def test_eligibility_is_asked_of_the_payer_and_kept(clinic: Clinic, payer: Payer):
    events = clinic.recorded("platform.rcm.eligibility_checked")
    claim = data(await draft(clinic), 201)
    answer = data(await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/eligibility"),
                  201)
    assert answer["eligible"] is True and answer["coverage_id"] == claim["coverage_id"]
    assert [i["allowed"] for i in answer["items"]] == ["1000.00", "1000.00"]
    request = (await clinic.get("billing", "/fhir/CoverageEligibilityRequest/"
                                + answer["request_id"])).json()
    assert request["patient"]["reference"] == f"Patient/{clinic.patient_id}"
    response = (await clinic.get("billing",
                                 f"/fhir/CoverageEligibilityResponse/{answer['id']}")).json()
    assert response["request"]["reference"] == \
        f"CoverageEligibilityRequest/{answer['request_id']}"
    payer[0].decision = "reject"
    own = data(await draft(clinic, insurer="Jubilee Insurance"), 201)
    lapsed = data(await clinic.post("admin", f"/api/rcm/claims/{own['id']}/eligibility"), 201)
    assert lapsed["eligible"] is False and lapsed["disposition"] == "Policy suspended"
    assert refusal(await clinic.post("receptionist",
                                     f"/api/rcm/claims/{own['id']}/eligibility")) == (
        403, "FORBIDDEN")
    await clinic.drain()
    assert len(events) == 2


async def test_pre_authorization_gives_a_reference_the_claim_carries(clinic: Clinic,
                                                                      payer: Payer):
    claim = data(await draft(clinic), 201)
    preauth = data(await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/preauth"),
                   201)
    assert preauth["decision"] == "approved" and preauth["pre_auth_ref"] == "NHIF-PA-7781"
    assert preauth["requested"] == preauth["approved"] == "1850.50"
    assert payer[0].received[-1][1]["use"] == "preauthorization"
    stored = (await clinic.get("billing", f"/fhir/Claim/{preauth['id']}")).json()
    assert stored["use"] == "preauthorization"
    assert stored["related"][0]["claim"]["reference"] == f"Claim/{claim['id']}"
    got = data(await clinic.get("billing", f"/api/rcm/claims/{claim['id']}"))
    assert got["pre_auth_ref"] == "NHIF-PA-7781"
    # the pre-authorization is not a claim of the lists
    assert [c["id"] for c in data(await clinic.get("billing", "/api/rcm/claims"))] == [
        claim["id"]]
    assert refusal(await clinic.get("billing", f"/api/rcm/claims/{preauth['id']}")) == (
        404, "NOT_FOUND")
    data(await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/submit"))
    late = await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/preauth")
    assert refusal(late) == (409, "CLAIM_NOT_EDITABLE")


async def test_own_format_pre_authorization(clinic: Clinic, payer: Payer):
    payer[0].decision = "partial"
    claim = data(await draft(clinic, insurer="Jubilee Insurance"), 201)
    preauth = data(await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/preauth"),
                   201)
    assert preauth["decision"] == "partial" and preauth["approved"] == "1110.30"
    assert preauth["pre_auth_ref"].startswith("JUB-PA-")
    assert payer[0].received[-1][0] == "/own/preauthorizations"


async def test_a_claim_is_cancelled_by_its_status_and_then_final(clinic: Clinic):
    claim = data(await draft(clinic), 201)
    path = f"/api/rcm/claims/{claim['id']}"
    cancelled = data(await put(clinic, "billing", path, {"status": "cancelled"}))
    assert cancelled["status"] == "cancelled"
    assert (await clinic.get("billing", f"/fhir/Claim/{claim['id']}")).json()["status"] == \
        "cancelled"
    assert refusal(await clinic.post("billing", path + "/submit")) == (409,
                                                                       "INVALID_TRANSITION")
    assert refusal(await put(clinic, "billing", path, {"status": "cancelled"})) == (
        409, "INVALID_TRANSITION")
    assert refusal(await put(clinic, "billing", path, {"status": "paid"})) == (
        422, "VALIDATION_ERROR")


async def test_lists_show_what_the_caller_may_see(clinic: Clinic):
    first = data(await draft(clinic), 201)
    other = await clinic.post("other_admin", "/api/organizations/" + clinic.other_org_id
                              + "/patients", {"first_name": "Baraka", "last_name": "Mwangi",
                                              "date_of_birth": "1979-02-01",
                                              "gender": "male", "mrn": "MNH-1"})
    theirs = data(await clinic.post("other_admin", "/api/rcm/claims", {
        "organization_id": clinic.other_org_id, "patient_id": data(other, 201)["id"],
        "insurer": "NHIF", "policy_number": "N-1", "currency": "KES",
        "service_date": "2026-11-19", "items": [{"description": "X-ray",
                                                 "unit_price": "2000"}]}), 201)
    mine = await clinic.get("billing", "/api/rcm/claims")
    assert [c["id"] for c in mine.json()["data"]] == [first["id"]]
    assert mine.json()["meta"]["total"] == 1
    assert refusal(await clinic.get("billing", f"/api/rcm/claims/{theirs['id']}"))[0] == 403
    assert data(await clinic.get("platform_admin", "/api/rcm/claims",
                                 organization_id=clinic.other_org_id))[0]["id"] == theirs["id"]
    assert data(await clinic.get("stranger", "/api/rcm/claims")) == []
    by_patient = data(await clinic.get("doctor", "/api/rcm/claims",
                                       patient_id=clinic.patient_id))
    assert [c["id"] for c in by_patient] == [first["id"]]


async def test_a_patient_reads_their_own_claims_and_nobody_elses(clinic: Clinic):
    person = await register_and_login(clinic.client, first_name="Wanjiru", last_name="Kamau")
    clinic.people["member"] = person
    own = data(await clinic.post("member", "/api/patients", {
        "first_name": "Wanjiru", "last_name": "Kamau", "date_of_birth": "1990-05-05",
        "gender": "female"}), 201)
    # a platform administrator files it for the clinic (the clinic cannot see her record)
    theirs = data(await draft(clinic, who="platform_admin", patient_id=own["id"]), 201)
    assert refusal(await draft(clinic, patient_id=own["id"]))[0] == 403
    mine = data(await draft(clinic), 201)
    listed = data(await clinic.get("member", "/api/rcm/claims"))
    assert [c["id"] for c in listed] == [theirs["id"]]
    assert data(await clinic.get("member", f"/api/rcm/claims/{theirs['id']}"))["total"] == \
        "1850.50"
    assert refusal(await clinic.get("member", f"/api/rcm/claims/{mine['id']}"))[0] == 403
    assert refusal(await put(clinic, "member", f"/api/rcm/claims/{theirs['id']}",
                             {"status": "cancelled"}))[0] == 403
