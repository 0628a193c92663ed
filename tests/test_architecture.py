"""The package's shape is checked, not just described: the import direction (an import-linter contract in
pyproject.toml), no import cycles between modules, and a command line that starts without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("lmembed", cache_dir=None)


def test_import_linter_contract_holds():
    """import-linter checks the layers contract in pyproject.toml (cli → training → evaluation → encoding →
    pooling/models → config); an import against the direction fails here, naming the chain. It runs in a
    child process because import-linter reconfigures logging in the process that runs it."""
    code = (
        "from importlinter.cli import lint_imports\n"
        f"raise SystemExit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True, no_logo=True))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 kept, 0 broken" in run.stdout, run.stdout


def test_no_import_cycles(graph):
    """No module reaches back to a module that imports it (lazy imports inside functions count too)."""
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if not imported.startswith("lmembed"):
                continue
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                cycles.append(" -> ".join((importer, *back)))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_library_never_imports_the_cli(graph):
    users = {
        m for m in graph.find_downstream_modules("lmembed.cli", as_package=True) if not m.startswith("lmembed.cli")
    }
    assert not users, f"library modules import the CLI: {sorted(users)}"


def test_cli_starts_without_torch():
    """``lmembed --help`` and every ``lmembed <command> --help`` load neither torch nor transformers."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from lmembed.cli import app\n"
        "for argv in (['--help'], ['encode', '--help'], ['eval', '--help'], ['train', '--help']):\n"
        "    result = CliRunner().invoke(app, argv)\n"
        "    assert result.exit_code == 0, result.output\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "HEAVY []" in run.stdout, run.stdout


SRC = ROOT / "src" / "lmembed"


def test_environment_variables_are_read_in_one_place():
    """Only ``paths.py`` reads lmembed's environment variables (``os.environ``/``os.getenv`` with LMEMBED_)."""
    readers = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "paths.py" and path.parent == SRC:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ("environ" in line or "getenv" in line) and "LMEMBED_" in line:
                readers.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert not readers, "LMEMBED_* read outside paths.py:\n" + "\n".join(readers)


def test_every_package_and_module_says_what_it_holds():
    import ast

    bare = [
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "__main__.py" and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not bare, f"modules without a docstring: {bare}"
