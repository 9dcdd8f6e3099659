"""The HMIS export and push of notifiable cases: ``GET /api/public-health/hmis-export``
and ``POST /api/public-health/hmis-push`` (a facility's ``ORG:ADMIN`` or a platform
administrator).

A week's cases of a facility become a DHIS2 ``dataValueSets`` document
(:mod:`.reporting`): per disease of the mapping (``data/hmis_mapping.json`` or
``HEALTHPLATFORM_HMIS_MAPPING_FILE``) and per age group (age at onset, from the
Patient's birth date; unknown ages count in the oldest group) two values, the cases and
the deaths (cases whose outcome is died), zeros included: IDSR counts a reported zero
("zero reporting"), and a zero sent again overwrites a count that a reclassification
(discarded) has since removed. The period is the week of onset (``2026W47``), the
organisation unit the facility's identifier in the mapping's system.

The push sends that document to the configured DHIS2 (:mod:`.dhis2`), records DHIS2's
import summary (document ``hmis_pushes``) and emits ``platform.public_health.hmis_pushed``.
Pushing a period again sends the whole period again: DHIS2 updates the values it holds
(``importCount.updated``) rather than adding to them.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from platform_api.envelope import Envelope, ok
from platform_api.facade import ApiContext, api_context
from platform_api.public_health.knowledge import HmisMapping
from platform_api.public_health.reporting import (
    HMIS_REFUSALS,
    PERIOD_PATTERN,
    Case,
    DataValue,
    DataValueSet,
    PushRequest,
    PushView,
    cases_between,
    hmis_facility,
    last_complete_week,
    mapping,
    org_unit_of,
    owned_by,
    push,
    week_days,
)

router = APIRouter(tags=["public-health"])
TOPIC = "platform.public_health.hmis_pushed"


def _age_group(m: HmisMapping, age: int | None) -> str:
    for group in m.age_groups:
        if group.below_years is not None and age is not None and age < group.below_years:
            return group.category_option_combo
    return m.age_groups[-1].category_option_combo


def case_values(m: HmisMapping, cases: list[Case], period: str, org_unit: str
                ) -> DataValueSet:
    counted: Counter[tuple[str, str]] = Counter()
    for case in cases:
        elements = m.disease_elements.get(case.disease.key)
        if elements is None:
            continue
        combo = _age_group(m, case.age_years)
        counted[(elements["cases"], combo)] += 1
        if case.died:
            counted[(elements["deaths"], combo)] += 1
    values = [DataValue(dataElement=element, period=period, orgUnit=org_unit,
                        categoryOptionCombo=group.category_option_combo,
                        value=str(counted[(element, group.category_option_combo)]))
              for elements in m.disease_elements.values()
              for element in (elements["cases"], elements["deaths"])
              for group in m.age_groups]
    return DataValueSet(dataSet=m.cases_data_set, period=period, orgUnit=org_unit,
                        dataValues=values)


async def weekly_case_values(ctx: ApiContext, org_id: str, period: str | None
                             ) -> DataValueSet:
    period = period or last_complete_week()
    monday, sunday = week_days(period)
    org_unit = await org_unit_of(ctx, org_id)
    cases = await cases_between(ctx, monday, sunday, owned_by(org_id))
    return case_values(mapping(ctx), cases, period, org_unit)


@router.get("/api/public-health/hmis-export", response_model=Envelope[DataValueSet],
            responses={k: v for k, v in HMIS_REFUSALS.items() if k in (404, 409)},
            summary="A week's notifiable cases of a facility as a DHIS2 dataValueSets "
                    "document (cases and deaths per disease and age group)")
async def hmis_export(
    ctx: ApiContext = Depends(api_context),
    period: Annotated[str | None, Query(pattern=PERIOD_PATTERN, examples=["2026W47"],
                                        description="ISO week; default the last complete "
                                                    "one")] = None,
    org_id: Annotated[str | None, Query(max_length=64)] = None,
) -> Any:
    facility = await hmis_facility(ctx, org_id)
    return ok((await weekly_case_values(ctx, facility, period)).model_dump())


@router.post("/api/public-health/hmis-push", response_model=Envelope[PushView],
             responses=HMIS_REFUSALS,
             summary="Push a week's notifiable cases to the HMIS (DHIS2 dataValueSets); "
                     "idempotent per period; answers DHIS2's import summary")
async def hmis_push(body: PushRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    facility = await hmis_facility(ctx, body.org_id)
    values = await weekly_case_values(ctx, facility, body.period)
    return ok(await push(ctx, "cases", facility, values, TOPIC))
