"""The public-health reports' line lists, as SQL on FHIR ViewDefinitions shipped as data.

``data/views/*.json`` holds one ViewDefinition per line list (``notifiable_cases``: a row
per notifiable case; ``patient_birth_dates``: a row per patient; the syndromic
surveillance's ``surveillance_encounters``, ``surveillance_conditions`` and
``surveillance_observations``: what each encounter, diagnosis and measurement says).
They are checked and compiled once, as a stored view would be
(:func:`fhir_server.views.definition.compile_view`, strict), and the reports aggregate
their rows: what a case's disease, onset, facility,
classification or outcome is comes from the view, where an analyst can read and change
it (the same file runs as is through ``POST /fhir/ViewDefinition/$run``).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from fhir_server.views.definition import CompiledView, compile_view

JSON = dict[str, Any]


@cache
def line_list(name: str) -> CompiledView:
    """The shipped view ``name``, compiled (a view that does not compile stops the server
    at start: :func:`platform_api.public_health.install` reads them all)."""
    text = resources.files("platform_api.public_health").joinpath(
        f"data/views/{name}.json").read_text(encoding="utf-8")
    return compile_view(json.loads(text), where=f"data/views/{name}.json")


def rows(name: str, found: list[JSON]) -> list[JSON]:
    """The rows of view ``name`` over ``found`` (resources of other types give none)."""
    view = line_list(name)
    return [row for resource in found for row in view.dicts(resource)]


VIEWS = ("notifiable_cases", "patient_birth_dates", "surveillance_encounters",
         "surveillance_conditions", "surveillance_observations")
