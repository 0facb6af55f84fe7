"""edgeasr's modules and the edgeasr modules each imports, read from the source (every import
counts, the ones inside functions too): for tests/test_layout.py and tests/test_install.py."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "edgeasr"


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


MODULES = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}
# `from edgeasr.asr import logits` names a module; keep only names that are modules or packages
KNOWN = set(MODULES)


def targets(name: str) -> set[str]:
    return {t for t in MODULES[name] if t in KNOWN and t != name}


def reached(name: str) -> set[str]:
    """Every edgeasr module `name` imports, directly or through the modules it imports."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for target in targets(todo.pop()) - seen:
            seen.add(target)
            todo.append(target)
    return seen


def part(name: str) -> str:
    """edgeasr.asr.decoding -> asr; edgeasr.config -> config; edgeasr -> edgeasr."""
    pieces = name.split(".")
    return pieces[1] if len(pieces) > 1 else pieces[0]


STAGES = ("audio", "asr", "output", "wyoming", "home")  # each imports only the core and itself
# What the daemon runs: the package, `edgeasr` without a sub-command (commands/run.py), the
# composition root, the core that moves audio and jobs, and the stages. (cli.py loads the lab's
# parsers when a lab command is asked for: tests/test_lab_commands.py runs it.)
RUNTIME = sorted({"edgeasr", "edgeasr.commands.run", "edgeasr.daemon", "edgeasr.pipeline", "edgeasr.worker",
                  *(n for n in MODULES if part(n) in STAGES)})
