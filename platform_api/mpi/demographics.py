"""A patient's demographics as the master patient index compares them.

:class:`Demographics` holds normalised values: names lower case with accents, digits and
punctuation dropped (given names kept as tokens: ``"amina w"`` is the given name Amina and
the middle initial W), their phonetic codes (``jellyfish``: Metaphone and NYSIIS, which
also fold transliteration variants such as Mohamed / Mohammed / Muhammad), the birth date,
sex, phones in E.164 (``phonenumbers``), e-mails, the address line with its common
abbreviations spelt out (``Rd`` → ``road``), city, postal code, national identifiers and
MRNs. :func:`demographics` reads them from a FHIR Patient; :meth:`Demographics.of` from
raw values (the /api match form, the bench).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jellyfish
import phonenumbers

JSON = dict[str, Any]
V2_0203 = "http://terminology.hl7.org/CodeSystem/v2-0203"

# Address words written in more than one way, to one spelling (what registration clerks
# abbreviate); "no" / "number" say nothing.
ADDRESS_WORDS = {
    "rd": "road", "st": "street", "str": "street", "ave": "avenue", "av": "avenue",
    "dr": "drive", "drv": "drive", "ln": "lane", "cres": "crescent", "cl": "close",
    "ct": "court", "pl": "place", "hwy": "highway", "blvd": "boulevard", "est": "estate",
    "hse": "house", "apt": "apartment", "apts": "apartments", "flt": "flat",
    "bldg": "building", "blk": "block", "no": "", "number": "",
}


@dataclass(frozen=True, slots=True)
class Demographics:
    given: str = ""  # given names, space separated, first one first
    family: str = ""
    birth_date: str = ""  # YYYY-MM-DD (a partial date keeps what it has)
    sex: str = ""
    phones: frozenset[str] = frozenset()  # E.164
    emails: frozenset[str] = frozenset()
    address: str = ""
    city: str = ""
    postcode: str = ""
    national_ids: frozenset[str] = frozenset()
    mrns: frozenset[tuple[str, str]] = frozenset()  # (system, value)
    codes: tuple[str, str, str, str] = ("", "", "", "")  # metaphone/nysiis given, family

    @classmethod
    def of(cls, **values: Any) -> Demographics:
        """Normalised demographics from raw values (``phone`` and ``email`` may be one
        value or several)."""
        given, family = normal_name(values.get("given")), normal_name(values.get("family"))
        region = values.get("region") or "KE"
        return cls(given=given, family=family,
                   birth_date=str(values.get("birth_date") or "")[:10],
                   sex=str(values.get("sex") or "").lower(),
                   phones=frozenset(p for p in (e164(v, region) for v in
                                                _several(values.get("phone"))) if p),
                   emails=frozenset(str(e).strip().lower() for e in
                                    _several(values.get("email")) if str(e).strip()),
                   address=normal_address(values.get("address")),
                   city=normal_text(values.get("city")),
                   postcode=re.sub(r"\s+", "", str(values.get("postcode") or "")).upper(),
                   national_ids=frozenset(str(i) for i in values.get("national_ids") or ()
                                          if i),
                   mrns=frozenset(values.get("mrns") or ()),
                   codes=(*given_codes(given), *family_codes(family)))

    @property
    def first_given(self) -> str:
        return self.given.split(" ", 1)[0] if self.given else ""

    def sort_key(self) -> tuple[Any, ...]:
        """A total order of demographics by content (what makes scoring and clustering
        independent of record ids and arrival order)."""
        return (self.given, self.family, self.birth_date, self.sex, sorted(self.phones),
                sorted(self.emails), self.address, self.city, self.postcode,
                sorted(self.national_ids), sorted(self.mrns))


def _several(value: Any) -> list[Any]:
    if not value:
        return []
    return list(value) if isinstance(value, list | tuple | set | frozenset) else [value]


def normal_text(value: Any) -> str:
    """Lower case, accents and punctuation dropped, spaces collapsed."""
    if not value:
        return ""
    text = unicodedata.normalize("NFKD", str(value))
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text).split())


def normal_name(value: Any) -> str:
    return re.sub(r"[0-9]", "", normal_text(value)).strip()


def normal_address(value: Any) -> str:
    text = re.sub(r"\bp ?o box\b", "box", normal_text(value))  # P.O. Box, PO Box
    words = (ADDRESS_WORDS.get(word, word) for word in text.split())
    return " ".join(word for word in words if word)


def given_codes(given: str) -> tuple[str, str]:
    """Phonetic codes of the first given name (none for an initial)."""
    first = given.split(" ", 1)[0] if given else ""
    if len(first) < 2:
        return "", ""
    return jellyfish.metaphone(first), jellyfish.nysiis(first)


def family_codes(family: str) -> tuple[str, str]:
    """Phonetic codes of the whole family name (Gebre Medhin and Gebremedhin alike)."""
    joined = family.replace(" ", "")
    if not joined:
        return "", ""
    return jellyfish.metaphone(joined), jellyfish.nysiis(joined)


def e164(value: Any, region: str = "KE") -> str:
    """A phone number in E.164 (``+254712345678``), or "" when it is not one."""
    if not value:
        return ""
    try:
        number = phonenumbers.parse(str(value), region)
    except phonenumbers.NumberParseException:
        return ""
    if not phonenumbers.is_possible_number(number):
        return ""
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)


def _official_name(patient: JSON) -> JSON:
    names = [n for n in patient.get("name") or [] if isinstance(n, dict)]
    return next((n for n in names if n.get("use") == "official"), names[0] if names else {})


def _current_address(patient: JSON) -> JSON:
    addresses = [a for a in patient.get("address") or [] if isinstance(a, dict)]
    current = [a for a in addresses if a.get("use") != "old"
               and not (a.get("period") or {}).get("end")]
    return (current or addresses or [{}])[0]


def _is_type(identifier: JSON, code: str) -> bool:
    return any(c.get("code") == code for c in (identifier.get("type") or {}).get("coding") or []
               if isinstance(c, dict))


def demographics(patient: JSON, national_systems: Iterable[str] = (),
                 region: str = "KE") -> Demographics:
    """The demographics of a FHIR Patient: the official name (else the first), every
    phone and e-mail, the current address; national identifiers are those of the
    ``national_systems`` or typed NI (v2-0203), MRNs those typed MR."""
    name = _official_name(patient)
    given = " ".join(g for g in name.get("given") or [] if isinstance(g, str))
    telecom = [t for t in patient.get("telecom") or [] if isinstance(t, dict)]
    address = _current_address(patient)
    systems = set(national_systems)
    identifiers = [i for i in patient.get("identifier") or [] if isinstance(i, dict)
                   and i.get("value")]
    return Demographics.of(
        given=given, family=name.get("family"), birth_date=patient.get("birthDate"),
        sex=patient.get("gender"), region=region,
        phone=[t.get("value") for t in telecom if t.get("system") == "phone"],
        email=[t.get("value") for t in telecom if t.get("system") == "email"],
        address=" ".join(line for line in address.get("line") or [] if isinstance(line, str)),
        city=address.get("city"), postcode=address.get("postalCode"),
        national_ids=[str(i["value"]) for i in identifiers
                      if i.get("system") in systems or _is_type(i, "NI")],
        mrns=[(str(i.get("system")), str(i["value"])) for i in identifiers
              if _is_type(i, "MR")])
