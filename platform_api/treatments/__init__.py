"""The Treatments area: treatment protocols and patients' treatments started from them.

- :mod:`.protocols`: treatment protocols → FHIR PlanDefinition (clinical-protocol),
  versioned, retired rather than deleted once in use;
- :mod:`.plans`: a patient's treatment → CarePlan instantiated from a protocol, its
  activities dated by :mod:`.schedule` from the protocol's timings.

:func:`start` stores the protocols shipped in ``data/`` (the WHO regimens for
drug-susceptible tuberculosis and first-line antiretroviral therapy) once.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from fastapi import APIRouter

from platform_api.services import Services
from platform_api.treatments import plans, protocols

router = APIRouter()
router.include_router(protocols.router)
router.include_router(plans.router)


def shipped_protocols() -> list[dict[str, Any]]:
    """The protocols in ``data/*.json`` (each an /api protocol payload)."""
    folder = resources.files(__package__) / "data"
    return [json.loads(f.read_text(encoding="utf-8")) for f in sorted(
        folder.iterdir(), key=lambda f: f.name) if f.name.endswith(".json")]


async def start(services: Services) -> None:
    await protocols.seed(services, shipped_protocols())


__all__ = ["router", "shipped_protocols", "start"]
