"""Out of the box (no model uploaded) diagnosis and cancer detection answer from what the
platform ships: the WHO IMCI/IMAI knowledge base and the cytology model built by
scripts/build_cancer_model.py; an uploaded active model still takes precedence."""

from __future__ import annotations

import hashlib
from importlib import resources

import numpy as np
import orjson
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import roc_auc_score

from tests.platform_api.ai.conftest import data, refusal
from tests.platform_api.ai.onnx_models import diagnosis_model, image_model
from tests.platform_api.ai.test_registry_and_inference import png, upload

DATA = resources.files("platform_api.ai.data")
CARD = orjson.loads(DATA.joinpath("cancer_cytology.card.json").read_bytes())
KNOWLEDGE = orjson.loads(DATA.joinpath("clinical_knowledge.json").read_bytes())


def cytology(row: int) -> dict[str, float]:
    sample = load_breast_cancer()
    return {name.replace(" ", "_"): float(value)
            for name, value in zip(sample.feature_names, sample.data[row], strict=True)}


def test_the_shipped_model_is_small_and_is_the_one_its_card_describes():
    content = DATA.joinpath("cancer_cytology.onnx").read_bytes()
    assert len(content) < 10_000 and len(content) == CARD["size"]
    assert hashlib.sha256(content).hexdigest() == CARD["sha256"]
    metrics = CARD["evaluation_held_out"]
    assert metrics["n"] == len(CARD["data"]["split"]["held_out_rows"]) == 171
    assert {"auc", "sensitivity", "specificity", "brier_score", "reliability"} <= set(metrics)


async def test_cancer_detection_answers_held_out_cases_without_an_upload(clinic):
    """Every held-out row of the Wisconsin data (never seen by the fit) posted through the
    API: the answers reproduce the model card's figures and separate the classes."""
    truth = load_breast_cancer().target == 0  # malignant
    rows = CARD["data"]["split"]["held_out_rows"]
    scores, flagged = [], []
    for row in rows:
        answer = data(await clinic.post("doctor", "/api/ai/cancer-detection",
                                         {"features": cytology(row)}))
        score = next(p["score"] for p in answer["predictions"] if p["label"] == "malignant")
        scores.append(score)
        flagged.append(answer["classification"] == "malignant")
        assert answer["classification"] == ("malignant" if score >= answer["threshold"]
                                            else "benign")
    y, flags = truth[rows], np.asarray(flagged)
    sensitivity = (flags & y).sum() / y.sum()
    specificity = (~flags & ~y).sum() / (~y).sum()
    metrics = CARD["evaluation_held_out"]
    assert sensitivity == pytest.approx(metrics["sensitivity"], abs=1e-4) and sensitivity >= 0.9
    assert specificity == pytest.approx(metrics["specificity"], abs=1e-4) and specificity >= 0.9
    assert roc_auc_score(y, scores) == pytest.approx(metrics["auc"], abs=1e-3)
    assert roc_auc_score(y, scores) > 0.97


async def test_a_cancer_detection_answer_says_what_it_is_based_on(clinic):
    malignant_row = next(r for r in CARD["data"]["split"]["held_out_rows"]
                         if load_breast_cancer().target[r] == 0)
    answer = data(await clinic.post("doctor", "/api/ai/cancer-detection", {
        "features": cytology(malignant_row), "patient_id": clinic.patient_id}))
    assert answer["model"]["name"] == CARD["name"] and answer["threshold"] == CARD["threshold"]
    basis = answer["support"]["based_on"][0]
    assert basis["kind"] == "model" and CARD["sha256"] in basis["source"]
    assert "held-out AUC" in basis["source"]
    assert len(answer["support"]["inputs"]) == 30
    event = data(await clinic.get("admin",
                                  f"/api/clinical/audit/{answer['support']['audit_event_id']}"))
    assert event["subtype"] == "ai-cancer-detection"
    assert event["patient_ids"] == [clinic.patient_id]
    missing = await clinic.post("doctor", "/api/ai/cancer-detection",
                                {"features": {"mean_radius": 17.99}})
    assert refusal(missing) == (422, "VALIDATION_ERROR")
    assert "missing mean_texture" in missing.json()["error"]["message"]
    benign_row = next(r for r in CARD["data"]["split"]["held_out_rows"]
                      if load_breast_cancer().target[r] == 1)
    top_one = data(await clinic.post("doctor", "/api/ai/cancer-detection",
                                     {"features": cytology(benign_row), "top": 1}))
    assert [p["label"] for p in top_one["predictions"]] == ["benign"]
    assert top_one["classification"] == "benign"
    both = await clinic.post("doctor", "/api/ai/cancer-detection",
                             {"features": cytology(0), "image": png((1, 2, 3))})
    assert both.status_code == 422


async def test_an_image_without_an_image_model_is_told_what_the_default_takes(clinic):
    answer = await clinic.post("doctor", "/api/ai/cancer-detection", {"image": png((9, 9, 9))})
    assert refusal(answer) == (409, "NO_IMAGE_MODEL")
    message = answer.json()["error"]["message"]
    assert "worst_fractal_dimension" in message and "POST /api/ai/models" in message


async def test_an_uploaded_cancer_model_takes_precedence(clinic):
    # an image model answers images; features still go to the shipped model
    data(await upload(clinic, image_model(), task="cancer-detection", features="",
                      labels="benign,malignant", name="Lesion colour screen"), 201)
    assert data(await clinic.post("doctor", "/api/ai/cancer-detection",
                                  {"image": png((220, 40, 40))}))["model"]["name"] == \
        "Lesion colour screen"
    assert data(await clinic.post("doctor", "/api/ai/cancer-detection",
                                  {"features": cytology(0)}))["model"]["name"] == CARD["name"]
    # a model with its own features replaces the shipped one for features
    mine = data(await upload(clinic, diagnosis_model(), task="cancer-detection",
                             version="2.0.0", labels="benign,malignant",
                             name="Local cytology model"), 201)
    answer = data(await clinic.post("doctor", "/api/ai/cancer-detection", {
        "features": {"temperature": 39.5, "wbc": 4.0, "platelets": 90}}))
    assert answer["model"]["id"] == mine["id"] and answer["threshold"] is None
    assert refusal(await clinic.post("doctor", "/api/ai/cancer-detection",
                                     {"features": cytology(0)})) == (422, "VALIDATION_ERROR")


def test_every_rule_cites_a_source_and_uses_declared_findings():
    for rule in KNOWLEDGE["rules"]:
        assert rule["source"] in KNOWLEDGE["sources"], rule["id"]
        assert rule.get("all") or rule.get("any"), rule["id"]
        for condition in [*rule.get("all", []), *rule.get("any", [])]:
            assert condition["finding"] in KNOWLEDGE["findings"], rule["id"]
        for other in rule.get("unless", []):
            assert other in {r["id"] for r in KNOWLEDGE["rules"]}, rule["id"]


async def diagnose(clinic, features, **extra):
    return data(await clinic.post("doctor", "/api/ai/diagnosis",
                                  {"features": features, **extra}))


async def test_fast_breathing_is_pneumonia_by_the_threshold_of_the_age(clinic):
    toddler = await diagnose(clinic, {"age_months": 18, "cough_or_difficult_breathing": 1,
                                      "respiratory_rate": 45})
    assert toddler["model"] is None and toddler["top_label"] == "Pneumonia"
    first = toddler["suggestions"][0]
    assert first["id"] == "imci-pneumonia" and first["source"]["key"] == "imci-2014"
    assert "Chart Booklet" in first["source"]["citation"]
    assert {e["finding"]: e["value"] for e in first["evidence"]} == {
        "cough_or_difficult_breathing": 1, "respiratory_rate": 45}
    assert "40 breaths per minute" in first["evidence"][1]["criterion"]
    # 45/min is not fast breathing at 6 months (threshold 50)
    infant = await diagnose(clinic, {"age_months": 6, "cough_or_difficult_breathing": True,
                                     "respiratory_rate": 45})
    assert infant["suggestions"] == [] and infant["top_label"] is None
    assert "chest_indrawing" in infant["support"]["missing"]
    # a danger sign makes it severe, and the lesser classification is not repeated
    severe = await diagnose(clinic, {"age_months": 18, "cough_or_difficult_breathing": 1,
                                     "respiratory_rate": 45, "stridor": 1})
    assert [s["id"] for s in severe["suggestions"]] == ["imci-severe-pneumonia"]
    assert severe["suggestions"][0]["urgency"] == "emergency"


async def test_fever_and_stiff_neck_in_an_adult_patient_is_possible_meningitis(clinic):
    """The age comes from the patient's birth date (1988): the IMAI rules apply."""
    answer = await diagnose(clinic, {"fever": 1, "stiff_neck": 1, "temperature": 39.2},
                            patient_id=clinic.patient_id)
    assert answer["top_label"] == "Possible bacterial meningitis"
    assert answer["suggestions"][0]["source"]["key"] == "imai-dcm-2011"
    age = next(i for i in answer["support"]["inputs"] if i["name"] == "age_months")
    assert age["reference"] == f"Patient/{clinic.patient_id}" and age["value"] > 12 * 30
    assert answer["support"]["based_on"][0]["kind"] == "rule"
    event = data(await clinic.get("admin",
                                  f"/api/clinical/audit/{answer['support']['audit_event_id']}"))
    assert event["subtype"] == "ai-diagnosis" and event["patient_ids"] == [clinic.patient_id]
    child = await diagnose(clinic, {"age_years": 3, "fever": 1, "stiff_neck": 1})
    assert child["suggestions"][0]["id"] == "imci-very-severe-febrile-disease"


async def test_dehydration_takes_the_most_severe_classification(clinic):
    answer = await diagnose(clinic, {"age_months": 14, "diarrhoea": 1, "sunken_eyes": 1,
                                     "skin_pinch_very_slow": 1, "restless_irritable": 1,
                                     "diarrhoea_days": 3})
    assert [s["id"] for s in answer["suggestions"]] == ["imci-severe-dehydration"]


async def test_the_knowledge_base_refuses_what_it_cannot_read_and_a_model_wins(clinic):
    unknown = await clinic.post("doctor", "/api/ai/diagnosis",
                                {"features": {"fever": 1, "crp": 120}})
    assert refusal(unknown) == (422, "VALIDATION_ERROR")
    assert unknown.json()["error"]["field"] == "features"
    vector = await clinic.post("doctor", "/api/ai/diagnosis", {"values": [1.0, 2.0]})
    assert refusal(vector) == (422, "VALIDATION_ERROR")
    assert "POST /api/ai/models" in vector.json()["error"]["message"]
    no_age = await diagnose(clinic, {"fever": 1, "stiff_neck": 1})
    assert no_age["suggestions"] == []
    assert no_age["support"]["missing"][0].startswith("age_months")
    assert data(await upload(clinic, diagnosis_model()), 201)
    answer = await diagnose(clinic, {"temperature": 39.5, "wbc": 4.0, "platelets": 90})
    assert answer["model"]["name"] == "Febrile illness classifier"
    assert answer["suggestions"] == []
