"""Column types: the FHIR types a view's column may hold, and how outputs write them.

The table is the specification's ("Type Hinting with Tags", default mappings from FHIR
and FHIRPath types to ISO/IEC 9075 SQL types), kept as data; Parquet (Arrow) types are
the nearest equivalent of each SQL type. A column's ``ansi/type`` tag overrides the
default SQL type (``DATE`` for a birth date known to be full, ``DOUBLE`` for a decimal
meant for arithmetic). A column of a non-primitive type (``Quantity``, a backbone
element) is written as its FHIR JSON text in CSV and Parquet, as itself in JSON.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

import orjson

# FHIR primitive type → ISO/IEC 9075 SQL type (the specification's table).
FHIR_SQL_TYPES: dict[str, str] = {
    "base64Binary": "BINARY",
    "boolean": "BOOLEAN",
    "canonical": "CHARACTER VARYING",
    "code": "CHARACTER VARYING",
    "date": "CHARACTER VARYING",
    "dateTime": "CHARACTER VARYING",
    "decimal": "CHARACTER VARYING",
    "id": "CHARACTER VARYING",
    "instant": "TIMESTAMP WITH TIME ZONE",
    "integer": "INT",
    "integer64": "BIGINT",
    "markdown": "CHARACTER VARYING",
    "oid": "CHARACTER VARYING",
    "positiveInt": "INT",
    "string": "CHARACTER VARYING",
    "time": "CHARACTER VARYING",
    "unsignedInt": "INT",
    "uri": "CHARACTER VARYING",
    "url": "CHARACTER VARYING",
    "uuid": "CHARACTER VARYING",
    "xhtml": "CHARACTER VARYING",
}
PRIMITIVES = frozenset(FHIR_SQL_TYPES)
# FHIRPath system types a path may end in, as the FHIR type that maps the same way.
FHIRPATH_TYPES = {"Boolean": "boolean", "String": "string", "Integer": "integer",
                  "Decimal": "decimal", "Date": "date", "DateTime": "dateTime",
                  "Time": "time"}
# Names of the FHIR datatypes (as in ``valueQuantity``): what may follow a choice
# element's name in FHIR JSON (R4 and R5).
COMPLEX_TYPES = frozenset({
    "Address", "Age", "Annotation", "Attachment", "Availability", "CodeableConcept",
    "CodeableReference", "Coding", "ContactDetail", "ContactPoint", "Contributor", "Count",
    "DataRequirement", "Distance", "Dosage", "Duration", "Expression",
    "ExtendedContactDetail", "Extension", "HumanName", "Identifier", "Meta",
    "MonetaryComponent", "Money", "ParameterDefinition", "Period", "Quantity", "Range",
    "Ratio", "RatioRange", "Reference", "RelatedArtifact", "SampledData", "Signature",
    "Timing", "TriggerDefinition", "UsageContext", "VirtualServiceDetail",
})
TYPE_SUFFIXES = frozenset({t[:1].upper() + t[1:] for t in PRIMITIVES} | COMPLEX_TYPES)

# SQL type (an ``ansi/type`` tag or the default) → Arrow type name; a type this table
# lacks is written as text.
SQL_ARROW_TYPES: dict[str, str] = {
    "BINARY": "binary", "VARBINARY": "binary", "BLOB": "binary",
    "BOOLEAN": "bool",
    "CHARACTER VARYING": "string", "VARCHAR": "string", "CHARACTER": "string",
    "CHAR": "string", "TEXT": "string", "CLOB": "string",
    "INT": "int32", "INTEGER": "int32", "SMALLINT": "int16", "BIGINT": "int64",
    "DOUBLE": "float64", "DOUBLE PRECISION": "float64", "FLOAT": "float64",
    "REAL": "float32", "DECIMAL": "float64", "NUMERIC": "float64",
    "DATE": "date32",
    "TIMESTAMP": "timestamp", "TIMESTAMP WITH TIME ZONE": "timestamptz",
}
ANSI_TYPE_TAG = "ansi/type"


@dataclass(frozen=True, slots=True)
class ColumnType:
    """What a column holds: its FHIR type (``None``: not known, written as text), whether
    it is a collection, and the SQL type it is written as."""

    fhir_type: str | None
    collection: bool
    sql_type: str

    @property
    def primitive(self) -> bool:
        return self.fhir_type is None or self.fhir_type in PRIMITIVES

    @property
    def arrow_name(self) -> str:
        if not self.primitive:
            return "string"  # JSON text
        return SQL_ARROW_TYPES.get(_base_sql(self.sql_type), "string")


def column_type(declared: str | None, inferred: str | None, collection: bool,
                tags: list[dict[str, Any]] | None = None) -> ColumnType:
    """A column's type: the declared ``type`` (relative names are FHIR types), else the
    type its path was inferred to end in; the ``ansi/type`` tag, else the table's SQL
    type."""
    fhir_type = declared.rsplit("/", 1)[-1] if declared else inferred
    fhir_type = FHIRPATH_TYPES.get(fhir_type or "", fhir_type)
    sql = next((str(t.get("value")) for t in tags or ()
                if t.get("name") == ANSI_TYPE_TAG and t.get("value")), None)
    if sql is None:
        sql = FHIR_SQL_TYPES.get(fhir_type or "", "CHARACTER VARYING")
    return ColumnType(fhir_type, collection, sql.upper())


def _base_sql(sql: str) -> str:
    """``DECIMAL(10,2)`` → ``DECIMAL``; ``VARCHAR(20)`` → ``VARCHAR``."""
    return re.sub(r"\s*\(.*\)\s*$", "", sql).strip()


# -- values as each format writes them --------------------------------------------------------
def text_value(value: Any) -> str | None:
    """A value as CSV text: primitives as FHIR writes them, complex ones as JSON."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return orjson.dumps(value).decode()


def arrow_value(value: Any, arrow_name: str) -> Any:
    """A single value as the Arrow column of ``arrow_name`` takes it (None when it does
    not fit: a value that is not what its column says is null, not an error)."""
    if value is None:
        return None
    try:
        if arrow_name == "string":
            return text_value(value)
        if arrow_name == "bool":
            return value if isinstance(value, bool) else None
        if arrow_name in ("int16", "int32", "int64"):
            return int(value) if isinstance(value, int | float) and not isinstance(
                value, bool) else int(str(value))
        if arrow_name in ("float32", "float64"):
            return float(value) if not isinstance(value, bool) else None
        if arrow_name == "binary":
            import base64
            return base64.b64decode(value) if isinstance(value, str) else None
        if arrow_name == "date32":
            return dt.date.fromisoformat(str(value)[:10]) if len(str(value)) >= 10 else None
        if arrow_name in ("timestamp", "timestamptz"):
            parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            if arrow_name == "timestamptz":
                return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
            return parsed.replace(tzinfo=None)
    except (ValueError, TypeError):
        return None
    return text_value(value)
