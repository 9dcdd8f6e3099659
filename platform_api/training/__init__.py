"""Training area: courses with modules, credits and an assessment, enrolments and their
progress, continuing education credits and their summary, assessment attempts (spec:
Endpoints, Workforce and training).

One module per part, each stating its FHIR mapping (or why it keeps documents):

- :mod:`~.courses`: courses (PlanDefinition) and their assessment (Questionnaire);
- :mod:`~.enrollments`: enrolments and monotonic progress (documents);
- :mod:`~.cme`: CME/CPD credits, earned or recorded with evidence, and the summary
  against the required total (documents);
- :mod:`~.assessments`: scored attempts (QuestionnaireResponse).
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.training import assessments, cme, courses, enrollments

router = APIRouter()
for _part in (courses, enrollments, cme, assessments):
    router.include_router(_part.router)

__all__ = ["router"]
