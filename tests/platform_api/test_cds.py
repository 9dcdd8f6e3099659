"""Clinical decision support through the app: CDS Hooks (discovery, the spec's example
requests, order-sign interaction cards, prefetch supplied vs resolved from the store,
from this server's /fhir and from a stand-in FHIR server, 412, client JWTs, feedback)
and the /api/cds routes (drug interaction check and table upsert, NEWS2, panic values,
adverse events, patient risk), with each role's allowed and refused access; panic values
raised from an ingested HL7 ORU."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from jwt.algorithms import ECAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cds_hooks.auth import CdsClient
from cds_hooks.medications import RXNORM
from platform_api.cds import cds_runtime
from platform_api.policy.roles import ORG_DOCTOR, ORG_NURSE, ORG_RECEPTIONIST
from platform_api.settings import Settings
from tests.cds_hooks.examples_data import example, hook_context, hook_request
from tests.cds_hooks.stand_in import serve
from tests.conftest import (
    add_member,
    make_admin,
    make_clinic_admin,
    make_settings,
    register_and_login,
)
from tests.hl7_gateway.messages import oru

JSON = dict[str, Any]
EHR = "https://fhir-ehr.example.com/"
BASE = "http://testserver"
SPEC_KEY = ECAlgorithm.from_jwk(example("client-jwk-private.spec-example.json"))
WARFARIN = {"system": RXNORM, "code": "855332", "display": "Warfarin Sodium 5 MG Oral Tablet"}
IBUPROFEN = {"system": RXNORM, "code": "197806", "display": "Ibuprofen 600 MG Oral Tablet"}
LOINC = "http://loinc.org"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, base_url="http://testserver", cds_clients={
        EHR: {"jwks": example("client-jwks-public.spec-example.json")}})


def client_jwt(path: str, **claims: Any) -> dict[str, str]:
    """The Authorization header of the spec's example EHR calling ``path``."""
    now = int(time.time())
    payload = {"iss": EHR, "aud": BASE + path, "exp": now + 240, "iat": now,
               "jti": str(uuid.uuid4()), **claims}
    token = jwt.encode(payload, SPEC_KEY, algorithm="ES384",
                       headers={"kid": "example-kid", "typ": "JWT"})
    return {"Authorization": f"Bearer {token}"}


async def call(client: httpx.AsyncClient, path: str, body: JSON,
               headers: dict[str, str] | None = None) -> httpx.Response:
    return await client.post(path, json=body, headers=headers or client_jwt(path))


def medication_request(patient_id: str, coding: JSON, *, status: str = "active",
                       request_id: str | None = None) -> JSON:
    resource: JSON = {"resourceType": "MedicationRequest", "status": status, "intent": "order",
                      "subject": {"reference": f"Patient/{patient_id}"},
                      "medicationCodeableConcept": {"coding": [coding],
                                                    "text": coding["display"]}}
    if request_id:
        resource["id"] = request_id
    return resource


def draft_bundle(*resources: JSON) -> JSON:
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"resource": r} for r in resources]}


def sign_request(patient_id: str, prefetch: JSON | None = None, **extra: Any) -> JSON:
    draft = medication_request(patient_id, IBUPROFEN, status="draft",
                               request_id="draft-ibuprofen")
    context = {"userId": "Practitioner/otieno", "patientId": patient_id,
               "draftOrders": draft_bundle(draft)}
    return hook_request("order-sign", context, prefetch, **extra)


async def fhir_create(client: httpx.AsyncClient, headers: dict[str, str], resource: JSON
                      ) -> JSON:
    response = await client.post(f"/fhir/{resource['resourceType']}", json=resource,
                                 headers={**headers, "Content-Type": "application/fhir+json"})
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


async def clinic_with_patient(client: httpx.AsyncClient) -> tuple[JSON, str]:
    """A clinic's ORG:ADMIN (a clinician) and a patient on warfarin."""
    doctor = await make_clinic_admin(client, name="Kisumu Heart Clinic", first_name="Otieno",
                                     last_name="Mwangi")
    patient = await client.post(f"/api/organizations/{doctor['org_id']}/patients",
                                headers=doctor["headers"], json={
                                    "first_name": "Achieng", "last_name": "Owino",
                                    "date_of_birth": "1956-07-21", "gender": "female"})
    assert patient.status_code == 201, patient.text
    patient_id = patient.json()["data"]["id"]
    await fhir_create(client, doctor["headers"], medication_request(patient_id, WARFARIN))
    return doctor, patient_id


def comparable(cards: list[JSON]) -> list[JSON]:
    """Cards without their random uuids."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "uuid"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(cards)  # type: ignore[no-any-return]


# --- discovery and the spec's examples -------------------------------------------------------
async def test_discovery_is_public_and_lists_every_service_per_hook(client) -> None:
    response = await client.get("/cds-services")
    assert response.status_code == 200
    services = response.json()["services"]
    assert {(s["id"], s["hook"]) for s in services} >= {
        ("drug-interactions", "order-select"), ("drug-interactions", "order-sign"),
        ("allergy-conflicts", "order-sign"), ("news2", "patient-view"),
        ("news2", "encounter-start"), ("critical-results", "patient-view")}
    for service in services:
        assert all(isinstance(service[k], str) for k in ("hook", "title", "description", "id",
                                                         "usageRequirements"))
        assert all("{{context.patientId}}" in q for q in service["prefetch"].values())


@pytest.mark.parametrize("hook,number,service", [
    ("patient-view", 1, "news2"), ("patient-view", 2, "critical-results"),
    ("order-select", 1, "drug-interactions"), ("order-select", 2, "allergy-conflicts"),
    ("order-sign", 2, "drug-interactions"), ("encounter-start", 1, "news2"),
    ("encounter-discharge", 1, "news2"), ("appointment-book", 1, "critical-results")])
async def test_the_spec_example_requests_are_answered_with_valid_cards(
        client, hook: str, number: int, service: str) -> None:
    definition = next(s for s in (await client.get("/cds-services")).json()["services"]
                      if s["id"] == service and s["hook"] == hook)
    empty = {"resourceType": "Bundle", "type": "searchset", "entry": []}
    prefetch = {key: empty for key in definition["prefetch"]}
    path = f"/cds-services/{service}"
    response = await call(client, path, hook_request(hook, hook_context(hook, number),
                                                     prefetch))
    assert response.status_code == 200, response.text
    assert response.json()["cards"] == []  # nothing to say about an empty record


async def test_the_specs_patient_view_request_is_answered(client) -> None:
    body = example("patient-view-request.spec-example.json")
    body["prefetch"] = {"flags": None}  # "null when there is no data"
    path = "/cds-services/critical-results"
    response = await call(client, path, body)
    assert response.status_code == 200, response.text
    assert response.json() == {"cards": []}


# --- order-sign: warfarin + ibuprofen -------------------------------------------------------
async def test_warfarin_and_ibuprofen_yield_a_critical_card_that_removes_the_draft(client
                                                                                   ) -> None:
    on_warfarin = medication_request("1288992", WARFARIN, request_id="rx-warfarin")
    prefetch = {"medications": {"resourceType": "Bundle", "type": "searchset",
                                "entry": [{"resource": on_warfarin}]},
                "statements": {"resourceType": "Bundle", "type": "searchset", "entry": []}}
    path = "/cds-services/drug-interactions"
    response = await call(client, path, sign_request("1288992", prefetch))
    assert response.status_code == 200, response.text
    [card] = response.json()["cards"]
    assert card["indicator"] == "critical"
    assert len(card["summary"]) < 140 and "Warfarin" in card["summary"]
    assert card["source"]["label"] == "Drug-drug interaction check"
    assert card["selectionBehavior"] == "at-most-one"
    [suggestion] = card["suggestions"]
    assert suggestion["actions"] == [{"type": "delete", "description": suggestion["label"],
                                      "resourceId": "MedicationRequest/draft-ibuprofen"}]
    assert {r["code"] for r in card["overrideReasons"]} >= {"benefit-outweighs-risk"}
    assert all(r["system"] and r["display"] for r in card["overrideReasons"])
    assert card["links"][0]["type"] == "absolute"
    uuid.UUID(card["uuid"])


async def test_order_select_checks_the_selection_against_the_other_draft_orders(client
                                                                                ) -> None:
    drafts = draft_bundle(medication_request("1288992", WARFARIN, status="draft",
                                             request_id="draft-warfarin"),
                          medication_request("1288992", IBUPROFEN, status="draft",
                                             request_id="draft-ibuprofen"))
    empty = {"resourceType": "Bundle", "type": "searchset", "entry": []}
    context = {"userId": "Practitioner/otieno", "patientId": "1288992",
               "selections": ["MedicationRequest/draft-ibuprofen"], "draftOrders": drafts}
    path = "/cds-services/drug-interactions"
    response = await call(client, path, hook_request(
        "order-select", context, {"medications": empty, "statements": empty}))
    [card] = response.json()["cards"]
    assert card["indicator"] == "critical"
    assert {a["resourceId"] for s in card["suggestions"] for a in s["actions"]} == {
        "MedicationRequest/draft-ibuprofen", "MedicationRequest/draft-warfarin"}


async def test_prefetch_supplied_and_resolved_from_the_store_give_the_same_cards(client
                                                                                 ) -> None:
    doctor, patient_id = await clinic_with_patient(client)
    path = "/cds-services/drug-interactions"
    # resolved: the caller is the clinician (an app with their access token)
    resolved = await call(client, path, sign_request(patient_id), doctor["headers"])
    assert resolved.status_code == 200, resolved.text
    # supplied: the same data, fetched by the client from /fhir beforehand
    found = await client.get(f"/fhir/MedicationRequest?patient={patient_id}&status=active",
                             headers=doctor["headers"])
    prefetch = {"medications": found.json(),
                "statements": {"resourceType": "Bundle", "type": "searchset", "entry": []}}
    supplied = await call(client, path, sign_request(patient_id, prefetch))
    assert supplied.status_code == 200, supplied.text
    assert resolved.json()["cards"]
    assert comparable(resolved.json()["cards"]) == comparable(supplied.json()["cards"])


async def test_prefetch_from_this_servers_fhir_api_uses_the_fhir_authorization(client) -> None:
    doctor, patient_id = await clinic_with_patient(client)
    path = "/cds-hooks/order-sign"
    authorization = {"access_token": doctor["token"], "token_type": "Bearer",
                     "expires_in": 300, "scope": "user/*.read", "subject": "healthplatform"}
    body = sign_request(patient_id, fhirServer=f"{BASE}/fhir",
                        fhirAuthorization=authorization)
    response = await call(client, path, body)
    assert response.status_code == 200, response.text
    assert [c["indicator"] for c in response.json()["cards"]] == ["critical"]
    # the token's own grants decide: a stranger's token sees none of the patient's records
    stranger = await register_and_login(client, first_name="Baraka", last_name="Mutua")
    body["fhirAuthorization"] = {**authorization, "access_token": stranger["token"]}
    blind = await call(client, path, body)
    assert (blind.status_code, blind.json()["cards"]) == (200, [])
    body["fhirAuthorization"] = {**authorization, "access_token": "v4.public.forged"}
    refused = await call(client, path, body)
    assert refused.status_code == 412
    assert refused.json()["resourceType"] == "OperationOutcome"


async def test_missing_prefetch_with_nowhere_to_fetch_it_is_a_412(client) -> None:
    path = "/cds-services/drug-interactions"
    response = await call(client, path, sign_request("1288992"))
    assert response.status_code == 412
    issue = response.json()["issue"][0]
    assert issue["expression"] == ["prefetch"] and "medications" in issue["diagnostics"]


async def test_a_client_reads_its_organizations_records_when_configured(app, client) -> None:
    _, patient_id = await clinic_with_patient(client)
    other_clinic, other_patient = await clinic_with_patient(client)
    # The organization's id exists only now: configure the EHR as the running server would.
    runtime = cds_runtime(app.state.services)
    runtime.verifier.clients[EHR] = CdsClient.from_config(EHR, {
        "jwks": example("client-jwks-public.spec-example.json"),
        "organizations": [other_clinic["org_id"]]})
    path = "/cds-services/drug-interactions"
    own = await call(client, path, sign_request(other_patient))
    assert [c["indicator"] for c in own.json()["cards"]] == ["critical"]
    # another organization's patient: nothing of theirs is visible, so nothing to say
    foreign = await call(client, path, sign_request(patient_id))
    assert foreign.status_code == 200 and foreign.json()["cards"] == []


class StandInFhir:
    """A client's FHIR server: answers MedicationRequest searches for a bearer token."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.app = Starlette(routes=[Route("/fhir/{resource_type}", self.search)])

    async def search(self, request: Request) -> JSONResponse:
        if request.headers.get("authorization") != "Bearer ehr-token-for-cds":
            return JSONResponse({"resourceType": "OperationOutcome"}, status_code=401)
        self.queries.append(f"{request.path_params['resource_type']}?{request.url.query}")
        entries = []
        if request.path_params["resource_type"] == "MedicationRequest":
            entries = [{"resource": medication_request("1288992", WARFARIN, request_id="w1")}]
        return JSONResponse({"resourceType": "Bundle", "type": "searchset",
                             "entry": entries})


@pytest.fixture
def remote_fhir() -> Iterator[tuple[StandInFhir, str]]:
    stand_in = StandInFhir()
    with serve(stand_in.app) as base:
        yield stand_in, f"{base}/fhir"


async def test_prefetch_is_fetched_from_the_clients_fhir_server(client, remote_fhir) -> None:
    stand_in, base = remote_fhir
    authorization = {"access_token": "ehr-token-for-cds", "token_type": "Bearer",
                     "expires_in": 300, "scope": "patient/*.read", "subject": "cds",
                     "patient": "1288992"}
    path = "/cds-services/drug-interactions"
    body = sign_request("1288992", fhirServer=base, fhirAuthorization=authorization)
    response = await call(client, path, body)
    assert response.status_code == 200, response.text
    assert [c["indicator"] for c in response.json()["cards"]] == ["critical"]
    assert sorted(stand_in.queries) == [
        "MedicationRequest?patient=1288992&status=active,on-hold",
        "MedicationStatement?patient=1288992&status=active,intended"]
    body["fhirAuthorization"] = {**authorization, "access_token": "expired"}
    assert (await call(client, path, body)).status_code == 412


async def test_an_app_user_cannot_make_the_server_fetch_another_url(client, user,
                                                                   remote_fhir) -> None:
    stand_in, base = remote_fhir
    authorization = {"access_token": "ehr-token-for-cds", "token_type": "Bearer",
                     "expires_in": 300, "scope": "patient/*.read", "subject": "cds"}
    body = sign_request("1288992", fhirServer=base, fhirAuthorization=authorization)
    response = await call(client, "/cds-services/drug-interactions", body, user["headers"])
    assert response.status_code == 412
    assert "this server's FHIR API" in response.json()["issue"][0]["diagnostics"]
    assert stand_in.queries == []


# --- other services through the hooks ------------------------------------------------------
async def test_order_sign_hook_runs_interactions_and_allergies_together(client) -> None:
    penicillin = {"resourceType": "AllergyIntolerance", "id": "a1", "criticality": "high",
                  "patient": {"reference": "Patient/1288992"},
                  "code": {"coding": [{"system": "http://snomed.info/sct", "code": "91936005",
                                       "display": "Allergy to penicillin"}]}}
    empty = {"resourceType": "Bundle", "type": "searchset", "entry": []}
    prefetch = {"medications": empty, "statements": empty, "allergies": {
        "resourceType": "Bundle", "type": "searchset", "entry": [{"resource": penicillin}]}}
    body = hook_request("order-sign", hook_context("order-sign", 2), prefetch)
    path = "/cds-hooks/order-sign"
    response = await call(client, path, body)
    assert response.status_code == 200, response.text
    [card] = response.json()["cards"]
    assert card["indicator"] == "critical" and "penicillin" in card["summary"].lower()
    assert card["suggestions"][0]["actions"][0]["resourceId"] == \
        "MedicationRequest/smart-MedicationRequest-103"


async def test_news2_on_encounter_start_returns_a_card_and_records_the_score(client) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def vital(code: str, value: float, unit: str) -> JSON:
        return {"resource": {"resourceType": "Observation", "id": f"v-{code}", "status": "final",
                             "code": {"coding": [{"system": LOINC, "code": code}]},
                             "subject": {"reference": "Patient/1288992"},
                             "effectiveDateTime": now,
                             "valueQuantity": {"value": value, "unit": unit}}}
    vitals = [vital("9279-1", 24, "/min"), vital("59408-5", 95, "%"), vital("3151-8", 2, "L/min"),
              vital("8480-6", 105, "mm[Hg]"), vital("8867-4", 115, "/min"),
              vital("8310-5", 38.5, "Cel"),
              {"resource": {"resourceType": "Observation", "id": "acvpu", "status": "final",
                            "code": {"coding": [{"system": LOINC, "code": "67775-7"}]},
                            "subject": {"reference": "Patient/1288992"},
                            "effectiveDateTime": now,
                            "valueCodeableConcept": {"text": "Alert"}}}]
    prefetch = {"vitals": {"resourceType": "Bundle", "type": "searchset", "entry": vitals},
                "conditions": {"resourceType": "Bundle", "type": "searchset", "entry": []}}
    path = "/cds-services/news2"
    response = await call(client, path, hook_request("encounter-start",
                                                     hook_context("encounter-start"), prefetch))
    assert response.status_code == 200, response.text
    body = response.json()
    [card] = body["cards"]
    assert (card["summary"], card["indicator"]) == ("NEWS2 9: high clinical risk", "critical")
    [action] = body["systemActions"]
    assert action["type"] == "create"
    assert action["resource"]["resourceType"] == "RiskAssessment"
    assert action["resource"]["encounter"] == {"reference": "Encounter/456"}
    assert action["resource"]["prediction"][0]["qualitativeRisk"]["coding"][0]["code"] == "high"


# --- refusals ------------------------------------------------------------------------------------
async def test_calls_without_a_trusted_jwt_are_refused(client) -> None:
    path = "/cds-services/drug-interactions"
    body = sign_request("1288992", {"medications": None, "statements": None})
    cases = {
        "no token": {},
        "expired": client_jwt(path, exp=int(time.time()) - 300, iat=int(time.time()) - 600),
        "wrong audience": client_jwt("/cds-services/news2"),
        "not a token at all": {"Authorization": "Bearer not-a-token"},
    }
    for case, headers in cases.items():
        response = await client.post(path, json=body, headers=headers)
        assert response.status_code == 401, case
        assert response.json()["resourceType"] == "OperationOutcome", case
    replayed = client_jwt(path)
    assert (await client.post(path, json=body, headers=replayed)).status_code == 200
    again = await client.post(path, json=body, headers=replayed)
    assert again.status_code == 401 and "replayed" in again.json()["issue"][0]["diagnostics"]


async def test_anonymous_calls_only_when_the_setting_allows_them(tmp_path: Path) -> None:
    from asgi_lifespan import LifespanManager

    from platform_api.app import create_app

    application = create_app(make_settings(tmp_path, cds_allow_anonymous=True))
    async with LifespanManager(application, startup_timeout=30):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as anonymous:
            response = await anonymous.post("/cds-services/drug-interactions", json=sign_request(
                "1288992", {"medications": None, "statements": None}))
            assert response.status_code == 200, response.text


async def test_bad_requests_are_400s_naming_the_field(client) -> None:
    path = "/cds-services/drug-interactions"
    body = sign_request("1288992")
    del body["context"]["draftOrders"]
    response = await call(client, path, body)
    assert response.status_code == 400
    assert response.json()["issue"][0]["expression"] == ["context.draftOrders"]
    wrong_hook = await call(client, path, hook_request("patient-view",
                                                       hook_context("patient-view")))
    assert (wrong_hook.status_code, wrong_hook.json()["issue"][0]["expression"]) == (
        400, ["hook"])
    not_json = await client.post(path, content=b"{", headers=client_jwt(path))
    assert not_json.status_code == 400
    unknown = await call(client, "/cds-services/pgx-on-order-sign", body)
    assert unknown.status_code == 404
    no_hook = await call(client, "/cds-hooks/order-dispatch", body)
    assert no_hook.status_code == 404


# --- feedback ------------------------------------------------------------------------------------
async def test_feedback_is_stored_and_the_acceptance_rate_reported_to_administrators(
        app, client) -> None:
    path = "/cds-services/drug-interactions/feedback"
    accepted = example("feedback-accepted.spec-example.json")
    overridden = example("feedback-overridden-with-reason.spec-example.json")
    overridden["feedback"][0]["overrideReason"]["reason"] = {
        "code": "monitoring-in-place", "system": "urn:healthplatform:cds:override-reason"}
    no_reason = example("feedback-overridden-no-reason.spec-example.json")
    for body in (accepted, overridden, no_reason):
        response = await call(client, path, body)
        assert (response.status_code, response.json()) == (200, {"received": 1})
    # the same card again: its latest outcome counts
    changed = example("feedback-overridden-no-reason.spec-example.json")
    changed["feedback"][0]["card"] = accepted["feedback"][0]["card"]
    assert (await call(client, path, changed)).status_code == 200
    bad = await call(client, path, {"feedback": [{"card": "x", "outcome": "ignored",
                                                  "outcomeTimestamp": "2026-03-02T10:00:00Z"}]})
    assert (bad.status_code, bad.json()["issue"][0]["expression"]) == (
        400, ["feedback[0].outcome"])

    admin = await make_admin(app, client)
    summary = await client.get("/api/cds/feedback/summary", headers=admin["headers"])
    assert summary.status_code == 200, summary.text
    row = next(r for r in summary.json()["data"] if r["service_id"] == "drug-interactions")
    assert (row["cards_with_feedback"], row["accepted"], row["overridden"],
            row["feedback_entries"]) == (3, 0, 3, 4)
    assert row["acceptance_rate"] == 0.0
    assert row["override_reasons"]["monitoring-in-place"]["count"] == 1
    entries = await client.get("/api/cds/feedback?service_id=drug-interactions&limit=2",
                               headers=admin["headers"])
    assert entries.json()["meta"]["total"] == 4 and len(entries.json()["data"]) == 2
    assert entries.json()["data"][0]["client"] == EHR
    user = await register_and_login(client)
    assert (await client.get("/api/cds/feedback/summary", headers=user["headers"])
            ).status_code == 403
    assert (await client.get("/api/cds/feedback/summary")).status_code == 401


# --- /api/cds ------------------------------------------------------------------------------------
async def test_drug_interaction_check_answers_the_specs_shape(client, user) -> None:
    response = await client.post("/api/cds/drug-interactions/check", headers=user["headers"],
                                 json={"medications": [
                                     {"name": "Warfarin 5 mg", "rxcui": "855332"},
                                     {"name": "Brufen 400 mg", "rxcui": "5640"},
                                     {"name": "Paracetamol 1 g"}]})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    [interaction] = data["interactions"]
    assert interaction["severity"] == "high"
    assert interaction["drugs"] == ["Warfarin 5 mg", "Brufen 400 mg"]
    assert interaction["description"] and interaction["recommendation"]
    assert [m["recognised"] for m in data["medications"]] == [True, True, True]
    bad = await client.post("/api/cds/drug-interactions/check", headers=user["headers"],
                            json={"medications": [{"name": "Warfarin", "rxcui": "W-5"}]})
    assert (bad.status_code, bad.json()["error"]["field"]) == (422, "medications.0.rxcui")
    assert (await client.post("/api/cds/drug-interactions/check", json={
        "medications": [{"name": "Warfarin"}]})).status_code == 401


async def test_the_check_includes_a_visible_patients_current_medications(client) -> None:
    doctor, patient_id = await clinic_with_patient(client)
    body = {"medications": [{"name": "Ibuprofen 400 mg", "rxcui": "5640"}],
            "patient_id": patient_id}
    response = await client.post("/api/cds/drug-interactions/check", headers=doctor["headers"],
                                 json=body)
    assert response.json()["data"]["current_medications"] == ["Warfarin Sodium 5 MG Oral Tablet"]
    assert len(response.json()["data"]["interactions"]) == 1
    stranger = await register_and_login(client, first_name="Baraka", last_name="Mutua")
    assert (await client.post("/api/cds/drug-interactions/check", headers=stranger["headers"],
                              json=body)).status_code == 403


async def test_administrators_upsert_versioned_interaction_entries(app, client, user) -> None:
    admin = await make_admin(app, client)
    changes: list[JSON] = []

    async def collect(event: JSON) -> None:
        changes.append(event["payload"])
    app.state.services.bus.subscribe("platform.cds.interaction_changed", collect)
    entry = {"key": "warfarin-metronidazole", "title": "Warfarin + metronidazole",
             "severity": "high", "a": {"ingredients": ["11289"]}, "b": {"ingredients": ["6922"]},
             "description": "Metronidazole inhibits warfarin metabolism: INR rises.",
             "recommendation": "Reduce the warfarin dose and check INR within 3-5 days.",
             "source": {"label": "US FDA prescribing information (Flagyl)",
                        "url": "https://dailymed.nlm.nih.gov/", "licence": "public domain"}}
    first = await client.post("/api/cds/drug-interactions", headers=admin["headers"],
                              json=entry)
    assert first.status_code == 201, first.text
    assert (first.json()["data"]["version"], first.json()["data"]["origin"]) == ("1", "stored")
    plan_id = first.json()["data"]["id"]
    plan = await client.get(f"/fhir/PlanDefinition/{plan_id}", headers=admin["headers"])
    assert plan.json()["identifier"][0]["value"] == "warfarin-metronidazole"
    check = {"medications": [{"name": "Warfarin 5 mg", "rxcui": "855332"},
                             {"name": "Flagyl 400 mg", "rxcui": "6922"}]}
    found = await client.post("/api/cds/drug-interactions/check", headers=user["headers"],
                              json=check)
    assert [i["key"] for i in found.json()["data"]["interactions"]] == ["warfarin-metronidazole"]
    second = await client.post("/api/cds/drug-interactions", headers=admin["headers"],
                               json={**entry, "status": "retired"})
    assert (second.status_code, second.json()["data"]["version"]) == (200, "2")
    history = await client.get(f"/fhir/PlanDefinition/{plan_id}/_history",
                               headers=admin["headers"])
    assert history.json()["total"] == 2
    gone = await client.post("/api/cds/drug-interactions/check", headers=user["headers"],
                             json=check)
    assert gone.json()["data"]["interactions"] == []
    # a seed entry changed by an administrator continues its version
    seed = {**entry, "key": "warfarin-nsaids", "a": {"ingredients": ["11289"]},
            "b": {"classes": ["nsaid"]}, "severity": "critical"}
    changed = await client.post("/api/cds/drug-interactions", headers=admin["headers"],
                                json=seed)
    assert (changed.status_code, changed.json()["data"]["version"]) == (201, "2")
    await app.state.services.bus.drain()
    assert [(c["key"], c["version"], c["status"]) for c in changes] == [
        ("warfarin-metronidazole", "1", "active"), ("warfarin-metronidazole", "2", "retired"),
        ("warfarin-nsaids", "2", "active")]
    assert changes[0]["plan_definition_id"] == plan_id
    table = await client.get("/api/cds/drug-interactions?limit=100", headers=user["headers"])
    listed = {e["key"]: e for e in table.json()["data"]}
    assert table.json()["meta"]["total"] == 21
    assert (listed["warfarin-nsaids"]["version"], listed["warfarin-nsaids"]["origin"]) == (
        "2", "stored")
    assert listed["digoxin-cyclosporine"]["origin"] == "seed"
    assert listed["warfarin-nsaids"]["source"]["label"].startswith("US FDA")
    retired = await client.get("/api/cds/drug-interactions?status=retired",
                               headers=user["headers"])
    assert [e["key"] for e in retired.json()["data"]] == ["warfarin-metronidazole"]
    invalid = await client.post("/api/cds/drug-interactions", headers=admin["headers"],
                                json={**entry, "b": {"classes": ["beta-blockers"]}})
    assert (invalid.status_code, invalid.json()["error"]["field"]) == (422, "b.classes")
    refused = await client.post("/api/cds/drug-interactions", headers=user["headers"],
                                json=entry)
    assert refused.status_code == 403


async def test_early_warning_score_of_posted_vitals_and_of_a_patient(client, user) -> None:
    vitals = {"respiration_rate": 24, "spo2": 95, "on_oxygen": True, "systolic_bp": 105,
              "pulse": 115, "consciousness": "alert", "temperature": 38.5}
    response = await client.post("/api/cds/early-warning-score", headers=user["headers"],
                                 json={"vitals": vitals})
    data = response.json()["data"]
    assert (data["score"], data["risk"], data["subscores"]["pulse"]["score"]) == (9, "high", 2)
    partial = await client.post("/api/cds/early-warning-score", headers=user["headers"],
                                json={"vitals": {"pulse": 135, "respiration_rate": 26}})
    assert partial.json()["data"]["missing"] == ["spo2", "air_or_oxygen", "systolic_bp",
                                                 "consciousness", "temperature"]
    assert partial.json()["data"]["score"] is None
    neither = await client.post("/api/cds/early-warning-score", headers=user["headers"],
                                json={})
    assert neither.status_code == 422

    doctor, patient_id = await clinic_with_patient(client)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for code, value, unit in [("9279-1", 21, "/min"), ("8867-4", 91, "/min")]:
        await fhir_create(client, doctor["headers"], {
            "resourceType": "Observation", "status": "final",
            "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/"
                                      "observation-category", "code": "vital-signs"}]}],
            "code": {"coding": [{"system": LOINC, "code": code}]},
            "subject": {"reference": f"Patient/{patient_id}"}, "effectiveDateTime": now,
            "valueQuantity": {"value": value, "unit": unit}})
    of_patient = await client.post("/api/cds/early-warning-score", headers=doctor["headers"],
                                   json={"patient_id": patient_id})
    data = of_patient.json()["data"]
    assert (data["partial_total"], data["complete"], len(data["observations"])) == (3, False, 2)
    assert (await client.post("/api/cds/early-warning-score", headers=user["headers"],
                              json={"patient_id": patient_id})).status_code == 403


async def test_panic_values_check(client, user) -> None:
    response = await client.post("/api/cds/panic-values/check", headers=user["headers"], json={
        "results": [{"code": "2823-3", "value": 6.9, "unit": "mmol/L"},
                    {"code": "2345-7", "value": 182, "unit": "mg/dL"},
                    {"code": "2160-0", "value": 0.9, "unit": "mg/dL"}]})
    data = response.json()["data"]
    assert data["critical"] is True
    assert [(r["code"], r["known"], r["critical"]) for r in data["results"]] == [
        ("2823-3", True, True), ("2345-7", True, False), ("2160-0", False, False)]
    assert data["results"][0]["direction"] == "high" and data["results"][0]["limit"] == 6.2
    bad = await client.post("/api/cds/panic-values/check", headers=user["headers"],
                            json={"results": [{"code": "potassium", "value": 6.9}]})
    assert (bad.status_code, bad.json()["error"]["field"]) == (422, "results.0.code")


async def test_adverse_events_are_recorded_and_listed_as_the_policy_allows(app, client) -> None:
    doctor, patient_id = await clinic_with_patient(client)
    event = {"patient_id": patient_id, "event": "Generalised maculopapular rash",
             "event_code": "271807003", "seriousness": "hospitalization", "severity": "severe",
             "outcome": "recovering", "date": "2026-03-01T18:30:00Z",
             "suspect_entities": [{"name": "Co-trimoxazole 960 mg", "rxcui": "10180",
                                   "causality": "probable"}]}
    created = await client.post("/api/cds/adverse-events", headers=doctor["headers"],
                                json=event)
    assert created.status_code == 201, created.text
    data = created.json()["data"]
    assert (data["seriousness"], data["suspect_entities"][0]["causality"]) == (
        "hospitalization", "probable")
    stored = await client.get(f"/fhir/AdverseEvent/{data['id']}", headers=doctor["headers"])
    resource = stored.json()
    assert resource["seriousness"]["coding"][0]["code"] == "SeriousResultsInHospitalization"
    assert resource["contained"][0]["code"]["coding"][0]["code"] == "10180"
    assert resource["meta"]["security"][0]["code"] == doctor["org_id"]
    listed = await client.get(f"/api/cds/adverse-events?patient_id={patient_id}",
                              headers=doctor["headers"])
    assert listed.json()["meta"]["total"] == 1
    nurse = await register_and_login(client, first_name="Wambui", last_name="Njoroge")
    await add_member(app, doctor["org_id"], nurse, ORG_NURSE)
    assert (await client.get("/api/cds/adverse-events", headers=nurse["headers"])
            ).json()["meta"]["total"] == 1
    receptionist = await register_and_login(client, first_name="Zawadi", last_name="Kiprop")
    await add_member(app, doctor["org_id"], receptionist, ORG_RECEPTIONIST)
    assert (await client.post("/api/cds/adverse-events", headers=receptionist["headers"],
                              json=event)).status_code == 403
    stranger = await register_and_login(client, first_name="Baraka", last_name="Mutua")
    assert (await client.get("/api/cds/adverse-events", headers=stranger["headers"])
            ).json()["meta"]["total"] == 0
    assert (await client.post("/api/cds/adverse-events", headers=stranger["headers"],
                              json=event)).status_code == 403
    missing = await client.post("/api/cds/adverse-events", headers=doctor["headers"],
                                json={**event, "seriousness": "bad"})
    assert (missing.status_code, missing.json()["error"]["field"]) == (422, "seriousness")


# --- panic values from an ingested HL7 ORU ----------------------------------------------------
async def test_a_critical_result_from_an_hl7_oru_raises_a_flag_and_an_event(app, client) -> None:
    doctor, patient_id = await clinic_with_patient(client)
    mrn_patient = await client.post(f"/api/organizations/{doctor['org_id']}/patients",
                                    headers=doctor["headers"], json={
                                        "first_name": "Grace", "last_name": "Achieng",
                                        "date_of_birth": "1980-04-12", "gender": "female",
                                        "mrn": "KSM-000417"})
    grace = mrn_patient.json()["data"]["id"]
    events: list[JSON] = []

    async def collect(event: JSON) -> None:
        events.append(event)
    app.state.services.bus.subscribe("platform.cds.panic_value", collect)
    authority = f"&urn:healthplatform:organization:{doctor['org_id']}:mrn&URI"
    message = oru("PANIC-1", patient="KSM-000417", authority=authority)  # potassium 6.9 HH
    hl7 = {**doctor["headers"], "Content-Type": "x-application/hl7-v2+er7"}
    assert (await client.post("/api/lab/hl7-ingest", content=message, headers=hl7)
            ).json()["data"]["ack_code"] == "AA"
    await app.state.services.bus.drain()
    flags = await client.get(f"/fhir/Flag?patient={grace}", headers=doctor["headers"])
    [flag] = [e["resource"] for e in flags.json().get("entry", [])]
    assert flag["status"] == "active"
    assert flag["code"]["text"] == "Critical potassium: 6.9 mmol/L (critical above 6.2 mmol/L)"
    assert flag["meta"]["security"][0]["code"] == doctor["org_id"]
    [event] = events
    assert (event["payload"]["patient_id"], event["payload"]["code"],
            event["payload"]["direction"]) == (grace, "2823-3", "high")
    assert event["payload"]["flag_id"] == flag["id"]
    # a resent message (and a redelivered event) raises nothing more
    await client.post("/api/lab/hl7-ingest", content=message, headers=hl7)
    await app.state.services.bus.drain()
    again = await client.get(f"/fhir/Flag?patient={grace}", headers=doctor["headers"])
    assert again.json()["total"] == 1 and len(events) == 1

    view = await call(client, "/cds-services/critical-results", hook_request(
        "patient-view", {"userId": "Practitioner/otieno", "patientId": grace},
        {"flags": again.json()}))
    [card] = view.json()["cards"]
    assert card["indicator"] == "critical" and "potassium" in card["summary"]

    risk = await client.get(f"/api/cds/patient-risk?patient_id={grace}",
                            headers=doctor["headers"])
    data = risk.json()["data"]
    assert data["level"] == "high" and data["critical_flags"][0]["id"] == flag["id"]
    assert patient_id != grace


async def test_a_critical_observation_written_through_fhir_is_flagged_too(app, client) -> None:
    doctor, patient_id = await clinic_with_patient(client)
    observation = await fhir_create(client, doctor["headers"], {
        "resourceType": "Observation", "status": "final",
        "code": {"coding": [{"system": LOINC, "code": "718-7"}]},
        "subject": {"reference": f"Patient/{patient_id}"},
        "valueQuantity": {"value": 4.8, "unit": "g/dL", "code": "g/dL",
                          "system": "http://unitsofmeasure.org"}})
    await app.state.services.bus.drain()
    flags = await client.get(f"/fhir/Flag?patient={patient_id}", headers=doctor["headers"])
    assert [e["resource"]["status"] for e in flags.json()["entry"]] == ["active"]
    corrected = {**observation, "status": "corrected",
                 "valueQuantity": {**observation["valueQuantity"], "value": 8.4}}
    response = await client.put(f"/fhir/Observation/{observation['id']}", json=corrected,
                                headers={**doctor["headers"],
                                         "Content-Type": "application/fhir+json"})
    assert response.status_code == 200, response.text
    await app.state.services.bus.drain()
    still = await client.get(f"/fhir/Flag?patient={patient_id}", headers=doctor["headers"])
    assert [e["resource"]["status"] for e in still.json()["entry"]] == ["inactive"]


async def test_patient_risk_gathers_everything_for_whoever_may_see_the_patient(app, client
                                                                               ) -> None:
    doctor, patient_id = await clinic_with_patient(client)
    await fhir_create(client, doctor["headers"], {
        "resourceType": "MedicationStatement", "status": "active",
        "subject": {"reference": f"Patient/{patient_id}"},
        "medicationCodeableConcept": {"text": "Brufen 400 mg three times daily"}})
    response = await client.get(f"/api/cds/patient-risk?patient_id={patient_id}",
                                headers=doctor["headers"])
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert data["level"] == "high"
    assert [i["key"] for i in data["interaction_alerts"]] == ["warfarin-nsaids"]
    assert data["early_warning"]["missing"] and data["early_warning"]["score"] is None
    assert data["critical_flags"] == [] and data["adverse_events"] == []
    doctor2 = await register_and_login(client, first_name="Kamau", last_name="Kariuki")
    await add_member(app, doctor["org_id"], doctor2, ORG_DOCTOR)
    assert (await client.get(f"/api/cds/patient-risk?patient_id={patient_id}",
                             headers=doctor2["headers"])).status_code == 200
    stranger = await register_and_login(client, first_name="Baraka", last_name="Mutua")
    assert (await client.get(f"/api/cds/patient-risk?patient_id={patient_id}",
                             headers=stranger["headers"])).status_code == 403
    assert (await client.get("/api/cds/patient-risk?patient_id=unknown",
                             headers=doctor["headers"])).status_code == 404
    assert (await client.get(f"/api/cds/patient-risk?patient_id={patient_id}")
            ).status_code == 401


# --- each role's access -----------------------------------------------------------------------
async def test_each_role_reaches_the_cds_routes_as_the_policy_says(app, client) -> None:
    doctor, patient_id = await clinic_with_patient(client)
    nurse = await register_and_login(client, first_name="Wambui", last_name="Njoroge")
    await add_member(app, doctor["org_id"], nurse, ORG_NURSE)
    receptionist = await register_and_login(client, first_name="Zawadi", last_name="Kiprop")
    await add_member(app, doctor["org_id"], receptionist, ORG_RECEPTIONIST)
    stranger = await register_and_login(client, first_name="Baraka", last_name="Mutua")
    admin = await make_admin(app, client)
    roles = {"anonymous": {}, "doctor": doctor["headers"], "nurse": nurse["headers"],
             "receptionist": receptionist["headers"], "stranger": stranger["headers"],
             "admin": admin["headers"]}
    event = {"patient_id": patient_id, "event": "Angioedema", "seriousness": "serious"}
    entry = {"key": "test-entry", "title": "Test", "severity": "low",
             "a": {"ingredients": ["161"]}, "b": {"ingredients": ["723"]},
             "description": "d", "recommendation": "r", "source": {"label": "local"}}
    routes = [  # (method, path, body, {role: status}); roles not named: as "stranger"
        ("POST", "/api/cds/drug-interactions/check",
         {"medications": [{"name": "Warfarin", "rxcui": "11289"}]},
         {"anonymous": 401, "stranger": 200}),
        ("POST", "/api/cds/drug-interactions", entry,
         {"anonymous": 401, "stranger": 403, "doctor": 403, "admin": 201}),
        # a receptionist may see the patient, not the clinical records: an answer built
        # from nothing (the searches carry the grants), never someone else's data
        ("POST", "/api/cds/early-warning-score", {"patient_id": patient_id},
         {"anonymous": 401, "stranger": 403, "receptionist": 200, "doctor": 200,
          "nurse": 200, "admin": 200}),
        ("POST", "/api/cds/panic-values/check",
         {"results": [{"code": "2823-3", "value": 5}]}, {"anonymous": 401, "stranger": 200}),
        ("POST", "/api/cds/adverse-events", event,
         {"anonymous": 401, "stranger": 403, "receptionist": 403, "doctor": 201,
          "nurse": 201, "admin": 201}),
        ("GET", f"/api/cds/adverse-events?patient_id={patient_id}", None,
         {"anonymous": 401, "stranger": 200, "receptionist": 200, "doctor": 200,
          "nurse": 200, "admin": 200}),
        ("GET", f"/api/cds/patient-risk?patient_id={patient_id}", None,
         {"anonymous": 401, "stranger": 403, "receptionist": 200, "doctor": 200,
          "nurse": 200, "admin": 200}),
        ("GET", "/api/cds/feedback/summary", None,
         {"anonymous": 401, "stranger": 403, "doctor": 403, "admin": 200}),
        ("GET", "/api/cds/feedback", None,
         {"anonymous": 401, "stranger": 403, "doctor": 403, "admin": 200}),
    ]
    wrong = []
    for method, path, body, expected in routes:
        for role, headers in roles.items():
            want = expected.get(role, expected["stranger"])
            response = await client.request(method, path, json=body, headers=headers)
            if response.status_code != want:
                wrong.append(f"{role} {method} {path}: {response.status_code}, expected {want}")
    assert not wrong, "\n".join(wrong)
    # what each may see of the adverse events: the organization's clinicians all of them
    seen = {role: (await client.get("/api/cds/adverse-events", headers=headers)).json()
            for role, headers in roles.items() if role in ("doctor", "receptionist", "stranger")}
    assert [seen[r]["meta"]["total"] for r in ("doctor", "receptionist", "stranger")] == [
        3, 0, 0]
    risk = await client.get(f"/api/cds/patient-risk?patient_id={patient_id}",
                            headers=receptionist["headers"])
    assert risk.json()["data"]["current_medications"] == []
    assert risk.json()["data"]["adverse_events"] == []
