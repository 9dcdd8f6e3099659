"""The server's clock as FHIR writes it: instants in UTC with microseconds."""

from __future__ import annotations

from datetime import UTC, datetime


def now_instant() -> str:
    """The current time as a FHIR instant in UTC with microseconds (sortable as text)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
