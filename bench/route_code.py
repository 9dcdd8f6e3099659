"""Lines of /api route code per operation, for the areas built on the facade kit.

Counts the code lines (no blank lines, comments or docstrings) of each area module and
the operations it mounts (``@router.<method>`` routes and the kit's generated ones, read
from each module's router), and prints one JSON line. ``--rev <git revision>`` measures the
modules as they were at that revision (the operation count is taken from the same
revision's decorators), so a before/after comparison is one command each.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import io
import json
import subprocess
import tokenize
from pathlib import Path

# The areas built on the kit: a module, or a package of modules, whose ``__init__`` and
# ``shared`` modules mount nothing of their own.
AREAS = ("platform_api/patients.py", "platform_api/patients/*.py",
         "platform_api/organizations.py", "platform_api/organizations/*.py",
         "platform_api/doctors/*.py", "platform_api/labs.py")
NOT_AREAS = ("__init__.py", "shared.py")
ROOT = Path(__file__).resolve().parent.parent


def area_files(rev: str | None) -> list[str]:
    """The area modules in the working tree, or at ``rev``."""
    if rev:
        listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "platform_api"],
                                cwd=ROOT, capture_output=True, text=True, check=True
                                ).stdout.split()
    else:
        listed = [str(p.relative_to(ROOT)) for p in (ROOT / "platform_api").rglob("*.py")]
    return sorted(f for f in listed if any(fnmatch.fnmatch(f, a) for a in AREAS)
                  and Path(f).name not in NOT_AREAS)


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    tree = ast.parse(source)
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            doc_lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                          tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - doc_lines)


def route_lines(source: str) -> int:
    """Code lines of the route handlers themselves: functions decorated as routes
    (``@router.get``, ``@facade.route``) and the statements mounting the kit's routes
    (``facade.mount(...)``, ``facade.action(...)``)."""
    tree = ast.parse(source)
    spans: list[tuple[int, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and any(
                _is_route(d) for d in node.decorator_list):
            first = min(d.lineno for d in node.decorator_list)
            spans.append((first, node.end_lineno or node.lineno))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Attribute) \
                and node.value.func.attr in ("mount", "action"):
            spans.append((node.lineno, node.end_lineno or node.lineno))
    lines = source.splitlines()
    code = set()
    for start, end in spans:
        for number in range(start, end + 1):
            text = lines[number - 1].strip()
            if text and not text.startswith("#"):
                code.add(number)
    return len(code)


def _is_route(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr in (
        "get", "post", "put", "patch", "delete", "api_route", "route")


def decorated_routes(source: str) -> int:
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if isinstance(target, ast.Attribute) and target.attr in (
                        "get", "post", "put", "patch", "delete", "api_route"):
                    count += 1
    return count


def kit_operations() -> int:
    """Operations the areas mount now: the routes of each area module's ``router``, the
    kit's generated ones included."""
    import importlib

    count = 0
    for area in area_files(None):
        module = importlib.import_module(area.removesuffix(".py").replace("/", "."))
        router = getattr(module, "router", None)  # an area's mapping module has none
        for route in router.routes if router is not None else ():
            count += len([m for m in getattr(route, "methods", ()) if m != "HEAD"])
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rev", help="git revision to measure instead of the working tree")
    args = parser.parse_args()
    total_lines = handlers = 0
    sources = {}
    areas = area_files(args.rev)
    for area in areas:
        if args.rev:
            source = subprocess.run(["git", "show", f"{args.rev}:{area}"], cwd=ROOT,
                                    capture_output=True, text=True, check=True).stdout
        else:
            source = (ROOT / area).read_text()
        sources[area] = source
        total_lines += code_lines(source)
        handlers += route_lines(source)
    operations = (sum(decorated_routes(s) for s in sources.values()) if args.rev
                  else kit_operations())
    print(json.dumps({"revision": args.rev or "working tree", "areas": len(areas),
                      "code_lines": total_lines, "operations": operations,
                      "lines_per_operation": round(total_lines / max(operations, 1), 1),
                      "route_handler_lines": handlers,
                      "route_lines_per_operation": round(handlers / max(operations, 1), 1)}))


if __name__ == "__main__":
    main()
