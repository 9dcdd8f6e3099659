"""Code systems defined by a grammar instead of a list of codes: MIME types (BCP 13),
language tags (BCP 47) and UCUM units. No list to look a code up in exists (or ships
here), so a code is checked by its syntax: ``True`` when it is well formed, ``False``
when it cannot be a code of the system.
"""

from __future__ import annotations

import re

MIME_TYPES = "urn:ietf:bcp:13"
LANGUAGES = "urn:ietf:bcp:47"
UCUM = "http://unitsofmeasure.org"

_TOKEN = r"[A-Za-z0-9!#$&^_.+\-]+"
_MIME = re.compile(rf"^{_TOKEN}/{_TOKEN}(\s*;\s*{_TOKEN}=(\"[^\"]*\"|[^;\s]+))*$")
# RFC 5646 language tags: language, extlang, script, region, variants, extensions,
# private use (grandfathered tags aside).
_LANGUAGE = re.compile(
    r"^(?:[A-Za-z]{2,3}(?:-[A-Za-z]{3}){0,3}|[A-Za-z]{4,8})"
    r"(?:-[A-Za-z]{4})?(?:-(?:[A-Za-z]{2}|[0-9]{3}))?"
    r"(?:-(?:[A-Za-z0-9]{5,8}|[0-9][A-Za-z0-9]{3}))*"
    r"(?:-[0-9A-WY-Za-wy-z](?:-[A-Za-z0-9]{2,8})+)*(?:-[xX](?:-[A-Za-z0-9]{1,8})+)?$"
    r"|^[xX](?:-[A-Za-z0-9]{1,8})+$")
# UCUM's syntax (The Unified Code for Units of Measure, 2.1 §1-§9): terms of annotated
# atoms with prefixes and exponents joined by '.' and '/'. Atoms themselves are not
# listed here, so a well-formed expression of unknown atoms passes.
_ANNOTATION = r"\{[^{}]*\}"
_ATOM = r"[A-Za-z%'\[\]\^*0-9_:]*[A-Za-z%'\[\]\^*_:](?:[+-]?[0-9]+)?"
_SIMPLE = rf"(?:{_ATOM}|[0-9]+)(?:{_ANNOTATION})?|{_ANNOTATION}"
_UCUM = re.compile(rf"^/?(?:{_SIMPLE}|\((?:[^()]+)\))(?:[./](?:{_SIMPLE}|\((?:[^()]+)\)))*$")

GRAMMAR_SYSTEMS = frozenset({MIME_TYPES, LANGUAGES, UCUM})


def grammar_check(system: str, code: str) -> bool | None:
    """Whether ``code`` is well formed in ``system``; None for a system not defined by a
    grammar here."""
    if system == MIME_TYPES:
        return bool(_MIME.match(code.strip()))
    if system == LANGUAGES:
        return bool(_LANGUAGE.match(code))
    if system == UCUM:
        return bool(code) and not any(c.isspace() for c in code) and bool(_UCUM.match(code))
    return None
