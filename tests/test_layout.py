"""The package tree shows the flow (audio -> asr -> output, front ends beside), and the imports
keep its direction. Every import counts, the ones inside functions too."""

from __future__ import annotations

import pytest
from helpers.import_graph import MODULES, PACKAGE, RUNTIME, STAGES, part, reached, targets

# imported at run time
TOOLS = ("commands", "models", "lab")
ROOTS = ("daemon", "cli", "__main__")  # the wiring: may import every stage


def is_core(name: str) -> bool:
    return part(name) not in STAGES + TOOLS + ROOTS


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


@pytest.mark.parametrize("name", sorted(n for n in MODULES if part(n) != "lab" and n != "edgeasr.cli"))
def test_the_product_works_without_the_lab(name):
    """The wheel and the .deb do not ship edgeasr/lab/: only the command line loads it, when one
    of its commands is asked for in a checkout."""
    bad = {t for t in targets(name) if part(t) == "lab"}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", RUNTIME)
def test_the_runtime_path_reaches_no_lab_module(name):
    bad = {t for t in reached(name) if part(t) == "lab"}
    assert not bad, f"{name} imports {sorted(bad)}, directly or through others"


def test_the_tree_names_the_flow():
    packages = {p.parent.name for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert set(STAGES) - {"wyoming"} <= packages and set(TOOLS) <= packages
    # the layout test sees every module: a stage that imported another would be caught
    assert any("edgeasr.asr.decoding" in MODULES[n] for n in MODULES if part(n) == "asr")
