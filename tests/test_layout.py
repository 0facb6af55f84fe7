"""The package tree shows the flow (audio -> asr -> output, front ends beside), and the imports
keep its direction. Every import counts, the ones inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgeasr"
STAGES = ("audio", "asr", "output", "wyoming", "home")  # each imports only the core and itself
# entry points, model preparation and measuring: never imported at run time
TOOLS = ("commands", "models", "lab")
ROOTS = ("daemon", "cli", "__main__")  # the wiring: may import every stage
RUNTIME = ("daemon", "pipeline", "worker", *STAGES)  # what the daemon runs


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The edgeasr modules `path` imports (absolute names)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edgeasr"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("edgeasr"))
    return found


def part(name: str) -> str:
    """edgeasr.asr.decoding -> asr; edgeasr.config -> config; edgeasr -> edgeasr."""
    pieces = name.split(".")
    return pieces[1] if len(pieces) > 1 else pieces[0]


def is_core(name: str) -> bool:
    return part(name) not in STAGES + TOOLS + ROOTS


MODULES = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}
# `from edgeasr.asr import logits` names a module; keep only names that are modules or packages
KNOWN = set(MODULES)


def targets(name: str) -> set[str]:
    return {t for t in MODULES[name] if t in KNOWN and t != name}


@pytest.mark.parametrize("name", sorted(n for n in MODULES if part(n) in STAGES))
def test_a_stage_imports_only_the_core_and_itself(name):
    bad = {t for t in targets(name) if not is_core(t) and part(t) != part(name)}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if is_core(n) and n != "edgeasr"))
def test_the_core_imports_no_stage(name):
    bad = {t for t in targets(name) if not is_core(t)}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if part(n) not in TOOLS + ("cli", "__main__")))
def test_no_runtime_module_imports_the_tools(name):
    bad = {t for t in targets(name) if part(t) in TOOLS}
    assert not bad, f"{name} imports {sorted(bad)}"


def reached(name: str) -> set[str]:
    """Every edgeasr module `name` imports, directly or through the modules it imports."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for target in targets(todo.pop()) - seen:
            seen.add(target)
            todo.append(target)
    return seen


@pytest.mark.parametrize("name", sorted(n for n in MODULES if part(n) in RUNTIME))
def test_the_runtime_path_reaches_no_lab_module(name):
    bad = {t for t in reached(name) if part(t) == "lab"}
    assert not bad, f"{name} imports {sorted(bad)}, directly or through others"


def test_the_tree_names_the_flow():
    packages = {p.parent.name for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert set(STAGES) - {"wyoming"} <= packages and set(TOOLS) <= packages
    # the layout test sees every module: a stage that imported another would be caught
    assert any("edgeasr.asr.decoding" in MODULES[n] for n in MODULES if part(n) == "asr")
