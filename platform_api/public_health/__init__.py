"""Public health reporting and syndromic surveillance.

One module per part: :mod:`.cases` (notifiable case reports of the WHO IDSR priority
diseases → Condition, Encounter, Observations), :mod:`.dashboard` (counts by disease,
epidemiological week, facility and district, as JSON, SVG or PNG), :mod:`.hmis` (the
DHIS2 ``dataValueSets`` export and push, through the client of :mod:`.dhis2`),
:mod:`.syndromes` (syndromes of encounters from their reasons, diagnoses and vital
signs), :mod:`.ears` (the CDC EARS C1, C2 and C3 algorithms) and :mod:`.surveillance`
(the /api/surveillance routes). What is knowledge is data (:mod:`.knowledge`,
``data/``), and so are the line lists the reports count (:mod:`.views`: SQL on FHIR
ViewDefinitions in ``data/views/``).
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.public_health import cases, dashboard, hmis, surveillance
from platform_api.public_health.knowledge import (
    diseases,
    ears_parameters,
    hmis_mapping,
    syndromes,
)
from platform_api.public_health.views import VIEWS, line_list
from platform_api.services import Services

router = APIRouter()
router.include_router(cases.router)
router.include_router(hmis.router)
router.include_router(dashboard.router)
router.include_router(surveillance.router)



def install(services: Services) -> None:
    """Read the knowledge files and the HMIS mapping now, so that a deployment's mapping
    that does not fit (an unknown disease or syndrome, no open last age group, a file
    that is not there) stops the server at start, saying what is wrong."""
    diseases()
    syndromes()
    ears_parameters()
    hmis_mapping(services.settings.hmis_mapping_file)
    for view in VIEWS:
        line_list(view)


__all__ = ["install", "router"]
