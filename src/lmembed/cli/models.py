"""``lmembed models``: the bundled offline models and the converted-model cache."""

from __future__ import annotations

from rich.table import Table

from lmembed import terminal
from lmembed.models.bundled import list_bundled
from lmembed.paths import models_dir

COLUMNS = ("name", "hub_id", "installed", "converted", "description")


def models() -> None:
    """List the bundled offline models and the converted-model cache."""
    err = terminal.console(stderr=True)
    table = Table(title="bundled models")
    for column in COLUMNS:
        table.add_column(column)
    rows = list_bundled()
    for row in rows:
        table.add_row(*(row[c] for c in COLUMNS))
    terminal.console().print(table)
    for row in rows:
        if row["installed"] == "no":
            err.print(f"[yellow]{row['name']}[/]: install with `{row['install']}`")
    err.print(f"converted models live in {models_dir()}")
