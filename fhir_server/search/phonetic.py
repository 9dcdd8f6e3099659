"""Phonetic codes for the ``phonetic`` search parameters of Patient, Person, Practitioner
and RelatedPerson: "a portion of either family or given name using some kind of phonetic
matching algorithm" (R4).

The algorithm is Metaphone (``jellyfish``): spellings that sound alike share a code,
``Mohammed`` / ``Muhammad`` / ``Mohamed`` → ``MHMT``, ``Smith`` / ``Smyth`` → ``SM0``,
``Kwame`` / ``Kwami`` → ``KWM``, ``Okafor`` / ``Okaafor`` → ``OKFR``. Accents go first
(``Wanjirũ`` is ``Wanjiru``); a name of several words has one code per word. The index
stores the code of each name part (the string index's ``value``, the text as written in
``exact``) and a search the code of its value, compared for equality.
"""

from __future__ import annotations

import re
from functools import lru_cache

import jellyfish

from fhir_server.search.values import normalize

PARAM = "phonetic"  # the code of every such parameter in R4
_WORD = re.compile(r"[^\W\d_]+")  # letters only: digits and punctuation have no sound


@lru_cache(maxsize=65536)  # names repeat: a population has far fewer than its people
def phonetic_code(text: str) -> str:
    """The code of a name (part); empty when it has no letters."""
    return " ".join(code for word in _WORD.findall(normalize(text))
                    if (code := jellyfish.metaphone(word)))
