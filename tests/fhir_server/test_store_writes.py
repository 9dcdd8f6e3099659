"""The versioning rules every store adapter applies (fhir_server.store.writes)."""

from __future__ import annotations

import orjson
import pytest

from fhir_server.store.port import ResourceExists, StagedWrite, VersionConflict
from fhir_server.store.writes import NEVER_WRITTEN, CurrentState, content_digest, decide

NOW = "2026-11-24T10:00:00.000000Z"


def patient(**extra: object) -> dict:
    return {"resourceType": "Patient", "name": [{"family": "Achieng"}], **extra}


def write(op: str, body: dict | None = None, **options: object) -> StagedWrite:
    return StagedWrite(op, "Patient", "p1", body, **options)  # type: ignore[arg-type]


def test_a_first_write_is_version_1_with_its_id_and_meta():
    new = decide(write("update", patient()), NEVER_WRITTEN, NOW)
    assert new is not None and (new.version, new.deleted) == (1, False)
    stored = orjson.loads(new.body)
    assert stored["id"] == "p1"
    assert stored["meta"] == {"versionId": "1", "lastUpdated": NOW}


def test_an_update_carrying_the_current_content_writes_nothing():
    same = write("update", patient(meta={"versionId": "9", "lastUpdated": "2020-01-01"}))
    current = CurrentState(3, False, content_digest(write("update", patient())))
    assert decide(same, current, NOW) is None and same.unchanged
    changed = write("update", patient(gender="female"))
    new = decide(changed, current, NOW)
    assert new is not None and new.version == 4 and not changed.unchanged


def test_a_deleted_resource_written_again_with_its_old_content_comes_back():
    body = patient()
    current = CurrentState(2, True, content_digest(write("update", body)))
    new = decide(write("update", patient()), current, NOW)
    assert new is not None and new.version == 3 and not new.deleted


def test_deletes_write_a_tombstone_once():
    new = decide(write("delete"), CurrentState(2, False, b"x"), NOW)
    assert new is not None and (new.version, new.deleted, new.body) == (3, True, b"")
    again = write("delete")
    assert decide(again, CurrentState(3, True, None), NOW) is None and again.unchanged
    absent = write("delete")
    assert decide(absent, NEVER_WRITTEN, NOW) is None and absent.unchanged


def test_preconditions_refuse_stale_versions_and_taken_ids():
    with pytest.raises(VersionConflict):
        decide(write("update", patient(), if_match=1), CurrentState(2, False, b"x"), NOW)
    with pytest.raises(VersionConflict):  # a tombstone is no version to update
        decide(write("update", patient(), if_match=2), CurrentState(2, True, None), NOW)
    assert decide(write("delete", if_match=2), CurrentState(2, False, b"x"), NOW) is not None
    with pytest.raises(ResourceExists):
        decide(write("create", patient(), must_not_exist=True), CurrentState(1, True), NOW)


def test_content_digests_ignore_key_order_and_the_stores_own_meta():
    a = write("update", {"resourceType": "Patient", "gender": "male", "active": True})
    b = write("update", {"active": True, "gender": "male", "resourceType": "Patient",
                         "meta": {"versionId": "4", "lastUpdated": NOW}})
    assert content_digest(a) == content_digest(b)
    tagged = write("update", {"resourceType": "Patient", "gender": "male", "active": True,
                              "meta": {"tag": [{"code": "x"}]}})
    assert content_digest(a) != content_digest(tagged)


def test_extracted_rows_have_the_fields_the_index_schema_names():
    from fhir_server.search.extract import IndexExtractor
    from fhir_server.search.registry import builtin_registry
    from fhir_server.store.index import FIELDS, as_document

    rows = IndexExtractor(builtin_registry())({
        "resourceType": "Observation", "id": "o1", "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
        "subject": {"reference": "Patient/p1"}, "effectiveDateTime": "2026-11-24",
        "valueQuantity": {"value": 72, "system": "http://unitsofmeasure.org", "code": "/min"},
        "text": {"status": "generated", "div": "<div>Heart rate 72</div>"}}).rows
    assert set(rows) <= set(FIELDS)
    for kind, found in rows.items():
        assert all(len(row) == len(FIELDS[kind]) for row in found), kind
    subject = next(as_document("reference", r) for r in rows["reference"]
                   if r[0] == "subject")
    assert subject == {"param": "subject", "target_type": "Patient", "target_id": "p1",
                       "url": None}
