"""UCUM canonical units for quantity search: ``5.4|http://unitsofmeasure.org|mg`` finds
a value stored as ``5400 ug``.

A quantity whose UCUM unit is in this table is indexed twice: as sent, and converted to
the dimension's base unit. A search with a convertible UCUM unit compares canonical
values. The table covers the units clinical data uses (mass, length, volume, time,
concentrations, rates, temperature); anything else is compared as sent.
"""

from __future__ import annotations

UCUM = "http://unitsofmeasure.org"

# unit → (base unit, factor): value_in_base = value * factor (+ offset for temperature).
_FACTORS: dict[str, tuple[str, float]] = {
    # mass
    "g": ("g", 1.0), "kg": ("g", 1e3), "mg": ("g", 1e-3), "ug": ("g", 1e-6),
    "ng": ("g", 1e-9), "pg": ("g", 1e-12), "[lb_av]": ("g", 453.59237),
    "[oz_av]": ("g", 28.349523125),
    # length
    "m": ("m", 1.0), "cm": ("m", 1e-2), "mm": ("m", 1e-3), "km": ("m", 1e3),
    "um": ("m", 1e-6), "[in_i]": ("m", 0.0254), "[ft_i]": ("m", 0.3048),
    # volume
    "L": ("L", 1.0), "l": ("L", 1.0), "dL": ("L", 0.1), "mL": ("L", 1e-3), "uL": ("L", 1e-6),
    "fL": ("L", 1e-15),
    # time
    "s": ("s", 1.0), "ms": ("s", 1e-3), "min": ("s", 60.0), "h": ("s", 3600.0),
    "d": ("s", 86400.0), "wk": ("s", 604800.0), "mo": ("s", 2629800.0), "a": ("s", 31557600.0),
    # rates
    "/s": ("/s", 1.0), "/min": ("/s", 1 / 60), "/h": ("/s", 1 / 3600),
    "{beats}/min": ("/s", 1 / 60), "{breaths}/min": ("/s", 1 / 60),
    # mass concentration
    "g/L": ("g/L", 1.0), "mg/dL": ("g/L", 1e-2), "g/dL": ("g/L", 10.0), "mg/L": ("g/L", 1e-3),
    "ug/L": ("g/L", 1e-6), "ng/mL": ("g/L", 1e-6), "ug/dL": ("g/L", 1e-5),
    "pg/mL": ("g/L", 1e-9),
    # substance concentration
    "mol/L": ("mol/L", 1.0), "mmol/L": ("mol/L", 1e-3), "umol/L": ("mol/L", 1e-6),
    "nmol/L": ("mol/L", 1e-9), "pmol/L": ("mol/L", 1e-12),
    # pressure
    "Pa": ("Pa", 1.0), "kPa": ("Pa", 1e3), "mm[Hg]": ("Pa", 133.322387415),
    # catalytic activity concentration
    "U/L": ("U/L", 1.0), "[IU]/L": ("[IU]/L", 1.0),
    # dimensionless
    "%": ("1", 1e-2), "1": ("1", 1.0),
}
_OFFSETS: dict[str, tuple[str, float, float]] = {
    "Cel": ("K", 1.0, 273.15),
    "[degF]": ("K", 5 / 9, 273.15 - 32 * 5 / 9),
    "K": ("K", 1.0, 0.0),
}


def canonical(value: float, unit: str) -> tuple[str, float] | None:
    """``(base unit, value in it)`` for a known UCUM unit, else None."""
    factor = _FACTORS.get(unit)
    if factor is not None:
        return factor[0], value * factor[1]
    offset = _OFFSETS.get(unit)
    if offset is not None:
        return offset[0], value * offset[1] + offset[2]
    return None


def canonical_span(lo: float, hi: float, unit: str) -> tuple[str, float, float] | None:
    """A search range converted to the base unit (factors are positive, order is kept)."""
    low, high = canonical(lo, unit), canonical(hi, unit)
    if low is None or high is None:
        return None
    return low[0], low[1], high[1]
