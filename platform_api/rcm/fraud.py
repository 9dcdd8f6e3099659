"""Fraud flags on claims: explainable rules over the FHIR Claims of a period the caller may
see (and their Patients), each flag naming its rule, the claim and the evidence.

Rules (data below where the rule is a table):

- ``duplicate_claim``: another claim (not cancelled) bills the same patient for the same
  service on the same day;
- ``service_after_death`` / ``service_before_birth``: the service date is after the
  patient's ``deceasedDateTime`` or before their ``birthDate``;
- ``impossible_quantity``: a line with more units than ``HEALTHPLATFORM_RCM_FRAUD_MAX_
  QUANTITY`` (default 60; none or fewer is refused when the claim is written);
- ``sex_inconsistent`` / ``age_inconsistent``: an ICD-10 diagnosis of a chapter block
  restricted to one sex, or to an age range, for a patient outside it (``SEX_SPECIFIC``,
  ``AGE_SPECIFIC``: ICD-10 chapters XV, XIV, II);
- ``billed_amount_outlier``: the unit price of a service is a statistical outlier among
  the same provider's claims for that service (modified z-score from the median and the
  median absolute deviation, |z| > 3.5, Iglewicz and Hoaglin 1993; at least 5 prices).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from statistics import median
from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from platform_api.envelope import PageEnvelope, Pagination, pagination
from platform_api.facade import ApiContext, api_context
from platform_api.fhir_values import amount_text, coding, decimal_of, local_id
from platform_api.rcm.claims import claim_service_date, stage_of
from platform_api.rcm.ledger import Period, claims_of_period, period

JSON = dict[str, Any]
router = APIRouter(tags=["rcm"])
RULES = ("duplicate_claim", "service_after_death", "service_before_birth",
         "impossible_quantity", "sex_inconsistent", "age_inconsistent",
         "billed_amount_outlier")
# (first, last ICD-10 category, the sex it applies to, the block's title)
SEX_SPECIFIC = (
    ("O00", "O9A", "female", "Pregnancy, childbirth and the puerperium"),
    ("Z32", "Z37", "female", "Pregnancy, supervision of pregnancy, outcome of delivery"),
    ("N70", "N98", "female", "Diseases of the female pelvic organs and genital tract"),
    ("C51", "C58", "female", "Malignant neoplasms of female genital organs"),
    ("N40", "N53", "male", "Diseases of male genital organs"),
    ("C60", "C63", "male", "Malignant neoplasms of male genital organs"),
)
# (first, last ICD-10 category, youngest, oldest age in years, the block's title)
AGE_SPECIFIC = (
    ("O00", "O9A", 10, 55, "Pregnancy, childbirth and the puerperium"),
    ("Z32", "Z37", 10, 55, "Pregnancy, supervision of pregnancy, outcome of delivery"),
)
OUTLIER_Z = Decimal("3.5")
OUTLIER_MIN_PRICES = 5
MAD_SCALE = Decimal("0.6745")


class FraudFlag(BaseModel):
    rule: str = Field(description=", ".join(RULES))
    claim_id: str
    claim_number: str | None
    patient_id: str | None
    organization_id: str | None
    service_date: str | None
    explanation: str
    evidence: dict[str, Any]


@dataclass
class Context:
    claims: list[JSON]
    patients: dict[str, JSON]
    max_quantity: int


def _flag(rule: str, claim: JSON, explanation: str, **evidence: Any) -> JSON:
    return FraudFlag(rule=rule, claim_id=claim["id"],
                     claim_number=(claim.get("identifier") or [{}])[0].get("value"),
                     patient_id=local_id(claim.get("patient"), "Patient"),
                     organization_id=local_id(claim.get("provider"), "Organization"),
                     service_date=claim_service_date(claim), explanation=explanation,
                     evidence=evidence).model_dump()


def _service(item: JSON) -> str:
    concept = item.get("productOrService") or {}
    first = coding(concept)
    return f"{first.get('system', '')}|{first['code']}" if first.get("code") else \
        f"text|{(concept.get('text') or '').strip().lower()}"


def _lines(claim: JSON) -> Iterator[tuple[JSON, str, str | None]]:
    for item in claim.get("item", []):
        yield item, _service(item), item.get("servicedDate") or claim_service_date(claim)


def duplicates(world: Context) -> Iterator[JSON]:
    seen: dict[tuple[str | None, str, str | None], list[JSON]] = defaultdict(list)
    for claim in world.claims:
        for _item, service, day in _lines(claim):
            key = (local_id(claim.get("patient"), "Patient"), service, day)
            if not any(c["id"] == claim["id"] for c in seen[key]):
                seen[key].append(claim)
    for (patient, service, day), claims in seen.items():
        if len(claims) < 2:
            continue
        for claim in claims:
            others = [c["id"] for c in claims if c["id"] != claim["id"]]
            yield _flag("duplicate_claim", claim, f"Service {service} for the same patient "
                        f"on {day} is also billed in {len(others)} other claim(s)",
                        service=service, service_date=day, patient_id=patient,
                        other_claims=others)


def _day(value: Any) -> date | None:
    try:
        return date.fromisoformat(str(value)[:10]) if value else None
    except ValueError:
        return None


def life_dates(world: Context) -> Iterator[JSON]:
    for claim in world.claims:
        patient = world.patients.get(local_id(claim.get("patient"), "Patient") or "")
        served = _day(claim_service_date(claim))
        if patient is None or served is None:
            continue
        died, born = _day(patient.get("deceasedDateTime")), _day(patient.get("birthDate"))
        if died is not None and served > died:
            yield _flag("service_after_death", claim, f"Services dated {served} come "
                        f"after the patient's death on {died}", service_date=str(served),
                        deceased=str(died))
        if born is not None and served < born:
            yield _flag("service_before_birth", claim, f"Services dated {served} come "
                        f"before the patient's birth on {born}", service_date=str(served),
                        birth_date=str(born))


def quantities(world: Context) -> Iterator[JSON]:
    for claim in world.claims:
        for item, service, _ in _lines(claim):
            quantity = Decimal(str((item.get("quantity") or {}).get("value", 1)))
            if quantity > world.max_quantity:
                yield _flag("impossible_quantity", claim, f"{quantity.normalize()} units "
                            f"of {service} on one line (at most {world.max_quantity})",
                            service=service, quantity=str(quantity.normalize()),
                            limit=world.max_quantity, line=item.get("sequence"))


def _in_block(code: str, first: str, last: str) -> bool:
    return first <= code[:3] <= last


def _age(born: date, on: date) -> int:
    return on.year - born.year - ((on.month, on.day) < (born.month, born.day))


def demographics(world: Context) -> Iterator[JSON]:
    for claim in world.claims:
        patient = world.patients.get(local_id(claim.get("patient"), "Patient") or "")
        if patient is None:
            continue
        sex, born = patient.get("gender"), _day(patient.get("birthDate"))
        served = _day(claim_service_date(claim))
        codes = [c for d in claim.get("diagnosis", [])
                 if (c := coding(d.get("diagnosisCodeableConcept")).get("code"))]
        for code in codes:
            for first, last, only, title in SEX_SPECIFIC:
                if _in_block(code, first, last) and sex in ("male", "female") and sex != only:
                    yield _flag("sex_inconsistent", claim, f"{code} ({title}, {first}-"
                                f"{last}) is for {only} patients; the patient is {sex}",
                                diagnosis=code, block=f"{first}-{last}", applies_to=only,
                                patient_sex=sex)
            for first, last, youngest, oldest, title in AGE_SPECIFIC:
                if born is None or served is None or not _in_block(code, first, last):
                    continue
                age = _age(born, served)
                if not youngest <= age <= oldest:
                    yield _flag("age_inconsistent", claim, f"{code} ({title}) for a "
                                f"patient aged {age} (expected {youngest}-{oldest})",
                                diagnosis=code, block=f"{first}-{last}", patient_age=age,
                                expected=[youngest, oldest])


def outliers(world: Context) -> Iterator[JSON]:
    prices: dict[tuple[str | None, str, str], list[tuple[JSON, Decimal]]] = defaultdict(list)
    for claim in world.claims:
        currency = str((claim.get("total") or {}).get("currency") or "")
        provider = local_id(claim.get("provider"), "Organization")
        for item, service, _ in _lines(claim):
            price = decimal_of((item.get("unitPrice") or {}).get("value"))
            prices[(provider, service, currency)].append((claim, price))
    for (provider, service, currency), found in prices.items():
        if len(found) < OUTLIER_MIN_PRICES:
            continue
        values = [p for _c, p in found]
        middle = median(values)
        mad = median([abs(v - middle) for v in values])
        if mad == 0:
            continue
        for claim, price in found:
            z = MAD_SCALE * (price - middle) / mad
            if abs(z) > OUTLIER_Z:
                yield _flag("billed_amount_outlier", claim, f"{service} billed at "
                            f"{amount_text(price)} {currency} a unit against a median of "
                            f"{amount_text(middle)} at this provider (modified z-score "
                            f"{z:.1f})", service=service, unit_price=amount_text(price),
                            median=amount_text(middle), mad=amount_text(mad),
                            z_score=float(round(z, 2)), prices=len(values),
                            provider_id=provider, currency=currency)


RULE_CHECKS = (duplicates, life_dates, quantities, demographics, outliers)


def fraud_flags(claims: list[JSON], patients: dict[str, JSON], max_quantity: int
                ) -> list[JSON]:
    world = Context([c for c in claims if stage_of(c) != "cancelled"], patients,
                    max_quantity)
    return [flag for check in RULE_CHECKS for flag in check(world)]


async def patients_of(ctx: ApiContext, claims: list[JSON]) -> dict[str, JSON]:
    ids = sorted({p for c in claims if (p := local_id(c.get("patient"), "Patient"))})
    found: dict[str, JSON] = {}
    for at in range(0, len(ids), 100):
        for patient in await ctx.fhir.search("Patient", [("_id", ",".join(ids[at:at + 100]))]):
            found[patient["id"]] = patient
    return found


@router.get("/api/rcm/claims/fraud-flags", response_model=PageEnvelope[FraudFlag],
            summary="Claims flagged by explainable rules (duplicates, dates outside the "
                    "patient's life, impossible quantities, sex or age, price outliers)")
async def list_fraud_flags(when: Period = Depends(period),
                           rule: str | None = Query(None, pattern="^(" + "|".join(RULES)
                                                    + ")$"),
                           page: Pagination = Depends(pagination),
                           ctx: ApiContext = Depends(api_context)) -> Any:
    claims = await claims_of_period(ctx, when)
    flags = fraud_flags(claims, await patients_of(ctx, claims),
                        ctx.services.settings.rcm_fraud_max_quantity)
    if rule is not None:
        flags = [f for f in flags if f["rule"] == rule]
    return page.respond(flags[page.offset:page.offset + page.limit], len(flags))
