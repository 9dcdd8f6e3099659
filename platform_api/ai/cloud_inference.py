"""``POST /api/ai/cloud-inference``: a request forwarded to the remote inference
endpoint the settings name, over one of two protocols:

- ``kserve-v2`` (the Open Inference Protocol of KServe, Triton, Seldon MLServer):
  ``POST {HEALTHPLATFORM_AI_CLOUD_URL}/v2/models/{model}/infer`` with ``inputs``
  (name, shape, datatype, data); the answer's ``outputs`` and ``model_version``;
- ``openai`` (an OpenAI-compatible chat completions API):
  ``POST {HEALTHPLATFORM_AI_CLOUD_URL}/chat/completions`` with ``messages``; the
  answer's message.

The key (``HEALTHPLATFORM_AI_CLOUD_API_KEY``) goes as a bearer token and is never
logged. Limits: the request as sent at most ``…_MAX_REQUEST_BYTES`` (413
``CLOUD_REQUEST_TOO_LARGE``), the answer read at most ``…_MAX_RESPONSE_BYTES`` (502
``CLOUD_RESPONSE_TOO_LARGE``), ``…_TIMEOUT_SECONDS`` for the whole exchange (504
``CLOUD_TIMEOUT``); a refusal or failure of the endpoint is 502 ``CLOUD_INFERENCE_FAILED``
with its status; no endpoint configured is 503 ``CLOUD_INFERENCE_NOT_CONFIGURED``.

**No patient identifiers leave** unless ``HEALTHPLATFORM_AI_CLOUD_SEND_PATIENT_IDENTIFIERS``
allows it: every text sent (messages, BYTES inputs) is scrubbed of the identifiers of the
patient named by ``patient_id`` (names, identifier values such as the MRN, telecom,
birth date, address lines) and of any e-mail address or phone number, each replaced by
``[redacted]``; the patient id itself is never sent. The answer says how many were
redacted. The call is audited like every AI call (:mod:`.common`).
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import httpx
import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, model_validator

from platform_api.ai.common import (
    OPTIONAL_PATIENT_ID,
    Basis,
    InputUsed,
    Support,
    answered,
    patient_for,
)
from platform_api.envelope import ApiError, Envelope, ok
from platform_api.facade import ApiContext, api_context
from platform_api.settings import Settings

JSON = dict[str, Any]
REDACTED = "[redacted]"
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+")
PHONE = re.compile(r"(?<![\w.])\+?\d[\d ()-]{7,}\d(?![\w.])")
DataType = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                   "INT64", "FP16", "FP32", "FP64", "BYTES"]


class TensorIn(BaseModel):
    name: str = Field(min_length=1, max_length=100)
    shape: list[int] = Field(min_length=1, max_length=8)
    datatype: DataType
    data: list[Any] = Field(max_length=1_000_000)


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=200_000)


class CloudInferenceRequest(BaseModel):
    model: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$",
                              description="Default: HEALTHPLATFORM_AI_CLOUD_MODEL")
    patient_id: str | None = OPTIONAL_PATIENT_ID
    inputs: list[TensorIn] | None = Field(default=None, max_length=32,
                                          description="kserve-v2: the input tensors")
    messages: list[Message] | None = Field(default=None, max_length=100,
                                           description="openai: the chat messages")
    max_tokens: int | None = Field(default=None, ge=1, le=32_000)

    @model_validator(mode="after")
    def _one_of(self) -> CloudInferenceRequest:
        if (self.inputs is None) == (self.messages is None):
            raise ValueError("send either inputs (kserve-v2) or messages (openai)")
        return self


class TensorOut(BaseModel):
    name: str
    shape: list[int] = []
    datatype: str | None = None
    data: list[Any] = []


class CloudInferenceView(BaseModel):
    protocol: str
    model: str
    model_version: str | None = None
    outputs: list[TensorOut] | None = None
    message: str | None = None
    redacted: int = Field(description="Identifiers removed from what was sent")
    patient_identifiers_sent: bool
    support: Support


# --- what may leave ------------------------------------------------------------------------------
def patient_identifiers(patient: JSON) -> list[str]:
    """The strings that identify the patient, longest first (so a full name goes before
    its parts)."""
    found: set[str] = set()
    for name in patient.get("name") or []:
        found |= {*name.get("given", []), name.get("family") or "", name.get("text") or ""}
    for identifier in patient.get("identifier") or []:
        found.add(str(identifier.get("value") or ""))
    for telecom in patient.get("telecom") or []:
        found.add(str(telecom.get("value") or ""))
    for address in patient.get("address") or []:
        found |= set(address.get("line") or [])
    found.add(patient.get("birthDate") or "")
    return sorted((s for s in found if len(s) >= 2), key=len, reverse=True)


class Scrubber:
    def __init__(self, identifiers: list[str]):
        self.patterns = [re.compile(rf"(?<!\w){re.escape(s)}(?!\w)", re.IGNORECASE)
                         for s in identifiers]
        self.count = 0

    def __call__(self, text: str) -> str:
        for pattern in [EMAIL, PHONE, *self.patterns]:  # whole addresses before names
            text, found = pattern.subn(REDACTED, text)
            self.count += found
        return text


def outgoing(body: CloudInferenceRequest, protocol: str, model: str,
             scrub: Scrubber | None) -> JSON:
    clean = scrub or (lambda text: text)
    if protocol == "openai":
        if body.messages is None:
            raise ApiError(422, "VALIDATION_ERROR", "The endpoint is OpenAI-compatible: "
                           "send messages", field="messages")
        sent: JSON = {"model": model, "messages": [
            {"role": m.role, "content": clean(m.content)} for m in body.messages]}
        if body.max_tokens:
            sent["max_tokens"] = body.max_tokens
        return sent
    if body.inputs is None:
        raise ApiError(422, "VALIDATION_ERROR", "The endpoint speaks KServe v2: send inputs",
                       field="inputs")
    return {"inputs": [{**t.model_dump(), "data": [clean(v) if isinstance(v, str) else v
                                                   for v in t.data]} for t in body.inputs]}


# --- the exchange ----------------------------------------------------------------------------
def _endpoint(settings: Settings, model: str) -> str:
    base = settings.ai_cloud_url.rstrip("/")
    if settings.ai_cloud_protocol == "openai":
        return f"{base}/chat/completions"
    return f"{base}/v2/models/{quote(model, safe='')}/infer"


async def exchange(settings: Settings, url: str, payload: bytes) -> JSON:
    headers = {"Content-Type": "application/json"}
    if settings.ai_cloud_api_key:
        headers["Authorization"] = f"Bearer {settings.ai_cloud_api_key}"
    limit = settings.ai_cloud_max_response_bytes
    try:
        async with httpx.AsyncClient(timeout=settings.ai_cloud_timeout_seconds) as client, \
                client.stream("POST", url, content=payload, headers=headers) as response:
            received = bytearray()
            async for chunk in response.aiter_bytes():
                received += chunk
                if len(received) > limit:
                    raise ApiError(502, "CLOUD_RESPONSE_TOO_LARGE", "The inference endpoint "
                                   f"answered more than {limit} bytes")
    except httpx.TimeoutException:
        raise ApiError(504, "CLOUD_TIMEOUT", "The inference endpoint did not answer within "
                       f"{settings.ai_cloud_timeout_seconds:g} s") from None
    except httpx.HTTPError as exc:
        raise ApiError(502, "CLOUD_INFERENCE_FAILED", "The inference endpoint could not be "
                       f"reached ({type(exc).__name__})") from None
    if response.status_code >= 400:
        raise ApiError(502, "CLOUD_INFERENCE_FAILED", "The inference endpoint refused the "
                       f"request with {response.status_code}: {_reason(bytes(received))}")
    try:
        answer = orjson.loads(received)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise ApiError(502, "CLOUD_INFERENCE_FAILED", "The inference endpoint's answer is "
                       "not a JSON object")
    return answer


def _reason(body: bytes) -> str:
    try:
        said = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace")
    error = said.get("error") if isinstance(said, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return str(message or said)[:200]


def read_answer(protocol: str, model: str, answer: JSON) -> JSON:
    try:
        if protocol == "openai":
            return {"model": str(answer.get("model") or model), "model_version": None,
                    "message": str(answer["choices"][0]["message"]["content"])}
        outputs = [TensorOut(**o).model_dump() for o in answer["outputs"]]
        return {"model": str(answer.get("model_name") or model),
                "model_version": answer.get("model_version"), "outputs": outputs}
    except (KeyError, IndexError, TypeError, ValueError):
        raise ApiError(502, "CLOUD_INFERENCE_FAILED", f"The inference endpoint's answer is "
                       f"not a {protocol} answer") from None


router = APIRouter(tags=["ai"])


@router.post("/api/ai/cloud-inference", response_model=Envelope[CloudInferenceView],
             summary="Forward a request to the configured remote inference endpoint "
                     "(KServe v2 or OpenAI-compatible), without patient identifiers")
async def cloud_inference(body: CloudInferenceRequest,
                          ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("ai.decision-support")
    settings = ctx.services.settings
    if not settings.ai_cloud_url:
        raise ApiError(503, "CLOUD_INFERENCE_NOT_CONFIGURED", "No remote inference "
                       "endpoint is configured (HEALTHPLATFORM_AI_CLOUD_URL)")
    patient = await patient_for(ctx, body.patient_id)
    model = body.model or settings.ai_cloud_model
    if not model:
        raise ApiError(422, "VALIDATION_ERROR", "Name the model", field="model")
    protocol = settings.ai_cloud_protocol
    identifiers_allowed = settings.ai_cloud_send_patient_identifiers
    scrub = None if identifiers_allowed else Scrubber(
        patient_identifiers(patient) if patient else [])
    payload = orjson.dumps(outgoing(body, protocol, model, scrub))
    if len(payload) > settings.ai_cloud_max_request_bytes:
        raise ApiError(413, "CLOUD_REQUEST_TOO_LARGE", "The request would send more than "
                       f"{settings.ai_cloud_max_request_bytes} bytes")
    answer = read_answer(protocol, model, await exchange(
        settings, _endpoint(settings, model), payload))
    host = urlsplit(settings.ai_cloud_url).netloc
    support = Support(
        based_on=[Basis(kind="model", name=answer["model"], version=answer["model_version"],
                        source=f"remote {protocol} endpoint at {host}")],
        inputs=[InputUsed(name=t.name, value=f"{t.datatype}{t.shape}")
                for t in body.inputs or []] + [
            InputUsed(name=f"message {i + 1} ({m.role})", value=f"{len(m.content)} chars")
            for i, m in enumerate(body.messages or [])])
    view = {"protocol": protocol, **answer, "redacted": scrub.count if scrub else 0,
            "patient_identifiers_sent": identifiers_allowed and patient is not None}
    return ok(await answered(ctx, "cloud-inference", view, support, patient=patient,
                             summary=f"{protocol} {answer['model']} at {host}"))


__all__ = ["Scrubber", "patient_identifiers", "router"]
