"""The catalogue of CDS services and how a call reaches them.

The services are data: each module of a service exports its ``SERVICE`` (id, hooks,
title, description, prefetch templates, runner), and discovery lists one entry per
(service, hook). A call names a service (``POST /cds-services/{id}``, which must answer
the request's hook) or a hook (``POST /cds-hooks/{hook}``: every service of that hook,
their cards together). The prefetch the services need is resolved once per call
(:mod:`cds_hooks.prefetch`), then each service runs on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cds_hooks import allergies, interactions, news2, panic_values
from cds_hooks.cards import CdsService, Invocation
from cds_hooks.models import CdsError, CdsResponse, Discovery, HookRequest, PatientContext
from cds_hooks.prefetch import FhirSource, resolve

SERVICES: tuple[CdsService, ...] = (
    interactions.SERVICE, allergies.SERVICE, news2.SERVICE, panic_values.SERVICE)


def discovery(services: Sequence[CdsService] = SERVICES) -> Discovery:
    return Discovery(services=[d for s in services for d in s.definitions()])


def known(service_id: str) -> CdsService:
    """The service ``service_id`` (404 when there is none)."""
    found = next((s for s in SERVICES if s.id == service_id), None)
    if found is None:
        raise CdsError(404, f"There is no CDS service {service_id!r}")
    return found


def service(service_id: str, hook: str) -> CdsService:
    """The service ``service_id`` for ``hook`` (404 unknown, 400 another hook)."""
    found = known(service_id)
    if hook not in found.hooks:
        raise CdsError(400, f"hook: the service {service_id!r} answers "
                       f"{', '.join(found.hooks)}, not {hook!r}", "hook")
    return found


def for_hook(hook: str) -> list[CdsService]:
    return [s for s in SERVICES if hook in s.hooks]


@dataclass
class Invoker:
    """Runs services on a validated request."""

    knowledge: interactions.InteractionKnowledge
    vitals_max_age: timedelta = timedelta(hours=24)

    async def invoke(self, services: Sequence[CdsService], request: HookRequest,
                     context: PatientContext, source: FhirSource | None) -> CdsResponse:
        templates: dict[str, str] = {}
        for chosen in services:
            templates.update(chosen.prefetch)
        prefetch = await resolve(templates, request, source)
        invocation = Invocation(request, context, prefetch, datetime.now(UTC),
                                self.vitals_max_age, self.knowledge.table)
        response = CdsResponse()
        for chosen in services:
            answer = await chosen.run(invocation)
            response.cards += answer.cards
            if answer.systemActions:
                response.systemActions = [*(response.systemActions or []),
                                          *answer.systemActions]
        return response
