"""The master patient index area (platform administrators only).

:mod:`.matching` is the record linkage model (Fellegi-Sunter weights, EM estimation,
blocking, the in-memory index); :mod:`.service` the index at run time, the background
comparison of every new or changed Patient, links and match decisions; :mod:`.routes`
the /api/mpi routes; :mod:`.fhir_match` the FHIR operation ``Patient/$match``.
:func:`start` subscribes the background comparison to the FHIR resource events.
"""

from __future__ import annotations

from platform_api.mpi.routes import router
from platform_api.mpi.service import start

__all__ = ["router", "start"]
