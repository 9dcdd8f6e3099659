"""``$run`` over the server's data, through the app: what the caller may search and no
more (the access policy as for a search), the output formats, ``_limit``, ``_since``,
``patient`` and ``group``, the type, instance and system levels, and refusals by name."""

from __future__ import annotations

import asyncio
import csv
import io
from typing import Any

import httpx
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import add_member, register_and_login
from tests.fhir_server.views.support import (
    BLOOD_PRESSURE,
    Clinics,
    blood_pressure,
    make_clinics,
    run_parameters,
)

JSON = dict[str, Any]
RUN = "/fhir/ViewDefinition/$run"


@pytest.fixture
async def clinics(app: Any, client: httpx.AsyncClient) -> Clinics:
    return await make_clinics(app, client)


async def test_a_clinic_sees_its_own_rows_and_none_of_another_clinics(
        client: httpx.AsyncClient, clinics: Clinics) -> None:
    mine = await client.post(RUN, headers=clinics.clinic.admin["headers"],
                             json=run_parameters(BLOOD_PRESSURE))
    assert mine.status_code == 200, mine.text
    assert mine.headers["content-type"].startswith("application/json")
    rows = mine.json()
    assert {r["id"]: r["patient"] for r in rows} == clinics.pressures
    assert sorted((r["systolic"], r["diastolic"]) for r in rows) == [
        (118, 76), (128, 84), (141, 92)]
    assert all(set(r) == {"id", "patient", "effective", "systolic", "diastolic"}
               for r in rows)
    theirs = await client.post(RUN, headers=clinics.other["headers"],
                               json=run_parameters(BLOOD_PRESSURE))
    assert [r["id"] for r in theirs.json()] == [clinics.other_pressure]


async def test_a_role_that_may_not_search_the_views_type_is_refused(
        app: Any, client: httpx.AsyncClient, clinics: Clinics) -> None:
    receptionist = await register_and_login(client, first_name="Faith", last_name="Chebet")
    await add_member(app, clinics.clinic.org_id, receptionist, "ORG:RECEPTIONIST")
    # A front desk may search Observations only where the policy says (none here)...
    narrowed = await client.post(RUN, headers=receptionist["headers"],
                                 json=run_parameters(BLOOD_PRESSURE))
    assert narrowed.status_code == 200 and narrowed.json() == []
    # ... and a type no role of the clinic's may search is refused outright.
    basic = {"resourceType": "ViewDefinition", "status": "active", "resource": "Basic",
             "select": [{"column": [{"name": "id", "path": "id"}]}]}
    refused = await client.post(RUN, headers=clinics.clinic.admin["headers"],
                                json=run_parameters(basic))
    assert refused.status_code == 403, refused.text
    assert "Basic" in refused.json()["issue"][0]["diagnostics"]
    nurse = await register_and_login(client, first_name="Mercy", last_name="Achieng")
    await add_member(app, clinics.clinic.org_id, nurse, "ORG:NURSE")
    allowed = await client.post(RUN, headers=nurse["headers"],
                                json=run_parameters(BLOOD_PRESSURE))
    assert allowed.status_code == 200 and len(allowed.json()) == 3
    anonymous = await client.post(RUN, json=run_parameters(BLOOD_PRESSURE))
    assert anonymous.status_code == 401


async def test_each_output_format(client: httpx.AsyncClient, clinics: Clinics) -> None:
    headers = clinics.clinic.admin["headers"]
    ndjson = await client.post(RUN, headers=headers,
                               json=run_parameters(BLOOD_PRESSURE, _format="ndjson"))
    assert ndjson.headers["content-type"].startswith("application/x-ndjson")
    assert len([orjson.loads(line) for line in ndjson.content.splitlines()]) == 3

    as_csv = await client.post(RUN, headers=headers,
                               json=run_parameters(BLOOD_PRESSURE, _format="csv"))
    assert as_csv.headers["content-type"].startswith("text/csv")
    lines = list(csv.reader(io.StringIO(as_csv.text)))
    assert lines[0] == ["id", "patient", "effective", "systolic", "diastolic"]
    assert len(lines) == 4
    bare = await client.post(RUN, headers={**headers, "Accept": "text/csv"},
                             json=run_parameters(BLOOD_PRESSURE, header=False))
    assert len(list(csv.reader(io.StringIO(bare.text)))) == 3

    parquet = await client.post(RUN, headers=headers,
                                json=run_parameters(BLOOD_PRESSURE, _format="parquet"))
    assert parquet.headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(pa.BufferReader(parquet.content))
    assert table.schema.field("systolic").type == pa.float64()  # its ansi/type tag
    assert table.schema.field("id").type == pa.string()
    assert sorted(table.column("diastolic").to_pylist()) == [76.0, 84.0, 92.0]


async def test_limit_patient_group_and_since_narrow_the_rows(
        client: httpx.AsyncClient, clinics: Clinics) -> None:
    clinic = clinics.clinic
    headers = clinic.admin["headers"]

    async def rows(**values: Any) -> list[JSON]:
        answer = await client.post(RUN, headers=headers,
                                   json=run_parameters(BLOOD_PRESSURE, **values))
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]

    assert len(await rows(_limit=2)) == 2
    assert {r["patient"] for r in await rows(patient=f"Patient/{clinic.amina}")} == \
        {clinic.amina}
    assert len(await rows(patient=[f"Patient/{clinic.amina}",
                                   f"Patient/{clinic.baraka}"])) == 3
    group = await client.post("/fhir/Group", headers=headers, json={
        "resourceType": "Group", "type": "person", "actual": True,
        "member": [{"entity": {"reference": f"Patient/{clinic.baraka}"}}]})
    assert group.status_code == 201, group.text
    assert {r["patient"] for r in await rows(group=f"Group/{group.json()['id']}")} == \
        {clinic.baraka}

    newest = await client.get("/fhir/Observation", headers=headers,
                              params={"_sort": "-_lastUpdated", "_count": "1"})
    since = newest.json()["entry"][0]["resource"]["meta"]["lastUpdated"]
    await asyncio.sleep(0.01)
    late = await client.post("/fhir/Observation", headers=headers,
                             json=blood_pressure(clinic.amina, 135, 88))
    since = since.replace("+00:00", "Z")
    assert [r["id"] for r in await rows(_since=since)] == [late.json()["id"]]


async def test_a_stored_view_runs_by_instance_reference_and_canonical_url(
        client: httpx.AsyncClient, clinics: Clinics) -> None:
    admin = clinics.clinic.platform_admin["headers"]  # stores views (see the README)
    stored = await client.post("/fhir/ViewDefinition", headers=admin, json=BLOOD_PRESSURE)
    view_id = stored.json()["id"]
    instance = await client.get(f"/fhir/ViewDefinition/{view_id}/$run",
                                params={"_format": "ndjson"}, headers=admin)
    assert instance.status_code == 200, instance.text
    assert len(instance.content.splitlines()) == 4  # both clinics: an administrator
    by_reference = await client.post(RUN, headers=admin, json=run_parameters(
        viewReference=f"ViewDefinition/{view_id}"))
    assert len(by_reference.json()) == 4
    by_url = await client.get("/fhir/$viewdefinition-run", headers=admin, params={
        "viewReference": BLOOD_PRESSURE["url"], "_limit": "1"})
    assert by_url.status_code == 200 and len(by_url.json()) == 1
    missing = await client.get("/fhir/ViewDefinition/no-such-view/$run", headers=admin)
    assert missing.status_code == 404


async def test_bad_requests_are_refused_naming_the_parameter(
        client: httpx.AsyncClient, clinics: Clinics) -> None:
    headers = clinics.clinic.admin["headers"]

    async def refused(body: JSON, status: int = 400) -> JSON:
        answer = await client.post(RUN, headers=headers, json=body)
        assert answer.status_code == status, answer.text
        return answer.json()["issue"][0]  # type: ignore[no-any-return]

    assert (await refused(run_parameters()))["code"] == "required"
    assert (await refused(run_parameters(BLOOD_PRESSURE, _format="xml")))["expression"] == \
        ["_format"]
    unknown = run_parameters(BLOOD_PRESSURE)
    unknown["parameter"].append({"name": "_count", "valueInteger": 3})
    assert "_count" in (await refused(unknown))["diagnostics"]
    source = run_parameters(BLOOD_PRESSURE)
    source["parameter"].append({"name": "source", "valueString": "s3://bucket"})
    assert "source" in (await refused(source))["diagnostics"]
    assert (await refused(run_parameters(BLOOD_PRESSURE, patient="Patient/nobody"))
            )["code"] == "not-found"
    broken = {**BLOOD_PRESSURE, "select": [{"column": [{"name": "id", "path": "id("}]}]}
    issue = await refused(run_parameters(broken), 422)
    assert issue["expression"] == ["viewResource.select[0].column[0].path"]
    several = {**BLOOD_PRESSURE, "where": [],
               "select": [{"column": [{"name": "code", "path": "component.code.coding.code"}]}]}
    issue = await refused(run_parameters(several), 422)
    assert "collection: true" in issue["diagnostics"]


async def test_supplied_resources_are_run_without_reading_the_servers_data(
        client: httpx.AsyncClient, clinics: Clinics) -> None:
    body = run_parameters(BLOOD_PRESSURE, _format="json")
    body["parameter"].append({"name": "resource",
                              "resource": {**blood_pressure("p-1", 101, 65), "id": "bp-1"}})
    answer = await client.post(RUN, headers=clinics.other["headers"], json=body)
    assert answer.json() == [{"id": "bp-1", "patient": "p-1",
                              "effective": "2026-03-02T09:30:00+03:00",
                              "systolic": 101, "diastolic": 65}]


async def test_an_api_key_needs_read_on_every_type_to_run_a_view(
        client: httpx.AsyncClient, clinics: Clinics) -> None:
    """A view reads its resource type and may name a stored view: the access table asks
    ``*:read`` of a key, as for a system search or a Bulk export."""
    headers = clinics.clinic.admin["headers"]

    async def key(scopes: list[str]) -> dict[str, str]:
        made = await client.post("/api/developer/keys", headers=headers,
                                 json={"name": "Analytics", "scopes": scopes})
        assert made.status_code == 201, made.text
        return {"X-API-Key": made.json()["data"]["key"]}

    narrow = await key(["Observation:read"])
    refused = await client.post(RUN, headers=narrow, json=run_parameters(BLOOD_PRESSURE))
    assert refused.status_code == 403, refused.text
    broad = await key(["*:read"])
    allowed = await client.post(RUN, headers=broad, json=run_parameters(BLOOD_PRESSURE))
    assert allowed.status_code == 200 and len(allowed.json()) == 3
