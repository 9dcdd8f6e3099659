"""``POST /api/ai/diagnosis`` and ``POST /api/ai/cancer-detection``: the active model of
the task (``diagnosis``, ``cancer-detection``; :mod:`.registry`) run in process with
onnxruntime on what the caller posts.

- **diagnosis**: clinical features. A model registered with feature names takes
  ``features: {name: value}`` (every name, nothing else: 422 naming the field); one
  without takes ``values: [...]`` of the input's width. The input is one row
  (``[1, n]``, or ``[n]`` for a rank-1 input) of the input's element type.
- **cancer-detection**: an image (``image``: base64 PNG or JPEG, at most
  ``HEALTHPLATFORM_AI_IMAGE_MAX_PIXELS`` pixels), converted to the input's layout (NCHW
  or NHWC from the input shape; 1 channel greyscale, 3 RGB), resized to its height and
  width (the image's own when the model leaves them open), scaled to 0-1.

The first output is the model's scores; with the model's ``output_activation`` (softmax
or sigmoid) they become probabilities; ``predictions`` pair them with the labels, best
first. With no active model for the task the answer is 409 ``NO_ACTIVE_MODEL``.
Sessions are cached per model version (id and checksum) and run in worker threads;
the file is verified against its SHA-256 when a session is built.

A ``patient_id`` (optional) must be a patient the caller may see; the call's AuditEvent
then names the patient. Nothing is stored besides the audit: the answer is decision
support for the clinician, not a record.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
from typing import Annotated, Any, Literal

import numpy as np
import onnxruntime
from fastapi import APIRouter, Depends
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, Field, model_validator

from platform_api.ai.common import (
    OPTIONAL_PATIENT_ID,
    Basis,
    InputUsed,
    Support,
    answered,
    patient_for,
)
from platform_api.ai.registry import active_model, model_bytes, model_view
from platform_api.envelope import ApiError, Envelope, ErrorEnvelope, ok
from platform_api.facade import ApiContext, api_context
from platform_api.services import Services

JSON = dict[str, Any]
SESSIONS = "ai_inference_sessions"
DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
          "tensor(int64)": np.int64, "tensor(int32)": np.int32}
NO_MODEL: dict[int | str, dict[str, Any]] = {409: {
    "model": ErrorEnvelope, "description": "NO_ACTIVE_MODEL: no model is registered (active) "
                                           "for the task"}}


# --- sessions --------------------------------------------------------------------------------
async def session_for(services: Services, device: JSON) -> onnxruntime.InferenceSession:
    """The model's onnxruntime session, built once per version."""
    cache: dict[tuple[str, str], onnxruntime.InferenceSession] = services.extras.setdefault(
        SESSIONS, {})
    view = model_view(device)
    key = (view["id"], view["sha256"] or "")
    session = cache.get(key)
    if session is None:
        content = await model_bytes(services, device)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = services.settings.ai_inference_threads
        session = await asyncio.to_thread(onnxruntime.InferenceSession, content, options,
                                          providers=["CPUExecutionProvider"])
        for old in [k for k in cache if k[0] == key[0]]:
            cache.pop(old)
        cache[key] = session
    return session


async def model_for(ctx: ApiContext, task: str) -> JSON:
    device = await active_model(ctx.fhir, task)
    if device is None:
        raise ApiError(409, "NO_ACTIVE_MODEL", f"No model is registered for the task "
                       f"{task!r}: a platform administrator uploads one (POST /api/ai/models)")
    return device


def activate(scores: np.ndarray, activation: str) -> np.ndarray:
    if activation == "softmax":
        shifted = np.exp(scores - scores.max())
        return shifted / shifted.sum()  # type: ignore[no-any-return]
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-scores))  # type: ignore[no-any-return]
    return scores


class Prediction(BaseModel):
    label: str
    score: float


class ModelRef(BaseModel):
    id: str
    name: str | None = None
    version: str
    task: str


class InferenceView(BaseModel):
    task: str
    model: ModelRef
    predictions: list[Prediction] = Field(description="Best first")
    top_label: str
    patient_id: str | None = None
    support: Support


async def run(ctx: ApiContext, device: JSON, array: np.ndarray, top: int
              ) -> tuple[JSON, list[JSON]]:
    """The model's predictions on ``array`` (one sample)."""
    view = model_view(device)
    session = await session_for(ctx.services, device)
    name = session.get_inputs()[0].name
    try:
        outputs = await asyncio.to_thread(session.run, None, {name: array})
    except Exception as exc:  # onnxruntime's errors: a shape or type the graph refuses
        raise ApiError(422, "MODEL_INPUT_MISMATCH", f"The model refused the input: "
                       f"{str(exc)[:300]}") from None
    scores = activate(np.asarray(outputs[0], dtype=np.float64).reshape(-1),
                      view["output_activation"])
    labels = view["labels"] or [f"class {i}" for i in range(len(scores))]
    if len(labels) != len(scores):
        raise ApiError(409, "MODEL_LABELS_MISMATCH", f"The model answered {len(scores)} "
                       f"scores for {len(labels)} labels")
    ranked = sorted(zip(labels, scores.tolist(), strict=True), key=lambda p: -p[1])
    predictions = [Prediction(label=label, score=round(float(score), 6)).model_dump()
                   for label, score in ranked[:top]]
    return view, predictions


def _answer(task: str, view: JSON, predictions: list[JSON], patient_id: str | None) -> JSON:
    return {"task": task, "model": ModelRef(id=view["id"], name=view["name"],
                                            version=view["version"], task=task).model_dump(),
            "predictions": predictions, "top_label": predictions[0]["label"],
            "patient_id": patient_id}


def _basis(view: JSON) -> Basis:
    return Basis(kind="model", name=view["name"] or view["task"], version=view["version"],
                 source=f"Device/{view['id']} (sha256 {view['sha256']}, licence "
                        f"{view['licence']})")


# --- diagnosis -----------------------------------------------------------------------------------
class DiagnosisRequest(BaseModel):
    patient_id: str | None = OPTIONAL_PATIENT_ID
    features: dict[Annotated[str, Field(max_length=100)], float] | None = Field(
        None, max_length=2000, description="Named features (a model registered with "
        "feature names)", examples=[{"age": 54, "temperature": 38.9, "crp": 120}])
    values: list[float] | None = Field(default=None, max_length=100_000, description="The input "
                                       "vector (a model without feature names)")
    top: int = Field(5, ge=1, le=100)

    @model_validator(mode="after")
    def _one_of(self) -> DiagnosisRequest:
        if (self.features is None) == (self.values is None):
            raise ValueError("send either features or values")
        return self


def feature_row(view: JSON, body: DiagnosisRequest, dtype: Any) -> tuple[np.ndarray,
                                                                        list[InputUsed]]:
    names = view["features"]
    if names:
        if body.features is None:
            raise ApiError(422, "VALIDATION_ERROR", "This model takes named features: "
                           + ", ".join(names), field="features")
        missing = [n for n in names if n not in body.features]
        unknown = sorted(set(body.features) - set(names))
        if missing or unknown:
            raise ApiError(422, "VALIDATION_ERROR", "features: " + "; ".join(
                part for part in (f"missing {', '.join(missing)}" if missing else "",
                                  f"unknown {', '.join(unknown)}" if unknown else "") if part),
                field="features")
        values = [body.features[n] for n in names]
        used = [InputUsed(name=n, value=body.features[n]) for n in names]
    else:
        if body.values is None:
            raise ApiError(422, "VALIDATION_ERROR", "This model takes a vector of values",
                           field="values")
        values = body.values
        used = [InputUsed(name="values", value=f"{len(values)} values")]
    return np.asarray(values, dtype=dtype), used


router = APIRouter(tags=["ai"])


@router.post("/api/ai/diagnosis", response_model=Envelope[InferenceView], responses=NO_MODEL,
             summary="Differential diagnosis support: the active 'diagnosis' model on "
                     "posted clinical features")
async def diagnosis(body: DiagnosisRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("ai.decision-support")
    patient = await patient_for(ctx, body.patient_id)
    device = await model_for(ctx, "diagnosis")
    session = await session_for(ctx.services, device)
    spec = session.get_inputs()[0]
    row, used = feature_row(model_view(device), body, DTYPES.get(spec.type, np.float32))
    array = row if len(spec.shape) == 1 else row.reshape(1, -1)
    view, predictions = await run(ctx, device, array, body.top)
    support = Support(based_on=[_basis(view)], inputs=used)
    return ok(await answered(ctx, "diagnosis", _answer("diagnosis", view, predictions,
                                                       body.patient_id), support,
                             patient=patient, records=[f"Device/{view['id']}"],
                             summary=f"top: {predictions[0]['label']}"))


# --- cancer detection ----------------------------------------------------------------------------
class CancerDetectionRequest(BaseModel):
    patient_id: str | None = OPTIONAL_PATIENT_ID
    image: str = Field(min_length=8, max_length=14_000_000, description="The image, base64")
    content_type: Literal["image/png", "image/jpeg"] = "image/png"
    top: int = Field(5, ge=1, le=100)


def image_tensor(content: bytes, shape: list[Any], dtype: Any, max_pixels: int
                 ) -> tuple[np.ndarray, str]:
    """The image in the input's layout; a description of it for the audit trail."""
    if len(shape) != 4:
        raise ApiError(409, "MODEL_NOT_AN_IMAGE_MODEL", "The active model's input is not "
                       "an image batch (rank 4)")
    channels_first = shape[1] in (1, 3)
    channels = shape[1] if channels_first else shape[3]
    height, width = (shape[2], shape[3]) if channels_first else (shape[1], shape[2])
    try:
        image: Image.Image = Image.open(io.BytesIO(content))
        if image.width * image.height > max_pixels:
            raise ApiError(413, "IMAGE_TOO_LARGE", f"The image has more than {max_pixels} "
                           "pixels")
        image = image.convert("L" if channels == 1 else "RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError):
        raise ApiError(422, "INVALID_IMAGE", "The image is not a readable PNG or JPEG",
                       field="image") from None
    said = f"{image.width}x{image.height} image, sha256 {hashlib.sha256(content).hexdigest()}"
    if isinstance(height, int) and isinstance(width, int):
        image = image.resize((width, height), Image.Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    pixels = pixels[..., np.newaxis] if pixels.ndim == 2 else pixels
    if channels_first:
        pixels = pixels.transpose(2, 0, 1)
    return pixels[np.newaxis, ...].astype(dtype), said


@router.post("/api/ai/cancer-detection", response_model=Envelope[InferenceView],
             responses=NO_MODEL,
             summary="Cancer detection support: the active 'cancer-detection' model on a "
                     "posted image")
async def cancer_detection(body: CancerDetectionRequest,
                           ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("ai.decision-support")
    patient = await patient_for(ctx, body.patient_id)
    try:
        content = base64.b64decode(body.image, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "INVALID_IMAGE", "image must be base64", field="image") from None
    device = await model_for(ctx, "cancer-detection")
    session = await session_for(ctx.services, device)
    spec = session.get_inputs()[0]
    array, said = image_tensor(content, list(spec.shape), DTYPES.get(spec.type, np.float32),
                               ctx.services.settings.ai_image_max_pixels)
    view, predictions = await run(ctx, device, array, body.top)
    support = Support(based_on=[_basis(view)], inputs=[
        InputUsed(name="image", value=f"{body.content_type} {said}")])
    return ok(await answered(ctx, "cancer-detection", _answer(
        "cancer-detection", view, predictions, body.patient_id), support, patient=patient,
        records=[f"Device/{view['id']}"], summary=f"top: {predictions[0]['label']}"))


__all__ = ["activate", "image_tensor", "router", "session_for"]
