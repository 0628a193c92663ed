"""The documentation is checked like code: the MkDocs site builds with ``--strict`` (a broken link, a page left out
of the navigation, a missing anchor or a docstring warning fails it), every ```` ```python ```` block of
README.md and docs/*.md runs, and the README stays a front door (short, no over-long lines).

A block that must not run (it needs the Hub, a GPU or a running server) is preceded by the line
``<!-- not run: REASON -->``; the reason may not be empty.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:(.*?)-->")
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```\s*$", re.M | re.S)


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line, code, reason not to run it or None) for each ```python block of a Markdown text."""
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        blocks.append((line, match.group(1), marker.group(1).strip() if marker else None))
    return blocks


def _cases() -> list:
    cases = []
    for page in PAGES:
        for line, code, reason in python_blocks(page.read_text(encoding="utf-8")):
            name = f"{page.relative_to(ROOT)}:{line}"
            cases.append(pytest.param(code, reason, id=name))
    return cases


def test_block_extraction_sees_markers():
    text = "x\n```python\na = 1\n```\n<!-- not run: needs the Hub -->\n```python title\nb = 2\n```\n"
    assert python_blocks(text) == [(2, "a = 1\n", None), (6, "b = 2\n", "needs the Hub")]


def test_the_readme_has_a_python_tour():
    runnable = [code for _, code, reason in python_blocks((ROOT / "README.md").read_text()) if reason is None]
    assert runnable and any("Embedder" in code for code in runnable), "README.md has no runnable Python tour"


# Runs every block in one Python process (imports and torch start-up paid once), each block in a fresh namespace,
# from a temporary folder; one line of JSON per block: its name and the traceback if it failed.
RUNNER = """
import json, sys, traceback
for name, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
        error = None
    except BaseException:
        error = traceback.format_exc()
    print("\\nBLOCK " + json.dumps([name, error]), flush=True)
"""


@pytest.fixture(scope="module")
def block_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """Every runnable block's name -> None if it ran, else its traceback."""
    folder = tmp_path_factory.mktemp("docs-blocks")
    runnable = [(case.id, case.values[0]) for case in _cases() if case.values[1] is None]
    (folder / "blocks.json").write_text(json.dumps(runnable), encoding="utf-8")
    (folder / "runner.py").write_text(RUNNER, encoding="utf-8")
    env = {**os.environ, "LMEMBED_CACHE": str(folder / "cache")}  # the blocks' vectors, not the user's cache
    done = subprocess.run(
        [sys.executable, "runner.py", "blocks.json"], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )
    results = dict(json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("BLOCK "))
    assert done.returncode == 0 and len(results) == len(runnable), f"the block runner failed:\n{done.stderr[-3000:]}"
    return results


@pytest.mark.parametrize(("code", "reason"), _cases())
def test_python_block_runs(code: str, reason: str | None, block_results: dict[str, str | None], request):
    if reason is not None:
        assert reason, "a `<!-- not run: -->` marker must say why the block does not run"
        pytest.skip(f"not run: {reason}")
    name = request.node.callspec.id
    assert block_results[name] is None, f"the block failed:\n{code}\n--- traceback ---\n{block_results[name]}"


def test_mkdocs_build_strict(tmp_path: Path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert (tmp_path / "site" / "api" / "index.html").read_text().count('id="lmembed.embedder.Embedder.encode"')


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 550, f"README.md has {len(lines)} lines; the details belong in docs/"
    long = [i for i, line in enumerate(lines, 1) if len(line) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"
    for command in ("bash run.sh ", "bash run.sh test "):
        assert any(line.startswith(command) for line in lines), f"README.md does not show `{command.strip()}`"


#: How docs/cli.md is made: from the CLI itself (typer reads every command's options and help).
CLI_REFERENCE = [
    "-m",
    "typer",
    "lmembed.cli.app",
    "utils",
    "docs",
    "--name",
    "lmembed",
    "--title",
    "Command-line reference",
]


def test_the_cli_reference_is_the_cli(tmp_path: Path):
    """docs/cli.md is generated from the commands, so it cannot drift from them: an option added, renamed or
    re-described without regenerating the page fails here."""
    fresh = tmp_path / "cli.md"
    run = subprocess.run([sys.executable, *CLI_REFERENCE, "--output", str(fresh)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    regenerate = "python " + " ".join(CLI_REFERENCE) + " --output docs/cli.md"
    assert (ROOT / "docs" / "cli.md").read_text() == fresh.read_text(), f"docs/cli.md is stale: {regenerate}"
