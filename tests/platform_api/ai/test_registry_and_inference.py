"""The model registry (POST/GET /api/ai/models, GET /api/ai/model-info) and the models
run by /api/ai/diagnosis and /api/ai/cancer-detection, with ONNX models built here."""

from __future__ import annotations

import base64
import hashlib
import io

import pytest
from PIL import Image

from tests.platform_api.ai.conftest import data, refusal
from tests.platform_api.ai.onnx_models import (
    diagnosis_model,
    expected_probabilities,
    image_model,
)

FEATURES = "temperature, wbc, platelets"


async def upload(clinic, content: bytes, who: str = "platform_admin", **fields):
    form = {"task": "diagnosis", "version": "1.0.0", "name": "Febrile illness classifier",
            "licence": "Apache-2.0", "labels": "malaria,typhoid", "features": FEATURES,
            "output_activation": "softmax", **fields}
    return await clinic.client.post("/api/ai/models", headers=clinic.h(who), data=form,
                                    files={"file": ("model.onnx", content,
                                                    "application/octet-stream")})


def png(colour: tuple[int, int, int], size: int = 40) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


async def test_registered_model_is_listed_and_described(clinic):
    content = diagnosis_model()
    model = data(await upload(clinic, content, description="Malaria vs typhoid"), 201)
    assert model["status"] == "active" and model["task"] == "diagnosis"
    assert model["sha256"] == hashlib.sha256(content).hexdigest()
    assert model["size"] == len(content) and model["licence"] == "Apache-2.0"
    assert model["labels"] == ["malaria", "typhoid"]
    assert model["features"] == ["temperature", "wbc", "platelets"]
    assert model["input"] == ["features: float[1, 3]"]
    assert model["output"] == ["logits: float[1, 2]"]
    # a FHIR Device (any signed-in user may read the registry)
    device = (await clinic.client.get(f"/fhir/Device/{model['id']}",
                                      headers=clinic.h("platform_admin"))).json()
    assert device["modelNumber"] == "diagnosis" and device["version"][0]["value"] == "1.0.0"
    listed = (await clinic.get("nurse", "/api/ai/models", task="diagnosis")).json()
    assert listed["meta"]["total"] == 1 and listed["data"][0]["id"] == model["id"]


async def test_one_active_version_per_task(clinic):
    first = data(await upload(clinic, diagnosis_model()), 201)
    second = data(await upload(clinic, diagnosis_model(), version="1.1.0"), 201)
    statuses = {m["id"]: m["status"] for m in
                data(await clinic.get("doctor", "/api/ai/models", task="diagnosis"))}
    assert statuses == {first["id"]: "inactive", second["id"]: "active"}
    # a device learns the current version without credentials
    info = data(await clinic.client.get("/api/ai/model-info"))
    assert info == [{"task": "diagnosis", "model_id": second["id"],
                     "name": "Febrile illness classifier", "version": "1.1.0",
                     "sha256": second["sha256"], "size": second["size"],
                     "labels": ["malaria", "typhoid"], "updated_at": info[0]["updated_at"]}]
    # an upload that does not activate leaves the current one in place
    third = data(await upload(clinic, diagnosis_model(), version="2.0.0-rc1",
                              activate="false"), 201)
    assert third["status"] == "inactive"
    assert data(await clinic.client.get("/api/ai/model-info?task=diagnosis"))[0][
        "version"] == "1.1.0"


async def test_upload_refusals(clinic):
    assert refusal(await upload(clinic, diagnosis_model(), who="admin")) == (
        403, "PLATFORM_ADMIN_REQUIRED")
    assert refusal(await upload(clinic, b"not a model at all")) == (422, "INVALID_MODEL")
    assert refusal(await upload(clinic, diagnosis_model(), labels="a,b,c")) == (
        422, "LABELS_MISMATCH")
    assert refusal(await upload(clinic, diagnosis_model(), features="age")) == (
        422, "FEATURES_MISMATCH")
    bad = await upload(clinic, diagnosis_model(), task="Bad Task")
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "task"
    data(await upload(clinic, diagnosis_model()), 201)
    assert refusal(await upload(clinic, diagnosis_model())) == (409, "MODEL_VERSION_EXISTS")
    assert refusal(await clinic.get("nurse", "/api/ai/models", status="retired")) == (
        422, "VALIDATION_ERROR")
    assert (await clinic.client.get("/api/ai/model-info?task=Not%20a%20task")).status_code \
        == 422


async def test_diagnosis_runs_the_active_model(clinic):
    body = {"patient_id": clinic.patient_id,
            "features": {"temperature": 39.5, "wbc": 4.0, "platelets": 90}}
    # before any upload the shipped knowledge base answers, and it has no "wbc" finding
    before = await clinic.post("doctor", "/api/ai/diagnosis", body)
    assert refusal(before) == (422, "VALIDATION_ERROR")
    assert "unknown platelets, wbc" in before.json()["error"]["message"]
    model = data(await upload(clinic, diagnosis_model()), 201)
    answer = data(await clinic.post("doctor", "/api/ai/diagnosis", body))
    expected = expected_probabilities([39.5, 4.0, 90])
    scores = {p["label"]: p["score"] for p in answer["predictions"]}
    assert scores["malaria"] == pytest.approx(float(expected[0]), abs=1e-5)
    assert scores["typhoid"] == pytest.approx(float(expected[1]), abs=1e-5)
    assert answer["top_label"] == answer["predictions"][0]["label"]
    basis = answer["support"]["based_on"][0]
    assert basis == {"kind": "model", "name": "Febrile illness classifier",
                     "version": "1.0.0", "source": basis["source"]}
    assert model["id"] in basis["source"]
    assert [i["name"] for i in answer["support"]["inputs"]] == [
        "temperature", "wbc", "platelets"]
    event = data(await clinic.get("admin",
                                  f"/api/clinical/audit/{answer['support']['audit_event_id']}"))
    assert event["subtype"] == "ai-diagnosis" and event["patient_ids"] == [clinic.patient_id]
    # features must be the model's, all of them
    missing = await clinic.post("doctor", "/api/ai/diagnosis",
                                {"features": {"temperature": 39.5}})
    assert refusal(missing) == (422, "VALIDATION_ERROR")
    assert "missing wbc, platelets" in missing.json()["error"]["message"]
    assert refusal(await clinic.post("receptionist", "/api/ai/diagnosis", body)) == (
        403, "CLINICAL_ROLE_REQUIRED")
    assert (await clinic.post("other_admin", "/api/ai/diagnosis", body)).status_code == 403


async def test_cancer_detection_runs_on_an_image(clinic):
    image_body = {"image": png((220, 40, 40)), "content_type": "image/png"}
    assert refusal(await clinic.post("doctor", "/api/ai/cancer-detection", image_body)) == (
        409, "NO_IMAGE_MODEL")
    data(await upload(clinic, image_model(), task="cancer-detection", features="",
                      labels="benign,malignant", name="Lesion colour screen"), 201)
    red = data(await clinic.post("doctor", "/api/ai/cancer-detection",
                                 {**image_body, "patient_id": clinic.patient_id}))
    assert red["top_label"] == "malignant" and red["predictions"][0]["score"] > 0.9
    assert "40x40 image" in red["support"]["inputs"][0]["value"]
    blue = data(await clinic.post("nurse", "/api/ai/cancer-detection",
                                  {"image": png((30, 30, 200))}))
    assert blue["top_label"] == "benign"
    assert refusal(await clinic.post("doctor", "/api/ai/cancer-detection",
                                     {"image": base64.b64encode(b"GIF89a....").decode()})) == (
        422, "INVALID_IMAGE")
    assert refusal(await clinic.post("doctor", "/api/ai/cancer-detection",
                                     {"image": "%%%not base64%%%"})) == (422, "INVALID_IMAGE")


async def test_a_model_file_that_no_longer_matches_its_checksum_is_not_run(clinic, app):
    model = data(await upload(clinic, diagnosis_model()), 201)
    services = app.state.services
    path = services.settings.data_dir / "blobs" / "ai-models" / model["id"] / "model.onnx"
    path.write_bytes(diagnosis_model(outputs=1))  # replaced behind the registry's back
    body = {"features": {"temperature": 39.5, "wbc": 4.0, "platelets": 90}}
    assert refusal(await clinic.post("doctor", "/api/ai/diagnosis", body)) == (
        409, "MODEL_FILE_CORRUPT")
    path.unlink()
    assert refusal(await clinic.post("doctor", "/api/ai/diagnosis", body)) == (
        409, "MODEL_FILE_MISSING")


async def test_a_model_larger_than_the_limit_is_refused(clinic, app):
    app.state.services.settings.ai_model_max_bytes = 100
    assert refusal(await upload(clinic, diagnosis_model())) == (413, "MODEL_TOO_LARGE")
    assert data(await clinic.get("doctor", "/api/ai/models")) == []


@pytest.mark.parametrize(("who", "allowed"), [
    ("admin", True), ("doctor", True), ("nurse", True), ("lab", True),
    ("other_admin", True), ("platform_admin", True),
    ("receptionist", False), ("billing", False), ("stranger", False)])
async def test_decision_support_needs_a_clinical_role_in_any_organization(clinic, who, allowed):
    """``ai.decision-support`` (``any_role``): a doctor, nurse, lab or administrator of any
    organization (another clinic's administrator too: the patient's own visibility is a
    separate check), or a platform administrator; the allowed go on to find no image
    model."""
    answer = await clinic.post(who, "/api/ai/cancer-detection",
                               {"image": png((220, 40, 40)), "content_type": "image/png"})
    assert refusal(answer) == ((409, "NO_IMAGE_MODEL") if allowed else
                               (403, "CLINICAL_ROLE_REQUIRED"))
