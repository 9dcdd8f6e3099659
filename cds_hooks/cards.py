"""What a CDS service is given and how it answers: the :class:`Invocation` (request,
typed context, prefetch data, the knowledge it may consult) and card builders that keep
the spec's rules (a summary under 140 characters, a source, override reasons, a
suggestion that removes a draft order)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from cds_hooks.models import (
    Action,
    Card,
    CardSource,
    CdsResponse,
    HookRequest,
    Link,
    OverrideReason,
    PatientContext,
    ServiceDefinition,
    Suggestion,
)

JSON = dict[str, Any]
Indicator = Literal["info", "warning", "critical"]
SUMMARY_LIMIT = 139
OVERRIDE_SYSTEM = "urn:healthplatform:cds:override-reason"
OVERRIDE_REASONS = (
    ("benefit-outweighs-risk", "Benefit outweighs the risk"),
    ("monitoring-in-place", "Monitoring is in place"),
    ("tolerated-before", "Patient has tolerated the combination before"),
    ("not-applicable", "Alert does not apply to this patient"),
)
INDICATOR_OF_SEVERITY: Mapping[str, Indicator] = {
    "critical": "critical", "high": "critical", "moderate": "warning", "low": "info"}


@dataclass
class Invocation:
    """One call of one service."""

    request: HookRequest
    context: PatientContext
    prefetch: dict[str, Any]
    now: datetime
    vitals_max_age: timedelta
    interaction_table: Callable[[], Awaitable[Any]]  # the current InteractionTable
    extras: dict[str, Any] = field(default_factory=dict)


Runner = Callable[[Invocation], Awaitable[CdsResponse]]


@dataclass(frozen=True)
class CdsService:
    """A service of the catalogue: its discovery entry (one per hook) and its runner."""

    id: str
    hooks: tuple[str, ...]
    title: str
    description: str
    prefetch: Mapping[str, str]
    run: Runner
    usage_requirements: str | None = None

    def definitions(self) -> list[ServiceDefinition]:
        return [ServiceDefinition(hook=hook, title=self.title, description=self.description,
                                  id=self.id, prefetch=dict(self.prefetch) or None,
                                  usageRequirements=self.usage_requirements)
                for hook in self.hooks]


def summary_of(text: str) -> str:
    """A card summary under 140 characters (cut at a word, with an ellipsis)."""
    text = " ".join(text.split())
    if len(text) <= SUMMARY_LIMIT:
        return text
    cut = text[:SUMMARY_LIMIT - 1].rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:-") + "…"


def source(label: str, url: str | None = None) -> CardSource:
    return CardSource(label=label, url=url)


def override_reasons() -> list[OverrideReason]:
    return [OverrideReason(code=code, system=OVERRIDE_SYSTEM, display=display)
            for code, display in OVERRIDE_REASONS]


def remove_draft(reference: str, label: str) -> Suggestion:
    """A suggestion that deletes the draft order ``Type/id``."""
    return Suggestion(label=label, uuid=str(uuid.uuid4()), isRecommended=True,
                      actions=[Action(type="delete", description=label, resourceId=reference)])


def card(summary: str, indicator: Indicator, card_source: CardSource, *,
         detail: str | None = None, suggestions: Sequence[Suggestion] = (),
         overridable: bool = False, links: Sequence[Link] = ()) -> Card:
    return Card(uuid=str(uuid.uuid4()), summary=summary_of(summary), indicator=indicator,
                detail=detail, source=card_source, suggestions=list(suggestions) or None,
                selectionBehavior="at-most-one" if suggestions else None,
                overrideReasons=override_reasons() if overridable else None,
                links=list(links) or None)


def source_link(label: str | None, url: str | None) -> list[Link]:
    return [Link(label=label or url, url=url, type="absolute")] if url \
        and url.startswith(("http://", "https://")) else []
