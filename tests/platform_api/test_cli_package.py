"""``healthplatform package install FILE``: a FHIR package (.tgz) installed into the
store, its profiles and value sets usable by a running server at once."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from typer.testing import CliRunner

from platform_api.app import create_app
from platform_api.cli import app as cli
from tests.conftest import make_clinic_admin, make_settings

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "conformance"
NATIONAL = "http://example.org/fhir/StructureDefinition/national-patient"


def build_package(path: Path, resources: list[dict[str, Any]], *,
                  fhir_versions: tuple[str, ...] = ("4.0.1",)) -> Path:
    """A package as implementation guides publish them: package/package.json and one
    JSON file per resource."""
    manifest = {"name": "example.national.ig", "version": "1.0.0",
                "fhirVersions": list(fhir_versions),
                "dependencies": {"hl7.fhir.r4.core": "4.0.1"}}
    with tarfile.open(path, "w:gz") as archive:
        for name, content in [("package/package.json", manifest),
                              *((f"package/{r['resourceType']}-{r['id']}.json", r)
                                for r in resources)]:
            data = json.dumps(content).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def package_resources() -> list[dict[str, Any]]:
    example = {"resourceType": "Patient", "id": "example", "gender": "female"}
    return [json.loads((DATA / "national-patient.json").read_text()),
            json.loads((DATA / "countries.json").read_text()), example]


def test_install_makes_the_profiles_usable_by_the_server_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))
    package = build_package(tmp_path / "national.tgz", package_resources())
    settings = make_settings(tmp_path)

    async def scenario() -> None:
        application = create_app(settings)
        async with LifespanManager(application, startup_timeout=30):
            transport = httpx.ASGITransport(app=application)
            async with httpx.AsyncClient(transport=transport,
                                         base_url="http://testserver") as client:
                clinic = await make_clinic_admin(client)
                headers = {**clinic["headers"], "Content-Type": "application/fhir+json"}
                before = await client.post(f"/fhir/Patient/$validate?profile={NATIONAL}",
                                           json={"resourceType": "Patient"}, headers=headers)
                assert any("not known" in i["diagnostics"] for i in before.json()["issue"])
                # installed by another process (the CLI) while the server runs
                result = await asyncio.to_thread(
                    subprocess.run, [sys.executable, "-m", "platform_api.cli", "package",
                                     "install", str(package)],
                    cwd=ROOT, env={**os.environ, "HEALTHPLATFORM_DATA_DIR": str(tmp_path)},
                    capture_output=True, text=True, timeout=120)
                assert result.returncode == 0, result.stderr
                assert "StructureDefinition" in result.stdout and "ValueSet" in result.stdout
                assert "1 examples and others left out" in result.stdout
                after = await client.post(
                    f"/fhir/Patient/$validate?profile={NATIONAL}",
                    json={"resourceType": "Patient", "gender": "female",
                          "address": [{"country": "FR"}]}, headers=headers)
                errors = [i for i in after.json()["issue"] if i["severity"] == "error"]
                codes = {i["details"]["coding"][0]["code"] for i in errors}
                assert {"cardinality-min", "binding-required"} <= codes, after.text
                stored = await client.get("/fhir/StructureDefinition/national-patient",
                                          headers=headers)
                assert stored.json()["snapshot"]["element"]  # generated on install

    asyncio.run(scenario())


def test_install_refuses_what_is_not_an_r4_package(tmp_path, monkeypatch):
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))
    not_a_package = tmp_path / "notes.tgz"
    not_a_package.write_text("not an archive")
    result = CliRunner().invoke(cli, ["package", "install", str(not_a_package)])
    assert result.exit_code == 1 and "is not a package" in result.output
    r5 = build_package(tmp_path / "r5.tgz", package_resources(), fhir_versions=("5.0.0",))
    result = CliRunner().invoke(cli, ["package", "install", str(r5)])
    assert result.exit_code == 1 and "this server is FHIR R4" in result.output
    orphan = json.loads((DATA / "national-patient.json").read_text())
    orphan["baseDefinition"] = "http://example.org/fhir/StructureDefinition/missing-base"
    broken = build_package(tmp_path / "broken.tgz", [orphan])
    result = CliRunner().invoke(cli, ["package", "install", str(broken)])
    assert result.exit_code == 1 and "missing-base" in result.output
