"""``POST /api/ai/diagnosis`` and ``POST /api/ai/cancer-detection``: the active model of
the task (``diagnosis``, ``cancer-detection``; :mod:`.registry`) run in process with
onnxruntime on what the caller posts; without an uploaded model, what the platform ships.

- **diagnosis**: clinical features. A model registered with feature names takes
  ``features: {name: value}`` (every name, nothing else: 422 naming the field); one
  without takes ``values: [...]`` of the input's width. The input is one row
  (``[1, n]``, or ``[n]`` for a rank-1 input) of the input's element type.
  **No model registered**: the WHO IMCI/IMAI knowledge base (:mod:`.knowledge`) answers
  named ``features`` (its findings; age from ``age_months``/``age_years`` or the
  patient's birth date) with ``suggestions``, each with its evidence and source.
- **cancer-detection**: ``features`` (a model registered with feature names; without
  one, the shipped cytology model of :mod:`.defaults`: the 30 nuclear features of a
  breast fine-needle aspirate, answered with its probabilities and the classification
  at the model card's threshold), or an image (``image``: base64 PNG or JPEG, at most
  ``HEALTHPLATFORM_AI_IMAGE_MAX_PIXELS`` pixels), converted to the input's layout (NCHW
  or NHWC from the input shape; 1 channel greyscale, 3 RGB), resized to its height and
  width (the image's own when the model leaves them open), scaled to 0-1. No image
  model is shipped (no public image data ships with a package): an image without an
  uploaded model is 409 ``NO_IMAGE_MODEL``, saying what the default takes and how to
  register an image model.

The first output is the model's scores; with the model's ``output_activation`` (softmax
or sigmoid) they become probabilities; ``predictions`` pair them with the labels, best
first. An uploaded active model always takes precedence over what ships.
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
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import numpy as np
import onnxruntime
from fastapi import APIRouter, Depends
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, Field, model_validator

from platform_api.ai import defaults, knowledge
from platform_api.ai.common import (
    OPTIONAL_PATIENT_ID,
    Basis,
    InputUsed,
    Support,
    answered,
    instant,
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
    "model": ErrorEnvelope, "description": "NO_IMAGE_MODEL: an image was posted and no "
                                           "image model is registered for the task"}}


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


class KnowledgeRef(BaseModel):
    name: str
    version: str
    sources: list[str]


class ModelRef(BaseModel):
    id: str
    name: str | None = None
    version: str
    task: str


class InferenceView(BaseModel):
    task: str
    model: ModelRef | None = Field(None, description="The model that answered (none when "
                                   "the knowledge base did)")
    predictions: list[Prediction] = Field([], description="Best first")
    top_label: str | None = Field(None, description="The best prediction, or the most "
                                  "urgent suggestion; none when nothing matched")
    threshold: float | None = Field(None, description="The shipped model's decision "
                                    "threshold for the positive label (its model card)")
    classification: str | None = Field(None, description="The label at that threshold")
    knowledge_base: KnowledgeRef | None = None
    suggestions: list[knowledge.Suggestion] = Field([], description="The knowledge base's "
                                                    "classifications, most urgent first")
    patient_id: str | None = None
    support: Support


async def run(ctx: ApiContext, device: JSON, array: np.ndarray, top: int
              ) -> tuple[JSON, list[JSON]]:
    """The model's predictions on ``array`` (one sample)."""
    view = model_view(device)
    return view, await predict(await session_for(ctx.services, device), view, array, top)


async def predict(session: onnxruntime.InferenceSession, view: JSON, array: np.ndarray,
                  top: int) -> list[JSON]:
    """The labels with their scores on ``array``, best first."""
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
    return [Prediction(label=label, score=round(float(score), 6)).model_dump()
            for label, score in ranked[:top]]


def _answer(task: str, view: JSON, predictions: list[JSON], patient_id: str | None) -> JSON:
    return {"task": task, "model": ModelRef(id=view["id"], name=view["name"],
                                            version=view["version"], task=task).model_dump(),
            "predictions": predictions, "top_label": predictions[0]["label"],
            "threshold": None, "classification": None, "knowledge_base": None,
            "suggestions": [], "patient_id": patient_id}


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


def feature_row(view: JSON, features: dict[str, float] | None, values: list[float] | None,
                dtype: Any) -> tuple[np.ndarray, list[InputUsed]]:
    names = view["features"]
    if names:
        if features is None:
            raise ApiError(422, "VALIDATION_ERROR", "This model takes named features: "
                           + ", ".join(names), field="features")
        missing = [n for n in names if n not in features]
        unknown = sorted(set(features) - set(names))
        if missing or unknown:
            raise ApiError(422, "VALIDATION_ERROR", "features: " + "; ".join(
                part for part in (f"missing {', '.join(missing)}" if missing else "",
                                  f"unknown {', '.join(unknown)}" if unknown else "") if part),
                field="features")
        values = [features[n] for n in names]
        used = [InputUsed(name=n, value=features[n]) for n in names]
    else:
        if values is None:
            raise ApiError(422, "VALIDATION_ERROR", "This model takes a vector of values",
                           field="values")
        used = [InputUsed(name="values", value=f"{len(values)} values")]
    return np.asarray(values, dtype=dtype), used


router = APIRouter(tags=["ai"])


@router.post("/api/ai/diagnosis", response_model=Envelope[InferenceView], responses=NO_MODEL,
             summary="Differential diagnosis support: the active 'diagnosis' model on "
                     "posted clinical features")
async def diagnosis(body: DiagnosisRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("ai.decision-support")
    patient = await patient_for(ctx, body.patient_id)
    device = await active_model(ctx.fhir, "diagnosis")
    if device is None:
        return ok(await _knowledge_answer(ctx, body, patient))
    session = await session_for(ctx.services, device)
    spec = session.get_inputs()[0]
    row, used = feature_row(model_view(device), body.features, body.values,
                            DTYPES.get(spec.type, np.float32))
    array = row if len(spec.shape) == 1 else row.reshape(1, -1)
    view, predictions = await run(ctx, device, array, body.top)
    support = Support(based_on=[_basis(view)], inputs=used)
    return ok(await answered(ctx, "diagnosis", _answer("diagnosis", view, predictions,
                                                       body.patient_id), support,
                             patient=patient, records=[f"Device/{view['id']}"],
                             summary=f"top: {predictions[0]['label']}"))


def age_in_months(features: dict[str, float], patient: JSON | None
                  ) -> tuple[float | None, InputUsed | None]:
    """The age the caller posted (``age_months``, else ``age_years``), else the patient's
    from their birth date (a year alone counts from its middle), else None."""
    if "age_months" in features:
        return features["age_months"], None
    if "age_years" in features:
        return features["age_years"] * 12, None
    born = (patient or {}).get("birthDate") or ""
    birth = instant(born + ("-07-01" if len(born) == 4 else "-15" if len(born) == 7 else "")
                    + "T00:00:00Z") if born else None
    if patient is None or birth is None:
        return None, None
    months = round((datetime.now(UTC) - birth).days / 30.4375, 1)
    return months, InputUsed(name="age_months", value=months, unit="mo",
                             reference=f"Patient/{patient['id']}")


async def _knowledge_answer(ctx: ApiContext, body: DiagnosisRequest, patient: JSON | None
                            ) -> JSON:
    """The knowledge base's suggestions for the posted findings (no diagnosis model)."""
    vocabulary = knowledge.findings()
    if body.features is None:
        raise ApiError(422, "VALIDATION_ERROR", "No diagnosis model is registered: the "
                       "shipped WHO IMCI/IMAI knowledge base takes named findings in "
                       "features (" + ", ".join(vocabulary) + "); a platform administrator "
                       "registers a model for a vector of values (POST /api/ai/models, task "
                       "diagnosis)", field="values")
    unknown = sorted(set(body.features) - set(vocabulary))
    if unknown:
        raise ApiError(422, "VALIDATION_ERROR", f"features: unknown {', '.join(unknown)}; "
                       "the knowledge base's findings are " + ", ".join(vocabulary),
                       field="features")
    age, from_record = age_in_months(body.features, patient)
    suggestions, missing = knowledge.suggest(body.features, age)
    base = knowledge.knowledge()
    used = [InputUsed(name=name, value=value, unit=vocabulary[name].get("unit"))
            for name, value in body.features.items()]
    support = Support(
        based_on=[Basis(kind="rule", name=base["name"], version=base["version"],
                        source="; ".join(base["sources"][key]["citation"] for key in
                                         dict.fromkeys(s.source.key for s in suggestions)
                                         or base["sources"]))],
        inputs=[*used, *([from_record] if from_record else [])],
        missing=(["age_months (or age_years, or a patient with a birth date)"]
                 if age is None else []) + missing)
    answer = {"task": "diagnosis", "model": None, "predictions": [], "threshold": None,
              "classification": None,
              "top_label": suggestions[0].name if suggestions else None,
              "knowledge_base": KnowledgeRef(name=base["name"], version=base["version"],
                                             sources=list(base["sources"])).model_dump(),
              "suggestions": [s.model_dump() for s in suggestions],
              "patient_id": body.patient_id}
    return await answered(ctx, "diagnosis", answer, support, patient=patient, summary=(
        "suggested: " + ", ".join(s.id for s in suggestions) if suggestions
        else "no classification matched"))


# --- cancer detection ----------------------------------------------------------------------------
class CancerDetectionRequest(BaseModel):
    patient_id: str | None = OPTIONAL_PATIENT_ID
    image: str | None = Field(None, min_length=8, max_length=14_000_000,
                              description="The image, base64 (an uploaded image model)")
    content_type: Literal["image/png", "image/jpeg"] = "image/png"
    features: dict[Annotated[str, Field(max_length=100)], float] | None = Field(
        None, max_length=2000, description="Named features: an uploaded model's, or the "
        "shipped cytology model's 30 nuclear features of a breast fine-needle aspirate",
        examples=[{"mean_radius": 17.99, "worst_concave_points": 0.2654}])
    top: int = Field(5, ge=1, le=100)

    @model_validator(mode="after")
    def _one_of(self) -> CancerDetectionRequest:
        if (self.features is None) == (self.image is None):
            raise ValueError("send either features or image")
        return self


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
    device = await active_model(ctx.fhir, "cancer-detection")
    if body.features is not None:
        return ok(await _cancer_from_features(ctx, body, body.features, device, patient))
    try:
        content = base64.b64decode(body.image or "", validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "INVALID_IMAGE", "image must be base64", field="image") from None
    if device is None:
        raise ApiError(409, "NO_IMAGE_MODEL", "No image model is registered for cancer "
                       "detection. The shipped default model takes features: the 30 nuclear "
                       "features of a breast fine-needle aspirate (" + ", ".join(
                           defaults.card("cancer-detection")["features"]) + "). To analyse "
                       "images, a platform administrator registers an ONNX image model: "
                       "POST /api/ai/models with task cancer-detection, labels and an "
                       "image input (NCHW or NHWC)")
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


async def _cancer_from_features(ctx: ApiContext, body: CancerDetectionRequest,
                                features: dict[str, float], device: JSON | None,
                                patient: JSON | None) -> JSON:
    """An uploaded model that takes named features, else the shipped cytology model."""
    shipped = device is None or not model_view(device)["features"]
    if shipped:
        view = defaults.view("cancer-detection")
        session = await defaults.session(ctx.services, "cancer-detection")
    else:
        assert device is not None
        view = model_view(device)
        session = await session_for(ctx.services, device)
    spec = session.get_inputs()[0]
    row, used = feature_row(view, features, None, DTYPES.get(spec.type, np.float32))
    ranked = await predict(session, view, row if len(spec.shape) == 1
                           else row.reshape(1, -1), 100)
    predictions = ranked[:body.top]
    answer = _answer("cancer-detection", view, predictions, body.patient_id)
    if shipped:
        card = defaults.card("cancer-detection")
        held_out = card["evaluation_held_out"]
        positive = next(p["score"] for p in ranked if p["label"] == "malignant")
        answer |= {"threshold": card["threshold"], "classification": "malignant"
                   if positive >= card["threshold"] else "benign"}
        basis = Basis(kind="model", name=view["name"], version=view["version"], source=(
            f"shipped platform_api/ai/data/{defaults.SHIPPED['cancer-detection'][0]} (sha256 "
            f"{view['sha256']}); model card {defaults.SHIPPED['cancer-detection'][1]}: "
            f"held-out AUC {held_out['auc']}, sensitivity {held_out['sensitivity']}, "
            f"specificity {held_out['specificity']} at {card['threshold']}"))
    else:
        basis = _basis(view)
    support = Support(based_on=[basis], inputs=used)
    return await answered(ctx, "cancer-detection", answer, support, patient=patient,
                          records=[] if shipped else [f"Device/{view['id']}"],
                          summary=f"top: {predictions[0]['label']}")


__all__ = ["activate", "image_tensor", "router", "session_for"]
