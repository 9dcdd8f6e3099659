"""What the AI-assisted tools cost a call, end to end in one process.

Runs the whole app on a fresh SQLite store in a temporary directory (rate limits off),
called through httpx's ASGI transport (no network), as a clinic's administrator (a
clinical role) with a platform login token. A platform administrator registers two ONNX
models built here with the ``onnx`` package: a diagnosis model (a linear layer over 3
features) and an image model (a 3x3 convolution with 8 filters over a 224x224 RGB input,
ReLU, global average pooling, a linear layer to 2 labels). Measures (milliseconds,
median and 95th percentile of ``--calls`` calls each, every call audited):

- ``session_run_ms``: the image model's ``InferenceSession.run`` alone (onnxruntime);
- ``cancer_detection``: ``POST /api/ai/cancer-detection`` with a 640x480 PNG (base64
  decoding, Pillow's decode and resize, the run, the AuditEvent written);
- ``diagnosis``: ``POST /api/ai/diagnosis`` with named features;
- ``diagnosis_knowledge_base`` and ``cancer_detection_shipped``: the same calls before any
  upload, answered by what ships (the WHO IMCI/IMAI rules over 4 findings of a
  3-year-old; the cytology model over a Wisconsin aspirate's 30 features);
- ``lab_interpretation``: a 3-result full blood count (reference ranges, panic table,
  delta checks, patterns: one FHIR read and searches per result);
- ``risk_stratification``: all five scores from a record with vital signs, conditions,
  medications and lipids.

Prints one JSON line. Usage: ``python bench/ai.py [--calls 100]``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime
from asgi_lifespan import LifespanManager
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from sklearn.datasets import load_breast_cancer

from platform_api.app import create_app
from platform_api.settings import Settings

PASSWORD = "correct horse battery staple"
LOINC = "http://loinc.org"


def diagnosis_model() -> bytes:
    rng = np.random.default_rng(7)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["logits"])], "diagnosis",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(rng.normal(size=(3, 2)).astype(np.float32), "W")])
    return _serialized(graph)


def image_model() -> bytes:
    rng = np.random.default_rng(11)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "K"], ["features"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["features"], ["active"]),
         helper.make_node("GlobalAveragePool", ["active"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]),
         helper.make_node("MatMul", ["flat", "W"], ["scores"])], "lesions",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "K"),
         numpy_helper.from_array(rng.normal(size=(8, 2)).astype(np.float32), "W")])
    return _serialized(graph)


def _serialized(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()  # type: ignore[no-any-return]


def png(width: int = 640, height: int = 480) -> str:
    pixels = np.random.default_rng(3).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


async def login(client: httpx.AsyncClient, email: str, first: str) -> dict[str, str]:
    await client.post("/api/auth/register", json={
        "email": email, "password": PASSWORD, "first_name": first, "last_name": "Bench"})
    answer = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    return {"Authorization": f"Bearer {answer.json()['data']['token']}"}


def ago(minutes: float) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def write(client: httpx.AsyncClient, headers: dict[str, str], resource: dict[str, Any]
                ) -> str:
    answer = await client.post(f"/fhir/{resource['resourceType']}", json=resource,
                               headers=headers)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def observation(patient: str, code: str, value: float, unit: str, when: str,
                category: str = "laboratory") -> dict[str, Any]:
    return {"resourceType": "Observation", "status": "final",
            "category": [{"coding": [{"code": category, "system":
                                      "http://terminology.hl7.org/CodeSystem/observation-category"}]}],
            "code": {"coding": [{"system": LOINC, "code": code}]},
            "subject": {"reference": f"Patient/{patient}"}, "effectiveDateTime": when,
            "valueQuantity": {"value": value, "unit": unit}}


async def setup(app: Any, client: httpx.AsyncClient) -> dict[str, Any]:
    headers = await login(client, "clinician@kliniki.example", "Wanjiru")
    org = (await client.post("/api/organizations", headers=headers, json={
        "name": "Kliniki ya Bench", "country": "KE"})).json()["data"]["id"]
    patient = (await client.post(f"/api/organizations/{org}/patients", headers=headers, json={
        "first_name": "Amina", "last_name": "Odhiambo", "date_of_birth": "1960-04-12",
        "gender": "female", "mrn": "B-1"})).json()["data"]["id"]
    results = [await write(client, headers, observation(patient, code, value, unit, ago(60)))
               for code, value, unit in (("718-7", 9.1, "g/dL"), ("787-2", 68, "fL"),
                                         ("777-3", 250, "10*3/uL"))]
    for code, value, unit in (("718-7", 11.9, "g/dL"), ("2093-3", 210, "mg/dL"),
                              ("2085-9", 45, "mg/dL"), ("6301-6", 2.5, "{INR}")):
        await write(client, headers, observation(patient, code, value, unit, ago(2000)))
    for code, value, unit in (("9279-1", 22, "/min"), ("8480-6", 135, "mm[Hg]"),
                              ("8867-4", 96, "/min"), ("59408-5", 95, "%"),
                              ("8310-5", 38.1, "Cel")):
        await write(client, headers, observation(patient, code, value, unit, ago(30),
                                                 "vital-signs"))
    for code in ("I10", "E11.9"):
        await write(client, headers, {
            "resourceType": "Condition", "subject": {"reference": f"Patient/{patient}"},
            "code": {"coding": [{"system": "http://hl7.org/fhir/sid/icd-10", "code": code}]}})
    report = await write(client, headers, {
        "resourceType": "DiagnosticReport", "status": "final",
        "code": {"coding": [{"system": LOINC, "code": "58410-2"}]},
        "subject": {"reference": f"Patient/{patient}"},
        "result": [{"reference": f"Observation/{r}"} for r in results]})
    return {"headers": headers, "patient": patient, "report": report}


async def register_models(app: Any, client: httpx.AsyncClient) -> None:
    await login(client, "admin@kliniki.example", "Grace")
    await app.state.services.auth.create_admin("admin@kliniki.example", PASSWORD, "Grace",
                                               "Bench")
    admin = await login(client, "admin@kliniki.example", "Grace")
    for task, content, labels, features in (
            ("diagnosis", diagnosis_model(), "malaria,typhoid", "temperature,wbc,platelets"),
            ("cancer-detection", image_model(), "benign,malignant", "")):
        answer = await client.post("/api/ai/models", headers=admin, data={
            "task": task, "version": "1.0.0", "name": task, "licence": "Apache-2.0",
            "labels": labels, "features": features, "output_activation": "softmax"},
            files={"file": ("model.onnx", content, "application/octet-stream")})
        assert answer.status_code == 201, answer.text


async def timed(call: Callable[[], Awaitable[httpx.Response]], n: int) -> dict[str, float]:
    await call()  # warm: sessions built, caches filled
    times = []
    for _ in range(n):
        started = time.perf_counter()
        answer = await call()
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, answer.text
    times.sort()
    return {"p50_ms": round(statistics.median(times), 2),
            "p95_ms": round(times[int(len(times) * 0.95) - 1], 2)}


def session_run(n: int) -> dict[str, float]:
    session = onnxruntime.InferenceSession(image_model(), providers=["CPUExecutionProvider"])
    image = np.random.default_rng(5).random((1, 3, 224, 224), dtype=np.float32)
    session.run(None, {"image": image})
    times = []
    for _ in range(n):
        started = time.perf_counter()
        session.run(None, {"image": image})
        times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": round(statistics.median(times), 3)}


async def main(calls: int) -> dict[str, Any]:
    logging.disable(logging.WARNING)
    directory = Path(tempfile.mkdtemp(prefix="bench-ai-"))
    try:
        settings = Settings(data_dir=directory, rate_limit_enabled=False, access_log=False,
                            log_level="WARNING", transcription_workers=0)
        app = create_app(settings)
        async with LifespanManager(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:
            world = await setup(app, client)
            headers, patient = world["headers"], world["patient"]
            image = png()

            def post(path: str, body: dict[str, Any]) -> Callable[[], Awaitable[httpx.Response]]:
                return lambda: client.post(path, headers=headers, json=body)
            sample = load_breast_cancer()
            aspirate = {name.replace(" ", "_"): float(value) for name, value in
                        zip(sample.feature_names, sample.data[0], strict=True)}
            shipped = {
                "diagnosis_knowledge_base": await timed(post("/api/ai/diagnosis", {
                    "patient_id": patient, "features": {
                        "age_years": 3, "cough_or_difficult_breathing": 1,
                        "respiratory_rate": 48, "fever": 1}}), calls),
                "cancer_detection_shipped": await timed(post("/api/ai/cancer-detection", {
                    "patient_id": patient, "features": aspirate}), calls)}
            await register_models(app, client)
            figures = {
                "calls": calls, "session_run_ms": session_run(calls), **shipped,
                "cancer_detection": await timed(post("/api/ai/cancer-detection", {
                    "image": image, "patient_id": patient}), calls),
                "diagnosis": await timed(post("/api/ai/diagnosis", {
                    "patient_id": patient,
                    "features": {"temperature": 38.2, "wbc": 11, "platelets": 150}}), calls),
                "lab_interpretation": await timed(post("/api/ai/lab-interpretation", {
                    "patient_id": patient, "lab_result_id": world["report"]}), calls),
                "risk_stratification": await timed(post("/api/ai/risk-stratification", {
                    "patient_id": patient}), calls),
            }
        return figures
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    arguments = parser.parse_args()
    print(json.dumps(asyncio.run(main(arguments.calls))))
