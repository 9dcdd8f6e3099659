"""``healthplatform export``: Bulk Data NDJSON files from the store itself, a manifest,
the same checks as $export, and --resume after a cut-off run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from fhir_server.bulk import local
from fhir_server.bulk.exporter import Exporter
from fhir_server.service import FhirService
from fhir_server.store.sqlite import SQLiteStore
from platform_api.cli import app

JSON = dict[str, Any]
LOINC = "http://loinc.org"


async def fill(data_dir: Path) -> dict[str, list[str]]:
    """Three patients, each with a glucose and a heart rate; a Group of the first two."""
    store = SQLiteStore(data_dir / "healthplatform.db")
    await store.open()
    service = FhirService(store)
    made: dict[str, list[str]] = {"Patient": [], "Observation": [], "Group": []}
    try:
        async with store.unit_of_work() as uow:
            for i, family in enumerate(("Odhiambo", "Kiptoo", "Wanjiru")):
                patient = service.stage_create(uow, {"resourceType": "Patient", "name": [
                    {"family": family}]}, resource_id=f"p{i}")
                made["Patient"].append(patient.id)
                for code in ("2339-0", "8867-4"):
                    staged = service.stage_create(uow, {
                        "resourceType": "Observation", "status": "final",
                        "code": {"coding": [{"system": LOINC, "code": code}]},
                        "subject": {"reference": f"Patient/p{i}"}},
                        resource_id=f"o{i}-{code}")
                    made["Observation"].append(staged.id)
            group = service.stage_create(uow, {
                "resourceType": "Group", "type": "person", "actual": True,
                "member": [{"entity": {"reference": "Patient/p0"}},
                           {"entity": {"reference": "Patient/p1"}}]}, resource_id="g1")
            made["Group"].append(group.id)
            await uow.commit()
    finally:
        await store.close()
    return made


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))
    return asyncio.run(fill(tmp_path))


def exported(out: Path) -> dict[str, list[str]]:
    return {path.stem: [orjson.loads(line)["id"] for line in path.read_bytes().splitlines()]
            for path in out.glob("*.ndjson")}


def test_everything_is_exported_once_with_a_manifest(tmp_path: Path,
                                                     data: dict[str, list[str]]) -> None:
    out = tmp_path / "export"
    result = CliRunner().invoke(app, ["export", "--out", str(out), "--page-size", "2"])
    assert result.exit_code == 0, result.output
    files = exported(out)
    for resource_type, ids in data.items():
        assert sorted(files[resource_type]) == sorted(ids)
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert {o["type"]: o["count"] for o in manifest["output"]} == {
        "Group": 1, "Observation": 6, "Patient": 3}
    assert manifest["output"][0]["url"].startswith("file://")
    assert not (out / local.PROGRESS).exists()
    assert "Exported 10 resources" in result.output
    # patient data: only the server's account reads it (issue 32 result 11)
    assert out.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {0o600}


def test_types_filters_and_groups_choose_what_is_exported(
        tmp_path: Path, data: dict[str, list[str]]) -> None:
    runner = CliRunner()
    labs = tmp_path / "labs"
    result = runner.invoke(app, ["export", "--out", str(labs), "--type", "Observation",
                                 "--type-filter", f"Observation?code={LOINC}|2339-0"])
    assert result.exit_code == 0, result.output
    assert sorted(exported(labs)["Observation"]) == ["o0-2339-0", "o1-2339-0", "o2-2339-0"]
    cohort = tmp_path / "cohort"
    result = runner.invoke(app, ["export", "--out", str(cohort), "--group", "g1"])
    assert result.exit_code == 0, result.output
    files = exported(cohort)
    assert sorted(files["Patient"]) == ["p0", "p1"] and len(files["Observation"]) == 4


@pytest.mark.parametrize(("args", "says"), [
    (["--since", "yesterday"], "_since"),
    (["--type", "Unicorn"], "Unicorn"),
    (["--type-filter", "Observation?flavour=sweet"], "_typeFilter"),
    (["--group", "no-such-group"], "no-such-group"),
    (["--group", "g1", "--patient-level"], "choose one"),
])
def test_bad_options_fail_with_one_line(tmp_path: Path, data: dict[str, list[str]],
                                        args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["export", "--out", str(tmp_path / "x"), *args])
    assert result.exit_code == 1
    assert says in result.output and "Traceback" not in result.output


def test_a_cut_off_export_resumes_and_writes_each_resource_once(
        tmp_path: Path, data: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "export"
    pages = 0
    write = Exporter._write

    def cut_off(self: Exporter, found: list[Any]) -> None:
        nonlocal pages
        pages += 1
        write(self, found)
        if pages == 3:
            raise KeyboardInterrupt  # the operator's Ctrl-C, between write and checkpoint

    monkeypatch.setattr(Exporter, "_write", cut_off)
    first = CliRunner().invoke(app, ["export", "--out", str(out), "--page-size", "1",
                                     "--type", "Patient,Observation"])
    assert first.exit_code != 0 and (out / local.PROGRESS).exists()
    monkeypatch.setattr(Exporter, "_write", write)
    refused = CliRunner().invoke(app, ["export", "--out", str(out)])
    assert refused.exit_code == 1 and "not empty" in refused.output
    other = CliRunner().invoke(app, ["export", "--out", str(out), "--resume"])
    assert other.exit_code == 1 and "started with" in other.output
    resumed = CliRunner().invoke(app, ["export", "--out", str(out), "--page-size", "1",
                                       "--type", "Patient,Observation", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    files = exported(out)
    assert sorted(files["Patient"]) == sorted(data["Patient"])
    assert sorted(files["Observation"]) == sorted(data["Observation"])
