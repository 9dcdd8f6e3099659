"""The CDS Hooks 2.0 (v2.0.1) messages as pydantic models: discovery, the hook request and
the context of each hook (Hook Library 1.0.1), the response (cards, suggestions,
actions, links, system actions) and feedback.

A request is checked in two steps (:func:`parse_request`): the envelope (``hook``,
``hookInstance`` a UUID, ``fhirServer`` required with ``fhirAuthorization``: cds-r-1),
then the ``context`` against the model of its hook. A refusal is a :class:`CdsError`
400 naming the field (``context.draftOrders``, ``hookInstance``).

The response models are what this server answers, so they hold the spec's rules: a
summary under 140 characters, an indicator of info | warning | critical, a source label,
``selectionBehavior`` whenever there are suggestions (cds-resp-6), ``appContext`` only
on smart links (cds-resp-3), an action of create | update | delete with its resource
(create, update) or ``resourceId`` (delete).
"""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

JSON = dict[str, Any]
REFERENCE = r"^(Practitioner|PractitionerRole|Patient|RelatedPerson)/[A-Za-z0-9\-.]{1,64}$"
FHIR_ID = r"^[A-Za-z0-9\-.]{1,64}$"


class CdsError(Exception):
    """A refusal of a CDS Hooks call: HTTP status and what was wrong (and where)."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field
        self.headers = headers or {}

    def outcome(self) -> JSON:
        """An OperationOutcome (CDS Hooks 3.0 asks for one on errors; 2.0 says nothing)."""
        code = {400: "invalid", 401: "login", 403: "forbidden", 404: "not-found",
                412: "not-found"}.get(self.status, "processing")
        issue: JSON = {"severity": "error", "code": code, "diagnostics": self.message}
        if self.field:
            issue["expression"] = [self.field]
        return {"resourceType": "OperationOutcome", "issue": [issue]}


# -- discovery -------------------------------------------------------------------------------
class ServiceDefinition(BaseModel):
    hook: str
    title: str
    description: str
    id: str
    prefetch: dict[str, str] | None = None
    usageRequirements: str | None = None


class Discovery(BaseModel):
    services: list[ServiceDefinition]


# -- the request --------------------------------------------------------------------------------
class FhirAuthorization(BaseModel):
    access_token: str = Field(min_length=1)
    token_type: Literal["Bearer"]
    expires_in: int = Field(ge=0)
    scope: str
    subject: str
    patient: str | None = None


class HookRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    hook: str = Field(min_length=1)
    hookInstance: UUID
    fhirServer: str | None = Field(default=None, pattern=r"^https?://\S+$")
    fhirAuthorization: FhirAuthorization | None = None
    context: JSON
    prefetch: dict[str, Any] | None = None
    extension: JSON | None = None

    @model_validator(mode="after")
    def _server_with_authorization(self) -> HookRequest:
        if self.fhirAuthorization is not None and self.fhirServer is None:
            raise ValueError("fhirServer is required when fhirAuthorization is given "
                             "(cds-r-1)")
        return self


def _bundle(value: Any) -> Any:
    if not isinstance(value, dict) or value.get("resourceType") != "Bundle":
        raise ValueError("must be a FHIR Bundle")
    for i, entry in enumerate(value.get("entry") or []):
        resource = entry.get("resource") if isinstance(entry, dict) else None
        if not isinstance(resource, dict) or not isinstance(resource.get("resourceType"), str):
            raise ValueError(f"entry[{i}] has no resource")
    return value


class PatientContext(BaseModel):
    model_config = ConfigDict(extra="allow")

    userId: str = Field(pattern=REFERENCE)
    patientId: str = Field(pattern=FHIR_ID)
    encounterId: str | None = Field(default=None, pattern=FHIR_ID)


class PatientViewContext(PatientContext):
    pass


class EncounterContext(PatientContext):
    encounterId: str = Field(pattern=FHIR_ID)


class OrderSignContext(PatientContext):
    draftOrders: JSON

    _draft_orders = field_validator("draftOrders")(_bundle)

    def orders(self) -> list[JSON]:
        return [e["resource"] for e in self.draftOrders.get("entry") or []]


class OrderSelectContext(OrderSignContext):
    selections: list[str] = Field(min_length=1)

    @field_validator("selections")
    @classmethod
    def _selections_are_draft_orders(cls, selections: list[str], info: ValidationInfo
                                     ) -> list[str]:
        bundle = info.data.get("draftOrders") or {}
        drafts = {f"{e['resource']['resourceType']}/{e['resource'].get('id')}"
                  for e in bundle.get("entry") or []}
        for selection in selections:
            if selection not in drafts:
                raise ValueError(f"{selection!r} is not one of the draftOrders")
        return selections

    def selected(self) -> list[JSON]:
        chosen = set(self.selections)
        return [r for r in self.orders() if f"{r['resourceType']}/{r.get('id')}" in chosen]


class AppointmentBookContext(PatientContext):
    appointments: JSON

    _appointments = field_validator("appointments")(_bundle)


HOOK_CONTEXTS: dict[str, type[PatientContext]] = {
    "patient-view": PatientViewContext,
    "order-select": OrderSelectContext,
    "order-sign": OrderSignContext,
    "appointment-book": AppointmentBookContext,
    "encounter-start": EncounterContext,
    "encounter-discharge": EncounterContext,
}


def _field_of(error: Any, prefix: str = "") -> str:
    parts = [str(p) for p in error.get("loc", ()) if p != "__root__"]
    dotted = ""
    for part in parts:
        dotted += f"[{part}]" if part.isdigit() else (("." if dotted else "") + part)
    return ".".join(p for p in (prefix, dotted) if p)


def _refusal(exc: ValidationError, prefix: str = "") -> CdsError:
    first = exc.errors()[0]
    field = _field_of(first, prefix) or prefix or None
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        message = "required"
    return CdsError(400, f"{field}: {message}" if field else message, field)


def parse_request(body: Any, hook: str | None = None) -> tuple[HookRequest, PatientContext]:
    """The request and its typed context; ``hook`` is the hook the route expects (a
    request for another is refused naming ``hook``)."""
    if not isinstance(body, dict):
        raise CdsError(400, "The request body must be a JSON object")
    if body.get("fhirAuthorization") is not None and body.get("fhirServer") is None:
        raise CdsError(400, "fhirServer: required when fhirAuthorization is given (cds-r-1)",
                       "fhirServer")
    try:
        request = HookRequest.model_validate(body)
    except ValidationError as exc:
        raise _refusal(exc) from None
    if hook is not None and request.hook != hook:
        raise CdsError(400, f"hook: this endpoint answers {hook!r}, not {request.hook!r}",
                       "hook")
    model = HOOK_CONTEXTS.get(request.hook)
    if model is None:
        raise CdsError(400, f"hook: {request.hook!r} is not a hook this server answers "
                       f"({', '.join(HOOK_CONTEXTS)})", "hook")
    try:
        context = model.model_validate(request.context)
    except ValidationError as exc:
        raise _refusal(exc, "context") from None
    return request, context


# -- the response ----------------------------------------------------------------------------
class Coding(BaseModel):
    code: str
    system: str | None = None
    display: str | None = None


class OverrideReason(BaseModel):
    code: str
    system: str
    display: str


class CardSource(BaseModel):
    label: str = Field(min_length=1)
    url: str | None = None
    icon: str | None = None
    topic: Coding | None = None


class Action(BaseModel):
    type: Literal["create", "update", "delete"]
    description: str
    resource: JSON | None = None
    resourceId: str | None = None

    @model_validator(mode="after")
    def _target(self) -> Action:
        if self.type == "delete" and not self.resourceId and not self.resource:
            raise ValueError("a delete action names resourceId")
        if self.type != "delete" and self.resource is None:
            raise ValueError(f"a {self.type} action carries the resource")
        return self


class Suggestion(BaseModel):
    label: str
    uuid: str | None = None
    isRecommended: bool | None = None
    actions: list[Action] = []


class Link(BaseModel):
    label: str
    url: str
    type: Literal["absolute", "smart"]
    appContext: str | None = None
    autolaunchable: bool | None = None

    @model_validator(mode="after")
    def _app_context_on_smart(self) -> Link:
        if self.appContext is not None and self.type != "smart":
            raise ValueError("appContext is only for smart links (cds-resp-3)")
        return self


class Card(BaseModel):
    uuid: str | None = None
    summary: str = Field(min_length=1, max_length=139)
    detail: str | None = None
    indicator: Literal["info", "warning", "critical"]
    source: CardSource
    suggestions: list[Suggestion] | None = None
    selectionBehavior: Literal["at-most-one", "any"] | None = None
    overrideReasons: list[OverrideReason] | None = None
    links: list[Link] | None = None

    @model_validator(mode="after")
    def _selection_with_suggestions(self) -> Card:
        if self.suggestions and self.selectionBehavior is None:
            raise ValueError("selectionBehavior is required with suggestions (cds-resp-6)")
        return self


class CdsResponse(BaseModel):
    cards: list[Card] = []
    systemActions: list[Action] | None = None

    def as_json(self) -> JSON:
        return self.model_dump(exclude_none=True)


# -- feedback ------------------------------------------------------------------------------
class AcceptedSuggestion(BaseModel):
    id: str = Field(min_length=1)


class OverrideReasonGiven(BaseModel):
    reason: Coding | None = None
    userComment: str | None = Field(default=None, max_length=4000)


class FeedbackItem(BaseModel):
    card: str = Field(min_length=1, max_length=128)
    outcome: Literal["accepted", "overridden"]
    acceptedSuggestions: list[AcceptedSuggestion] | None = None
    overrideReason: OverrideReasonGiven | None = None
    outcomeTimestamp: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?"
                                  r"(Z|[+-]\d{2}:\d{2})$")

    @model_validator(mode="after")
    def _accepted_names_suggestions(self) -> FeedbackItem:
        if self.outcome == "accepted" and not self.acceptedSuggestions:
            raise ValueError("acceptedSuggestions is required when the outcome is accepted")
        if self.outcome == "accepted" and self.overrideReason is not None:
            raise ValueError("overrideReason is only for an overridden card")
        return self


class FeedbackRequest(BaseModel):
    feedback: list[FeedbackItem] = Field(min_length=1)


def parse_feedback(body: Any) -> FeedbackRequest:
    try:
        return FeedbackRequest.model_validate(body)
    except ValidationError as exc:
        raise _refusal(exc) from None
