"""Revenue cycle area (spec: Endpoints, Revenue cycle): claims from draft to paid with the
payers' APIs, eligibility and pre-authorization, analytics, fraud flags, reconciliation,
invoices, and the insurance marketplace. One module per part, each stating its FHIR
mapping:

- :mod:`~.claims`: Claim (with its status table), ClaimResponse, CoverageEligibilityRequest
  and CoverageEligibilityResponse; :mod:`~.payers`: the payers' APIs (FHIR or their own);
- :mod:`~.analytics`: by insurer, by provider, reconciliation; :mod:`~.fraud`: the rules;
  :mod:`~.ledger`: the claims, decisions and payments those reports read;
- :mod:`~.invoices`: Invoice (taxes, totals);
- :mod:`~.insurance`: InsurancePlan, Coverage (enrolment, policies).

``router`` mounts them all, the static ``/api/rcm/claims/...`` paths before
``/api/rcm/claims/{id}``.
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.rcm import analytics, claims, fraud, insurance, invoices

router = APIRouter()
for _part in (analytics.router, fraud.router, claims.router, claims.item_router,
              invoices.router, insurance.router):
    router.include_router(_part)

__all__ = ["router"]
