"""``$viewdefinition-export`` through the app: kick-off, status (202 then 303), result,
files in each format with the specification's column types (Parquet read back by pyarrow
and queried by DuckDB), several views at once, the access policy, cancel, and resuming
after a restart without losing or repeating a row."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from pathlib import Path
from typing import Any

import duckdb
import httpx
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fhir_server.bulk.jobs import BulkExports
from fhir_server.bulk.view_exporter import ViewExporter
from tests.conftest import add_member, register_and_login
from tests.fhir_server.views.support import BLOOD_PRESSURE, Clinics, make_clinics

JSON = dict[str, Any]
ASYNC = {"Prefer": "respond-async"}
PATIENTS: JSON = {
    "resourceType": "ViewDefinition", "name": "patients", "status": "active",
    "resource": "Patient", "select": [{"column": [
        {"name": "id", "path": "getResourceKey()", "type": "id"},
        {"name": "born", "path": "birthDate", "type": "date"},
        {"name": "active", "path": "active", "type": "boolean"},
        {"name": "given", "path": "name.given", "type": "string", "collection": True}]}]}


@pytest.fixture
async def clinics(app: Any, client: httpx.AsyncClient) -> Clinics:
    return await make_clinics(app, client)


def jobs_of(app: Any) -> BulkExports:
    return app.state.services.extras["bulk_exports"]  # type: ignore[no-any-return]


def export_body(*views: JSON, fmt: str = "ndjson", **extra: Any) -> JSON:
    parameters: list[JSON] = [{"name": "_format", "valueCode": fmt}]
    parameters += [{"name": "view", "part": [{"name": "viewResource", "resource": v}]}
                   for v in views]
    parameters += [{"name": k, "valueString": v} for k, v in extra.items()]
    return {"resourceType": "Parameters", "parameter": parameters}


async def kick_off(client: httpx.AsyncClient, headers: dict[str, str], body: JSON
                   ) -> httpx.Response:
    return await client.post("/fhir/ViewDefinition/$viewdefinition-export",
                             headers={**headers, **ASYNC}, json=body)


async def result(client: httpx.AsyncClient, headers: dict[str, str], started: httpx.Response
                 ) -> JSON:
    """Poll until 303, follow it: the result Parameters."""
    assert started.status_code == 202, started.text
    status_url = started.headers["content-location"]
    assert {"name": "status", "valueCode": "accepted"} in started.json()["parameter"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        polled = await client.get(status_url, headers=headers)
        if polled.status_code == 303:
            answer = await client.get(polled.headers["location"], headers=headers)
            assert answer.status_code == 200, answer.text
            assert answer.headers["expires"]
            return answer.json()  # type: ignore[no-any-return]
        assert polled.status_code == 202, polled.text
        assert "rows exported" in polled.headers["x-progress"]
        await asyncio.sleep(0.02)
    raise AssertionError("the export did not finish within 60 s")


def outputs(done: JSON) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for parameter in done["parameter"]:
        if parameter["name"] == "output":
            parts = parameter["part"]
            found[parts[0]["valueString"]] = [p["valueUri"] for p in parts[1:]]
    return found


async def download(client: httpx.AsyncClient, headers: dict[str, str], url: str) -> bytes:
    answer = await client.get(url, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.content


async def test_two_views_to_parquet_typed_as_the_specification_says(
        client: httpx.AsyncClient, clinics: Clinics, tmp_path: Path) -> None:
    headers = clinics.clinic.admin["headers"]
    done = await result(client, headers, await kick_off(
        client, headers, export_body(BLOOD_PRESSURE, PATIENTS, fmt="parquet",
                                     clientTrackingId="march-vitals")))
    values = {p["name"]: p for p in done["parameter"] if p["name"] != "output"}
    assert values["clientTrackingId"]["valueString"] == "march-vitals"
    assert values["_format"]["valueCode"] == "parquet"
    files = outputs(done)
    assert set(files) == {"blood_pressure", "patients"}
    pressures = pq.read_table(pa.BufferReader(
        await download(client, headers, files["blood_pressure"][0])))
    assert pressures.num_rows == 3  # this clinic's only
    assert pressures.schema.field("systolic").type == pa.float64()  # ansi/type DOUBLE
    assert pressures.schema.field("effective").type == pa.string()  # dateTime: VARCHAR
    patients = pq.read_table(pa.BufferReader(
        await download(client, headers, files["patients"][0])))
    assert patients.schema.field("active").type == pa.bool_()
    assert patients.schema.field("given").type == pa.list_(pa.string())
    assert sorted(patients.column("born").to_pylist()) == ["1979-11-03", "1988-04-12"]

    # The README's three lines: the file queried with DuckDB
    (tmp_path / "bp.parquet").write_bytes(
        await download(client, headers, files["blood_pressure"][0]))
    average = duckdb.sql(f"SELECT patient, avg(systolic) AS systolic FROM "
                         f"'{tmp_path / 'bp.parquet'}' GROUP BY patient ORDER BY systolic"
                         ).fetchall()
    assert average == [(clinics.clinic.baraka, 118.0), (clinics.clinic.amina, 134.5)]


async def test_ndjson_csv_and_json_files(client: httpx.AsyncClient, clinics: Clinics
                                         ) -> None:
    headers = clinics.clinic.admin["headers"]
    for fmt in ("ndjson", "csv", "json"):
        done = await result(client, headers, await kick_off(
            client, headers, export_body(BLOOD_PRESSURE, fmt=fmt)))
        [url] = outputs(done)["blood_pressure"]
        assert url.endswith(f"/blood_pressure.{fmt}")
        body = await download(client, headers, url)
        if fmt == "ndjson":
            rows = [orjson.loads(line) for line in body.splitlines()]
        elif fmt == "csv":
            rows = list(csv.DictReader(io.StringIO(body.decode())))
        else:
            rows = orjson.loads(body)
        assert sorted(r["id"] for r in rows) == sorted(clinics.pressures)


async def test_access_refusals_and_another_clients_polls(
        app: Any, client: httpx.AsyncClient, clinics: Clinics) -> None:
    headers = clinics.clinic.admin["headers"]
    no_async = await client.post("/fhir/$viewdefinition-export", headers=headers,
                                 json=export_body(BLOOD_PRESSURE))
    assert no_async.status_code == 400
    basic = {**PATIENTS, "name": "basics", "resource": "Basic",
             "select": [{"column": [{"name": "id", "path": "id"}]}]}
    refused = await kick_off(client, headers, export_body(basic))
    assert refused.status_code == 403, refused.text
    both = await kick_off(client, headers, export_body(
        basic, {**PATIENTS, "select": [{"column": [{"name": "x", "path": "id("}]}]}))
    assert both.status_code == 400  # every view checked: both problems at once
    assert len(both.json()["issue"]) == 2

    started = await kick_off(client, headers, export_body(BLOOD_PRESSURE))
    status_url = started.headers["content-location"]
    stranger = await register_and_login(client, first_name="Otieno", last_name="Kamau")
    await add_member(app, clinics.other["org_id"], stranger, "ORG:DOCTOR")
    assert (await client.get(status_url, headers=stranger["headers"])).status_code == 404
    done = await result(client, headers, started)
    [url] = outputs(done)["blood_pressure"]
    assert (await client.get(url, headers=stranger["headers"])).status_code == 404
    assert (await client.delete(status_url, headers=headers)).status_code == 202
    assert (await client.get(status_url, headers=headers)).status_code == 404


async def test_an_export_cut_off_by_a_restart_resumes_without_losing_or_repeating_rows(
        app: Any, client: httpx.AsyncClient, clinics: Clinics,
        monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = jobs_of(app)
    jobs.page_size, jobs.part_rows = 1, 2  # a page a resource, a part every 2 rows
    pages = 0
    rows_of = ViewExporter._rows

    def crashing(self: ViewExporter, view: Any, bodies: list[bytes]) -> Any:
        nonlocal pages
        pages += 1
        if pages == 3:  # the first part closed, the second open: the process dies
            raise asyncio.CancelledError
        return rows_of(self, view, bodies)

    monkeypatch.setattr(ViewExporter, "_rows", crashing)
    headers = clinics.clinic.admin["headers"]
    started = await kick_off(client, headers, export_body(BLOOD_PRESSURE, fmt="parquet"))
    status_url = started.headers["content-location"]
    job_id = status_url.rsplit("/", 1)[1]
    for _ in range(200):
        if job_id not in jobs._running:
            break
        await asyncio.sleep(0.01)
    assert (await client.get(status_url, headers=headers)).status_code == 202  # orphaned
    monkeypatch.setattr(ViewExporter, "_rows", rows_of)

    restarted = BulkExports(jobs.service, jobs.identity, jobs.directory, page_size=1,
                            part_rows=2)
    assert (await restarted.tend(now=time.time() + 61))["resumed"] == 1
    for _ in range(500):
        if job_id not in restarted._running:
            break
        await asyncio.sleep(0.01)
    done = await result(client, headers, started)
    urls = outputs(done)["blood_pressure"]
    assert [u.rsplit("/", 1)[1] for u in urls] == ["blood_pressure.part1.parquet",
                                                   "blood_pressure.part2.parquet"]
    ids: list[str] = []
    for url in urls:
        table = pq.read_table(pa.BufferReader(await download(client, headers, url)))
        ids += table.column("id").to_pylist()
    assert sorted(ids) == sorted(clinics.pressures)  # each once: nothing lost or repeated
