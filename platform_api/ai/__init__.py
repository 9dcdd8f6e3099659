"""AI-assisted tools and the model registry (the /api/ai operations of the Clinical
decision support area).

One module per part: :mod:`.lab_interpretation` (rules over a lab result and its panel),
:mod:`.risk_scores` (validated scores from the patient's FHIR data), :mod:`.registry`
(ONNX models → FHIR Device, the file in the blob store), :mod:`.inference` (the active
model of a task run with onnxruntime: diagnosis, cancer detection; without an upload,
:mod:`.knowledge` (the WHO IMCI/IMAI knowledge base) and :mod:`.defaults` (the shipped
cytology model) answer), :mod:`.devices`
(on-device AI: edge devices → FHIR Device, heartbeats, the model versions per task),
:mod:`.cloud_inference` (a remote KServe v2 or OpenAI-compatible endpoint). What every
answer shares (its basis, inputs, the decision-support statement, the audit) is in
:mod:`.common`.
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.ai import (
    cloud_inference,
    devices,
    inference,
    lab_interpretation,
    registry,
    risk_scores,
)

router = APIRouter()
router.include_router(lab_interpretation.router)
router.include_router(risk_scores.router)
router.include_router(registry.router)
router.include_router(inference.router)
router.include_router(devices.router)
router.include_router(cloud_inference.router)

__all__ = ["router"]
