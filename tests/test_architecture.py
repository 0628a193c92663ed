"""The package's shape is checked, not just described: the import direction (the import-linter contract in
pyproject.toml, the one place its order is written; README *Architecture* must show the same chain and tree),
no import cycles between modules, and a command line that starts without torch."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("lmembed", cache_dir=None)


def test_import_linter_contract_holds():
    """import-linter checks the layers contract in pyproject.toml; an import against the direction, or a
    top-level module the (exhaustive) contract gives no layer, fails here, naming it. It runs in a child
    process because import-linter reconfigures logging in the process that runs it."""
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
        "from lmembed.cli.app import app\n"
        "for argv in (['--help'], ['encode', '--help'], ['eval', '--help'], ['train', '--help']):\n"
        "    result = CliRunner().invoke(app, argv)\n"
        "    assert result.exit_code == 0, result.output\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "HEAVY []" in run.stdout, run.stdout


def test_the_training_command_runs_as_a_module_without_runpy_warnings():
    """``python -m lmembed.cli.train`` (what ``accelerate launch -m`` runs): the package must not import it first."""
    run = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "lmembed.cli.train", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert "Usage" in run.stdout and not run.stderr


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


def test_consoles_are_made_in_one_place():
    """Only ``terminal.py`` builds rich consoles: one written to a log is then full width and never wrapped at 80
    columns, whichever command prints."""
    makers = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "terminal.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"(?<![.\w])Console\(", line)
    ]
    assert not makers, "rich consoles built outside terminal.py:\n" + "\n".join(makers)


def test_every_package_and_module_says_what_it_holds():
    import ast

    bare = [
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "__main__.py" and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not bare, f"modules without a docstring: {bare}"


def _contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "pipeline"]
    return contract


def _architecture_section() -> str:
    """The documentation's *Architecture* page (docs/architecture.md), up to its first ``##`` section."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    return page.split("\n", 1)[1].split("\n## ", 1)[0]


def test_the_contract_is_exhaustive():
    """Every child of ``lmembed`` must be given a layer: a new top-level module cannot join none."""
    contract = _contract()
    assert contract["exhaustive"] is True and contract["containers"] == ["lmembed"]


def test_readme_chain_is_the_contract():
    """README *Architecture* shows the contract's layers, in its order, with its separators (``|``, ``:``)."""
    section = _architecture_section()
    bold = re.search(r"\*\*(cli →.*?)\*\*", section, re.S)
    assert bold, "README *Architecture* has no bold import chain starting at cli"
    chain = [" ".join(layer.split()) for layer in bold.group(1).split("→")]
    layers = [layer.strip("()") for layer in _contract()["layers"]]
    assert chain == layers, f"README chain {chain} != pyproject.toml layers {layers}"


def test_readme_tree_names_every_package():
    """Every package under src/lmembed (sub-packages too) and every top-level module has its line in the tree
    of README *Architecture*, indented two spaces per level."""
    tree = _architecture_section().split("```", 2)[1].splitlines()[2:]  # after the "src/lmembed/" line
    shown = {(len(line) - len(line.lstrip()), line.split()[0]) for line in tree if line.strip()}
    packages = [p.parent.relative_to(SRC) for p in SRC.rglob("__init__.py") if p.parent != SRC]
    wanted = {(2 * len(package.parts), package.name + "/") for package in packages}
    wanted |= {(2, module.name) for module in SRC.glob("*.py") if module.name != "__init__.py"}
    missing = sorted(wanted - shown)
    assert not missing, f"README *Architecture* tree lacks (indent, name): {missing}"
