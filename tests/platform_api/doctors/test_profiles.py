"""Doctor profiles (Practitioner, PractitionerRole, VerificationResult): creation and
changes by the doctor, verification by platform administrators (the organizations a
doctor practises at: test_joining.py)."""

from __future__ import annotations

from typing import Any

from tests.conftest import register_and_login
from tests.platform_api.clinic import Clinic, refusal

CARDIOLOGY = {"code": "394579002", "display": "Cardiology"}
PAEDIATRICS = {"code": "394537008", "display": "Paediatric specialty"}
PROFILE = {"first_name": "Wanjiru", "last_name": "Kamau", "title": "Dr.", "gender": "female",
           "phone": "+254722334455", "email": "wanjiru.kamau@kliniki.example",
           "license_number": "A12345", "license_authority": "KMPDC",
           "specialties": [CARDIOLOGY], "languages": ["sw", "en"], "city": "Nairobi",
           "country": "ke", "qualifications": [{"title": "MBChB", "institution":
                                               "University of Nairobi", "year": 2012}],
           "biography": "Cardiologist with ten years at Kenyatta National Hospital."}


async def new_doctor(clinic: Clinic, **changes: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A user with a doctor profile: (the user, the profile)."""
    user = await register_and_login(clinic.client, first_name="Wanjiru", last_name="Kamau")
    created = await clinic.client.post("/api/doctors", json={**PROFILE, **changes},
                                       headers=user["headers"])
    assert created.status_code == 201, created.text
    return user, created.json()["data"]



async def test_a_doctor_creates_a_profile_pending_verification(clinic: Clinic):
    user, doctor = await new_doctor(clinic)
    assert doctor["display_name"] == "Dr. Wanjiru Kamau" and doctor["user_id"] == \
        user["user"]["id"]
    assert doctor["verification"]["status"] == "pending"
    assert doctor["specialties"] == [{"code": "394579002", "system": "http://snomed.info/sct",
                                      "display": "Cardiology"}]
    assert doctor["languages"] == ["sw", "en"] and doctor["country"] == "KE"
    assert doctor["license_number"] == "A12345" and doctor["phone"] == "+254722334455"
    admin = clinic.h("platform_admin")
    fhir = (await clinic.client.get(f"/fhir/Practitioner/{doctor['id']}", headers=admin)).json()
    assert {"system": "urn:healthplatform:user", "value": user["user"]["id"]} in fhir[
        "identifier"]
    assert fhir["communication"][0]["coding"][0] == {"system": "urn:ietf:bcp:47", "code": "sw"}
    roles = (await clinic.client.get("/fhir/PractitionerRole", headers=admin, params={
        "practitioner": f"Practitioner/{doctor['id']}"})).json()
    assert roles["entry"][0]["resource"]["specialty"][0]["coding"][0]["code"] == "394579002"
    checks = (await clinic.client.get("/fhir/VerificationResult", headers=admin, params={
        "target": f"Practitioner/{doctor['id']}"})).json()
    assert checks["entry"][0]["resource"]["status"] == "in-process"
    again = await clinic.client.post("/api/doctors", json=PROFILE, headers=user["headers"])
    assert refusal(again) == (409, "PROFILE_EXISTS")
    mine = await clinic.client.get("/api/doctors/me", headers=user["headers"])
    assert mine.json()["data"]["id"] == doctor["id"]
    assert refusal(await clinic.get("stranger", "/api/doctors/me")) == (404, "NOT_FOUND")


async def test_a_profile_is_validated(clinic: Clinic):
    user = await register_and_login(clinic.client, first_name="Juma", last_name="Hassan")
    for field, value in (("languages", ["Kiswahili!"]), ("phone", "0722334455"),
                         ("country", "Kenya"), ("photo_url", "not a url")):
        bad = await clinic.client.post("/api/doctors", json={**PROFILE, field: value},
                                       headers=user["headers"])
        assert refusal(bad) == (422, "VALIDATION_ERROR"), field
        assert bad.json()["error"]["field"].startswith(field)
    assert (await clinic.client.post("/api/doctors", json=PROFILE)).status_code == 401


async def test_only_the_doctor_and_platform_admins_change_a_profile(clinic: Clinic):
    user, doctor = await new_doctor(clinic)
    url = f"/api/doctors/{doctor['id']}"
    changed = await clinic.client.put(url, json={"specialties": [CARDIOLOGY, PAEDIATRICS],
                                                 "city": "Kisumu"}, headers=user["headers"])
    assert changed.status_code == 200, changed.text
    data = changed.json()["data"]
    assert data["city"] == "Kisumu" and data["last_name"] == "Kamau"  # the rest stays
    assert [s["code"] for s in data["specialties"]] == ["394579002", "394537008"]
    for who in ("nurse", "admin"):
        assert refusal(await clinic.client.put(url, json={"city": "Eldoret"},
                                               headers=clinic.h(who))) == (403, "FORBIDDEN")
    by_admin = await clinic.client.put(url, json={"title": "Prof."},
                                       headers=clinic.h("platform_admin"))
    assert by_admin.json()["data"]["display_name"] == "Prof. Wanjiru Kamau"
    assert refusal(await clinic.client.put("/api/doctors/nobody", json={"city": "X"},
                                           headers=user["headers"])) == (404, "NOT_FOUND")


async def verify(clinic: Clinic, doctor_id: str, decision: str, reason: str | None = None,
                 who: str = "platform_admin") -> Any:
    return await clinic.client.patch(f"/api/doctors/{doctor_id}/verify", headers=clinic.h(who),
                                     json={"decision": decision, "reason": reason})


async def test_administrators_verify_or_reject_a_doctor(clinic: Clinic):
    decisions = clinic.recorded("platform.doctors.verification_decided")
    user, doctor = await new_doctor(clinic, license_number=None)
    pending = (await clinic.get("platform_admin", "/api/doctors/pending")).json()
    assert [d["id"] for d in pending["data"]] == [doctor["id"]]
    assert refusal(await clinic.get("admin", "/api/doctors/pending")) == (403, "FORBIDDEN")
    assert refusal(await verify(clinic, doctor["id"], "approve", who="admin")) == (
        403, "FORBIDDEN")
    no_reason = await verify(clinic, doctor["id"], "reject")
    assert refusal(no_reason) == (422, "VALIDATION_ERROR")
    assert no_reason.json()["error"]["field"] == "reason"
    assert refusal(await verify(clinic, doctor["id"], "approve")) == (409, "INCOMPLETE_PROFILE")
    rejected = await verify(clinic, doctor["id"], "reject", "No licence number given")
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["data"]["verification"]["status"] == "rejected"
    assert rejected.json()["data"]["verification"]["reason"] == "No licence number given"
    assert refusal(await verify(clinic, doctor["id"], "reject", "Again")) == (
        409, "INVALID_TRANSITION")
    # Changing a rejected profile sends it back for review.
    resubmitted = await clinic.client.put(f"/api/doctors/{doctor['id']}", headers=user[
        "headers"], json={"license_number": "A12345", "license_authority": "KMPDC"})
    assert resubmitted.json()["data"]["verification"]["status"] == "pending"
    approved = await verify(clinic, doctor["id"], "approve")
    assert approved.json()["data"]["verification"]["status"] == "verified"
    check = (await clinic.client.get("/fhir/VerificationResult", params={
        "target": f"Practitioner/{doctor['id']}"}, headers=clinic.h("platform_admin"))).json()
    result = check["entry"][0]["resource"]
    assert result["status"] == "validated"
    assert result["validator"][0]["attestationSignature"]["who"]["identifier"]["value"] == \
        clinic.user_id("platform_admin")
    assert refusal(await verify(clinic, "nobody", "approve")) == (404, "NOT_FOUND")
    await clinic.drain()
    assert [e["payload"]["status"] for e in decisions] == ["rejected", "verified"]
