"""The matcher behind the FHIR operation ``Patient/$match``
(:mod:`fhir_server.interactions.match`): the MPI's candidates for the Patient given, read
through the caller's access (what the caller may not see is left out, as in a search),
graded as the MPI grades them (``certain``: the index would link it by itself); a
record merged away answers as its golden record."""

from __future__ import annotations

from typing import Any

from fhir_server.access import AccessDenied
from fhir_server.caller import CallerFhir
from fhir_server.interactions.match import PatientMatcher
from platform_api.mpi.service import mpi_of
from platform_api.services import Services

JSON = dict[str, Any]


def patient_matcher(services: Services) -> PatientMatcher:
    async def matcher(caller: CallerFhir, patient: JSON, count: int, only_certain: bool
                      ) -> list[tuple[JSON, float, str]]:
        mpi = mpi_of(services)
        found = await mpi.match(mpi.demographics(patient), limit=count)
        answered = []
        for pair in found:
            if only_certain and pair.grade != "certain":
                continue
            try:
                stored = await caller.find_json("Patient", pair.scored.id)
            except AccessDenied:
                continue
            if stored is None:
                continue
            answered.append((stored, pair.scored.probability, pair.grade or "possible"))
        return answered
    return matcher
