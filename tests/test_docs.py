"""The README and docs/ cannot drift from the config file, the CLI, .ci/run or each other."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DOCUMENTS = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "packaging" / "README.md",
             *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.S | re.M)


def dotted_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in tree.items():
        keys.add(prefix + name)
        if isinstance(value, dict):
            keys |= dotted_keys(value, f"{prefix}{name}.")
    return keys


def test_the_readme_points_to_the_config_file_as_its_reference():
    assert "[`config/edgeasr.yaml`](config/edgeasr.yaml)" in README


def test_every_yaml_snippet_in_the_readme_parses_and_names_keys_of_the_shipped_config():
    reference = dotted_keys(yaml.safe_load((REPO / "config" / "edgeasr.yaml").read_text()))
    snippets = fenced_blocks(README, "yaml")
    assert len(snippets) >= 2, "README lost its configuration snippets"
    for snippet in snippets:
        tree = yaml.safe_load(snippet)
        assert isinstance(tree, dict) and tree, f"not a mapping of keys:\n{snippet}"
        unknown = dotted_keys(tree) - reference
        assert not unknown, f"keys not in config/edgeasr.yaml: {sorted(unknown)}\n{snippet}"


def test_ci_runs_the_readme_test_command():
    marker = README.index("<!-- test-command -->")
    command = re.search(r"```bash\n(.+?)\n```", README[marker:]).group(1)
    ci = subprocess.run(["bash", ".ci/run", "--print-command"], capture_output=True, text=True, cwd=REPO)
    assert ci.returncode == 0 and ci.stdout.strip() == command


def test_first_command_uses_real_cli_options():
    first = re.search(r"```bash\n(bash packaging/setup-dev.sh && .+?)\n```", README).group(1)
    args = first.split("&& ", 1)[1].split()
    assert args[0] == ".venv/bin/edgeasr" and "--input" in args
    help_text = subprocess.run([sys.executable, "-m", "edgeasr", "--help"], capture_output=True,
                               text=True, cwd=REPO).stdout
    assert "--input" in help_text and "--config" in help_text


def headings(markdown: str, level: str = "#{1,6}") -> list[str]:
    """A document's headings of that level (a pattern of #), code blocks left out."""
    prose = re.sub(r"^```.*?^```$", "", markdown, flags=re.S | re.M)
    return re.findall(rf"^{level} (.+)$", prose, re.M)


def anchors(markdown: str) -> set[str]:
    """GitHub's ids for a document's headings."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings(markdown)}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_between_the_documents_resolve(document):
    """Every relative link names a file that exists, and a #section one of its headings."""
    text = document.read_text()
    links = [link for link in LINK.findall(text) if not re.match(r"[a-z]+:", link)]
    for link in links:
        path, _, section = link.partition("#")
        target = (document.parent / path).resolve() if path else document
        assert target.exists(), f"{document.name}: {link} names no file"
        if section:
            assert section in anchors(target.read_text()), f"{document.name}: {link} names no heading"


def test_the_readme_links_every_document_in_docs():
    for document in (REPO / "docs").glob("*.md"):
        assert f"(docs/{document.name})" in README, f"README does not link docs/{document.name}"


def test_the_readme_is_read_in_ten_minutes():
    """For the user, at most 300 lines: the history and the architecture live in docs/."""
    assert len(README.splitlines()) <= 300


def test_the_readme_opens_with_the_two_fresh_machine_commands():
    """Before anything else: the command that runs the embedded default, then the test command."""
    top = "\n".join(README.splitlines()[:25])
    commands = re.findall(r"```bash\n(.+?)\n```", top)
    assert len(commands) == 2, "README's first screen lost one of its two commands"
    assert commands[0].startswith("bash packaging/setup-dev.sh && ")
    assert top.index("<!-- test-command -->") < top.index(commands[1])


def test_the_benchmarks_page_holds_today_and_the_archive_the_dated_runs():
    """docs/benchmarks.md is today's figures, no dated section; the archive is newest first."""
    today = (REPO / "docs" / "benchmarks.md").read_text()
    assert not [h for h in headings(today, "##") if re.match(r"\d{4}-\d{2}-\d{2}", h)]
    assert headings(today, "##")[0] == "Accuracy"
    archive = (REPO / "docs" / "benchmarks-archive.md").read_text()
    dates = [h[:10] for h in headings(archive, "##")]
    assert dates and all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", d) for d in dates)
    assert dates == sorted(dates, reverse=True)


def test_the_changelog_speaks_to_users_not_in_milliseconds():
    """Timings belong to docs/benchmarks.md; the changelog says what a user sees."""
    assert not re.findall(r"\d\s?(?:ms|µs)\b", (REPO / "CHANGELOG.md").read_text())


# -- docs/architecture.md's tables and the code ---------------------------------------------------

ARCHITECTURE = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "edgeasr"
# a module path as the document writes one in code: `asr/text/`, `asr/decoding.py`,
# `lab/commands/bench_*.py`, `edgeasr/continuation.py`, `asr/transcriber.py:build_engine`, or a
# bare `cleanup.py` in a row that names its package
MODULE_PATH = re.compile(r"^(?:edgeasr/)?((?:[a-z_0-9]+/)*(?:[a-z_0-9*]+\.py|[a-z_0-9]+/))(?::\w+)?$")
# modules the architecture need not name, and why
UNNAMED = {
    "__main__.py": "`python -m edgeasr`: it only calls cli.main",
}


def modules() -> set[str]:
    """edgeasr's modules, as paths under edgeasr/ (packages' __init__.py left out)."""
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


def named_paths() -> list[tuple[str, set[str]]]:
    """Each module path the document names in code (outside code blocks), with the folders named
    in the same table row or paragraph (where a bare file name is looked for)."""
    text = re.sub(r"^```.*?^```$", "", ARCHITECTURE.read_text(), flags=re.S | re.M)
    named = []
    for block in re.split(r"\n(?=\|)|\n\s*\n", text):  # a table row, or a paragraph
        paths = [m.group(1) for span in re.findall(r"`([^`\s]+)`", block)
                 if (m := MODULE_PATH.match(span)) and span != "edgeasr/"
                 and not span.startswith(("tests/", "docs/", "packaging/"))]
        folders = {p.rsplit("/", 1)[0] + "/" for p in paths if "/" in p.rstrip("/")} | {p for p in paths if p.endswith("/")}
        named += [(p, folders) for p in paths]
    return named


def resolve(path: str, folders: set[str]) -> set[str]:
    """The modules a named path stands for (for a folder, the folder itself: a package or the
    data a module reads)."""
    if path.endswith("/"):
        return {path} if (PACKAGE / path).is_dir() else set()
    candidates = [path] if "/" in path else [path, *(folder + path for folder in folders)]
    return {m for m in modules() for c in candidates if fnmatch.fnmatchcase(m, c)}


def test_every_module_the_architecture_names_exists():
    """Each `asr/...py`, `lab/...`, `continuation.py` or folder docs/architecture.md names is a
    module (or a folder) of edgeasr/: a bare file name one in a folder its row names."""
    missing = sorted({path for path, folders in named_paths() if not resolve(path, folders)})
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_the_architecture_names_every_module():
    """Every module of edgeasr/ is in docs/architecture.md's tables or prose, by path (or by name
    in a row of its package), but the few in UNNAMED."""
    named = set().union(*(resolve(path, folders) for path, folders in named_paths()))
    unnamed = sorted(modules() - named - set(UNNAMED))
    assert not unnamed, f"modules docs/architecture.md does not name: {unnamed}"
    assert not set(UNNAMED) - modules(), "UNNAMED lists a module that is gone"
