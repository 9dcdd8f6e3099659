"""Server-assigned ids: UUID version 7, in creation order, unique, valid FHIR ids."""

from __future__ import annotations

import uuid

from fhir_server import service
from fhir_server.ids import new_id
from fhir_server.validation import ID_PATTERN


def test_ids_are_uuid7_in_creation_order_and_unique():
    ids = [new_id() for _ in range(20_000)]  # many within one millisecond
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert all(ID_PATTERN.match(i) for i in ids[:100])


def test_ids_stay_ordered_when_the_clock_goes_back(monkeypatch):
    first = new_id()
    monkeypatch.setattr(service.time, "time_ns", lambda: 0)  # 1970
    assert new_id() > first
