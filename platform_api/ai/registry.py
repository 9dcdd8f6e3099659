"""The model registry: ONNX models uploaded by platform administrators, one active
version per task; ``GET /api/ai/model-info`` (public) tells devices which version is
current.

A model version is a FHIR **Device** (a software device; R4's DeviceDefinition has no
status, and the registry needs one to keep a single active version per task); the ONNX
file is an object of the blob store (:mod:`platform_api.sessions.blobs`, key
``ai-models/<Device id>/model.onnx``). Mapping (/api field → Device element):

    id            → id
    task          → modelNumber, and identifier urn:healthplatform:ai-model|<task>:<version>
                    (unique: a second upload of a version is 409 MODEL_VERSION_EXISTS)
    name          → deviceName[type model-name]
    version       → version[0].value
    status        → status: active (the task's current version) | inactive
    description   → note[0].text
    licence       → property[licence].valueCode[0].text (an SPDX id or the licence's text)
    labels        → property[labels].valueCode[].text, in the order of the output vector
    features      → property[features].valueCode[].text, in the order of the input vector
    input, output → property[input|output].valueCode[].text: what the caller wrote, then
                    each graph input/output as "name: type[shape]" read from the file
    output_activation → property[output-activation] (none | softmax | sigmoid)
    sha256, size  → identifier urn:healthplatform:sha256|<hex>; property[size] (bytes)
    (always)      → type urn:healthplatform:device-kind#ai-model; the blob key in the
                    extension urn:healthplatform:extension:blob-key; no owner (the
                    registry is the platform's, readable by every signed-in user)

An upload is checked before it is stored: onnxruntime must open it (it parses and
checks the graph; 422 ``INVALID_MODEL``); labels must match the output's width and features the
input's when the file says them (422). With ``activate`` (default true) the new version
becomes the task's active one and the previous active version turns inactive, in the
same unit of work. Event ``platform.ai.model_registered`` (and ``…_activated``).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import onnxruntime
from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir
from fhir_server.ids import new_id
from platform_api.envelope import ApiError, Envelope, ErrorEnvelope, conflict, created, ok
from platform_api.facade import (
    ApiContext,
    Facade,
    SearchParam,
    api_context,
    create_unique,
    is_duplicate,
    staged_body,
)
from platform_api.services import Services
from platform_api.sessions.blobs import BlobMissing, BlobTooLarge, spool
from platform_api.sessions.common import concept, extension, set_extension
from platform_api.sessions.recordings import blobs

JSON = dict[str, Any]
MODEL_SYSTEM = "urn:healthplatform:ai-model"
SHA256_SYSTEM = "urn:healthplatform:sha256"
KINDS = "urn:healthplatform:device-kind"
PROPERTIES = "urn:healthplatform:ai-model-property"
AI_MODEL = f"{KINDS}|ai-model"
TOPIC = "platform.ai.model_"
TASK_PATTERN = r"^[a-z][a-z0-9-]{1,39}$"
Activation = Literal["none", "softmax", "sigmoid"]


class ModelView(BaseModel):
    id: str
    task: str
    name: str | None = None
    version: str
    status: str
    description: str | None = None
    licence: str | None = None
    labels: list[str] = []
    features: list[str] = []
    input: list[str] = []
    output: list[str] = []
    output_activation: str = "none"
    sha256: str | None = None
    size: int | None = None
    registered_at: str | None = None


class ModelQuery(BaseModel):
    task: Annotated[str | None, SearchParam("model")] = Field(default=None, pattern=TASK_PATTERN)
    status: Annotated[Literal["active", "inactive"] | None, SearchParam("status")] = None


class ModelUpload(BaseModel):
    """The form fields of an upload (the file is the part ``file``)."""

    task: str = Field(pattern=TASK_PATTERN, examples=["cancer-detection"])
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,39}$", examples=["1.2.0"])
    name: str = Field(min_length=1, max_length=200)
    licence: str = Field(min_length=1, max_length=500, examples=["Apache-2.0"])


def _property(code: str, texts: list[str]) -> JSON:
    return {"type": concept(PROPERTIES, code), "valueCode": [{"text": t} for t in texts]}


def _texts(device: JSON, code: str) -> list[str]:
    for prop in device.get("property") or []:
        if any(c.get("code") == code for c in (prop.get("type") or {}).get("coding") or []):
            return [v.get("text", "") for v in prop.get("valueCode") or []]
    return []


def _size(device: JSON) -> int | None:
    for prop in device.get("property") or []:
        if any(c.get("code") == "size" for c in (prop.get("type") or {}).get("coding") or []):
            return int((prop.get("valueQuantity") or [{}])[0].get("value", 0))
    return None


def _identifier(device: JSON, system: str) -> str | None:
    return next((i.get("value") for i in device.get("identifier") or []
                 if i.get("system") == system), None)


def model_view(device: JSON) -> JSON:
    return ModelView(
        id=device["id"], task=device.get("modelNumber", ""),
        name=next((n.get("name") for n in device.get("deviceName") or []), None),
        version=(device.get("version") or [{}])[0].get("value", ""),
        status=device.get("status", "inactive"),
        description=(device.get("note") or [{}])[0].get("text"),
        licence=next(iter(_texts(device, "licence")), None), labels=_texts(device, "labels"),
        features=_texts(device, "features"), input=_texts(device, "input"),
        output=_texts(device, "output"),
        output_activation=next(iter(_texts(device, "output-activation")), "none"),
        sha256=_identifier(device, SHA256_SYSTEM), size=_size(device),
        registered_at=(device.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


def blob_key(device_id: str) -> str:
    return f"ai-models/{device_id}/model.onnx"


# --- checking an upload -----------------------------------------------------------------------
def _shape(arg: Any) -> str:
    """``name: float[1, 3]`` of an onnxruntime NodeArg (open dimensions by their name)."""
    kind = str(arg.type).removeprefix("tensor(").removesuffix(")")
    dims = [str(d) if d is not None else "?" for d in arg.shape]
    return f"{arg.name}: {kind}[{', '.join(dims)}]"


def _last_dim(arg: Any) -> int | None:
    shape = list(arg.shape)
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def inspect_model(content: bytes, labels: list[str], features: list[str]
                  ) -> tuple[list[str], list[str]]:
    """The graph's inputs and outputs described, once onnxruntime accepted the file (it
    parses and checks the graph, and refuses operators it cannot run): 422
    ``INVALID_MODEL``, ``LABELS_MISMATCH``, ``FEATURES_MISMATCH``."""
    try:
        session = onnxruntime.InferenceSession(content, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own kinds (InvalidGraph, Fail, ...)
        raise ApiError(422, "INVALID_MODEL", f"Not a usable ONNX model: {str(exc)[:300]}",
                       field="file") from None
    inputs, outputs = session.get_inputs(), session.get_outputs()
    width = _last_dim(outputs[0]) if outputs else None
    if labels and width not in (None, len(labels)):
        raise ApiError(422, "LABELS_MISMATCH", f"The model's output has {width} values; "
                       f"{len(labels)} labels were given", field="labels")
    depth = _last_dim(inputs[0]) if len(inputs) == 1 else None
    if features and depth not in (None, len(features)):
        raise ApiError(422, "FEATURES_MISMATCH", f"The model's input has {depth} values; "
                       f"{len(features)} features were given", field="features")
    return [_shape(i) for i in inputs], [_shape(o) for o in outputs]


def _names(text: str, field: str) -> list[str]:
    names = [n.strip() for n in text.replace("\n", ",").split(",") if n.strip()]
    if len(names) != len(set(names)) or any(len(n) > 100 for n in names):
        raise ApiError(422, "VALIDATION_ERROR", f"{field}: names must be distinct, at most "
                       "100 characters each", field=field)
    return names


async def _chunks(upload: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await upload.read(1024 * 1024):
        yield chunk


def model_device(device_id: str, form: ModelUpload, *, description: str | None,
                 labels: list[str], features: list[str], inputs: list[str],
                 outputs: list[str], activation: str, sha256: str, size: int,
                 active: bool) -> JSON:
    device: JSON = {
        "resourceType": "Device", "id": device_id,
        "identifier": [{"system": MODEL_SYSTEM, "value": f"{form.task}:{form.version}"},
                       {"system": SHA256_SYSTEM, "value": sha256}],
        "status": "active" if active else "inactive",
        "type": concept(KINDS, "ai-model", "AI model"),
        "deviceName": [{"name": form.name, "type": "model-name"}],
        "modelNumber": form.task, "version": [{"value": form.version}],
        "property": [
            _property("licence", [form.licence]), _property("input", inputs),
            _property("output", outputs), _property("output-activation", [activation]),
            *([_property("labels", labels)] if labels else []),
            *([_property("features", features)] if features else []),
            {"type": concept(PROPERTIES, "size"),
             "valueQuantity": [{"value": size, "unit": "byte"}]}],
    }
    if description:
        device["note"] = [{"text": description}]
    set_extension(device, "blob-key", "valueString", blob_key(device_id))
    return device


# --- reading the registry ------------------------------------------------------------------------
REGISTRY_READER = "ai_registry_reader"


def registry_reader(services: Services) -> CallerFhir:
    """Who reads the registry for ``GET /api/ai/model-info``, which devices call without
    credentials: the platform, elevated once per process (the registry is public)."""
    reader = services.extras.get(REGISTRY_READER)
    if reader is None:
        reader = services.extras[REGISTRY_READER] = services.policy.elevate(
            "model info: read the public registry of AI models for devices")
    return reader  # type: ignore[no-any-return]


async def active_model(fhir: CallerFhir, task: str) -> JSON | None:
    """The task's active model version (the registry's Devices: every signed-in user
    reads them)."""
    found = await fhir.search("Device", [
        ("type", AI_MODEL), ("model", task), ("status", "active"), ("_sort", "-_lastUpdated")])
    return found[0] if found else None


async def model_bytes(services: Services, device: JSON) -> bytes:
    """The model's file, checked against its SHA-256 (409 ``MODEL_FILE_MISSING`` /
    ``MODEL_FILE_CORRUPT``: the registry and the blob store disagree)."""
    key = extension(device, "blob-key") or blob_key(device["id"])
    content = bytearray()
    try:
        async for chunk in blobs(services).chunks(key):
            content += chunk
    except BlobMissing:
        raise ApiError(409, "MODEL_FILE_MISSING", "The model's file is missing from the "
                       "blob store") from None
    if hashlib.sha256(content).hexdigest() != _identifier(device, SHA256_SYSTEM):
        raise ApiError(409, "MODEL_FILE_CORRUPT", "The model's file does not match its "
                       "checksum")
    return bytes(content)


# --- routes ---------------------------------------------------------------------------------
def _read_only(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    raise AssertionError("models are registered by upload_model")


models = Facade(resource="Device", name="AI model", create=ModelUpload, view=ModelView,
                query=ModelQuery, to_fhir=_read_only, from_fhir=model_view,
                fixed=(("type", AI_MODEL),), tags=["ai"],
                summaries={"list": "The model registry (filter by task, status)"})
router = APIRouter(tags=["ai"])
models.mount(router, "/api/ai/models", ops=("list",))
_UPLOAD_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorEnvelope, "description": "The multipart form could not be read"},
    409: {"model": ErrorEnvelope, "description": "MODEL_VERSION_EXISTS: this task already "
                                                 "has this version"},
    422: {"model": ErrorEnvelope, "description": "A field is missing or wrong (named in "
                                                 "error.field); INVALID_MODEL, "
                                                 "LABELS_MISMATCH, FEATURES_MISMATCH"}}


@router.post("/api/ai/models", status_code=201, response_model=Envelope[ModelView],
             responses=_UPLOAD_RESPONSES,
             summary="Register an ONNX model version (platform administrators; "
                     "multipart/form-data with the file in the part 'file')")
async def upload_model(
    form: Annotated[ModelUpload, Form()],
    file: Annotated[UploadFile, File(description="The ONNX model")],
    description: Annotated[str | None, Form(max_length=2000)] = None,
    labels: Annotated[str, Form(max_length=20_000, description="Output labels, in order, "
                                "comma-separated")] = "",
    features: Annotated[str, Form(max_length=20_000, description="Input feature names, in "
                                  "order, comma-separated")] = "",
    input_description: Annotated[str | None, Form(max_length=2000)] = None,
    output_description: Annotated[str | None, Form(max_length=2000)] = None,
    output_activation: Annotated[Activation, Form()] = "none",
    activate: Annotated[bool, Form()] = True,
    ctx: ApiContext = Depends(api_context),
) -> Any:
    ctx.authorize("ai.model.register")
    services = ctx.services
    store = blobs(services)
    try:
        spooled = await spool(_chunks(file), store.spool_dir, services.settings.ai_model_max_bytes)
    except BlobTooLarge:
        raise ApiError(413, "MODEL_TOO_LARGE", "A model file may hold at most "
                       f"{services.settings.ai_model_max_bytes} bytes") from None
    try:
        label_names, feature_names = _names(labels, "labels"), _names(features, "features")
        inputs, outputs = inspect_model(spooled.path.read_bytes(), label_names, feature_names)
        device_id = new_id()
        device = model_device(
            device_id, form, description=description, labels=label_names,
            features=feature_names,
            inputs=[*([input_description] if input_description else []), *inputs],
            outputs=[*([output_description] if output_description else []), *outputs],
            activation=output_activation, sha256=spooled.sha256, size=spooled.size,
            active=activate)
        await store.put_file(blob_key(device_id), spooled.path, "application/octet-stream")
    finally:
        spooled.path.unlink(missing_ok=True)
    try:
        stored = await _register(ctx, device, activate)
    except Exception as exc:
        await store.delete(blob_key(device_id))
        if is_duplicate(exc):
            raise conflict("MODEL_VERSION_EXISTS", f"{form.task} already has version "
                           f"{form.version}") from None
        raise
    return created(model_view(stored))


async def _register(ctx: ApiContext, device: JSON, activate: bool) -> JSON:
    previous = await active_model(ctx.fhir, device["modelNumber"]) if activate else None
    unit = ctx.unit()
    async with unit:
        staged = await create_unique(unit, device, [
            ("identifier", f"{MODEL_SYSTEM}|{device['identifier'][0]['value']}")],
            resource_id=device["id"], ownerless=True)
        if previous is not None:
            await unit.update({**previous, "status": "inactive"},
                              if_match=int(previous["meta"]["versionId"]))
        view = model_view({**device, "meta": {}})
        unit.emit(TOPIC + "registered", view, source_service="ai")
        if activate:
            unit.emit(TOPIC + "activated", {**view, "replaced": previous["id"]
                                            if previous else None}, source_service="ai")
        await unit.commit()
    return staged_body(staged)


class ModelInfoView(BaseModel):
    task: str
    model_id: str
    name: str | None = None
    version: str
    sha256: str | None = None
    size: int | None = None
    labels: list[str] = []
    updated_at: str | None = None


@router.get("/api/ai/model-info", response_model=Envelope[list[ModelInfoView]],
            summary="The current (active) model version of each task, for devices (public)")
async def model_info(request: Request,
                     task: Annotated[str | None, Query(pattern=TASK_PATTERN)] = None) -> Any:
    services: Services = request.app.state.services
    params = [("type", AI_MODEL), ("status", "active"), ("_sort", "-_lastUpdated")]
    if task:
        params.append(("model", task))
    current: dict[str, JSON] = {}
    for device in await registry_reader(services).search("Device", params):
        view = model_view(device)
        current.setdefault(view["task"], ModelInfoView(
            task=view["task"], model_id=view["id"], name=view["name"],
            version=view["version"], sha256=view["sha256"], size=view["size"],
            labels=view["labels"], updated_at=view["registered_at"]).model_dump())
    return ok([current[name] for name in sorted(current)])


__all__ = ["AI_MODEL", "ModelView", "active_model", "model_bytes",
           "model_view", "router"]
