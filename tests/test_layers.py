"""The layers of the code base, as ARCHITECTURE.md draws them: ``platform_api`` →
``cds_hooks``, ``hl7_gateway`` → ``fhir_server``; ``fhir_server`` imports none of the
others, and its modules import one another without cycles (so the FHIR service, the
bundle engine and the interactions can each be reached alone)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fhir_server", "hl7_gateway", "cds_hooks", "platform_api")
ALLOWED = {  # package → the packages it may import
    "fhir_server": {"fhir_server"},
    "hl7_gateway": {"hl7_gateway", "fhir_server"},
    "cds_hooks": {"cds_hooks", "fhir_server"},
    "platform_api": set(PACKAGES),
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules a module imports, anywhere in it (a function-level import is a
    dependency too), ``TYPE_CHECKING`` blocks left out."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n in known}


def test_packages_import_only_what_the_architecture_allows():
    known = modules()
    for name, path in known.items():
        package = name.split(".")[0]
        for target in imports(path, known):
            assert target.split(".")[0] in ALLOWED[package], f"{name} imports {target}"


def test_fhir_server_modules_import_each_other_without_cycles():
    known = {n: p for n, p in modules().items() if n.startswith("fhir_server")}
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    # a package's __init__ re-exporting its modules is not a cycle with them
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in done:
            return
        assert node not in visiting, "import cycle: " + " -> ".join(
            [*visiting[visiting.index(node):], node])
        visiting.append(node)
        for target in sorted(graph[node]):
            visit(target)
        visiting.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_the_store_port_loads_no_adapter_until_a_url_asks_for_one():
    import subprocess
    import sys

    probe = ("import sys, fhir_server.store as s, fhir_server.service, fhir_server.caller; "
             "loaded = lambda *p: [m for m in sys.modules if m.startswith(p)]; "
             "assert not loaded('fhir_server.store.sqlite', 'fhir_server.store.mongo', "
             "'pymongo', 'bson'); "
             "s.store_from_url('sqlite:///:memory:'); "
             "assert 'fhir_server.store.sqlite' in sys.modules and not loaded('pymongo'); "
             "s.store_from_url('mongodb://127.0.0.1:27017/healthplatform?replicaSet=rs0'); "
             "assert 'fhir_server.store.mongo' in sys.modules and loaded('pymongo')")
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=ROOT)
