"""FHIR Bulk Data export (IG 2.0) through the app: kick-off, polling, the manifest, the
NDJSON files, cancel, one export per client, expiry, resuming after a restart, and the
access policy (a clinic exports its own records only; a SMART backend client its scopes'
types only)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from fhir_server.access import SYSTEM
from fhir_server.bulk import exporter as exporter_module
from fhir_server.bulk.exporter import Exporter, Progress
from fhir_server.bulk.jobs import JOBS, BulkExports
from fhir_server.bulk.request import ExportRequest
from fhir_server.caller import CallerFhir
from tests.conftest import make_clinic_admin, make_settings, register_and_login
from tests.platform_api.smart.support import Clinic, make_clinic

JSON = dict[str, Any]
ASYNC = {"Prefer": "respond-async", "Accept": "application/fhir+json"}


@pytest.fixture
def settings(tmp_path: Path) -> Any:
    """The server's public base is the test client's (SMART token URLs, manifest links
    are never taken from the request's Host)."""
    return make_settings(tmp_path, base_url="http://testserver")


@pytest.fixture
async def clinic(app: Any, client: httpx.AsyncClient) -> Clinic:
    return await make_clinic(app, client)


def jobs_of(app: Any) -> BulkExports:
    return app.state.services.extras["bulk_exports"]  # type: ignore[no-any-return]


async def kick_off(client: httpx.AsyncClient, headers: dict[str, str],
                   path: str = "/fhir/$export", **params: str) -> httpx.Response:
    return await client.get(path, params=params, headers={**headers, **ASYNC})


async def finished(client: httpx.AsyncClient, headers: dict[str, str], status_url: str
                   ) -> httpx.Response:
    """Poll the status URL until it stops answering 202 (bounded)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        response = await client.get(status_url, headers=headers)
        if response.status_code != 202:
            return response
        assert response.headers["retry-after"].isdigit()
        assert "resources exported" in response.headers["x-progress"]
        await asyncio.sleep(0.02)
    raise AssertionError("the export did not finish within 60 s")


async def export(client: httpx.AsyncClient, headers: dict[str, str],
                 path: str = "/fhir/$export", **params: str) -> tuple[JSON, dict[str, list[JSON]]]:
    """Run an export to its end: the manifest, and each output file's resources by type."""
    started = await kick_off(client, headers, path, **params)
    assert started.status_code == 202, started.text
    done = await finished(client, headers, started.headers["content-location"])
    assert done.status_code == 200, done.text
    manifest = done.json()
    files: dict[str, list[JSON]] = {}
    for output in manifest["output"]:
        got = await client.get(output["url"], headers=headers)
        assert got.status_code == 200
        assert got.headers["content-type"].startswith("application/fhir+ndjson")
        lines = [orjson.loads(line) for line in got.content.splitlines()]
        assert len(lines) == output["count"]
        files[output["type"]] = lines
    return manifest, files


def ids(resources: list[JSON]) -> set[str]:
    return {r["id"] for r in resources}


async def test_a_clinic_exports_its_records_as_ndjson_and_nothing_of_another_clinic(
        app: Any, client: httpx.AsyncClient, clinic: Clinic) -> None:
    other = await make_clinic_admin(client, name="Mathare North Clinic",
                                    first_name="Achieng", last_name="Otieno")
    stranger = await client.post("/fhir/Patient", headers=other["headers"], json={
        "resourceType": "Patient", "name": [{"family": "Wafula", "given": ["Juma"]}]})
    assert stranger.status_code == 201
    jobs_of(app).page_size = 2  # several pages per type

    manifest, files = await export(client, clinic.admin["headers"])

    assert manifest["requiresAccessToken"] is True
    assert manifest["request"].startswith("http://testserver/fhir/$export")
    assert manifest["transactionTime"] and manifest["error"] == []
    assert ids(files["Patient"]) == {clinic.amina, clinic.baraka}
    assert ids(files["Observation"]) == {o for v in clinic.observations.values() for o in v}
    assert stranger.json()["id"] not in {r["id"] for rs in files.values() for r in rs}
    _, theirs = await export(client, other["headers"], _type="Patient,Observation")
    assert ids(theirs["Patient"]) == {stranger.json()["id"]}
    assert "Observation" not in theirs
    # the files: 0600 in 0700 directories (issue 32 result 11)
    root = app.state.services.settings.data_dir / "bulk-exports"
    written = [p for p in root.rglob("*") if p.is_file()]
    assert written and {p.stat().st_mode & 0o777 for p in written} == {0o600}
    assert {p.parent.stat().st_mode & 0o777 for p in written} == {0o700}


async def test_type_since_and_type_filters_choose_what_is_exported(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    headers = clinic.admin["headers"]
    _, labs = await export(client, headers, _type="Observation",
                           _typeFilter="Observation?category=laboratory")
    assert ids(labs["Observation"]) == {v[1] for v in clinic.observations.values()}
    assert set(labs) == {"Observation"}

    started = await client.get("/fhir/$export", headers={**headers, **ASYNC}, params=[
        ("_type", "Observation"), ("_typeFilter", "Observation?category=laboratory"),
        ("_typeFilter", "Observation?code=http://loinc.org|2339-0,8867-4")])
    done = await finished(client, headers, started.headers["content-location"])
    both = orjson.loads(b"[" + (await client.get(done.json()["output"][0]["url"],
                                                 headers=headers)).content.strip()
                        .replace(b"\n", b",") + b"]")
    assert sorted(r["id"] for r in both) == sorted(  # each once, though two filters match
        o for v in clinic.observations.values() for o in v)

    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time())) + "Z"
    await asyncio.sleep(1.1)
    newer = await client.post("/fhir/Patient", headers=headers, json={
        "resourceType": "Patient", "name": [{"family": "Mutua", "given": ["Neema"]}]})
    _, recent = await export(client, headers, _since=since, _type="Patient,Observation")
    assert set(recent) == {"Patient"} and ids(recent["Patient"]) == {newer.json()["id"]}


@pytest.mark.parametrize(("params", "status", "says"), [
    ({"_outputFormat": "text/csv"}, 400, "_outputFormat"),
    ({"_type": "Patient,Unicorn"}, 400, "Unicorn"),
    ({"_since": "2026-01-01"}, 400, "_since"),
    ({"_typeFilter": "Observation?flavour=sweet"}, 400, "_typeFilter"),
    ({"_type": "Patient", "_typeFilter": "Observation?status=final"}, 400, "_type"),
    ({"_elements": "id"}, 202, ""),
])
async def test_bad_kick_off_parameters_are_refused_by_name(
        client: httpx.AsyncClient, clinic: Clinic, params: dict[str, str], status: int,
        says: str) -> None:
    response = await kick_off(client, clinic.admin["headers"], **params)
    assert response.status_code == status, response.text
    assert says in response.text
    if status == 202:  # not offered, ignored (lenient), named in the error file
        done = await finished(client, clinic.admin["headers"],
                              response.headers["content-location"])
        [error] = done.json()["error"]
        assert error["type"] == "OperationOutcome"
        outcome = (await client.get(error["url"], headers=clinic.admin["headers"])).json()
        assert "_elements" in outcome["issue"][0]["diagnostics"]
    strict = await client.get("/fhir/$export", params={"_elements": "id"}, headers={
        **clinic.admin["headers"], "Prefer": "respond-async, handling=strict"})
    assert strict.status_code == 400 and "_elements" in strict.text


async def test_kick_off_needs_respond_async_and_a_signed_in_client(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    plain = await client.get("/fhir/$export", headers=clinic.admin["headers"])
    assert plain.status_code == 400 and "respond-async" in plain.text
    anonymous = await client.get("/fhir/$export", headers=ASYNC)
    assert anonymous.status_code == 401


async def test_patient_and_group_level_exports_cover_their_compartments(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    headers = clinic.admin["headers"]
    _, patients = await export(client, headers, "/fhir/Patient/$export")
    assert ids(patients["Patient"]) == {clinic.amina, clinic.baraka}
    assert "Organization" not in patients  # not in any patient's compartment

    group = await client.post("/fhir/Group", headers=headers, json={
        "resourceType": "Group", "type": "person", "actual": True,
        "name": "Diabetes follow-up", "member": [
            {"entity": {"reference": f"Patient/{clinic.amina}"}},
            {"entity": {"reference": f"Patient/{clinic.baraka}"}, "inactive": True}]})
    assert group.status_code == 201, group.text
    _, members = await export(client, headers,
                              f"/fhir/Group/{group.json()['id']}/$export")
    assert ids(members["Patient"]) == {clinic.amina}
    assert ids(members["Observation"]) == set(clinic.observations[clinic.amina])

    missing = await kick_off(client, headers, "/fhir/Group/no-such-group/$export")
    assert missing.status_code == 404
    wrong_type = await kick_off(client, headers, "/fhir/Patient/$export",
                                _type="Organization")
    assert wrong_type.status_code == 400 and "compartment" in wrong_type.text


async def test_a_post_kick_off_takes_parameters(client: httpx.AsyncClient,
                                                clinic: Clinic) -> None:
    headers = {**clinic.admin["headers"], **ASYNC}
    started = await client.post("/fhir/Patient/$export", headers=headers, json={
        "resourceType": "Parameters", "parameter": [
            {"name": "_type", "valueString": "Observation"},
            {"name": "_typeFilter", "valueString": "Observation?category=vital-signs"}]})
    assert started.status_code == 202, started.text
    done = await finished(client, clinic.admin["headers"], started.headers["content-location"])
    assert [o["type"] for o in done.json()["output"]] == ["Observation"]
    assert done.json()["output"][0]["count"] == 2


async def test_one_export_per_client_at_a_time_and_cancel_removes_the_files(
        app: Any, client: httpx.AsyncClient, clinic: Clinic,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = asyncio.Event()
    run = Exporter.run

    async def held(self: Exporter) -> Progress:
        await gate.wait()
        return await run(self)

    monkeypatch.setattr(Exporter, "run", held)
    headers = clinic.admin["headers"]
    first = await kick_off(client, headers)
    assert first.status_code == 202
    second = await kick_off(client, headers)
    assert second.status_code == 429 and second.headers["retry-after"]
    doctor = await kick_off(client, clinic.doctor["headers"])  # another client may
    assert doctor.status_code == 202

    status_url = first.headers["content-location"]
    job_id = status_url.rsplit("/", 1)[1]
    assert (await client.get(status_url, headers=clinic.doctor["headers"])).status_code == 404
    cancelled = await client.delete(status_url, headers=headers)
    assert cancelled.status_code == 202
    assert (await client.get(status_url, headers=headers)).status_code == 404
    assert not (jobs_of(app).directory / job_id).exists()
    again = await kick_off(client, headers)
    assert again.status_code == 202
    gate.set()
    done = await finished(client, headers, again.headers["content-location"])
    assert done.status_code == 200


async def test_files_are_the_exporting_clients_only_and_expire(
        app: Any, client: httpx.AsyncClient, clinic: Clinic) -> None:
    headers = clinic.admin["headers"]
    manifest, _ = await export(client, headers, _type="Patient")
    url = manifest["output"][0]["url"]
    assert (await client.get(url)).status_code == 401
    assert (await client.get(url, headers=clinic.doctor["headers"])).status_code == 404
    stranger = await register_and_login(client, first_name="Kevin", last_name="Ouma")
    assert (await client.get(url, headers=stranger["headers"])).status_code == 404
    job_id = url.split("/")[-2]
    jobs = jobs_of(app)
    assert (jobs.directory / job_id).is_dir()

    assert (await jobs.tend(now=time.time() + 3600))["expired"] == 0
    assert (await jobs.tend(now=time.time() + 25 * 3600))["expired"] == 1
    assert not (jobs.directory / job_id).exists()
    assert (await client.get(url, headers=headers)).status_code == 404


async def test_a_smart_backend_client_exports_what_its_system_scopes_allow(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    from tests.platform_api.smart.test_client_auth import ClientKeys, register_backend, token

    keys = ClientKeys("ES384", "bulk-1")
    client_id = await register_backend(client, clinic, jwks={"keys": [keys.jwk]},
                                       scope="system/Observation.rs")
    issued = await token(client, keys.assertion(client_id), "system/Observation.rs")
    assert issued.status_code == 200, issued.text
    backend = {"Authorization": f"Bearer {issued.json()['access_token']}"}

    _, files = await export(client, backend)
    assert set(files) == {"Observation"}
    assert ids(files["Observation"]) == {o for v in clinic.observations.values() for o in v}
    refused = await kick_off(client, backend, _type="Patient")
    assert refused.status_code == 403 and "Patient" in refused.text


async def test_an_export_cut_off_by_a_restart_resumes_where_it_stood(
        app: Any, client: httpx.AsyncClient, clinic: Clinic,
        monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = jobs_of(app)
    jobs.page_size = 1
    pages = 0
    write = Exporter._write

    def crashing(self: Exporter, found: list[Any]) -> None:
        nonlocal pages
        pages += 1
        write(self, found)
        if pages == 3:  # written, not yet checkpointed: the process dies here
            raise asyncio.CancelledError

    monkeypatch.setattr(Exporter, "_write", crashing)
    headers = clinic.admin["headers"]
    started = await kick_off(client, headers, _type="Patient,Observation")
    status_url = started.headers["content-location"]
    job_id = status_url.rsplit("/", 1)[1]
    for _ in range(200):
        if job_id not in jobs._running:
            break
        await asyncio.sleep(0.01)
    assert (await client.get(status_url, headers=headers)).status_code == 202  # orphaned
    monkeypatch.setattr(Exporter, "_write", write)

    restarted = BulkExports(jobs.service, jobs.identity, jobs.directory, page_size=1)
    assert (await restarted.tend(now=time.time() + 61))["resumed"] == 1
    for _ in range(500):
        if job_id not in restarted._running:
            break
        await asyncio.sleep(0.01)
    jobs_of(app).__dict__.update(_running={})  # the app's jobs answer the polls
    done = await finished(client, headers, status_url)
    assert done.status_code == 200, done.text
    exported: list[str] = []
    for output in done.json()["output"]:
        body = (await client.get(output["url"], headers=headers)).content
        exported += [orjson.loads(line)["id"] for line in body.splitlines()]
    expected = [clinic.amina, clinic.baraka,
                *(o for v in clinic.observations.values() for o in v)]
    assert sorted(exported) == sorted(expected)  # each once: nothing lost, nothing twice


async def test_a_resumed_export_runs_under_the_clients_rights_of_now(
        app: Any, client: httpx.AsyncClient, clinic: Clinic) -> None:
    jobs = jobs_of(app)
    services = app.state.services
    job = {"id": "resume-suspended", "owner": f"user:{clinic.doctor['user']['id']}",
           "identity": {"user_id": clinic.doctor["user"]["id"], "kind": "user",
                        "email": None, "roles": [], "scopes": [], "token_id": None,
                        "smart": None},
           "request": ExportRequest("system", "http://testserver/fhir/$export").to_json(),
           "status": "in-progress", "transaction_time": "2026-11-29T00:00:00Z",
           "progress": Progress().to_json(), "created": 0, "heartbeat": 0, "error": None}
    async with services.store.unit_of_work() as uow:
        uow.put_document(JOBS, job["id"], job)
        await uow.commit()
    await services.auth.set_user_status(clinic.doctor["user"]["id"], "suspended",
                                        actor=None)
    assert (await jobs.tend())["resumed"] == 1
    for _ in range(200):
        stored = await services.store.get_document(JOBS, job["id"])
        if stored["status"] != "in-progress":
            break
        await asyncio.sleep(0.01)
    assert stored["status"] == "failed" and "no longer active" in stored["error"]


async def test_memory_stays_one_page_the_exporter_streams(
        app: Any, tmp_path: Path, clinic: Clinic) -> None:
    """The exporter holds one page at a time: with a page of 1 it never keeps more than
    one resource's body between checkpoints."""
    caller = CallerFhir(app.state.services.fhir, SYSTEM)
    held: list[int] = []

    async def checkpoint(progress: Progress) -> None:
        held.append(progress.exported)

    request = ExportRequest("system", "cli", types=("Observation",))
    done = await Exporter(caller, request, tmp_path / "out", Progress(), checkpoint,
                          page_size=1).run()
    assert done.exported == 4 and held == [1, 2, 3, 4]
    assert len((tmp_path / "out" / "Observation.ndjson").read_bytes().splitlines()) == 4
    assert exporter_module.file_name("Observation") == "Observation.ndjson"


async def test_the_capability_statement_offers_the_export_operations(
        client: httpx.AsyncClient) -> None:
    statement = (await client.get("/fhir/metadata")).json()
    assert "http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data" in \
        statement["instantiates"]
    rest = statement["rest"][0]
    assert {"name": "export", "definition":
            "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/export"} in rest["operation"]
    group = next(r for r in rest["resource"] if r["type"] == "Group")
    assert any(o["definition"].endswith("group-export") for o in group["operation"])


async def test_a_resumed_group_export_keeps_the_members_it_started_with(
        app: Any, client: httpx.AsyncClient, tmp_path: Path, clinic: Clinic) -> None:
    headers = clinic.admin["headers"]
    group = (await client.post("/fhir/Group", headers=headers, json={
        "resourceType": "Group", "type": "person", "actual": True, "member": [
            {"entity": {"reference": f"Patient/{clinic.amina}"}},
            {"entity": {"reference": f"Patient/{clinic.baraka}"}}]})).json()
    caller = CallerFhir(app.state.services.fhir, SYSTEM)
    request = ExportRequest("group", "test", group_id=group["id"])
    saved: list[JSON] = []

    class Cut(Exception):
        pass

    async def cut_after_first_page(progress: Progress) -> None:
        saved.append(progress.to_json())
        raise Cut

    with pytest.raises(Cut):
        await Exporter(caller, request, tmp_path / "out", Progress(), cut_after_first_page,
                       page_size=1).run()
    group["member"] = group["member"][1:]  # Amina leaves the cohort meanwhile
    assert (await client.put(f"/fhir/Group/{group['id']}", headers=headers,
                             json=group)).status_code == 200

    async def keep(progress: Progress) -> None:
        pass

    await Exporter(caller, request, tmp_path / "out", Progress.from_json(saved[0]), keep,
                   page_size=1).run()
    patients = (tmp_path / "out" / "Patient.ndjson").read_bytes().splitlines()
    assert sorted(orjson.loads(p)["id"] for p in patients) == sorted(
        [clinic.amina, clinic.baraka])
