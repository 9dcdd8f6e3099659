"""What a new checkout needs: `make run` installs the runtime dependencies only, `make
test` adds the test extras (also after a `make run`), and the server imports nothing
that only the test extras install."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fhir_server", "hl7_gateway", "cds_hooks", "platform_api")


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _test_only_dependencies() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_requirement_name(r) for r in project["dependencies"]}
    return {_requirement_name(r) for r in project["optional-dependencies"]["test"]} - runtime


def _imported_top_names() -> set[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module.split(".")[0])
    return names - set(PACKAGES) - set(sys.stdlib_module_names)


def test_the_server_imports_no_package_that_only_the_test_extras_install():
    test_only = _test_only_dependencies()
    distributions = packages_distributions()
    for name in sorted(_imported_top_names()):
        owners = {d.lower().replace("_", "-") for d in distributions.get(name, [name])}
        assert not owners & test_only, f"the server imports {name}, a test-only dependency"
        # Everything else comes with a runtime dependency (directly or as theirs).
        assert owners, name


def _make_dry_run(workdir: Path, target: str) -> str:
    result = subprocess.run(["make", "-n", target], cwd=workdir, capture_output=True,
                            text=True, check=True, env={**os.environ, "PYTHON3": "python3"})
    return result.stdout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The Makefile and pyproject.toml of a checkout whose .venv exists."""
    if shutil.which("make") is None:
        pytest.fail("make is needed (Debian package make)")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    return tmp_path


def _age(path: Path, seconds: int) -> None:
    stamp = path.stat().st_mtime - seconds
    os.utime(path, (stamp, stamp))


def test_make_run_installs_the_runtime_dependencies_only(checkout: Path):
    plan = _make_dry_run(checkout, "run")
    assert "pip install -e .\n" in plan and "[test]" not in plan
    assert "healthplatform serve" in plan


def test_make_test_after_make_run_installs_the_test_extras(checkout: Path):
    _age(checkout / "pyproject.toml", 60)
    (checkout / ".venv" / ".installed-run").touch()  # `make run` ran since the last change
    assert "pip install" not in _make_dry_run(checkout, "run")
    plan = _make_dry_run(checkout, "test")
    assert "pip install -e '.[test]'" in plan and "pytest" in plan


def test_make_run_after_make_test_installs_nothing(checkout: Path):
    _age(checkout / "pyproject.toml", 60)
    for stamp in (".installed-run", ".installed-test"):
        (checkout / ".venv" / stamp).touch()
    assert "pip install" not in _make_dry_run(checkout, "run")
    assert "pip install" not in _make_dry_run(checkout, "test")


def test_a_changed_pyproject_installs_again(checkout: Path):
    for stamp in (".installed-run", ".installed-test"):
        (checkout / ".venv" / stamp).touch()
        _age(checkout / ".venv" / stamp, 60)
    assert "pip install -e .\n" in _make_dry_run(checkout, "run")
    assert "pip install -e '.[test]'" in _make_dry_run(checkout, "test")
