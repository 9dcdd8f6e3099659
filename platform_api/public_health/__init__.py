"""Public health reporting and syndromic surveillance.

One module per part: :mod:`.cases` (notifiable case reports of the WHO IDSR priority
diseases → Condition, Encounter, Observations), :mod:`.dashboard` (counts by disease,
epidemiological week, facility and district, as JSON, SVG or PNG), :mod:`.hmis` (the
DHIS2 ``dataValueSets`` export and push, through the client of :mod:`.dhis2`),
:mod:`.syndromes` (syndromes of encounters from their reasons, diagnoses and vital
signs), :mod:`.ears` (the CDC EARS C1, C2 and C3 algorithms) and :mod:`.surveillance`
(the /api/surveillance routes). What is knowledge is data (:mod:`.knowledge`,
``data/``).
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.public_health import cases, dashboard, hmis, surveillance

router = APIRouter()
router.include_router(cases.router)
router.include_router(hmis.router)
router.include_router(dashboard.router)
router.include_router(surveillance.router)

__all__ = ["router"]
