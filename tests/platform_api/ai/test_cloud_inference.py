"""POST /api/ai/cloud-inference against a local stand-in endpoint (KServe v2 and
OpenAI-compatible): forwarding, time-out, size limits, and no patient identifiers sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.platform_api.ai.conftest import data, refusal
from tests.platform_api.ai.inference_standin import InferenceStandIn
from tests.stand_ins import serving

URL = "/api/ai/cloud-inference"
KEY = "sk-cloud-kibera"
VITALS = {"model": "sepsis-risk", "inputs": [
    {"name": "vitals", "shape": [1, 3], "datatype": "FP32", "data": [38.9, 112, 24]}]}


@pytest.fixture
async def stand_in() -> AsyncIterator[tuple[InferenceStandIn, str]]:
    remote = InferenceStandIn(KEY)
    async with serving(remote.app()) as url:
        yield remote, url


def configure(app: Any, **settings: Any) -> None:
    for name, value in settings.items():
        setattr(app.state.services.settings, name, value)


async def test_kserve_v2_request_is_forwarded(clinic, app, stand_in):
    remote, base = stand_in
    configure(app, ai_cloud_url=base, ai_cloud_api_key=KEY)
    answer = data(await clinic.post("doctor", URL, VITALS))
    assert answer["protocol"] == "kserve-v2" and answer["model_version"] == "7"
    assert answer["outputs"][0]["data"] == pytest.approx([174.9, 112])
    assert answer["support"]["based_on"][0]["kind"] == "model"
    assert remote.received == [{"inputs": VITALS["inputs"]}]
    event = data(await clinic.get("platform_admin",
                                  f"/api/clinical/audit/{answer['support']['audit_event_id']}"))
    assert event["subtype"] == "ai-cloud-inference"


async def test_patient_identifiers_do_not_leave(clinic, app, stand_in):
    remote, base = stand_in
    configure(app, ai_cloud_url=f"{base}/v1", ai_cloud_api_key=KEY, ai_cloud_protocol="openai",
              ai_cloud_model="clinical-llm")
    text = ("Amina Odhiambo (MRN KCC-0001, born 1988-04-12, amina@example.org, "
            "+254 722 334 455) has fever and a cough for three days.")
    body = {"patient_id": clinic.patient_id, "messages": [{"role": "user", "content": text}]}
    answer = data(await clinic.post("doctor", URL, body))
    sent = remote.received[-1]["messages"][0]["content"]
    for identifier in ("Amina", "Odhiambo", "KCC-0001", "1988-04-12", "example.org",
                       "722 334"):
        assert identifier not in sent
    assert "has fever and a cough for three days" in sent
    assert answer["redacted"] == 6 and answer["patient_identifiers_sent"] is False
    # KServe v2 text inputs are scrubbed the same way
    configure(app, ai_cloud_url=base, ai_cloud_protocol="kserve-v2")
    notes = {"model": "sepsis-risk", "patient_id": clinic.patient_id, "inputs": [
        {"name": "note", "shape": [1], "datatype": "BYTES",
         "data": ["Odhiambo, Amina: fever 38.9"]}]}
    scrubbed = data(await clinic.post("doctor", URL, notes))
    assert remote.received[-1]["inputs"][0]["data"] == ["[redacted], [redacted]: fever 38.9"]
    assert scrubbed["redacted"] == 2 and scrubbed["outputs"][0]["data"] == [34]
    configure(app, ai_cloud_url=f"{base}/v1", ai_cloud_protocol="openai")
    assert clinic.patient_id not in str(remote.received)
    assert answer["message"].startswith("I read") and answer["model"] == "clinical-llm"
    # allowed by setting: sent as written
    configure(app, ai_cloud_send_patient_identifiers=True)
    answer = data(await clinic.post("doctor", URL, body))
    assert remote.received[-1]["messages"][0]["content"] == text
    assert answer["redacted"] == 0 and answer["patient_identifiers_sent"] is True


async def test_limits_and_failures(clinic, app, stand_in):
    remote, base = stand_in
    assert refusal(await clinic.post("doctor", URL, VITALS)) == (
        503, "CLOUD_INFERENCE_NOT_CONFIGURED")
    configure(app, ai_cloud_url=base, ai_cloud_api_key=KEY, ai_cloud_timeout_seconds=0.3)
    remote.delay = 1.0
    assert refusal(await clinic.post("doctor", URL, VITALS)) == (504, "CLOUD_TIMEOUT")
    remote.delay, remote.padding = 0.0, 5000
    configure(app, ai_cloud_max_response_bytes=2000)
    assert refusal(await clinic.post("doctor", URL, VITALS)) == (
        502, "CLOUD_RESPONSE_TOO_LARGE")
    configure(app, ai_cloud_max_request_bytes=50)
    assert refusal(await clinic.post("doctor", URL, VITALS)) == (
        413, "CLOUD_REQUEST_TOO_LARGE")
    configure(app, ai_cloud_max_request_bytes=10_000, ai_cloud_max_response_bytes=100_000)
    failed = await clinic.post("doctor", URL, {**VITALS, "model": "unknown-model"})
    assert refusal(failed) == (502, "CLOUD_INFERENCE_FAILED")
    assert "404" in failed.json()["error"]["message"]
    configure(app, ai_cloud_api_key="sk-wrong")
    assert refusal(await clinic.post("doctor", URL, VITALS)) == (502, "CLOUD_INFERENCE_FAILED")
    # openai endpoint, kserve body
    configure(app, ai_cloud_protocol="openai", ai_cloud_api_key=KEY)
    assert refusal(await clinic.post("doctor", URL, VITALS)) == (422, "VALIDATION_ERROR")
    assert refusal(await clinic.post("receptionist", URL, VITALS)) == (
        403, "CLINICAL_ROLE_REQUIRED")
    assert refusal(await clinic.post("doctor", URL, {"model": "m"})) == (
        422, "VALIDATION_ERROR")
