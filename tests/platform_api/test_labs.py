"""Labs area through the app: HTTP ingest, lab results and reviews, lab orders, and the
MLLP listener the app starts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import orjson
from asgi_lifespan import LifespanManager

from hl7_gateway.gateway import DEAD_LETTERS
from hl7_gateway.mllp import MLLPClient
from hl7_gateway.parser import parse
from hl7_gateway.send import client_tls_context, messages_in, send_files
from platform_api.app import create_app
from platform_api.labs import MLLP_SERVER, hl7_gateway
from tests.conftest import make_settings, register_and_login
from tests.hl7_gateway.hl7_samples import sample_files
from tests.hl7_gateway.messages import CHEMISTRY, EXPECTED_ACKS, oru
from tests.hl7_gateway.test_gateway import FailingOnce
from tests.hl7_gateway.test_mllp import self_signed_certificate

JSON = dict[str, Any]
HL7 = {"Content-Type": "x-application/hl7-v2+er7"}
PATIENT = {"first_name": "Grace", "last_name": "Achieng", "date_of_birth": "1980-04-12",
           "gender": "female", "mrn": "KSM-000417"}


def msa(ack: str) -> tuple[str, str]:
    segment = parse(ack).segment("MSA")
    assert segment is not None
    return segment.field(1), segment.field(2)


async def ingest(client: httpx.AsyncClient, headers: dict[str, str], message: bytes) -> JSON:
    response = await client.post("/api/lab/hl7-ingest", content=message,
                                 headers={**headers, **HL7})
    assert response.status_code == 200, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


async def clinic(client: httpx.AsyncClient) -> tuple[dict[str, Any], str, str]:
    """A clinician, their organization, and a patient the organization registered."""
    doctor = await register_and_login(client, first_name="Otieno", last_name="Mwangi")
    org = await client.post("/api/organizations", headers=doctor["headers"],
                            json={"name": "Kisumu Community Clinic", "country": "KE"})
    assert org.status_code == 201, org.text
    org_id = org.json()["data"]["id"]
    patient = await client.post(f"/api/organizations/{org_id}/patients",
                                headers=doctor["headers"], json=PATIENT)
    assert patient.status_code == 201, patient.text
    return doctor, org_id, patient.json()["data"]["id"]


def for_org_patient(org_id: str, control_id: str, **options: Any) -> bytes:
    """An ORU whose PID-3 is the organization's MRN: it reaches the registered patient."""
    authority = f"&urn:healthplatform:organization:{org_id}:mrn&URI"
    return oru(control_id, patient=PATIENT["mrn"], authority=authority, **options)


# --- ingest ---------------------------------------------------------------------------------


async def test_ingest_answers_with_the_ack_in_the_envelope(client, admin) -> None:
    data = await ingest(client, admin["headers"], oru("HTTP-1"))
    assert (data["outcome"], data["ack_code"], data["duplicate"]) == ("accept", "AA", False)
    assert msa(data["ack"]) == ("AA", "HTTP-1")
    kinds = {r.split("/")[0] for r in data["resources"]}
    assert kinds >= {"Patient", "DiagnosticReport", "Observation", "Specimen", "Binary",
                     "Provenance"}
    again = await ingest(client, admin["headers"], oru("HTTP-1"))
    assert (again["duplicate"], again["acks"]) == (True, data["acks"])


async def test_ingest_takes_text_plain_and_json(client, admin) -> None:
    plain = await client.post("/api/lab/hl7-ingest", content=oru("TXT-1"),
                              headers={**admin["headers"], "Content-Type": "text/plain"})
    assert plain.json()["data"]["ack_code"] == "AA"
    as_json = await client.post("/api/lab/hl7-ingest", headers=admin["headers"],
                                json={"message": oru("JSON-1").decode()})
    assert as_json.json()["data"]["ack_code"] == "AA"
    bad = await client.post("/api/lab/hl7-ingest", headers=admin["headers"], json={"msg": 1})
    assert (bad.status_code, bad.json()["error"]["code"]) == (422, "VALIDATION_ERROR")
    other = await client.post("/api/lab/hl7-ingest", content=b"<xml/>",
                              headers={**admin["headers"], "Content-Type": "application/xml"})
    assert other.status_code == 415


async def test_a_nak_is_still_a_200_carrying_the_ack(client, admin) -> None:
    data = await ingest(client, admin["headers"], oru("HTTP-AR").replace(b"|2.5.1", b"|3.0"))
    assert (data["outcome"], data["ack_code"]) == ("reject", "AR")
    assert data["errors"][0]["code"] == 203
    assert "ERR|" in data["ack"]


async def test_ingest_needs_credentials_and_a_lab_or_organization(client, user, admin
                                                                  ) -> None:
    anonymous = await client.post("/api/lab/hl7-ingest", content=oru("A-1"), headers=HL7)
    assert anonymous.status_code == 401
    patient = await client.post("/api/lab/hl7-ingest", content=oru("A-2"),
                                headers={**user["headers"], **HL7})
    assert patient.status_code == 403
    key = await client.post("/api/developer/keys", headers=admin["headers"],
                            json={"name": "city-lab-lis", "scopes": ["lab:write"]})
    assert key.status_code == 201, key.text
    lab = {"X-API-Key": key.json()["data"]["key"]}
    assert (await ingest(client, lab, oru("A-3")))["ack_code"] == "AA"
    doctor, _, _ = await clinic(client)
    assert (await ingest(client, doctor["headers"], oru("A-4")))["ack_code"] == "AA"


async def test_every_sample_over_http_gets_its_acknowledgements(client, admin) -> None:
    got: dict[str, list[str]] = {}
    for path in sample_files():
        for message in messages_in(path.read_bytes()):
            data = await ingest(client, admin["headers"], message)
            codes = [msa(a)[0] for a in data["acks"]]
            got.setdefault(path.name[:2], []).extend(codes)
    assert got == EXPECTED_ACKS


# --- lab results and reviews ------------------------------------------------------------------


async def test_results_reach_the_registered_patient_and_the_clinic_reviews_them(
        client, user) -> None:
    doctor, org_id, patient_id = await clinic(client)
    data = await ingest(client, doctor["headers"], for_org_patient(org_id, "RES-1"))
    assert f"Patient/{patient_id}" in data["resources"]

    listed = await client.get(f"/api/patients/{patient_id}/lab-results",
                              headers=doctor["headers"])
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert body["meta"] == {"page": 1, "limit": 20, "total": 1}
    [result] = body["data"]
    assert (result["status"], result["code"], result["abnormal"]) == ("final", "24323-8", True)
    assert (result["filler_order_number"], result["placer_order_number"]) == ("F-1001",
                                                                              "P-5001")
    potassium = next(r for r in result["results"] if r["code"] == "2823-3")
    assert (potassium["value"], potassium["unit"], potassium["interpretation"]) == (
        6.9, "mmol/L", ["HH"])
    assert potassium["reference_range"] == "3.5-5.1" and potassium["abnormal"] is True
    assert len(result["results"]) == len(CHEMISTRY)
    assert result["review"] is None

    stranger = await client.get(f"/api/patients/{patient_id}/lab-results",
                                headers=user["headers"])
    assert stranger.status_code == 403
    refused = await client.patch(f"/api/lab-results/{result['id']}/review",
                                 headers=user["headers"], json={})
    assert refused.status_code == 403

    reviewed = await client.patch(f"/api/lab-results/{result['id']}/review",
                                  headers=doctor["headers"],
                                  json={"comment": "Potassium critical: patient called in"})
    assert reviewed.status_code == 200, reviewed.text
    review = reviewed.json()["data"]["review"]
    assert (review["current"], review["comment"]) == (True, "Potassium critical: patient "
                                                            "called in")
    assert review["reviewed_by"] == doctor["user"]["email"]
    task = (await client.get(f"/fhir/Task/{review['id']}", headers=doctor["headers"])).json()
    assert task["focus"]["reference"] == f"DiagnosticReport/{result['id']}/_history/1"
    assert task["for"] == {"reference": f"Patient/{patient_id}"}

    corrected = [(c, n, "5.0" if c == "2823-3" else v, u, r, "N" if c == "2823-3" else f)
                 for c, n, v, u, r, f in CHEMISTRY]
    await ingest(client, doctor["headers"],
                 for_org_patient(org_id, "RES-2", status="C", results=corrected))
    [after] = (await client.get(f"/api/patients/{patient_id}/lab-results",
                                headers=doctor["headers"])).json()["data"]
    assert after["id"] == result["id"] and after["status"] == "corrected"
    assert after["review"]["current"] is False  # the lab changed it after the review


async def test_a_patient_sees_their_own_results(client, user) -> None:
    profile = await client.post("/api/patients", headers=user["headers"], json={
        k: v for k, v in PATIENT.items() if k != "mrn"})
    patient_id = profile.json()["data"]["id"]
    message = oru("SELF-1", patient=user["user"]["id"],
                  authority="&urn:healthplatform:user&URI")
    doctor, _, _ = await clinic(client)
    await ingest(client, doctor["headers"], message)
    mine = await client.get(f"/api/patients/{patient_id}/lab-results", headers=user["headers"])
    assert mine.status_code == 200 and mine.json()["meta"]["total"] == 1


async def test_lab_results_of_an_unknown_patient_are_404(client, admin) -> None:
    missing = await client.get("/api/patients/no-such-patient/lab-results",
                               headers=admin["headers"])
    assert missing.status_code == 404
    review = await client.patch("/api/lab-results/no-such-report/review",
                                headers=admin["headers"], json={})
    assert review.status_code == 404


# --- lab orders -------------------------------------------------------------------------------


async def test_lab_orders_follow_their_status_table(client, user) -> None:
    doctor, _, patient_id = await clinic(client)
    created = await client.post("/api/labs", headers=doctor["headers"], json={
        "patient_id": patient_id, "test_type": "Complete blood count", "priority": "urgent",
        "notes": "Fasting since midnight"})
    assert created.status_code == 201, created.text
    order = created.json()["data"]
    assert (order["status"], order["priority"], order["test_type"]) == (
        "active", "urgent", "Complete blood count")
    assert order["placer_order_number"].startswith("HP")
    fhir = (await client.get(f"/fhir/ServiceRequest/{order['id']}",
                             headers=doctor["headers"])).json()
    assert fhir["intent"] == "order"
    assert fhir["identifier"][0]["system"] == "urn:healthplatform:lab-order"

    mine = (await client.get("/api/labs", headers=doctor["headers"])).json()
    assert [o["id"] for o in mine["data"]] == [order["id"]]
    by_patient = await client.get(f"/api/labs?patient_id={patient_id}",
                                  headers=doctor["headers"])
    assert by_patient.json()["meta"]["total"] == 1
    assert (await client.get(f"/api/labs/{order['id']}", headers=user["headers"])
            ).status_code == 403

    held = await client.patch(f"/api/labs/{order['id']}", headers=doctor["headers"],
                              json={"status": "on-hold", "priority": "stat"})
    assert (held.json()["data"]["status"], held.json()["data"]["priority"]) == ("on-hold",
                                                                                "stat")
    done = await client.patch(f"/api/labs/{order['id']}", headers=doctor["headers"],
                              json={"status": "completed"})
    assert done.status_code == 409
    assert done.json()["error"]["code"] == "INVALID_TRANSITION"
    cancelled = await client.post(f"/api/labs/{order['id']}/cancel",
                                  headers=doctor["headers"])
    assert cancelled.json()["data"]["status"] == "revoked"
    twice = await client.post(f"/api/labs/{order['id']}/cancel", headers=doctor["headers"])
    assert twice.status_code == 409


async def test_lab_messages_link_to_the_order_by_its_placer_number(client) -> None:
    doctor, org_id, patient_id = await clinic(client)
    order = (await client.post("/api/labs", headers=doctor["headers"], json={
        "patient_id": patient_id, "test_type": "Metabolic panel",
        "notes": "Fasting since midnight"})).json()["data"]
    placer = order["placer_order_number"]
    status_update = (
        "MSH|^~\\&|CITYLAB-LIS|CITY LAB|CLINIC-EHR|KISUMU CLINIC|20240301093000+0300||"
        "ORM^O01^ORM_O01|ORM-1|P|2.5.1\r"
        f"PID|1||{PATIENT['mrn']}^^^&urn:healthplatform:organization:{org_id}:mrn&URI^MR||"
        "Achieng^Grace\r"
        f"ORC|SC|{placer}^HEALTHPLATFORM|F-2002^CITY LAB||IP\r"
        "OBR|1|" + placer + "^HEALTHPLATFORM|F-2002^CITY LAB|24323-8^Comprehensive metabolic "
        "panel^LN\r").encode()
    assert (await ingest(client, doctor["headers"], status_update))["ack_code"] == "AA"
    updated = (await client.get(f"/api/labs/{order['id']}", headers=doctor["headers"])
               ).json()["data"]
    assert (updated["status"], updated["filler_order_number"]) == ("active", "F-2002")
    assert updated["notes"] == "Fasting since midnight"  # merged, not replaced

    result = for_org_patient(org_id, "ORU-LINK", placer=placer,
                             placer_namespace="HEALTHPLATFORM", filler="F-2002")
    assert (await ingest(client, doctor["headers"], result))["ack_code"] == "AA"
    linked = (await client.get(f"/api/labs/{order['id']}", headers=doctor["headers"])
              ).json()["data"]
    [report_id] = linked["result_ids"]
    [lab_result] = (await client.get(f"/api/patients/{patient_id}/lab-results",
                                     headers=doctor["headers"])).json()["data"]
    assert (lab_result["id"], lab_result["order_id"]) == (report_id, order["id"])


# --- dead letters and the listener --------------------------------------------------------------


async def test_a_dead_lettered_message_is_stored_when_its_event_is_retried(app, client,
                                                                           admin) -> None:
    services = app.state.services
    gateway = hl7_gateway(services)
    real = gateway.fhir
    gateway.fhir = FailingOnce(real)
    failed = await ingest(client, admin["headers"], oru("DLQ-1"))
    gateway.fhir = real
    assert failed["ack_code"] == "AR"
    entry = await services.store.get_document(DEAD_LETTERS, failed["dead_letter_id"])
    assert orjson.loads(entry["original_payload"])["topic"] == "platform.hl7.message_failed"
    assert await services.bus.deliver_raw(entry["original_payload"])  # the generic DLQ retry
    again = await ingest(client, admin["headers"], oru("DLQ-1"))
    assert (again["duplicate"], again["ack_code"]) == (True, "AA")


async def test_the_app_serves_mllp_when_enabled(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, mllp_enabled=True, mllp_port=0)
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30):
        server = application.state.services.extras[MLLP_SERVER]
        async with MLLPClient("127.0.0.1", server.port) as client:
            reply = await client.send(oru("APP-MLLP-1"))
    assert msa(reply.decode()) == ("AA", "APP-MLLP-1")


async def test_the_app_serves_mllp_over_tls_with_the_https_certificate(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    settings = make_settings(tmp_path, mllp_enabled=True, mllp_port=0,
                             tls_cert_file=str(cert), tls_key_file=str(key))
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30):
        port = application.state.services.extras[MLLP_SERVER].port
        results = await send_files([_write(tmp_path, oru("TLS-APP-1"))], "localhost", port,
                                   tls=client_tls_context(str(cert)))
    assert [(r.codes, r.error) for r in results] == [(["AA"], None)]


def _write(directory: Path, message: bytes) -> Path:
    path = directory / "message.hl7"
    path.write_bytes(message)
    return path


# --- batch files and the README's example ------------------------------------------------------


async def test_a_batch_file_over_http_is_answered_with_an_acknowledgement_batch(
        client, admin) -> None:
    from tests.hl7_gateway.test_intake import batch_file, result
    sent = batch_file(result("HB-1", "555444460", "2045813", "182"),
                      result("HB-2", "555444461", "2045814", "95"))
    data = await ingest(client, admin["headers"], sent.encode())
    assert (data["batch"], data["outcome"], data["control_id"]) == (True, "accept",
                                                                    "FILE-0215-01")
    assert [(m["control_id"], m["ack_code"]) for m in data["messages"]] == [
        ("HB-1", "AA"), ("HB-2", "AA")]
    lines = data["ack"].rstrip("\r").split("\r")
    assert [line[:3] for line in lines] == ["FHS", "BHS", "MSH", "MSA", "MSH", "MSA", "BTS",
                                            "FTS"]
    assert lines[0].endswith("|FILE-0215-01") and lines[1].endswith("|BATCH-0215-01")
    assert lines[6].startswith("BTS|2|") and lines[7].startswith("FTS|1|")


ROOT = Path(__file__).resolve().parents[2]


async def test_the_readme_http_ingest_example_runs_as_written(client) -> None:
    """The README's curl line: its file exists, and posted with its Content-Type by the
    tour's user (a doctor who created an organization) it is stored (comment lines and
    all: the shared samples start with their provenance)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## HL7v2 gateway"):]
    example = section[:section.index("```\n", section.index("```sh") + 5)]
    media = re.search(r"-H 'Content-Type: ([^']+)'", example)
    path = re.search(r"--data-binary @(\S+)", example)
    assert media is not None and path is not None, example
    body = (ROOT / path.group(1)).read_bytes()
    assert body.startswith(b"#")  # the sample's provenance notes come first
    doctor = await register_and_login(client, first_name="Wanjiru", last_name="Kamau",
                                      role="DOCTOR")
    org = await client.post("/api/organizations", headers=doctor["headers"],
                            json={"name": "Kibera Community Clinic", "type": "clinic",
                                  "country": "KE"})
    assert org.status_code == 201, org.text
    response = await client.post("/api/lab/hl7-ingest", content=body, headers={
        **doctor["headers"], "Content-Type": media.group(1)})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert (data["outcome"], data["ack_code"], data["dead_letter_id"]) == ("accept", "CA", None)
    assert any(r.startswith("DiagnosticReport/") for r in data["resources"])
