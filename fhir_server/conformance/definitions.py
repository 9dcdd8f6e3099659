"""The R4 StructureDefinitions the server ships: every resource, data type, core extension
and other core profile, as snapshots (``fhir_server/data/r4-structure-definitions.json.gz``,
generated from the official definitions by ``scripts/generate_conformance_data.py``).

Loaded once, on first use (~0.2 s, or at start-up through ``preload``)."""

from __future__ import annotations

import gzip
import json
from functools import cache
from importlib import resources
from typing import Any

from fhir_server import added_types

CORE = "http://hl7.org/fhir/StructureDefinition/"
FHIR_VERSION = "4.0.1"


@cache
def shipped_structure_definitions() -> dict[str, dict[str, Any]]:
    """Canonical URL → StructureDefinition (snapshot only)."""
    data = resources.files("fhir_server.data").joinpath("r4-structure-definitions.json.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as text:
        definitions: list[dict[str, Any]] = json.load(text)
    # The types this server adds to R4 (SQL on FHIR's ViewDefinition), as R4's own.
    definitions += added_types.structures()
    return {sd["url"]: sd for sd in definitions}


def core_url(type_code: str) -> str:
    """The canonical URL of the base definition of a type (``Patient``, ``HumanName``)."""
    if "/" in type_code:
        return type_code
    added = added_types.structure(type_code)  # a type this server adds has its own URL
    return str(added["url"]) if added is not None else CORE + type_code


def split_canonical(canonical: str) -> tuple[str, str | None]:
    """``url|version`` → (url, version or None)."""
    url, _, version = canonical.partition("|")
    return url, version or None


@cache
def primitive_types() -> frozenset[str]:
    return frozenset(sd["type"] for sd in shipped_structure_definitions().values()
                     if sd.get("kind") == "primitive-type")


@cache
def resource_type_names() -> frozenset[str]:
    """Every R4 resource type, abstract ones included (Resource, DomainResource)."""
    return frozenset(sd["type"] for sd in shipped_structure_definitions().values()
                     if sd.get("kind") == "resource" and sd.get("derivation") != "constraint")


@cache
def complex_types() -> frozenset[str]:
    return frozenset(sd["type"] for sd in shipped_structure_definitions().values()
                     if sd.get("kind") == "complex-type"
                     and sd.get("derivation") != "constraint")


def is_primitive(type_code: str) -> bool:
    return type_code in primitive_types()


@cache
def type_ancestors(type_code: str) -> tuple[str, ...]:
    """``type_code`` and the types it specializes, nearest first (Patient, DomainResource,
    Resource); ``Quantity`` for the Quantity profiles (SimpleQuantity, Age, ...)."""
    chain = [type_code]
    definitions = shipped_structure_definitions()
    sd = definitions.get(core_url(type_code))
    while sd is not None and sd.get("baseDefinition"):
        base = definitions.get(sd["baseDefinition"])
        if base is None:
            break
        if base["type"] not in chain:
            chain.append(base["type"])
        sd = base
    return tuple(chain)


def specializes(type_code: str, ancestor: str) -> bool:
    """Whether ``type_code`` is ``ancestor`` or derives from it (Patient → Resource)."""
    return ancestor in type_ancestors(type_code)
